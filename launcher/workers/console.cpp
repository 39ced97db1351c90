#include "launcher/workers/console.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace ddprun::launcher::workers {
namespace {

// Sent to a writer thread that is blocked in write(2) when ddprun is done: the handler does
// nothing, and without SA_RESTART the write returns EINTR.
const int kInterruptSignal = SIGRTMIN + 3;

void install_interrupt_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(kInterruptSignal, &sa, nullptr);
  });
}

}  // namespace

Consoles& consoles() {
  static Consoles c;
  return c;
}

ConsoleWriter::ConsoleWriter(int fd, size_t capacity, std::function<void()> on_first_drop)
    : fd_(fd), capacity_(capacity), on_first_drop_(std::move(on_first_drop)) {
  install_interrupt_handler();
  thread_ = std::thread([this] { run(); });
}

ConsoleWriter::~ConsoleWriter() {
  drain(std::chrono::seconds(2));
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  // A write still blocked on a console nobody reads: interrupt it (the rest is dropped).
  while (!exited_.load()) {
    ::pthread_kill(thread_.native_handle(), kInterruptSignal);
    std::unique_lock lock(mutex_);
    idle_.wait_for(lock, std::chrono::milliseconds(10));
  }
  thread_.join();
}

void ConsoleWriter::write(std::string_view bytes) {
  if (bytes.empty()) return;
  bool first_drop = false;
  {
    std::lock_guard lock(mutex_);
    if (broken_) return;
    if (queue_.size() + bytes.size() > capacity_) {
      dropped_ += bytes.size();
      first_drop = !announced_.exchange(true);
    } else {
      queue_.append(bytes);
    }
  }
  if (first_drop && on_first_drop_) on_first_drop_();
  wake_.notify_one();
}

bool ConsoleWriter::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return idle_.wait_for(lock, timeout, [this] { return broken_ || (queue_.empty() && !writing_); });
}

void ConsoleWriter::run() {
  std::string batch;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, nothing left
    batch.swap(queue_);
    writing_ = true;
    lock.unlock();
    std::string_view left = batch;
    bool failed = false;
    while (!left.empty()) {
      const ssize_t n = ::write(fd_, left.data(), left.size());
      if (n > 0) {
        left.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) {
        std::lock_guard check(mutex_);
        if (stop_) {
          failed = true;  // interrupted at the end: drop the rest
          break;
        }
        continue;
      }
      failed = true;  // EPIPE, EBADF, EIO: the console is gone
      break;
    }
    lock.lock();
    batch.clear();
    if (batch.capacity() > capacity_) std::string().swap(batch);
    writing_ = false;
    if (failed) {
      broken_ = true;
      queue_.clear();
    }
    idle_.notify_all();
    if (failed) break;
  }
  writing_ = false;
  exited_ = true;
  idle_.notify_all();
}

}  // namespace ddprun::launcher::workers
