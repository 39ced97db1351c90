#pragma once
// One worker stream (stdout or stderr) on its way out: split into whole lines, prefixed and queued
// for the console (a ConsoleWriter, which never blocks) one batch of whole lines at a time so lines
// of different ranks never mix mid-line, copied raw to the rank's log file, and its last lines kept
// for the failure report. Not thread-safe.

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/unique_fd.hpp"
#include "launcher/workers/console.hpp"
#include "launcher/workers/merge.hpp"

namespace ddprun::launcher::workers {

// The lines of every rank's stream that contain one of `filters`, copied (prefixed) into one file
// (torchrun's --duplicate-stdout-filters). Shared by the ranks' LineWriters of that stream, which
// the supervisor's thread drives. A file that cannot be written is said once and then left alone.
class FilteredCopy {
 public:
  FilteredCopy(std::vector<std::string> filters, std::string path);
  ~FilteredCopy();
  FilteredCopy(const FilteredCopy&) = delete;
  FilteredCopy& operator=(const FilteredCopy&) = delete;
  bool matches(std::string_view line) const;
  void write(std::string_view lines);

 private:
  std::vector<std::string> filters_;
  std::string path_;
  UniqueFd fd_;
};

class LineWriter {
 public:
  // A stream's destinations. console: the node's console (not owned), nullptr for none;
  // to_console: whether lines go there while the file takes them; file_fd: the log file (none:
  // no file; the writer owns and closes it); file_name: how messages name the file ("rank 3's log file PATH").
  struct Sinks {
    ConsoleWriter* console = nullptr;
    bool to_console = true;
    UniqueFd file_fd;
    std::string file_name;
    std::shared_ptr<FilteredCopy> filtered;  // nullptr for none
    // --merge_lines: console lines go to the merger (as this rank's) rather than to `console`.
    std::shared_ptr<LineMerger> merger;
    int rank = 0;
    int local_rank = 0;
  };
  // When the file cannot take more (a full disk, say), it is closed, ddprun says so once, and the
  // lines go to the console from there on, also where they went to the file only.
  LineWriter(std::string prefix, Sinks sinks, size_t tail_lines);
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;

  void feed(std::string_view data);
  // End of stream: a last line without a newline is written with one.
  void finish();
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  static constexpr size_t kMaxLine = size_t{64} << 10;  // longer runs without a newline are cut into lines
  void emit_line(std::string_view line, std::string& batch, std::string& filtered);
  void write_console(const std::string& batch);

  std::string prefix_;
  ConsoleWriter* console_;
  bool to_console_;
  UniqueFd file_fd_;
  std::string file_name_;
  std::shared_ptr<FilteredCopy> filtered_;
  std::shared_ptr<LineMerger> merger_;
  int rank_ = 0;
  int local_rank_ = 0;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

// Expands a prefix template as torchrun 2.x does (Python's string.Template.safe_substitute):
// $rank or ${rank}, $local_rank, $role_name, and ddprun's $host (also $hostname); $$ is a $.
std::string expand_prefix(const std::string& tmpl, int rank, int local_rank, const std::string& role,
                          const std::string& host);
// The same with the ranks as text (merged lines: "0-3,6").
std::string expand_prefix_text(const std::string& tmpl, const std::string& rank, const std::string& local_rank,
                               const std::string& role, const std::string& host);

}  // namespace ddprun::launcher::workers
