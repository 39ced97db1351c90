#include "ddp_comm_group.hpp"

#include <ATen/core/ivalue.h>

#include <stdexcept>
#include <string>

#include "ddprun/worker/progress.hpp"

namespace ddprun::worker::detail {
namespace {

// A bucket's all-reduce, done when its future is.
class RingWork final : public c10d::Work {
 public:
  explicit RingWork(c10::intrusive_ptr<c10::ivalue::Future> future) : future_(std::move(future)) {}
  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->completed() && !future_->hasError(); }
  std::exception_ptr exception() const override { return future_->hasError() ? future_->exception_ptr() : nullptr; }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    future_->wait();
    future_->value();  // rethrows the all-reduce's error
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

bool ring_can_take(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1 || opts.reduceOp != c10d::ReduceOp::SUM) return false;
  const at::Tensor& t = tensors[0];
  const auto type = t.scalar_type();
  return t.device().is_cpu() && t.layout() == c10::kStrided && t.is_contiguous() && t.numel() > 0 &&
         (type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16 || type == at::kInt ||
          type == at::kLong);
}

}  // namespace

DdpCommGroup::DdpCommGroup(c10::intrusive_ptr<CommGroup> inner, const c10::intrusive_ptr<c10d::Store>& store,
                           const std::string& prefix, std::chrono::milliseconds timeout, bool busy_poll)
    : CommGroup(inner->getRank(), inner->getSize()), inner_(std::move(inner)), busy_poll_(busy_poll) {
  ring_ = std::make_unique<GlooRing>(store, prefix, getRank(), getSize(), timeout);
  worker_ = std::thread([this] { worker_loop(); });
}

DdpCommGroup::~DdpCommGroup() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

c10::intrusive_ptr<c10d::Work> DdpCommGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  if (!ring_can_take(tensors, opts)) return inner_->allreduce(tensors, opts);
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({tensors[0], future});
    ++launched_;
  }
  cv_.notify_all();
  return c10::make_intrusive<RingWork>(future);
}

void DdpCommGroup::run_next(std::unique_lock<std::mutex>& lock, bool on_waiting_thread) {
  Job job = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  std::exception_ptr error = error_;
  lock.unlock();
  if (!error) {
    try {
      ring_->set_spinning(on_waiting_thread && busy_poll_);
      at::Tensor& t = job.tensor;
      const auto count = static_cast<size_t>(t.numel());
      switch (t.scalar_type()) {
        case at::kFloat: ring_->allreduce_sum(t.data_ptr<float>(), count); break;
        case at::kDouble: ring_->allreduce_sum(t.data_ptr<double>(), count); break;
        case at::kHalf: ring_->allreduce_sum(t.data_ptr<c10::Half>(), count); break;
        case at::kBFloat16: ring_->allreduce_sum(t.data_ptr<c10::BFloat16>(), count); break;
        case at::kInt: ring_->allreduce_sum(t.data_ptr<int32_t>(), count); break;
        case at::kLong: ring_->allreduce_sum(t.data_ptr<int64_t>(), count); break;
        default: throw std::logic_error("the ring takes float, double, half, bfloat16, int and long tensors only");
      }
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(
          "gradient all-reduce (Gloo) failed; a peer rank has probably exited or stalled: " + std::string(e.what())));
    }
  }
  // Completing the future may run callbacks: outside the lock.
  if (error) {
    job.future->setError(error);
  } else {
    job.future->markCompleted(c10::IValue(std::vector<at::Tensor>{job.tensor}));
  }
  lock.lock();
  running_ = false;
  ++finished_;
  if (error && !error_) error_ = error;
  cv_.notify_all();
}

void DdpCommGroup::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!running_ && !queue_.empty()); });
    if (stop_) return;
    run_next(lock, false);
  }
}

void DdpCommGroup::drain() {
  std::unique_lock lock(mutex_);
  if (finished_ == launched_) return;
  CollectiveWait waiting;  // blocked on the other ranks from here on, spinning or not
  while (finished_ < launched_) {
    if (!running_ && !queue_.empty()) {
      run_next(lock, true);
    } else {
      cv_.wait(lock);
    }
  }
}

}  // namespace ddprun::worker::detail
