#include "launcher/workers/worker_env.hpp"

#include <sstream>

#include "ddprun/worker/env_contract.hpp"

extern char** environ;

namespace ddprun::launcher::workers {

namespace names = worker::env_names;

Environment worker_environment(const Environment& base, const WorkerPlacement& where, const AttemptContext& attempt,
                               const std::string& error_file) {
  Environment env = base;
  const bool virtual_rank = attempt.one_gpu_each.has_value();
  env[names::kLocalRank] = std::to_string(virtual_rank ? 0 : where.local_rank);
  env[names::kRank] = std::to_string(where.rank);
  env[names::kGroupRank] = std::to_string(where.group_rank);
  env[names::kRoleRank] = std::to_string(where.role_rank);
  env[names::kRoleName] = attempt.role;
  env[names::kLocalWorldSize] = std::to_string(where.local_world_size);
  env[names::kWorldSize] = std::to_string(where.world_size);
  env[names::kGroupWorldSize] = std::to_string(where.group_world_size);
  env[names::kRoleWorldSize] = std::to_string(where.role_world_size);
  env[names::kMasterAddr] = attempt.master_addr;
  env[names::kMasterPort] = std::to_string(attempt.master_port);
  env[names::kRestartCount] = std::to_string(attempt.restart_count);
  env[names::kRound] = std::to_string(attempt.round);
  env[names::kMaxRestarts] = std::to_string(attempt.max_restarts);
  env[names::kRunId] = attempt.run_id;
  env[names::kUseAgentStore] = "True";
  env[names::kErrorFile] = error_file;
  env[names::kSignalsToHandle] = attempt.signals_to_handle;
  // PyTorch < 2.2 reads NCCL_ASYNC_ERROR_HANDLING, later releases TORCH_NCCL_ASYNC_ERROR_HANDLING.
  const auto inherited = [&](const char* name) -> std::optional<std::string> {
    auto it = base.find(name);
    if (it == base.end()) return std::nullopt;
    return it->second;
  };
  const std::string async_errors =
      inherited("TORCH_NCCL_ASYNC_ERROR_HANDLING").value_or(inherited("NCCL_ASYNC_ERROR_HANDLING").value_or("1"));
  env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = inherited("TORCH_NCCL_ASYNC_ERROR_HANDLING").value_or(async_errors);
  env["NCCL_ASYNC_ERROR_HANDLING"] = inherited("NCCL_ASYNC_ERROR_HANDLING").value_or(async_errors);
  if (virtual_rank) {
    const auto& ids = *attempt.one_gpu_each;
    env[attempt.gpu_variable] = ids.empty() ? "" : ids[static_cast<size_t>(where.local_rank) % ids.size()];
  }
  return env;
}

std::vector<std::string> visible_gpu_ids(const Environment& base, int count, const std::string& variable) {
  std::vector<std::string> ids;
  auto it = base.find(variable);
  if (it != base.end()) {
    std::stringstream in(it->second);
    std::string id;
    while (std::getline(in, id, ',')) {
      if (!id.empty()) ids.push_back(id);
    }
    return ids;
  }
  for (int i = 0; i < count; ++i) ids.push_back(std::to_string(i));
  return ids;
}

std::vector<std::string> substitute_args(const std::vector<std::string>& args, int local_rank) {
  static const std::string kMacro = "${local_rank}";
  std::vector<std::string> out = args;
  for (std::string& a : out) {
    for (size_t pos = a.find(kMacro); pos != std::string::npos; pos = a.find(kMacro, pos)) {
      a.replace(pos, kMacro.size(), std::to_string(local_rank));
    }
  }
  return out;
}

Environment current_environment() {
  Environment env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

std::vector<std::string> to_envp(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

}  // namespace ddprun::launcher::workers
