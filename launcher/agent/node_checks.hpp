#pragma once
// Health checks a node runs before it joins each round: the user's script (--node_check) and the
// built-in ones (--check_free_space, --check_interface, --check_gpus). The first check that fails
// says why in one line that names the check; the agent then leaves the job (see agent.hpp): an
// elastic job goes on without this node, a static one ends with a report that names the node and
// the check.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/stop_signal.hpp"
#include "launcher/cli/options.hpp"

namespace ddprun::launcher::agent {

struct NodeCheckSettings {
  std::string script;  // --node_check: run by /bin/sh -c; "" none
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  std::vector<cli::FreeSpaceCheck> free_space;  // --check_free_space
  std::vector<std::string> interfaces;          // --check_interface
  std::vector<std::string> gpus;                // --check_gpus: the GPU ids this node's workers use
  bool any() const { return !script.empty() || !free_space.empty() || !interfaces.empty() || !gpus.empty(); }
};

// Runs every check (the built-in ones first: they are quick); the first failure's one-line reason,
// or nullopt when all pass. A stop request ends a running script (StopRequested).
std::optional<std::string> run_node_checks(const NodeCheckSettings& s, const StopSignal& stop);

// The checks one at a time, for the tests.
std::optional<std::string> check_free_space(const cli::FreeSpaceCheck& c);
std::optional<std::string> check_interface(const std::string& name,
                                           const std::string& sys_class_net = "/sys/class/net");
std::optional<std::string> check_gpu(const std::string& id, std::chrono::milliseconds timeout, const StopSignal& stop);
std::optional<std::string> check_script(const std::string& script, std::chrono::milliseconds timeout,
                                        const StopSignal& stop);

}  // namespace ddprun::launcher::agent
