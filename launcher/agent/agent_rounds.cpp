// Between the agent's rounds (see agent.hpp): whether this node is fit for the next one (a
// worker's request to leave, the health checks), what it knows of the job's progress for the
// restart policy, and how it announces the next round.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "common/log.hpp"
#include "common/unique_fd.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/agent/node_checks.hpp"

namespace ddprun::launcher::agent {

using rendezvous::RoundEnd;
using rendezvous::World;

bool Agent::lost_here(const RoundEnd& end, const World& world) const {
  return multi_node_ && end.kind == RoundEnd::Kind::NodeLost && end.root_node == world.group_rank;
}

std::optional<ft::Finished> Agent::job_finished_elsewhere(const RoundEnd& end) const {
  if (!coordinator_ || end.kind != RoundEnd::Kind::Failure) return std::nullopt;
  return coordinator_->over();
}

std::optional<Agent::Unready> Agent::unready_for_round() {
  if (!std::exchange(looked_for_strikes_, true) && options_.max_unfit_leaves > 0) {
    // A node of a host that left this run of the job unfit again and again (a flapping node, its
    // agent restarted each time) is not taken back: it leaves before it could disturb the world.
    const std::vector<std::string> before = backend_->unfit_leaves(options_.max_unfit_leaves);
    if (static_cast<int>(before.size()) >= options_.max_unfit_leaves) {
      return Unready{"node_not_taken_back",
                     "is not taken back: nodes of " + host_ + " left this run of the job unfit " +
                         std::to_string(before.size()) + " times (--max_unfit_leaves " +
                         std::to_string(options_.max_unfit_leaves) + "; the last " + before.back() +
                         "); mend the host and start the job again, or raise --max_unfit_leaves",
                     /*strike=*/false};
    }
  }
  std::ifstream asked(exclusion_file());
  if (asked) {
    std::string reason;
    std::getline(asked, reason);
    if (reason.size() > 300) reason = reason.substr(0, 300) + "...";
    return Unready{"node_excluded", "was asked by a worker to leave the job" + (reason.empty() ? "" : ": " + reason)};
  }
  NodeCheckSettings s;
  s.script = options_.node_check;
  s.timeout = options_.node_check_timeout;
  s.free_space = options_.check_free_space;
  s.interfaces = options_.check_interfaces;
  if (options_.check_gpus) {
    s.gpus = gpus_ ? *gpus_ : workers::visible_gpu_ids(base_env_, options_.nproc_per_node, "CUDA_VISIBLE_DEVICES");
  }
  if (!s.any()) return std::nullopt;
  health(StatusServer::Phase::Rendezvous, "running the health checks");
  if (auto failed = run_node_checks(s, stop_))
    return Unready{"node_check_failed", "failed its health check: " + *failed};
  return std::nullopt;
}

namespace {

// --iterations_file, read now: its count, or nullopt with the reason said on the console (nothing
// is said of a file that is not there yet: a program writes it at its first checkpoint). Opened
// without blocking and read only if it is a regular file of a few bytes, so a FIFO, a device or a
// huge file named by mistake never holds up the agent.
std::optional<uint64_t> read_iterations_file(const std::string& path) {
  constexpr size_t kMost = 64;
  auto ignored = [&](const std::string& problem) -> std::optional<uint64_t> {
    log::warn("ddprun") << "--iterations_file " << path << " " << problem
                        << "; it is ignored for this failure, whose progress is what the progress pages say";
    return std::nullopt;
  };
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd) return errno == ENOENT ? std::nullopt : ignored(std::string("cannot be read: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return ignored("is not a regular file");
  if (st.st_size > static_cast<off_t>(kMost)) {
    return ignored("holds " + std::to_string(st.st_size) + " bytes, not a count of iterations");
  }
  char text[kMost];
  const ssize_t n = ::pread(fd.get(), text, sizeof text, 0);
  if (n < 0) return ignored(std::string("cannot be read: ") + std::strerror(errno));
  IterationsText said = parse_iterations_text({text, static_cast<size_t>(n)});
  return said.iterations ? said.iterations : ignored(said.problem);
}

}  // namespace

rendezvous::ProgressMark Agent::progress_mark() const {
  rendezvous::ProgressMark m;
  std::optional<uint64_t> now = watchdog_ ? watchdog_->iterations() : std::nullopt;
  if (!options_.iterations_file.empty()) {
    if (auto written = read_iterations_file(options_.iterations_file)) now = std::max(now.value_or(0), *written);
  }
  if (!now && !best_iterations_) return m;  // the program reports no iterations: nothing is known
  m.iterations = now.value_or(0);
  if (best_iterations_ && *m.iterations <= *best_iterations_) m.no_progress_restarts = no_progress_restarts_ + 1;
  return m;
}

void Agent::learn_progress(const RoundEnd& end) {
  if (end.kind != RoundEnd::Kind::Failure || !end.progress.iterations) return;
  best_iterations_ = std::max(best_iterations_.value_or(0), *end.progress.iterations);
  no_progress_restarts_ = end.progress.no_progress_restarts;
}

void Agent::announce_next_round(Decision::Kind kind, const RoundEnd& end, const World& world) {
  if (kind == Decision::Kind::Restart) {
    ++restarts_;
    view_event("restart", end.detail + " (restart " + std::to_string(restarts_) + " of " +
                              std::to_string(options_.max_restarts) + ")");
    log::warn("ddprun") << end.detail << "; restarting the worker group"
                        << (multi_node_ ? "s of all " + std::to_string(world.group_world_size) + " nodes" : "")
                        << " (restart " << restarts_ << " of " << options_.max_restarts << ")";
  } else if (lost_here(end, world)) {
    // Cut off or frozen for longer than the keep-alive window, and back: the others went on to a
    // new round, and this node joins it rather than leave the job.
    log::warn("ddprun") << "the other nodes counted this node as lost (" << end.detail
                        << "); it is back, and joins the job's next round (not counted as a restart)";
  } else {
    log::warn("ddprun") << end.detail << "; re-rendezvous"
                        << (end.kind == RoundEnd::Kind::NodeLost ? " without it" : " to admit it")
                        << " (not counted as a restart)";
  }
}

}  // namespace ddprun::launcher::agent
