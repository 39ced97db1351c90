#include "ddprun/worker/nccl.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace ddprun::worker {
namespace {

std::string where(int rank, int device) {
  return "rank " + std::to_string(rank) + " (cuda:" + std::to_string(device) + ")";
}

void check_cuda(cudaError_t status, const char* call, int rank, int device) {
  if (status != cudaSuccess) {
    throw std::runtime_error(where(rank, device) + ": " + call + " failed: " + cudaGetErrorString(status));
  }
}

void check_nccl(ncclResult_t status, const char* call, int rank, int device) {
  if (status != ncclSuccess) {
    throw std::runtime_error(where(rank, device) + ": " + call + " failed: " + ncclGetErrorString(status) +
                             " (NCCL_DEBUG=INFO shows why)");
  }
}

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::create(const Distributed& dist, const std::string& key) {
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator());
  c->rank_ = dist.rank();
  c->size_ = dist.world_size();
  c->device_ = dist.local_rank();

  int devices = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&devices); status != cudaSuccess || devices == 0) {
    throw std::runtime_error(
        where(c->rank_, c->device_) + ": no usable CUDA device (" +
        (status != cudaSuccess ? std::string(cudaGetErrorString(status)) : std::string("0 devices")) +
        "): NCCL needs one GPU per rank; run on a GPU node, or use the gloo backend on CPUs");
  }
  if (c->device_ >= devices) {
    throw std::runtime_error(where(c->rank_, c->device_) + ": LOCAL_RANK " + std::to_string(c->device_) + " but only " +
                             std::to_string(devices) +
                             " CUDA device(s) are visible: start at most that many processes per node "
                             "(--nproc_per_node gpu) or check CUDA_VISIBLE_DEVICES");
  }
  check_cuda(cudaSetDevice(c->device_), "cudaSetDevice", c->rank_, c->device_);

  ncclUniqueId id;
  auto& store = *dist.store();
  if (c->rank_ == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", c->rank_, c->device_);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof id));
  } else {
    const auto value = store.get(key);  // waits for rank 0, up to the store timeout
    if (value.size() != sizeof id) {
      throw std::runtime_error(where(c->rank_, c->device_) + ": store key '" + key + "' holds " +
                               std::to_string(value.size()) + " bytes, not an NCCL unique id (" +
                               std::to_string(sizeof id) + " bytes): is another program using that key?");
    }
    std::memcpy(&id, value.data(), sizeof id);
  }
  check_cuda(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking), "cudaStreamCreate", c->rank_, c->device_);
  check_nccl(ncclCommInitRank(&c->comm_, c->size_, id, c->rank_), "ncclCommInitRank", c->rank_, c->device_);
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclCommunicator::all_reduce(void* data, size_t count, int nccl_type) {
  check_nccl(ncclAllReduce(data, data, count, static_cast<ncclDataType_t>(nccl_type), ncclSum, comm_, stream_),
             "ncclAllReduce", rank_, device_);
}

void NcclCommunicator::all_reduce_sum(float* device_data, size_t count) { all_reduce(device_data, count, ncclFloat32); }

void NcclCommunicator::all_reduce_sum(double* device_data, size_t count) {
  all_reduce(device_data, count, ncclFloat64);
}

void NcclCommunicator::synchronize() {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", rank_, device_);
}

}  // namespace ddprun::worker
