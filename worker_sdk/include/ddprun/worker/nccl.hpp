#pragma once
// A raw NCCL communicator for CUDA code that does not go through LibTorch's ProcessGroupNCCL (a
// CPU-only LibTorch is enough): one GPU per rank, cuda:LOCAL_RANK. Rank 0 creates the NCCL unique
// id and publishes it in the job's store; every other rank reads it from there, then all call
// ncclCommInitRank. Link ddprun::worker_nccl (built when nccl.h and the CUDA runtime are found).
//
//   auto dist = Distributed::init(InitOptions().backend("gloo"));  // store + a CPU group for the rest
//   auto nccl = NcclCommunicator::create(dist);
//   nccl->all_reduce_sum(device_ptr, count);              // in place, on nccl->stream()
//   nccl->synchronize();
//
// Errors (no GPU, LOCAL_RANK beyond the visible devices, NCCL failures) throw std::runtime_error
// naming the rank, the device and what to check.

#include <cstddef>
#include <memory>
#include <string>

#include "ddprun/worker/distributed.hpp"

struct ncclComm;
struct CUstream_st;

namespace ddprun::worker {

class NcclCommunicator {
 public:
  // Collective over all ranks of `dist`. `key` names the unique id in the store; use a different
  // key for each communicator a job creates.
  static std::unique_ptr<NcclCommunicator> create(const Distributed& dist, const std::string& key = "ddprun/nccl/0");
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int device() const { return device_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The stream collectives are enqueued on (created with the communicator).
  CUstream_st* stream() const { return stream_; }

  // In-place sum over all ranks of `count` elements on this rank's device, enqueued on stream().
  void all_reduce_sum(float* device_data, size_t count);
  void all_reduce_sum(double* device_data, size_t count);
  // Waits for everything enqueued on stream().
  void synchronize();

 private:
  NcclCommunicator() = default;
  void all_reduce(void* data, size_t count, int nccl_type);

  ncclComm* comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  int device_ = 0;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace ddprun::worker
