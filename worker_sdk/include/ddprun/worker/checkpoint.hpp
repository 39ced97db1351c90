#pragma once
// Checkpoints for data-parallel training: rank 0 writes while the others wait at a barrier, as a
// durable replace (a uniquely named temporary file, fsynced and closed, renamed over the target,
// then the directory fsynced: a crash leaves the old checkpoint or the new one, never a partial
// one, and two jobs saving to one path do not collide); everyone loads onto its own device, the
// optimizer state included (tensors are saved from the CPU, so nothing lands on GPU 0 by accident). The file is torch.save's zip format
// (torch::pickle_save of a dict), so Python's torch.load reads it too:
//   {"model": {name: tensor}, "epoch": int, "optimizer": uint8 tensor (LibTorch's archive), "world_size": int}
// State-dict names are stored without DDP's "module." prefix and accepted with or without it.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ddprun/worker/distributed.hpp"

namespace ddprun::worker {

// Saves model (+ optimizer) and epoch; rank 0 writes, every rank returns after the file exists.
// Throws std::runtime_error naming the file and the system's reason (a full disk, say); the
// previous checkpoint is then left as it was.
void save_checkpoint(const std::string& path, const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                     int64_t epoch, Distributed& dist);

// Loads into model (+ optimizer) if `path` exists; returns the saved epoch, or nullopt when there
// is no file. Throws std::runtime_error naming the first missing or mis-shaped tensor.
std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                       torch::optim::Optimizer* optimizer);

}  // namespace ddprun::worker
