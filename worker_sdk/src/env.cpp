#include "ddprun/worker/env.hpp"

#include <cstdlib>
#include <stdexcept>

#include "common/numbers.hpp"
#include "ddprun/worker/env_contract.hpp"

namespace ddprun::worker {
namespace {

namespace names = env_names;

constexpr const char* kWho =
    "; it is set by ddprun or torchrun, or set it by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)";

long long parse_int(const std::string& name, const std::string& text, long long lo, long long hi) {
  const auto v = to_int(text);
  if (v && *v >= lo && *v <= hi) return *v;
  throw std::invalid_argument("environment variable " + name + "='" + text + "' is not a whole number from " +
                              std::to_string(lo) + " to " + std::to_string(hi) + kWho);
}

}  // namespace

WorkerEnv WorkerEnv::from_lookup(const Lookup& env) {
  WorkerEnv w;
  const char* required[] = {names::kRank, names::kWorldSize, names::kMasterAddr, names::kMasterPort};
  int present = 0;
  for (const char* name : required) present += env(name).has_value() ? 1 : 0;
  if (present == 0) return w;  // a plain single process
  auto need = [&](const char* name) -> std::string {
    auto v = env(name);
    if (!v || v->empty())
      throw std::invalid_argument(std::string("environment variable ") + name + " is not set" + kWho);
    return *v;
  };
  w.launched = true;
  w.world_size = static_cast<int>(parse_int(names::kWorldSize, need(names::kWorldSize), 1, 1 << 24));
  w.rank = static_cast<int>(parse_int(names::kRank, need(names::kRank), 0, w.world_size - 1));
  w.master_addr = need(names::kMasterAddr);
  w.master_port = static_cast<uint16_t>(parse_int(names::kMasterPort, need(names::kMasterPort), 1, 65535));
  if (auto v = env(names::kLocalRank)) w.local_rank = static_cast<int>(parse_int(names::kLocalRank, *v, 0, 1 << 16));
  w.local_world_size = w.world_size;
  if (auto v = env(names::kLocalWorldSize)) {
    w.local_world_size = static_cast<int>(parse_int(names::kLocalWorldSize, *v, 1, 1 << 16));
  }
  w.use_agent_store = env(names::kUseAgentStore).value_or("") == "True";
  if (w.use_agent_store) {
    // PyTorch's env:// needs it too in agent-store mode (the /worker/attempt_<k> prefix).
    w.restart_count = static_cast<int>(parse_int(names::kRestartCount, need(names::kRestartCount), 0, 1 << 24));
  } else if (auto v = env(names::kRestartCount)) {
    w.restart_count = static_cast<int>(parse_int(names::kRestartCount, *v, 0, 1 << 24));
  }
  if (auto v = env(names::kRound)) w.round = static_cast<int>(parse_int(names::kRound, *v, 0, 1 << 30));
  return w;
}

WorkerEnv WorkerEnv::from_environment() {
  return from_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace ddprun::worker
