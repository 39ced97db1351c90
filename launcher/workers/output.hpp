#pragma once
// One worker stream (stdout or stderr) on its way out: split into whole lines, prefixed and queued
// for the console (a ConsoleWriter, which never blocks) one batch of whole lines at a time so lines
// of different ranks never mix mid-line, copied raw to the rank's log file, and its last lines kept
// for the failure report. Not thread-safe.

#include <deque>
#include <string>
#include <string_view>

#include "launcher/workers/console.hpp"

namespace ddprun::launcher {

class LineWriter {
 public:
  // console: nullptr for none (not owned); file_fd: -1 for none (owned: closed by the writer).
  LineWriter(std::string prefix, ConsoleWriter* console, int file_fd, size_t tail_lines);
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  void feed(std::string_view data);
  // End of stream: a last line without a newline is written with one.
  void finish();
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  static constexpr size_t kMaxLine = 64 * 1024;  // longer runs without a newline are cut into lines
  void emit_line(std::string_view line, std::string& batch);
  void write_console(const std::string& batch);

  std::string prefix_;
  ConsoleWriter* console_;
  int file_fd_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Expands ${rank}, ${local_rank}, ${role_name} and ${host} in a prefix template.
std::string expand_prefix(std::string tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host);

}  // namespace ddprun::launcher
