// What the agent leaves a person at a round's end (see agent.hpp): the hang report, in the run
// directory and on the console of the node that diagnosed it, and the job's table of step rates.
// On the agent's thread; both write once per round, after the workers are stopped.
#include <filesystem>
#include <fstream>

#include "common/log.hpp"
#include "launcher/agent/agent.hpp"
#include "launcher/workers/console.hpp"

namespace ddprun::launcher::agent {

using rendezvous::RoundEnd;
using rendezvous::World;
using watchdog::FinalRates;
using watchdog::format_rates_table;
using workers::consoles;
using workers::ConsoleWriter;

void Agent::show_hang_report(const World& world, const RoundEnd& end) {
  // In the run directory of every node; on the console of the node that diagnosed it (one report
  // for the job), a pointer to it on the others.
  const fs::path file = attempt_dir_ / "hang_report.txt";
  bool written = false;
  {
    std::ofstream out(file, std::ios::trunc);
    out << (end.report.empty() ? end.detail + "\n" : end.report);
    out.close();
    written = static_cast<bool>(out);
  }
  if (written) report_.set_hang_report_file(file.string());
  if (health_ && written) health_->view().set_hang_report_file(file.string());
  view_event("hang", end.detail);
  std::error_code ec;
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace, ec);
  run_dir_.keep();
  const bool diagnosed_here = !multi_node_ || end.root_node == world.group_rank;
  if (diagnosed_here && !end.report.empty()) {
    if (ConsoleWriter* err = consoles().err) err->write(end.report);
  } else {
    log::error("ddprun") << "the job hung (diagnosed by node " << end.root_node << "): " << end.detail
                         << "; the full report is on that node's console";
  }
  if (written) {
    log::error("ddprun") << "hang report: " << file.string();
  } else {
    log::warn("ddprun") << "cannot write the hang report " << file.string() << " (a full disk?): "
                        << (diagnosed_here ? "it is on this console only" : "it is on that node's console only");
  }
}

void Agent::print_rates() {
  if (!watchdog_) return;
  FinalRates rates = watchdog_->final_rates();
  // The job's table is printed once: by the node that has every rank's figures.
  if (rates.job_wide && !rates.ranks.empty()) {
    if (ConsoleWriter* err = consoles().err) err->write(format_rates_table(rates.ranks, rates.stragglers));
  }
  report_.set_rates(std::move(rates));
}

}  // namespace ddprun::launcher::agent
