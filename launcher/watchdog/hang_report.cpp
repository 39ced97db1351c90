#include "launcher/watchdog/hang_report.hpp"

#include <algorithm>
#include <ctime>
#include <map>
#include <set>
#include <sstream>

#include "common/procfs.hpp"
#include "common/system.hpp"  // seconds_text
#include "launcher/watchdog/hang_frames.hpp"
#include "launcher/watchdog/stacks.hpp"

namespace ddprun::launcher::watchdog {

namespace {

constexpr size_t kRanksInFull = 16;  // ranks whose stacks the report shows; the rest get one line
constexpr size_t kPythonLines = 40;
constexpr size_t kNativeLines = 20;

std::string seconds(double s) {
  std::ostringstream out;
  out.precision(s < 10 ? 2 : 0);
  out << std::fixed << s << " s";
  return out.str();
}

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out;
}

std::string rank_list(const std::vector<int>& v) { return (v.size() == 1 ? "rank " : "ranks ") + join_ints(v); }

std::string format_time(std::chrono::system_clock::time_point t) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

void block(std::ostringstream& out, const std::string& text) {
  for (const std::string& line : lines_of(text)) out << "    | " << line << "\n";
}

using Ranks = std::vector<const RankState*>;

// Who waits in the store for which keys, and who never connected to it. Returns the ranks that wait.
std::set<int> store_findings(const Ranks& ranks, const StoreView& store, HangFindings& out, std::set<int>& behind) {
  std::map<std::string, int> rank_of_endpoint;
  for (const RankState* r : ranks) {
    for (const std::string& ep : r->store_endpoints) rank_of_endpoint[procfs::normalize_endpoint(ep)] = r->rank;
  }
  std::set<int> in_store;
  for (const StoreWait& w : store.waits) {
    std::string keys;
    for (size_t i = 0; i < w.keys.size() && i < 3; ++i) keys += (i ? ", '" : "'") + w.keys[i] + "'";
    if (w.keys.size() > 3) keys += " and " + std::to_string(w.keys.size() - 3) + " more";
    auto it = rank_of_endpoint.find(procfs::normalize_endpoint(w.peer));
    if (it != rank_of_endpoint.end()) {
      in_store.insert(it->second);
      out.facts.push_back("rank " + std::to_string(it->second) + " waits in the store for key " + keys + " (for " +
                          seconds(w.seconds) + ")");
    } else {
      out.facts.push_back("a client at " + w.peer + " waits in the store for key " + keys + " (for " +
                          seconds(w.seconds) + ")");
    }
  }
  const bool any_connected =
      std::any_of(ranks.begin(), ranks.end(), [](auto* r) { return !r->store_endpoints.empty(); });
  if (!any_connected) return in_store;
  std::vector<int> never;
  for (const RankState* r : ranks) {
    if (r->store_endpoints.empty()) never.push_back(r->rank);
  }
  if (!never.empty()) {
    out.facts.push_back(rank_list(never) + (never.size() == 1 ? " has" : " have") +
                        " no connection to the worker store: never reached init_process_group (or closed it)");
    behind.insert(never.begin(), never.end());
  }
  return in_store;
}

// Training steps, where the ranks report them (progress pages, else heartbeat counters): the ranks
// at the fewest are behind.
void step_findings(const Ranks& ranks, const StoreView* store, HangFindings& out, std::set<int>& behind) {
  std::map<int, uint64_t> steps;
  for (const RankState* r : ranks) {
    if (r->reports_progress) steps[r->rank] = r->steps;
  }
  const char* unit = "step";
  if (steps.size() < 2 && store && store->heartbeats.size() >= 2) {
    steps.clear();
    for (const auto& [rank, count] : store->heartbeats)
      steps[rank] = static_cast<uint64_t>(std::max<int64_t>(count, 0));
    unit = "heartbeat";
  }
  if (steps.size() < 2) return;
  uint64_t most = 0, least = UINT64_MAX;
  for (const auto& [rank, n] : steps) {
    most = std::max(most, n);
    least = std::min(least, n);
  }
  if (least == most) return;
  std::vector<int> slow;
  for (const auto& [rank, n] : steps) {
    if (n == least) slow.push_back(rank);
  }
  out.facts.push_back(rank_list(slow) + (slow.size() == 1 ? " is" : " are") + " at " + unit + " " +
                      std::to_string(least) + ", others at " + unit + " " + std::to_string(most));
  behind.insert(slow.begin(), slow.end());
}

// A rank stuck destroying its Gloo process group: the destructor joins the group's worker thread
// while holding the GIL, and that thread, freeing a tensor whose Python object it now owns, waits
// for the GIL (PyTorch 2.6; a temporary given to a collective).
std::vector<int> destroy_findings(const Ranks& ranks, HangFindings& out) {
  std::vector<int> destroying;
  for (const RankState* r : ranks) {
    if (r->native_stack.find("ProcessGroupGloo::~ProcessGroupGloo") != std::string::npos &&
        r->native_stack.find("maybe_destroy_pyobj") != std::string::npos) {
      destroying.push_back(r->rank);
    }
  }
  if (!destroying.empty()) {
    out.facts.push_back(rank_list(destroying) + (destroying.size() == 1 ? " is" : " are") +
                        " stuck in destroy_process_group: ProcessGroupGloo's destructor waits for its worker "
                        "thread, which waits for the GIL to free a tensor (a PyTorch deadlock when a temporary "
                        "tensor was given to a collective: keep such tensors in a variable until the group is "
                        "destroyed)");
  }
  return destroying;
}

}  // namespace

HangFindings analyze_hang(const HangDiagnosis& d) {
  HangFindings out;
  Ranks ranks;
  const StoreView* store = nullptr;
  for (const NodeDiagnosis& n : d.nodes) {
    for (const RankState& r : n.ranks) {
      if (!r.exited) ranks.push_back(&r);
    }
    if (n.store) store = &*n.store;
  }
  std::sort(ranks.begin(), ranks.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  std::set<int> behind;
  const std::set<int> in_store = store ? store_findings(ranks, *store, out, behind) : std::set<int>();
  step_findings(ranks, store, out, behind);
  const std::vector<int> destroying = destroy_findings(ranks, out);
  // Who waits (in the store or a collective) and who does not.
  std::vector<int> waiting, elsewhere;
  for (const RankState* r : ranks) {
    if (std::find(destroying.begin(), destroying.end(), r->rank) != destroying.end()) continue;
    (in_store.count(r->rank) || rank_in_collective(*r) ? waiting : elsewhere).push_back(r->rank);
  }
  if (!waiting.empty() && !elsewhere.empty()) {
    out.facts.push_back(rank_list(waiting) + (waiting.size() == 1 ? " waits" : " wait") +
                        " for other ranks (in a collective or the store); " + rank_list(elsewhere) +
                        (elsewhere.size() == 1 ? " does" : " do") + " not");
    behind.insert(elsewhere.begin(), elsewhere.end());
  }
  if (behind.empty() && destroying.empty() && !ranks.empty()) {
    if (elsewhere.empty()) {
      out.facts.push_back(
          "every rank waits for the others: they disagree on which collective comes next, or a "
          "connection between them was lost");
    } else {
      out.facts.push_back(
          "no rank waits in a collective or the store: each is stuck in its own code (a deadlock, a "
          "blocking read, a sleep)");
    }
  }
  out.behind.assign(behind.begin(), behind.end());
  return out;
}

std::string hang_summary(const HangDiagnosis& d) {
  const HangFindings f = analyze_hang(d);
  std::string s =
      "no rank made progress for " + seconds(d.idle_seconds) + " (--hang_timeout " + seconds_text(d.timeout) + ")";
  if (!f.behind.empty()) s += "; behind: " + rank_list(f.behind);
  return s;
}

std::string format_hang_report(const HangDiagnosis& d) {
  const HangFindings f = analyze_hang(d);
  std::ostringstream out;
  const std::string rule(72, '='), thin(72, '-');
  out << rule << "\n"
      << d.program << " HUNG: no rank made progress for " << seconds(d.idle_seconds) << " (--hang_timeout "
      << seconds_text(d.timeout) << ")\n"
      << thin << "\n";
  out << "detected   : " << format_time(d.detected_at) << " by "
      << (d.detector_node >= 0 ? "node " + std::to_string(d.detector_node) + " (" + d.detector_host + ")"
                               : d.detector_host)
      << "\n";
  if (!d.silent_nodes.empty()) {
    out << "missing    : no diagnosis from node" << (d.silent_nodes.size() > 1 ? "s " : " ")
        << join_ints(d.silent_nodes) << " in time\n";
  }
  out << "behind     : " << (f.behind.empty() ? "(not determined)" : rank_list(f.behind)) << "\n";
  out << "findings   :\n";
  for (const std::string& fact : f.facts) out << "  - " << fact << "\n";
  std::vector<std::pair<const NodeDiagnosis*, const RankState*>> ranks;
  for (const NodeDiagnosis& n : d.nodes) {
    for (const RankState& r : n.ranks) ranks.emplace_back(&n, &r);
  }
  std::sort(ranks.begin(), ranks.end(), [](auto& a, auto& b) { return a.second->rank < b.second->rank; });
  // The ranks behind first: they are what the user needs to see.
  std::stable_partition(ranks.begin(), ranks.end(), [&](auto& x) {
    return std::find(f.behind.begin(), f.behind.end(), x.second->rank) != f.behind.end();
  });
  size_t shown = 0;
  for (const auto& [node, r] : ranks) {
    out << thin << "\n";
    out << "rank " << r->rank << " (local_rank " << r->local_rank << ", " << node->host
        << (node->node >= 0 ? ", node " + std::to_string(node->node) : "") << ", pid " << r->pid << "): ";
    if (r->exited) {
      out << "exited\n";
      continue;
    }
    out << rank_location(*r) << "\n";
    out << "  state    : " << r->state << (r->wchan.empty() ? "" : " (" + r->wchan + ")") << ", "
        << seconds(r->cpu_seconds) << " CPU" << (r->reports_progress ? ", step " + std::to_string(r->steps) : "")
        << ", no progress for " << seconds(r->idle_seconds) << "\n";
    for (const std::string& p : r->problems) out << "  note     : " << p << "\n";
    if (++shown > kRanksInFull) continue;
    if (!r->python_stack.empty()) {
      out << "  python (all threads):\n";
      block(out, first_lines(r->python_stack, kPythonLines));
    }
    if (!r->native_stack.empty()) {
      const auto frames = native_main_functions(r->native_stack, r->pid);
      out << "  native (" << r->native_tool << ", main thread):\n";
      std::string text;
      for (size_t i = 0; i < frames.size() && i < kNativeLines; ++i) {
        text += "#" + std::to_string(i) + "  " + frames[i] + "\n";
      }
      if (frames.size() > kNativeLines)
        text += "... (" + std::to_string(frames.size() - kNativeLines) + " more frames)\n";
      block(out, text.empty() ? first_lines(r->native_stack, kNativeLines) : text);
    }
    if (!r->stack_file.empty()) out << "  stacks   : " << r->stack_file << " (every thread)\n";
  }
  if (shown > kRanksInFull) {
    out << thin << "\n(stacks of " << shown - kRanksInFull << " more rank(s) are in their stack files)\n";
  }
  out << rule << "\n";
  return out.str();
}

}  // namespace ddprun::launcher::watchdog
