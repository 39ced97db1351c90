#pragma once
// Sum all-reduce of fixed CPU buffers over a dedicated Gloo context in synchronous mode, used by
// DistributedDataParallel for its CPU gradient buckets.
//
// Why not ProcessGroupGloo::allreduce: its work goes through a queue to a worker thread, and every
// receive is handed from Gloo's event-loop thread to that worker and then to the waiting caller.
// On a loaded machine each of those wake-ups can wait for a scheduler tick, so a 0.25 MB all-reduce
// between two processes on one host averages about 1 ms (p90 4 ms). Here the pairs are in Gloo's
// synchronous mode: the thread that runs the collective reads the sockets itself (blocking, or
// spinning with busy_poll), and the same all-reduce averages under 0.1 ms.
//
// Buffers are registered once (their storage must not move) and split into messages no larger than
// the agreed limit: in synchronous mode a send blocks until the kernel takes it, so each message
// must fit in a socket send buffer even when the peer is not reading yet. The limit is half of the
// smallest net.core.wmem_max over all ranks.
//
// Reductions run in launch order on one background thread, which sleeps in recv while it waits for
// peers; wait_all() runs the ones still queued on the calling thread (the end of backward, where
// that thread would only wait anyway), and with busy_poll it spins on the sockets meanwhile.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace gloo {
class Algorithm;
class Context;
}  // namespace gloo

namespace ddprun::worker::detail {

class GlooBucketReducer {
 public:
  // Collective: every rank constructs it with the same key prefix. Connects a full mesh through
  // the store under `prefix`.
  GlooBucketReducer(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                    std::chrono::milliseconds timeout, bool busy_poll);
  ~GlooBucketReducer();
  GlooBucketReducer(const GlooBucketReducer&) = delete;
  GlooBucketReducer& operator=(const GlooBucketReducer&) = delete;

  // Registers a buffer to be summed in place; every rank registers the same sizes in the same
  // order. Returns its id, or nullopt when Gloo's slot numbers (an int, 2 * size * (size - 1) per
  // message) would run out: that buffer must then be reduced some other way. The answer is the
  // same on every rank.
  std::optional<size_t> add(float* data, size_t count);
  std::optional<size_t> add(double* data, size_t count);

  // Queues buffer `id`. Every rank launches the same ids in the same order. wake_worker=false
  // leaves it for the next wait_all() (the caller is about to wait anyway).
  void launch(size_t id, bool wake_worker = true);
  // Returns once every launched reduction is done, running queued ones on this thread when the
  // background thread is not already on them. Throws std::runtime_error if one failed; the
  // reducer is unusable after that (a peer is gone or timed out).
  void wait_all();

 private:
  template <typename T>
  std::optional<size_t> add_buffer(T* data, size_t count);
  void worker_loop();
  // Pops the next queued id and runs it with the lock released. Requires the lock and !running_.
  void run_next(std::unique_lock<std::mutex>& lock, bool on_waiting_thread);
  // Switches the pairs between spinning and sleeping reads (only the running thread calls it).
  void set_spinning(bool spin);

  std::shared_ptr<gloo::Context> context_;
  size_t max_message_bytes_ = 0;
  int64_t slots_used_ = 0;
  bool busy_poll_ = false;
  bool spinning_ = false;
  std::vector<std::vector<std::unique_ptr<gloo::Algorithm>>> buffers_;  // per id: one all-reduce per message

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  size_t launched_ = 0;
  size_t finished_ = 0;
  bool running_ = false;  // a reduction is executing on some thread
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace ddprun::worker::detail
