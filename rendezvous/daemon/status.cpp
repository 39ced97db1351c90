#include "rendezvous/daemon/status.hpp"

#include <chrono>

#include "common/system.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/daemon/job_summary.hpp"

namespace ddprun::rdzv::daemon {

using json = nlohmann::json;

json store_status(client::Client& client) {
  const std::vector<std::string> keys = client.list();
  std::vector<std::string> ours;
  for (const auto& k : keys) {
    // A hang diagnosis (every rank's stacks) is large and not part of the summary.
    if (k.rfind(core::kRoot, 0) == 0 && k.find("/diagnosis/") == std::string::npos) ours.push_back(k);
  }
  // Read in slices, each well under the server's reply limit; a key deleted since LIST reads empty
  // (summarize_jobs takes it as gone).
  std::vector<std::pair<std::string, std::string>> entries;
  entries.reserve(ours.size());
  constexpr size_t kSlice = 2048;
  for (size_t i = 0; i < ours.size(); i += kSlice) {
    const std::vector<std::string> slice(ours.begin() + static_cast<long>(i),
                                         ours.begin() + static_cast<long>(std::min(ours.size(), i + kSlice)));
    const auto values = client.multi_get_now(slice);
    for (size_t j = 0; j < slice.size(); ++j) entries.emplace_back(slice[j], values[j]);
  }
  json summary = summarize_jobs(entries, now_ms());
  json out = {{"endpoint", client.endpoint()}, {"keys", keys.size()}, {"jobs", std::move(summary["jobs"])}};
  if (!summary["fault_tolerant_jobs"].empty()) out["fault_tolerant_jobs"] = std::move(summary["fault_tolerant_jobs"]);
  if (!summary["skipped"].empty()) out["skipped"] = std::move(summary["skipped"]);
  return out;
}

}  // namespace ddprun::rdzv::daemon
