#include "launcher/workers/worker_env.hpp"

#include <sstream>

extern char** environ;

namespace ddprun::launcher::workers {

Environment worker_environment(const Environment& base, const WorkerPlacement& where, const AttemptContext& attempt,
                               const std::string& error_file) {
  Environment env = base;
  const bool virtual_rank = attempt.one_gpu_each.has_value();
  env["LOCAL_RANK"] = std::to_string(virtual_rank ? 0 : where.local_rank);
  env["RANK"] = std::to_string(where.rank);
  env["GROUP_RANK"] = std::to_string(where.group_rank);
  env["ROLE_RANK"] = std::to_string(where.rank);  // one role per job: role rank = global rank
  env["ROLE_NAME"] = attempt.role;
  env["LOCAL_WORLD_SIZE"] = std::to_string(where.local_world_size);
  env["WORLD_SIZE"] = std::to_string(where.world_size);
  env["GROUP_WORLD_SIZE"] = std::to_string(where.group_world_size);
  env["ROLE_WORLD_SIZE"] = std::to_string(where.world_size);
  env["MASTER_ADDR"] = attempt.master_addr;
  env["MASTER_PORT"] = std::to_string(attempt.master_port);
  env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt.restart_count);
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(attempt.max_restarts);
  env["TORCHELASTIC_RUN_ID"] = attempt.run_id;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_ERROR_FILE"] = error_file;
  env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = attempt.signals_to_handle;
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
