#pragma once
// The end-of-job failure report: which rank failed first (the root cause), how (exit code or
// signal name), where (host, pid), when, its last stderr lines, and what it wrote to its
// TORCHELASTIC_ERROR_FILE. Pure formatting.

#include <optional>
#include <string>
#include <vector>

#include "launcher/workers/worker_exit.hpp"

namespace ddprun::launcher::workers {

// `failures` in the order they happened (the first is the root cause); `stopped` are the ranks
// ddprun stopped afterwards.
std::string format_failure_report(const std::string& program, const std::vector<WorkerExit>& failures,
                                  const std::vector<int>& stopped_ranks);

}  // namespace ddprun::launcher::workers
