#pragma once
// One worker stream (stdout or stderr) on its way out: split into whole lines, prefixed and written
// to the console with one write(2) per batch so lines of different ranks never mix mid-line, copied
// raw to the rank's log file, and its last lines kept for the failure report. Not thread-safe.

#include <deque>
#include <string>
#include <string_view>

namespace ddprun::launcher {

class LineWriter {
 public:
  // console_fd / file_fd: -1 for none. The writer owns file_fd (closes it) but not console_fd.
  LineWriter(std::string prefix, int console_fd, int file_fd, size_t tail_lines);
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
  int console_fd_;
  int file_fd_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Expands ${rank}, ${local_rank}, ${role_name} and ${host} in a prefix template.
std::string expand_prefix(std::string tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host);

// write(2) of everything, retrying EINTR and short writes; false if the descriptor failed.
bool write_fully(int fd, std::string_view data);

}  // namespace ddprun::launcher
