#include "common/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "common/system.hpp"

namespace ddprun::log {
namespace {

Level level_from_env() {
  const char* text = std::getenv("DDPRUN_LOG_LEVEL");
  Level level = Level::Info;
  if (text != nullptr && *text != '\0' && !parse_level(text, level)) {
    std::string msg = "ddprun: ignoring DDPRUN_LOG_LEVEL='" + std::string(text) +
                      "' (expected debug, info, warn or error)\n";
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, msg.data(), msg.size());
  }
  return level;
}

std::atomic<int>& current_level() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

const char* level_name(Level level) {
  switch (level) {
    case Level::Debug: return "DEBUG";
    case Level::Info: return "INFO ";
    case Level::Warn: return "WARN ";
    case Level::Error: return "ERROR";
  }
  return "?????";
}

std::atomic<Sink>& current_sink() {
  static std::atomic<Sink> sink{nullptr};
  return sink;
}

}  // namespace

void set_sink(Sink sink) { current_sink().store(sink); }

bool enabled(Level level) { return static_cast<int>(level) >= current_level().load(std::memory_order_relaxed); }

void set_level(Level level) { current_level().store(static_cast<int>(level)); }

Level current() { return static_cast<Level>(current_level().load(std::memory_order_relaxed)); }

std::string_view level_word(Level level) {
  switch (level) {
    case Level::Debug: return "debug";
    case Level::Info: return "info";
    case Level::Warn: return "warn";
    case Level::Error: return "error";
  }
  return "info";
}

bool parse_level(std::string_view text, Level& out) {
  if (text == "debug") out = Level::Debug;
  else if (text == "info") out = Level::Info;
  else if (text == "warn" || text == "warning") out = Level::Warn;
  else if (text == "error") out = Level::Error;
  else return false;
  return true;
}

Line::Line(Level level, std::string_view component) : level_(level) {
  if (!enabled(level_)) return;
  stream_ << utc_timestamp(std::chrono::system_clock::now()) << ' ' << level_name(level_) << ' ' << component << ": ";
}

Line::~Line() {
  if (!enabled(level_)) return;
  stream_ << '\n';
  const std::string text = stream_.str();
  if (Sink sink = current_sink().load()) {
    sink(text);
    return;
  }
  // One write per line keeps lines whole; a short write on stderr is retried for the rest.
  write_all(STDERR_FILENO, text);
}

}  // namespace ddprun::log
