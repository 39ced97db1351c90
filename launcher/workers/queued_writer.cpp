#include "launcher/workers/queued_writer.hpp"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace ddprun::launcher::workers {
namespace {

// Sent to a writer thread that is blocked in write(2) when its owner is done: the handler does
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

// What the writer's thread uses: shared with it, so that a thread left behind in a write the
// kernel does not interrupt still has it after the owner has gone.
struct QueuedWriter::State {
  int fd = -1;
  UniqueFd owned;
  Settings settings;
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable idle;
  std::string queue;
  bool writing = false;
  bool stop = false;
  bool broken = false;  // a write failed: nothing more to write
  std::atomic<uint64_t> dropped{0};
  std::atomic<bool> announced{false};
  std::atomic<bool> exited{false};
  std::thread thread;
};

QueuedWriter::QueuedWriter(int fd, size_t capacity, std::function<void()> on_first_drop)
    : QueuedWriter(fd, Settings{capacity, std::move(on_first_drop), {}}) {}

QueuedWriter::QueuedWriter(int fd, Settings settings) : QueuedWriter(fd, UniqueFd(), std::move(settings)) {}

QueuedWriter::QueuedWriter(UniqueFd fd, Settings settings) : QueuedWriter(-1, std::move(fd), std::move(settings)) {}

QueuedWriter::QueuedWriter(int fd, UniqueFd owned, Settings settings)
    : fd_(owned ? owned.get() : fd), state_(std::make_shared<State>()) {
  install_interrupt_handler();
  state_->fd = fd_;
  state_->owned = std::move(owned);
  state_->settings = std::move(settings);
  state_->thread = std::thread([s = state_] { run(s); });
}

QueuedWriter::~QueuedWriter() {
  State& s = *state_;
  drain(s.settings.drain_bound);
  {
    std::lock_guard lock(s.mutex);
    s.stop = true;
  }
  s.wake.notify_all();
  // A write still blocked on a reader that does not read: interrupt it (the rest is dropped).
  const auto give_up = std::chrono::steady_clock::now() + s.settings.interrupt_bound;
  while (!s.exited.load() && std::chrono::steady_clock::now() < give_up) {
    ::pthread_kill(s.thread.native_handle(), kInterruptSignal);
    std::unique_lock lock(s.mutex);
    s.idle.wait_for(lock, std::chrono::milliseconds(10), [&] { return s.exited.load(); });
  }
  if (s.exited.load()) {
    s.thread.join();
  } else {
    // A write the kernel does not interrupt (a hard NFS mount): the thread keeps the state it
    // shares and ends when the write does; ddprun's exit does not wait for it.
    s.thread.detach();
  }
}

void QueuedWriter::write(std::string_view bytes) {
  if (bytes.empty()) return;
  State& s = *state_;
  bool first_drop = false;
  {
    std::lock_guard lock(s.mutex);
    if (s.broken || s.stop) return;
    if (s.queue.size() + bytes.size() > s.settings.capacity) {
      s.dropped += bytes.size();
      first_drop = !s.announced.exchange(true);
    } else {
      s.queue.append(bytes);
    }
  }
  if (first_drop && s.settings.on_first_drop) s.settings.on_first_drop();
  s.wake.notify_one();
}

bool QueuedWriter::drain(std::chrono::milliseconds timeout) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  return s.idle.wait_for(lock, timeout, [&] { return s.broken || (s.queue.empty() && !s.writing); });
}

uint64_t QueuedWriter::dropped_bytes() const { return state_->dropped.load(); }

bool QueuedWriter::failed() const {
  std::lock_guard lock(state_->mutex);
  return state_->broken;
}

void QueuedWriter::run(const std::shared_ptr<State>& state) {
  State& s = *state;
  std::string batch;
  std::unique_lock lock(s.mutex);
  for (;;) {
    s.wake.wait(lock, [&] { return s.stop || !s.queue.empty(); });
    if (s.queue.empty()) break;  // stopping, nothing left
    batch.swap(s.queue);
    s.writing = true;
    lock.unlock();
    std::string_view left = batch;
    int err = 0;
    while (!left.empty()) {
      const ssize_t n = ::write(s.fd, left.data(), left.size());
      if (n > 0) {
        left.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) {
        std::lock_guard check(s.mutex);
        if (s.stop) break;  // interrupted at the end: drop the rest
        continue;
      }
      err = n < 0 ? errno : ENOSPC;  // EPIPE, EBADF, EIO, a full disk: the reader is gone
      break;
    }
    lock.lock();
    const bool failed = err != 0 || !left.empty();
    batch.clear();
    if (batch.capacity() > s.settings.capacity) std::string().swap(batch);
    s.writing = false;
    if (failed) {
      s.broken = true;
      s.queue.clear();
      // Under the lock: once the destructor has said stop, nobody is told (the owner has gone).
      if (err != 0 && !s.stop && s.settings.on_failure) s.settings.on_failure(err);
    }
    s.idle.notify_all();
    if (failed) break;
  }
  s.writing = false;
  s.exited = true;
  s.idle.notify_all();
}

}  // namespace ddprun::launcher::workers
