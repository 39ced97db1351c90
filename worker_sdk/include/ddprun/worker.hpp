#pragma once
// The ddprun worker SDK: everything a data-parallel C++ training program needs.
#include "ddprun/worker/checkpoint.hpp"
#include "ddprun/worker/comm_hooks.hpp"
#include "ddprun/worker/ddp.hpp"
#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/env.hpp"
#include "ddprun/worker/join.hpp"
#include "ddprun/worker/model_averaging.hpp"
#include "ddprun/worker/progress.hpp"
#include "ddprun/worker/sampler.hpp"
#include "ddprun/worker/serialize.hpp"
#include "ddprun/worker/sync_batch_norm.hpp"
#include "ddprun/worker/zero.hpp"
