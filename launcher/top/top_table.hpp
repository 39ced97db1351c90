#pragma once
// ddprun-top's table: a job's /api/job ("ddprun-job-view/1", docs/job-views.md) as lines of text,
// the ranks in the order the others wait for them (the snapshot's own order). Pure. The snapshot
// is whatever the server sent: any JSON value is shown without a throw (a field of the wrong type
// reads as absent), and its texts with their control characters made visible.

#include <nlohmann/json.hpp>
#include <string>

namespace ddprun::launcher::top {

// The header (job, phase, round, restarts, workers, stragglers) and one line per rank, fitting
// `width` columns and `height` lines (0: no limit), with "... N more" when the ranks do not fit.
// `where`: the address the snapshot came from, for the header.
std::string format_table(const nlohmann::json& snapshot, const std::string& where, int width = 0, int height = 0);

}  // namespace ddprun::launcher::top
