#include "gloo_ring.hpp"

#include <gloo/algorithm.h>
#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/buffer.h>
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
      throw std::invalid_argument(
          std::string("DDPRUN_DDP_MAX_MESSAGE_BYTES must be a positive number of bytes, got '") + env + "'");
    }
    limit = std::clamp<int64_t>(v, 64, limit);
  }
  return limit;
}

}  // namespace

GlooRing::GlooRing(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                   std::chrono::milliseconds timeout) {
  auto device = make_gloo_device();  // the context keeps it
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  StoreAdapter adapter(store, prefix);
  context->connectFullMesh(adapter, device);
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) context->getPair(peer)->setSync(true, false);
  }
  context_ = context;

  // Every rank must cut chunks into the same pieces: agree on the smallest limit.
  int64_t limit = local_message_limit();
  gloo::AllreduceRing<int64_t>(context_, {&limit}, 1, gloo::ReductionFunction<int64_t>::min).run();
  max_message_bytes_ = static_cast<size_t>(limit);
  scratch_.resize((max_message_bytes_ + sizeof(double) - 1) / sizeof(double));
}

GlooRing::~GlooRing() = default;

int GlooRing::rank() const { return context_->rank; }

int GlooRing::size() const { return context_->size; }

void GlooRing::set_spinning(bool spin) {
  if (spin == spinning_) return;
  for (int peer = 0; peer < context_->size; ++peer) {
    if (peer != context_->rank) context_->getPair(peer)->setSync(true, spin);
  }
  spinning_ = spin;
}

void GlooRing::allreduce_sum(float* data, size_t count) { run(data, count); }

void GlooRing::allreduce_sum(double* data, size_t count) { run(data, count); }

void GlooRing::allreduce_sum(c10::Half* data, size_t count) { run(data, count); }

void GlooRing::allreduce_sum(c10::BFloat16* data, size_t count) { run(data, count); }

void GlooRing::allreduce_sum(int32_t* data, size_t count) { run(data, count); }

void GlooRing::allreduce_sum(int64_t* data, size_t count) { run(data, count); }

template <typename T>
void GlooRing::run(T* data, size_t count) {
  const int n = context_->size;
  const int r = context_->rank;
  if (n == 1 || count == 0) return;
  constexpr size_t e = sizeof(T);
  const size_t total = count * e;
  const RingChunks chunks = ring_chunks(total, e, n);
  const size_t piece = std::max(e, max_message_bytes_ / e * e);
  auto pieces = [&](int chunk) { return (chunks.end(chunk) - chunks.begin(chunk) + piece - 1) / piece; };
  auto piece_length = [&](int chunk, size_t p) {
    return std::min(piece, chunks.end(chunk) - chunks.begin(chunk) - p * piece);
  };

  // Two slots per call, the same on every rank (calls come in the same order everywhere), clear
  // of the slots the context hands out itself.
  const int base = (1 << 30) + 2 * static_cast<int>(calls_++ % (1u << 28));
  const int scatter_slot = base;
  const int gather_slot = base + 1;
  auto& left = context_->getPair((r + n - 1) % n);
  auto& right = context_->getPair((r + 1) % n);
  auto* scratch = reinterpret_cast<T*>(scratch_.data());
  // Reduce-scatter: partial sums go left, into the neighbour's scratch; ours come from the right.
  auto scatter_send = left->createSendBuffer(scatter_slot, data, total);
  auto scatter_recv = right->createRecvBuffer(scatter_slot, scratch, piece);
  // All-gather: finished chunks go right, straight to their place; ours come from the left.
  auto gather_send = right->createSendBuffer(gather_slot, data, total);
  auto gather_recv = left->createRecvBuffer(gather_slot, data, total);

  // Step j: send chunk r+1+j (our partial sum of it) left, receive chunk r+2+j from the right and
  // add our own value to it. After n-1 steps chunk r holds x[r] + (x[r+1] + ... + x[r-1]).
  for (int j = 0; j + 1 < n; ++j) {
    const int out = (r + 1 + j) % n;
    const int in = (r + 2 + j) % n;
    const size_t steps = std::max(pieces(out), pieces(in));
    for (size_t p = 0; p < steps; ++p) {
      if (p < pieces(out)) {
        scatter_send->send(chunks.begin(out) + p * piece, piece_length(out, p), 0);
        scatter_send->waitSend();
      }
      if (p < pieces(in)) {
        scatter_recv->waitRecv();
        T* mine = data + (chunks.begin(in) + p * piece) / e;
        const size_t len = piece_length(in, p) / e;
        for (size_t i = 0; i < len; ++i) mine[i] = mine[i] + scratch[i];
      }
    }
  }
  // Step j: send chunk r-j right, receive chunk r-1-j from the left (copies: no arithmetic).
  for (int j = 0; j + 1 < n; ++j) {
    const int out = (r - j + n) % n;
    const int in = (r - 1 - j + 2 * n) % n;
    const size_t steps = std::max(pieces(out), pieces(in));
    for (size_t p = 0; p < steps; ++p) {
      if (p < pieces(out)) {
        const size_t offset = chunks.begin(out) + p * piece;
        gather_send->send(offset, piece_length(out, p), offset);
        gather_send->waitSend();
      }
      if (p < pieces(in)) gather_recv->waitRecv();
    }
  }
}

template void GlooRing::run<float>(float*, size_t);
template void GlooRing::run<double>(double*, size_t);
template void GlooRing::run<c10::Half>(c10::Half*, size_t);
template void GlooRing::run<c10::BFloat16>(c10::BFloat16*, size_t);
template void GlooRing::run<int32_t>(int32_t*, size_t);
template void GlooRing::run<int64_t>(int64_t*, size_t);

}  // namespace ddprun::worker::detail
