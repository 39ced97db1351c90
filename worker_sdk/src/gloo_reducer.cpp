#include "gloo_reducer.hpp"

#include <gloo/algorithm.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include "gloo_device.hpp"

namespace ddprun::worker::detail {
namespace {

// Gloo's rendezvous store interface over a c10d store, under a key prefix.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(c10::intrusive_ptr<c10d::Store> store, std::string prefix)
      : store_(std::move(store)), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->get(prefix_ + key);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(prefixed(keys)); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    store_->wait(prefixed(keys), timeout);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

// Largest message a blocking send may carry: half of net.core.wmem_max (the kernel grants a send
// buffer of twice the requested size, capped there), within sane bounds. DDPRUN_DDP_MAX_MESSAGE_BYTES
// may lower it (never raise it).
int64_t local_message_limit() {
  int64_t wmem_max = 212992;  // the kernel's default
  std::ifstream in("/proc/sys/net/core/wmem_max");
  if (int64_t v = 0; in >> v && v > 0) wmem_max = v;
  int64_t limit = std::clamp<int64_t>(wmem_max / 2, 16 << 10, 16 << 20);
  if (const char* env = std::getenv("DDPRUN_DDP_MAX_MESSAGE_BYTES"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v <= 0) {
      throw std::invalid_argument(std::string("DDPRUN_DDP_MAX_MESSAGE_BYTES must be a positive number of bytes, got '") +
                                  env + "'");
    }
    limit = std::clamp<int64_t>(v, 64, limit);
  }
  return limit;
}

}  // namespace

GlooBucketReducer::GlooBucketReducer(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix,
                                     int rank, int size, std::chrono::milliseconds timeout, bool busy_poll) {
  auto device = make_gloo_device();  // the context keeps it
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  StoreAdapter adapter(store, prefix);
  context->connectFullMesh(adapter, device);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) context->getPair(peer)->setSync(true, false);
  }
  context_ = context;
  busy_poll_ = busy_poll;

  // Every rank must split buffers the same way: agree on the smallest limit.
  int64_t limit = local_message_limit();
  gloo::AllreduceRing<int64_t>(context_, {&limit}, 1, gloo::ReductionFunction<int64_t>::min).run();
  max_message_bytes_ = static_cast<size_t>(limit);

  worker_ = std::thread([this] { worker_loop(); });
}

GlooBucketReducer::~GlooBucketReducer() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

template <typename T>
std::optional<size_t> GlooBucketReducer::add_buffer(T* data, size_t count) {
  const size_t per_message = std::max<size_t>(1, max_message_bytes_ / sizeof(T));
  const auto messages = static_cast<int64_t>((count + per_message - 1) / per_message);
  const int64_t n = context_->size;
  const int64_t slots = messages * 2 * n * (n - 1);  // what each halving-doubling instance reserves
  if (slots_used_ + slots > (int64_t{1} << 30)) return std::nullopt;
  slots_used_ += slots;
  std::vector<std::unique_ptr<gloo::Algorithm>> reductions;
  for (size_t offset = 0; offset < count; offset += per_message) {
    const int len = static_cast<int>(std::min(per_message, count - offset));
    reductions.push_back(
        std::make_unique<gloo::AllreduceHalvingDoubling<T>>(context_, std::vector<T*>{data + offset}, len));
  }
  buffers_.push_back(std::move(reductions));
  return buffers_.size() - 1;
}

std::optional<size_t> GlooBucketReducer::add(float* data, size_t count) { return add_buffer(data, count); }

std::optional<size_t> GlooBucketReducer::add(double* data, size_t count) { return add_buffer(data, count); }

void GlooBucketReducer::launch(size_t id, bool wake_worker) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(id);
    ++launched_;
  }
  if (wake_worker) cv_.notify_all();
}

void GlooBucketReducer::set_spinning(bool spin) {
  if (spin == spinning_) return;
  for (int peer = 0; peer < context_->size; ++peer) {
    if (peer != context_->rank) context_->getPair(peer)->setSync(true, spin);
  }
  spinning_ = spin;
}

void GlooBucketReducer::run_next(std::unique_lock<std::mutex>& lock, bool on_waiting_thread) {
  const size_t id = queue_.front();
  queue_.pop_front();
  running_ = true;
  const bool failed = error_ != nullptr;
  lock.unlock();
  std::exception_ptr error;
  if (!failed) {
    try {
      set_spinning(on_waiting_thread && busy_poll_);
      for (auto& reduction : buffers_[id]) reduction->run();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(std::runtime_error(
          "gradient all-reduce (Gloo) failed; a peer rank has probably exited or stalled: " + std::string(e.what())));
    }
  }
  lock.lock();
  running_ = false;
  ++finished_;
  if (error && !error_) error_ = error;
  cv_.notify_all();
}

void GlooBucketReducer::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (!running_ && !queue_.empty()); });
    if (stop_) return;
    run_next(lock, false);
  }
}

void GlooBucketReducer::wait_all() {
  std::unique_lock lock(mutex_);
  while (finished_ < launched_) {
    if (!running_ && !queue_.empty()) {
      run_next(lock, true);
    } else {
      cv_.wait(lock);
    }
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace ddprun::worker::detail
