#include "common/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <string>

#include "common/printable.hpp"
#include "common/system.hpp"

namespace ddprun::log {
namespace {

Level level_from_env() {
  const char* text = std::getenv("DDPRUN_LOG_LEVEL");
  Level level = Level::Info;
  if (text == nullptr || *text == '\0') {
    // torchrun's LOGLEVEL (Python's level names: DEBUG, INFO, WARNING, ERROR, CRITICAL), when
    // DDPRUN_LOG_LEVEL is not set; a value that is no level is left to whoever else reads it.
    if (const char* py = std::getenv("LOGLEVEL"); py != nullptr) {
      std::string lower(py);
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (lower == "critical" || lower == "fatal") lower = "error";
      parse_level(lower, level);
    }
    return level;
  }
  if (!parse_level(text, level)) {
    std::string msg =
        "ddprun: ignoring DDPRUN_LOG_LEVEL='" + std::string(text) + "' (expected debug, info, warn or error)\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg.data(), msg.size());
  }
  return level;
}

std::atomic<int>& current_level() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

// Each level's word (what DDPRUN_LOG_LEVEL and --log-level take) and its label in a log line, by
// the enum's value.
struct LevelNames {
  std::string_view word;
  const char* label;
};
constexpr LevelNames kLevelNames[] = {{"debug", "DEBUG"}, {"info", "INFO "}, {"warn", "WARN "}, {"error", "ERROR"}};

const LevelNames& names_of(Level level) {
  const auto i = static_cast<size_t>(level);
  return i < std::size(kLevelNames) ? kLevelNames[i] : kLevelNames[static_cast<size_t>(Level::Info)];
}

const char* level_name(Level level) { return names_of(level).label; }

std::atomic<Sink>& current_sink() {
  static std::atomic<Sink> sink{nullptr};
  return sink;
}

}  // namespace

void set_sink(Sink sink) { current_sink().store(sink); }

bool enabled(Level level) { return static_cast<int>(level) >= current_level().load(std::memory_order_relaxed); }

void set_level(Level level) { current_level().store(static_cast<int>(level)); }

Level current() { return static_cast<Level>(current_level().load(std::memory_order_relaxed)); }

std::string_view level_word(Level level) { return names_of(level).word; }

bool parse_level(std::string_view text, Level& out) {
  if (text == "warning") text = "warn";
  for (size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (text == kLevelNames[i].word) {
      out = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

Line::Line(Level level, std::string_view component) : level_(level) {
  if (!enabled(level_)) return;
  stream_ << utc_timestamp(std::chrono::system_clock::now()) << ' ' << level_name(level_) << ' ' << component << ": ";
}

Line::~Line() {
  if (!enabled(level_)) return;
  // A line often carries text from outside (a node check's output, a peer's reason, a file's
  // name): its control characters are shown, never sent to the terminal to act on.
  const std::string text = printable_lines(stream_.str()) + '\n';
  if (Sink sink = current_sink().load()) {
    sink(text);
    return;
  }
  // One write per line keeps lines whole; a short write on stderr is retried for the rest.
  write_all(STDERR_FILENO, text);
}

}  // namespace ddprun::log
