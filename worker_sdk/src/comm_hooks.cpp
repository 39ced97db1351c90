// The built-in communication hooks of torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py,
// step for step (the same operations in the same order give the same bits).
#include "ddprun/worker/comm_hooks.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/jit_type.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#ifdef DDPRUN_WORKER_DIRECT_GLOO
#include "ddp_comm_group.hpp"
#endif

namespace ddprun::worker::comm_hooks {
namespace {

// The tensor a collective's future holds (ProcessGroup work futures hold the list of its tensors).
at::Tensor first_tensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTensorList()) {
    auto list = value.toTensorVector();
    if (!list.empty()) return list[0];
  }
  throw std::runtime_error("communication hook: the all-reduce's future holds no tensor");
}

// Whether `group` can sum a bfloat16 tensor like `t`: ProcessGroupGloo of PyTorch 1.x cannot (it
// fails inside the work, on its own thread, with "Invalid scalar type"); the direct ring can.
bool sums_bfloat16(const ProcessGroupPtr& group, const at::Tensor& t) {
#if TORCH_VERSION_MAJOR >= 2
  (void)group;
  (void)t;
  return true;
#else
  if (!t.device().is_cpu() || group->getBackendName() != "gloo") return true;
#ifdef DDPRUN_WORKER_DIRECT_GLOO
  return dynamic_cast<detail::DdpCommGroup*>(group.get()) != nullptr;
#else
  return false;
#endif
#endif
}

TensorFuture launch_allreduce(const ProcessGroupPtr& group, at::Tensor tensor) {
  std::vector<at::Tensor> tensors{std::move(tensor)};
  return group->allreduce(tensors)->getFuture();
}

// _compress_hook: cast, divide, sum, and copy back into the bucket's buffer.
TensorFuture compress_hook(at::ScalarType type, const ProcessGroupPtr& group, c10d::GradBucket& bucket,
                           const char* hook) {
  at::Tensor buffer = bucket.getBufferRef();
  if (type == at::kBFloat16 && !sums_bfloat16(group, buffer)) {
    throw std::runtime_error(std::string(hook) +
                             ": ProcessGroupGloo of PyTorch 1.x has no bfloat16 sum: use fp16_compress_hook, or "
                             "keep DdpOptions::direct_gloo on (its ring sums bfloat16)");
  }
  at::Tensor compressed = buffer.to(type).div_(group->getSize());
  auto future = launch_allreduce(group, std::move(compressed));
  return future->then(
      [buffer](c10::ivalue::Future& done) {
        buffer.copy_(first_tensor(done.value()));  // in place, as Python decompresses
        return c10::IValue(buffer);
      },
      c10::TensorType::get());
}

}  // namespace

TensorFuture allreduce_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket) {
  at::Tensor buffer = bucket.getBufferRef();
  buffer.div_(group->getSize());
  auto future = launch_allreduce(group, buffer);
  return future->then([](c10::ivalue::Future& done) { return c10::IValue(first_tensor(done.value())); },
                      c10::TensorType::get());
}

TensorFuture fp16_compress_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket) {
  return compress_hook(at::kHalf, group, bucket, "fp16_compress_hook");
}

TensorFuture bf16_compress_hook(const ProcessGroupPtr& group, c10d::GradBucket& bucket) {
  return compress_hook(at::kBFloat16, group, bucket, "bf16_compress_hook");
}

// --- PowerSGD -----------------------------------------------------------------------------------

namespace {

TensorFuture completed(const at::Tensor& t) {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  future->markCompleted(c10::IValue(t));
  return future;
}

// A blocking all-reduce (sum) of `t` in place. PowerSGD's three collectives per bucket run one
// after another from the calling thread: the order of collectives is then the bucket order on
// every rank, whichever rank's Gloo finishes first (a callback issuing the next collective would
// race the next bucket's hook for the group's sequence of collectives).
void allreduce_now(const ProcessGroupPtr& group, at::Tensor& t) {
  std::vector<at::Tensor> tensors{t};
  auto work = group->allreduce(tensors);
  work->wait();
  at::Tensor result = first_tensor(work->getFuture()->value());
  if (!result.is_same(t)) t.copy_(result);
}

// torch.norm(col, dim=1, keepdim=True): frobenius_norm in PyTorch 1.x, linalg.vector_norm in 2.x.
at::Tensor column_norm(const at::Tensor& col) {
#if TORCH_VERSION_MAJOR >= 2
  return at::linalg_vector_norm(col, 2, at::IntArrayRef{1}, /*keepdim=*/true);
#else
  return at::frobenius_norm(col, {1}, /*keepdim=*/true);
#endif
}

// _orthogonalize_gram_schmidt over a batch of matrices [batch, n, rank], in place.
void orthogonalize_gram_schmidt(at::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    at::Tensor col = matrices.narrow(2, i, 1);
    if (epsilon == 0) {
      col.div_(column_norm(col));  // a zero column gives NaNs, as in Python
    } else {
      col.div_(column_norm(col) + epsilon);
    }
    if (i + 1 < cols) {
      at::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(at::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// _orthogonalize: Gram-Schmidt up to rank 2 and in 16-bit types, QR (into the matrices) above.
void orthogonalize(at::Tensor& matrices, double epsilon) {
  TORCH_CHECK(matrices.dim() == 3 && matrices.size(2) <= matrices.size(1),
              "PowerSGD: orthogonalize expects [batch, n, rank] with rank <= n");
  const int64_t rank = matrices.size(2);
  const auto type = matrices.scalar_type();
  if (rank <= 2 || type == at::kHalf || type == at::kBFloat16) {
    orthogonalize_gram_schmidt(matrices, epsilon);
  } else {
    at::Tensor r = at::empty({matrices.size(0), rank, rank}, matrices.options());
    at::linalg_qr_out(matrices, r, matrices);
  }
}

// torch.random.fork_rng(devices=[]) around torch.manual_seed(seed): the CPU generator's state
// is put back when the scope ends.
class ForkedCpuRng {
 public:
  explicit ForkedCpuRng(uint64_t seed) : generator_(at::detail::getDefaultCPUGenerator()) {
    {
      std::lock_guard<std::mutex> lock(generator_.mutex());
      saved_ = generator_.get_state();
    }
    at::manual_seed(seed);
  }
  ~ForkedCpuRng() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_);
  }
  ForkedCpuRng(const ForkedCpuRng&) = delete;
  ForkedCpuRng& operator=(const ForkedCpuRng&) = delete;

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

// The error-feedback step at the start of a compressed bucket: the last step's error added in,
// and a copy of the result kept to measure this step's error against.
at::Tensor apply_error_feedback(PowerSGDState& state, size_t bucket_index, at::Tensor& input) {
  if (!state.use_error_feedback) return {};
  auto it = state.error_dict.find(bucket_index);
  if (it != state.error_dict.end()) {
    input.add_(it->second);
  } else {
    state.error_dict[bucket_index] = at::zeros({input.size(0)}, input.options());
  }
  return input.clone().detach();
}

// Python's default._allreduce_fut before start_powerSGD_iter; null from then on.
TensorFuture vanilla_before_start(PowerSGDState& state, c10d::GradBucket& bucket) {
  if (state.iter >= state.start_powerSGD_iter) return {};
  state.maybe_increase_iter(bucket);
  return allreduce_hook(state.process_group, bucket);
}

void finish_compressed_bucket(PowerSGDState& state, const c10d::GradBucket& bucket, const at::Tensor& input_copy,
                              const at::Tensor& input) {
  if (state.use_error_feedback) state.error_dict[bucket.getIndex()] = input_copy - input;
  if (!state.warm_start) {
    state.p_memory_dict.clear();
    state.q_memory_dict.clear();
  }
}

}  // namespace

PowerSGDState::PowerSGDState(ProcessGroupPtr group, const PowerSGDOptions& options)
    : process_group(std::move(group)),
      matrix_approximation_rank(options.matrix_approximation_rank()),
      start_powerSGD_iter(options.start_powerSGD_iter()),
      min_compression_rate(options.min_compression_rate()),
      use_error_feedback(options.use_error_feedback()),
      warm_start(options.warm_start()),
      orthogonalization_epsilon(options.orthogonalization_epsilon()),
      batch_tensors_with_same_shape(options.batch_tensors_with_same_shape()),
      rng(options.random_seed()) {
  if (!process_group) throw std::invalid_argument("PowerSGDState: process_group is null");
  if (matrix_approximation_rank < 1) {
    throw std::invalid_argument("PowerSGDState: matrix_approximation_rank must be at least 1, got " +
                                std::to_string(matrix_approximation_rank));
  }
  if ((use_error_feedback || warm_start) && start_powerSGD_iter <= 1) {
    throw std::invalid_argument(
        "PowerSGDState: expect start_powerSGD_iter > 1 if use_error_feedback or warm_start is enabled, because "
        "PowerSGD can only be applied after the first two iterations in DDP (got " +
        std::to_string(start_powerSGD_iter) + ")");
  }
}

PowerSGDState::CompressionStats PowerSGDState::compression_stats() const {
  const double rate = total_numel_after_compression > 0 ? static_cast<double>(total_numel_before_compression) /
                                                              static_cast<double>(total_numel_after_compression)
                                                        : 0.0;
  return {rate, total_numel_before_compression, total_numel_after_compression};
}

uint32_t PowerSGDState::randint(uint32_t high) {
  if (high == 0) throw std::invalid_argument("PowerSGDState::randint: high must be positive");
  const uint32_t range = high - 1;
  uint32_t mask = range;
  for (int shift = 1; shift < 32; shift <<= 1) mask |= mask >> shift;
  uint32_t value;
  do {
    value = static_cast<uint32_t>(rng()) & mask;
  } while (value > range);
  return value;
}

void PowerSGDState::maybe_increase_iter(const c10d::GradBucket& bucket) {
  if (bucket.isLast()) ++iter;
}

TensorFuture powerSGD_hook(const PowerSGDStatePtr& state_ptr, c10d::GradBucket& bucket) {
  PowerSGDState& state = *state_ptr;
  if (auto vanilla = vanilla_before_start(state, bucket)) return vanilla;
  const ProcessGroupPtr& group = state.process_group;
  const int world_size = group->getSize();
  at::Tensor input = bucket.getBufferRef();
  const size_t bucket_index = bucket.getIndex();
  const at::Tensor input_copy = apply_error_feedback(state, bucket_index, input);

  // The gradients (views of the buffer) as matrices: those worth compressing, and the rest.
  std::vector<at::Tensor> to_compress, uncompressed;
  int64_t total_ps = 0, total_qs = 0;
  for (const at::Tensor& tensor : bucket.getGradients()) {
    // A 0-dim gradient (a scalar parameter) is a 1 x 1 matrix, never compressed.
    const at::Tensor matrix = tensor.dim() == 0 ? tensor.view({1, 1}) : tensor.view({tensor.size(0), -1});
    const int64_t n = matrix.size(0), m = matrix.size(1);
    const int64_t rank = std::min({n, m, state.matrix_approximation_rank});
    const int64_t compressed = (n + m) * rank;
    state.total_numel_before_compression += n * m;
    if (static_cast<double>(compressed) * state.min_compression_rate < static_cast<double>(n * m)) {
      to_compress.push_back(matrix);
      total_ps += n * rank;
      total_qs += m * rank;
      state.total_numel_after_compression += compressed;
    } else {
      uncompressed.push_back(tensor);
      state.total_numel_after_compression += n * m;
    }
  }
  std::vector<at::Tensor> flat;
  flat.reserve(uncompressed.size());
  for (const at::Tensor& t : uncompressed) flat.push_back(t.view(-1));
  at::Tensor uncompressed_memory = flat.empty() ? at::empty({0}, input.options()) : at::cat(flat);

  bool randomize_qs = false;
  if (!state.warm_start || state.p_memory_dict.count(bucket_index) == 0) {
    randomize_qs = true;
    state.p_memory_dict[bucket_index] = at::empty({total_ps}, input.options());
    state.q_memory_dict[bucket_index] = at::empty({total_qs}, input.options());
  }
  // Python groups the matrices by shape (in the order each shape first appears) and then takes
  // them one by one, or stacked per shape with batch_tensors_with_same_shape.
  std::vector<std::pair<std::vector<int64_t>, std::vector<at::Tensor>>> by_shape;
  for (const at::Tensor& matrix : to_compress) {
    const std::vector<int64_t> shape = matrix.sizes().vec();
    auto it = std::find_if(by_shape.begin(), by_shape.end(), [&](const auto& e) { return e.first == shape; });
    if (it == by_shape.end()) {
      by_shape.push_back({shape, {}});
      it = std::prev(by_shape.end());
    }
    it->second.push_back(matrix);
  }
  std::vector<at::Tensor> batches, ps, qs;
  for (const auto& [shape, matrices] : by_shape) {
    if (state.batch_tensors_with_same_shape && matrices.size() > 1) {
      batches.push_back(at::stack(matrices));
    } else {
      for (const at::Tensor& matrix : matrices) batches.push_back(matrix.unsqueeze(0));
    }
  }
  at::Tensor& p_memory = state.p_memory_dict[bucket_index];
  at::Tensor& q_memory = state.q_memory_dict[bucket_index];
  int64_t p_index = 0, q_index = 0;
  for (const at::Tensor& batch : batches) {
    const int64_t b = batch.size(0), n = batch.size(1), m = batch.size(2);
    const int64_t rank = std::min({n, m, state.matrix_approximation_rank});
    ps.push_back(p_memory.narrow(0, p_index, b * n * rank).view({b, n, rank}));
    qs.push_back(q_memory.narrow(0, q_index, b * m * rank).view({b, m, rank}));
    p_index += b * n * rank;
    q_index += b * m * rank;
  }
  if (!randomize_qs) {
    for (at::Tensor& q : qs) orthogonalize(q, state.orthogonalization_epsilon);
  } else {
    ForkedCpuRng fork(state.randint(1000000000));
    for (at::Tensor& q : qs) {
      q.copy_(at::randn(q.sizes(), at::TensorOptions().dtype(q.scalar_type())));
      orthogonalize(q, state.orthogonalization_epsilon);
    }
  }
  for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(ps[i], batches[i], qs[i]);

  allreduce_now(group, uncompressed_memory);
  uncompressed_memory.div_(world_size);
  int64_t offset = 0;
  for (at::Tensor& tensor : uncompressed) {
    tensor.copy_(uncompressed_memory.narrow(0, offset, tensor.numel()).view_as(tensor));
    offset += tensor.numel();
  }
  allreduce_now(group, p_memory);
  for (at::Tensor& p : ps) orthogonalize(p, state.orthogonalization_epsilon);
  for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(qs[i], batches[i].transpose(1, 2), ps[i]);
  allreduce_now(group, q_memory);
  q_memory.div_(world_size);
  for (size_t i = 0; i < batches.size(); ++i) at::bmm_out(batches[i], ps[i], qs[i].transpose(1, 2));
  if (state.batch_tensors_with_same_shape) {
    size_t next = 0;
    for (const auto& [shape, matrices] : by_shape) {
      if (matrices.size() > 1) {
        for (size_t i = 0; i < matrices.size(); ++i) matrices[i].copy_(batches[next][static_cast<int64_t>(i)]);
        ++next;
      } else {
        next += matrices.size();
      }
    }
  }
  finish_compressed_bucket(state, bucket, input_copy, input);
  state.maybe_increase_iter(bucket);
  return completed(input);
}

TensorFuture batched_powerSGD_hook(const PowerSGDStatePtr& state_ptr, c10d::GradBucket& bucket) {
  PowerSGDState& state = *state_ptr;
  if (auto vanilla = vanilla_before_start(state, bucket)) return vanilla;
  const ProcessGroupPtr& group = state.process_group;
  const int world_size = group->getSize();
  at::Tensor input = bucket.getBufferRef();
  const int64_t total_length = input.size(0);
  const auto side = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(total_length))));
  const int64_t rank = state.matrix_approximation_rank;
  TORCH_CHECK(rank <= side, "batched_powerSGD_hook: matrix_approximation_rank ", rank,
              " exceeds the side of the bucket's square matrix (", side, ")");
  state.total_numel_before_compression += total_length;
  state.total_numel_after_compression += side * rank * 2;
  const int64_t padded_length = side * side;
  input.resize_({padded_length});
  input.narrow(0, total_length, padded_length - total_length).fill_(0);
  const size_t bucket_index = bucket.getIndex();
  const at::Tensor input_copy = apply_error_feedback(state, bucket_index, input);
  at::Tensor matrix = input.view({side, side});
  if (!state.warm_start || state.p_memory_dict.count(bucket_index) == 0) {
    state.p_memory_dict[bucket_index] = at::empty({side, rank}, input.options());
    ForkedCpuRng fork(state.randint(1000000000));
    state.q_memory_dict[bucket_index] =
        at::randn({side, rank}, at::TensorOptions().dtype(input.scalar_type())).to(input.device());
  }
  at::Tensor& p = state.p_memory_dict[bucket_index];
  at::Tensor& q = state.q_memory_dict[bucket_index];
  // Python hands these 2-D matrices to _orthogonalize, which asserts a batch of them (PyTorch
  // 1.13 to 2.6 stop there): here they are a batch of one.
  at::Tensor q_batch = q.unsqueeze(0);
  orthogonalize(q_batch, state.orthogonalization_epsilon);
  at::matmul_out(p, matrix, q);
  allreduce_now(group, p);
  at::Tensor p_batch = p.unsqueeze(0);
  orthogonalize(p_batch, state.orthogonalization_epsilon);
  at::matmul_out(q, matrix.t(), p);
  allreduce_now(group, q);
  q.div_(world_size);
  at::matmul_out(matrix, p, q.t());
  finish_compressed_bucket(state, bucket, input_copy, input);
  at::Tensor result = input.resize_({total_length});
  state.maybe_increase_iter(bucket);
  return completed(result);
}

PostLocalSGDState::PostLocalSGDState(ProcessGroupPtr group, ProcessGroupPtr sub, int64_t start_iter,
                                     bool post_local_allreduce)
    : process_group(std::move(group)),
      subgroup(std::move(sub)),
      start_localSGD_iter(start_iter),
      post_local_gradient_allreduce(post_local_allreduce) {
  if (!process_group) throw std::invalid_argument("PostLocalSGDState: process_group is null");
  if (!subgroup) {
    throw std::invalid_argument(
        "PostLocalSGDState: subgroup is null: make one with Distributed::new_subgroups() (one per node by default)");
  }
}

void PostLocalSGDState::maybe_increase_iter(const c10d::GradBucket& bucket) {
  if (bucket.isLast()) ++iter;
}

TensorFuture post_localSGD_hook(const PostLocalSGDStatePtr& state_ptr, c10d::GradBucket& bucket) {
  PostLocalSGDState& state = *state_ptr;
  if (state.iter < state.start_localSGD_iter) {
    state.maybe_increase_iter(bucket);
    return allreduce_hook(state.process_group, bucket);
  }
  // Python stops counting here: the iteration count stays at start_localSGD_iter.
  if (!state.post_local_gradient_allreduce) return completed(bucket.getBufferRef());
  return allreduce_hook(state.subgroup, bucket);
}

GroupHook function_of(Builtin hook) {
  switch (hook) {
    case Builtin::allreduce: return &allreduce_hook;
    case Builtin::fp16_compress: return &fp16_compress_hook;
    case Builtin::bf16_compress: return &bf16_compress_hook;
  }
  throw std::invalid_argument("unknown built-in communication hook");
}

std::string name_of(Builtin hook) {
  switch (hook) {
    case Builtin::allreduce: return "allreduce_hook";
    case Builtin::fp16_compress: return "fp16_compress_hook";
    case Builtin::bf16_compress: return "bf16_compress_hook";
  }
  throw std::invalid_argument("unknown built-in communication hook");
}

Builtin parse_builtin(const std::string& text) {
  if (text == "allreduce") return Builtin::allreduce;
  if (text == "fp16") return Builtin::fp16_compress;
  if (text == "bf16") return Builtin::bf16_compress;
  throw std::invalid_argument("unknown communication hook '" + text + "': the choices are allreduce, fp16 and bf16");
}

}  // namespace ddprun::worker::comm_hooks
