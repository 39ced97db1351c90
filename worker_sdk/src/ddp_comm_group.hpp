#pragma once
// The process group a DistributedDataParallel reduces its gradients on when the direct Gloo path is
// on: the job's process group for every collective, except the sum all-reduce of one contiguous
// CPU float or double tensor (a gradient bucket), which runs on a GlooRing (gloo_ring.hpp) with
// ProcessGroupGloo's summation order, so that results stay Python DDP's to the bit, of one half
// or bfloat16 tensor (the compression hooks' buckets, in the same order), and of one int or long
// tensor (find_unused_parameters' map of used parameters: exact in any order).
//
// c10d::Reducer launches its buckets through allreduce() from the autograd hooks while backward
// still runs. The all-reduces run in launch order on one background thread, which sleeps in recv
// while it waits for peers; the returned Work's future completes when its bucket is summed.
// drain() runs the ones still queued on the calling thread (the end of backward, where that thread
// would only wait anyway) and waits for the rest; with busy_poll that thread spins on the sockets
// meanwhile, as NCCL and MPI wait.
//
// Costs one extra set of Gloo connections per DDP object. Thread-safety: allreduce() and drain()
// may be called from any thread; the background thread lives as long as the object.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "ddprun/worker/distributed.hpp"
#include "gloo_ring.hpp"

namespace ddprun::worker::detail {

class DdpCommGroup final : public CommGroup {
 public:
  // Collective (the ring connects through the store under `prefix`).
  DdpCommGroup(c10::intrusive_ptr<CommGroup> inner, const c10::intrusive_ptr<c10d::Store>& store,
               const std::string& prefix, std::chrono::milliseconds timeout, bool busy_poll);
  ~DdpCommGroup() override;

  const std::string getBackendName() const override { return inner_->getBackendName(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;

  // Runs the queued all-reduces on this thread and returns when every launched one has finished.
  // Errors are left in the futures of the buckets they concern.
  void drain();

  // The job's process group: every other collective.
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override {
    return inner_->broadcast(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override {
    return inner_->allreduce_coalesced(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override {
    return inner_->reduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return inner_->allgather(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return inner_->_allgather_base(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override {
    return inner_->allgather_coalesced(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override {
    return inner_->gather(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override {
    return inner_->scatter(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return inner_->reduce_scatter(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override {
    return inner_->_reduce_scatter_base(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override {
    return inner_->alltoall_base(output, input, output_splits, input_splits, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override {
    return inner_->alltoall(outputs, inputs, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return inner_->send(tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return inner_->recv(tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return inner_->recvAnysource(tensors, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override {
    return inner_->barrier(opts);
  }

 private:
  struct Job {
    at::Tensor tensor;
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  void worker_loop();
  // Pops the next queued job and runs it with the lock released. Requires the lock and !running_.
  void run_next(std::unique_lock<std::mutex>& lock, bool on_waiting_thread);

  c10::intrusive_ptr<CommGroup> inner_;
  std::unique_ptr<GlooRing> ring_;
  bool busy_poll_ = false;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  size_t launched_ = 0;
  size_t finished_ = 0;
  bool running_ = false;  // a job is executing on some thread
  bool stop_ = false;
  std::exception_ptr error_;  // the first failure: every later job fails with it
  std::thread worker_;
};

}  // namespace ddprun::worker::detail
