#pragma once
// Defaults that several parts of ddprun share, named once (most are torchrun's, so that a job
// moved from torchrun behaves the same without a flag).

#include <chrono>
#include <cstdint>

namespace ddprun::defaults {

// The port of a rendezvous store given without one (--rdzv_endpoint HOST; ddprun-rendezvous).
inline constexpr uint16_t kStorePort = 29400;
// The workers' store of a multi-node static job run without --master_port.
inline constexpr uint16_t kMasterPort = 29500;
// How long a node waits for its rendezvous round to form (rdzv_conf join_timeout).
inline constexpr std::chrono::seconds kJoinTimeout{600};
// How often a long wait (a rendezvous, a quorum, a slow shutdown) says where it is
// (DDPRUN_PROGRESS_INTERVAL).
inline constexpr std::chrono::seconds kProgressInterval{10};

}  // namespace ddprun::defaults
