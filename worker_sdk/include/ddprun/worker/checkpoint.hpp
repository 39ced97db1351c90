#pragma once
// Checkpoints for data-parallel training: rank 0 writes while the others wait at a barrier, as a
// durable replace (a uniquely named temporary file, fsynced and closed, renamed over the target,
// then the directory fsynced: a crash leaves the old checkpoint or the new one, never a partial
// one, and two jobs saving to one path do not collide); everyone loads onto its own device, the
// optimizer state included. The file is a torch.save file that Python's torch.load reads (with
// weights_only=True as well) and whose parts Python's load_state_dict takes as they are:
//   {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": int, "world_size": int}
// (serialize.hpp has the layouts). load_checkpoint reads that, what Python saves in the layouts
// people use, {"model" | "model_state_dict" | "state_dict": ..., "optimizer" | "optimizer_state_dict":
// ..., "epoch": ...} or a bare torch.save(model.state_dict()), and the LibTorch optimizer archive of
// earlier ddprun checkpoints. State-dict names are saved without DDP's "module." prefix and accepted
// with or without it.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/serialize.hpp"

namespace ddprun::worker {

// Saves model (+ optimizer) and epoch; rank 0 writes, every rank returns after the file exists.
// Throws std::runtime_error naming the file and the system's reason (a full disk, say); the
// previous checkpoint is then left as it was.
void save_checkpoint(const std::string& path, const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                     int64_t epoch, Distributed& dist);

// Loads into model (+ optimizer, when the file has its state) if `path` exists; returns the saved
// epoch (0 when the file names none), or nullopt when there is no file. Loading is strict, as
// Python's load_state_dict(strict=True): a std::runtime_error names the file and every missing,
// unexpected and mis-shaped tensor, or what of the optimizer's state does not fit.
std::optional<int64_t> load_checkpoint(const std::string& path, torch::nn::Module& model,
                                       torch::optim::Optimizer* optimizer);

}  // namespace ddprun::worker
