#pragma once
// Bytes written for a person (ddprun's console, the --trace_file, a rank's log file) by a thread of
// their own, so that a reader that does not keep up (a pipe nobody reads, a hung NFS mount, a
// stopped pager) never blocks the caller: write() queues and returns. The queue is bounded; when
// the reader falls further behind, new batches are dropped and counted and the owner is told once.
// A write that fails (EPIPE, ENOSPC, EIO) ends the writer; the owner is told once, with errno.
//
// Thread-safe: write() may be called from any thread. The file descriptor's flags are left alone
// (making a terminal or a shell's pipe non-blocking would change it for every process sharing it).
// The destructor gives the reader a short time to drain, then interrupts a write still blocked
// (a signal, no SA_RESTART); a write the kernel does not interrupt is left behind on its thread,
// which owns what it uses (the descriptor too, when owned): the owner's exit never waits on it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "common/unique_fd.hpp"

namespace ddprun::launcher::workers {

class QueuedWriter {
 public:
  static constexpr size_t kDefaultCapacity = size_t{4} << 20;

  struct Settings {
    size_t capacity = kDefaultCapacity;
    // Runs once, on the caller's thread, when bytes are first dropped.
    std::function<void()> on_first_drop;
    // Runs once, on the writer's thread, when a write fails (not when the destructor stops it).
    std::function<void(int err)> on_failure;
    // How long the destructor waits for the queue to drain, then for a blocked write to return.
    std::chrono::milliseconds drain_bound = std::chrono::seconds(2);
    std::chrono::milliseconds interrupt_bound = std::chrono::seconds(1);
  };

  // `fd` is not owned (a console).
  QueuedWriter(int fd, size_t capacity = kDefaultCapacity, std::function<void()> on_first_drop = {});
  QueuedWriter(int fd, Settings settings);
  // `fd` is owned: closed once the writer's thread is done with it.
  QueuedWriter(UniqueFd fd, Settings settings);
  ~QueuedWriter();
  QueuedWriter(const QueuedWriter&) = delete;
  QueuedWriter& operator=(const QueuedWriter&) = delete;

  // Queues `bytes` (whole lines, whole records) without blocking; drops them if the reader is too
  // far behind or the writer has failed.
  void write(std::string_view bytes);
  // Waits up to `timeout` for everything queued to be written; false if it was not.
  bool drain(std::chrono::milliseconds timeout);
  uint64_t dropped_bytes() const;
  // A write failed: nothing more is written.
  bool failed() const;
  int fd() const { return fd_; }

 private:
  struct State;
  QueuedWriter(int fd, UniqueFd owned, Settings settings);
  static void run(const std::shared_ptr<State>& s);

  int fd_;
  std::shared_ptr<State> state_;
};

}  // namespace ddprun::launcher::workers
