#pragma once
// --merge_lines: a console line that several ranks of this node write within a short window is
// printed once, prefixed with all of them ("[rank0-7]: epoch 3 done"), instead of once per rank.
//
// Lines wait up to the window, in order of arrival; a rank's line joins a waiting line of the same
// text from other ranks unless that would move it before the rank's own earlier lines, so every
// rank's lines keep their order. A line is printed once it is older than the window (a thread of
// the merger's own), or when the merger ends (the end of the worker group). Log files are not
// involved: they keep every rank's lines as written. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "launcher/workers/console.hpp"

namespace ddprun::launcher::workers {

class LineMerger {
 public:
  // `console`: where merged lines go (not owned; it outlives the merger). `prefix_template`: the
  // console prefix with ${rank}, ${local_rank}, ${role_name}, ${host}, ${hostname} (the ranks
  // become lists such as "0-3,6").
  LineMerger(ConsoleWriter* console, std::chrono::milliseconds window, std::string prefix_template, std::string role,
             std::string host);
  ~LineMerger();
  LineMerger(const LineMerger&) = delete;
  LineMerger& operator=(const LineMerger&) = delete;

  // One line of a rank (without its newline).
  void add(int rank, int local_rank, std::string_view line);
  // Prints everything waiting, at once.
  void flush();

 private:
  struct Entry {
    uint64_t seq = 0;
    std::string text;
    std::set<int> ranks, local_ranks;
    std::chrono::steady_clock::time_point first;
  };
  void loop();
  // Prints the entries that are due (all of them when `all`); requires the lock.
  void emit(bool all, std::chrono::steady_clock::time_point now);

  ConsoleWriter* console_;
  std::chrono::milliseconds window_;
  std::string template_, role_, host_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> waiting_;
  std::map<int, uint64_t> last_seq_;  // each rank's latest entry
  uint64_t next_seq_ = 1;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddprun::launcher::workers
