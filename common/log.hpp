#pragma once
// Line-oriented logging to stderr: "2026-11-21T10:00:00.123Z INFO  store: listening on 127.0.0.1:41234".
// stdout belongs to the workers, so nothing here ever writes there. Each line is emitted whole (one
// write(2), or one entry of the installed sink), so lines from several threads or processes never
// interleave mid-line; control characters in a line but its newlines are shown as \xNN
// (common/printable.hpp), whatever text from outside the line carries.
// The level comes from DDPRUN_LOG_LEVEL (debug, info, warn, error; default info) and is read once.

#include <sstream>
#include <string_view>

namespace ddprun::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// True when messages of `level` are printed.
bool enabled(Level level);

// Overrides the level chosen by DDPRUN_LOG_LEVEL (used by tests and --quiet style flags).
void set_level(Level level);

// The level in effect: DDPRUN_LOG_LEVEL's (info without it), or set_level's.
Level current();

// Parses "debug", "info", "warn"/"warning", "error"; returns false for anything else.
bool parse_level(std::string_view text, Level& out);
// The word parse_level reads for `level`: "debug", "info", "warn", "error".
std::string_view level_word(Level level);

// Where finished lines go: by default a write(2) to stderr. A program whose stderr may block (the
// launcher: a pipe nobody reads) installs a sink that queues instead. Set it before other threads log.
using Sink = void (*)(std::string_view line);
void set_sink(Sink sink);

// One log line. Collects the message with operator<< and writes it when destroyed.
class Line {
 public:
  Line(Level level, std::string_view component);
  ~Line();
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;

  template <typename T>
  Line& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream stream_;
};

inline Line debug(std::string_view component) { return Line(Level::Debug, component); }
inline Line info(std::string_view component) { return Line(Level::Info, component); }
inline Line warn(std::string_view component) { return Line(Level::Warn, component); }
inline Line error(std::string_view component) { return Line(Level::Error, component); }

}  // namespace ddprun::log

// Skips formatting entirely when the level is off: DDPRUN_LOG_DEBUG("store") << expensive();
#define DDPRUN_LOG_DEBUG(component)                           \
  if (!::ddprun::log::enabled(::ddprun::log::Level::Debug)) { \
  } else ::ddprun::log::debug(component)
