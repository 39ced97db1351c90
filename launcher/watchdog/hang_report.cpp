#include "launcher/watchdog/hang_report.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <set>
#include <sstream>

#include "common/numbers.hpp"
#include "common/procfs.hpp"
#include "common/system.hpp"  // seconds_text
#include "rendezvous/core/json_fields.hpp"
#include "launcher/watchdog/stacks.hpp"
#include "rendezvous/core/job_keys.hpp"

namespace ddprun::launcher {

using json = nlohmann::json;

namespace {

constexpr size_t kRanksInFull = 16;  // ranks whose stacks the report shows; the rest get one line
constexpr size_t kPythonLines = 40;
constexpr size_t kNativeLines = 20;

double number_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

bool bool_field(const json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string seconds(double s) {
  std::ostringstream out;
  out.precision(s < 10 ? 2 : 0);
  out << std::fixed << s << " s";
  return out.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Python: the frames ("  File ..." lines, innermost first) of the thread that runs the program
// (its outermost frame is <module>), else of the first thread.
std::vector<std::string> python_main_frames(const std::string& stack) {
  std::vector<std::vector<std::string>> threads;
  for (const std::string& line : split_lines(stack)) {
    if (line.rfind("Thread ", 0) == 0 || line.rfind("Current thread ", 0) == 0) threads.emplace_back();
    else if (line.rfind("  File \"", 0) == 0 && !threads.empty()) threads.back().push_back(line);
  }
  for (const auto& t : threads) {
    if (!t.empty() && t.back().find(" in <module>") != std::string::npos) return t;
  }
  return threads.empty() ? std::vector<std::string>{} : threads.front();
}

// `  File "/a/b/train.py", line 12 in step` -> {"train.py:12", "step", "/a/b/train.py"}
struct PyFrame {
  std::string where, function, path;
};
PyFrame parse_py_frame(const std::string& line) {
  PyFrame f;
  const auto q1 = line.find('"'), q2 = line.find('"', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) return f;
  f.path = line.substr(q1 + 1, q2 - q1 - 1);
  const auto slash = f.path.rfind('/');
  const std::string base = slash == std::string::npos ? f.path : f.path.substr(slash + 1);
  const auto ln = line.find("line ", q2), in = line.find(" in ", q2);
  std::string number = ln == std::string::npos ? "?" : line.substr(ln + 5, (in == std::string::npos ? line.size() : in) - ln - 5);
  f.where = base + ":" + number;
  f.function = in == std::string::npos ? "?" : line.substr(in + 4);
  return f;
}

// Native: the function names of the main thread (its TID is the pid), innermost first.
std::vector<std::string> native_main_functions(const std::string& stack, pid_t pid) {
  std::vector<std::string> out;
  bool in_main = false;
  const std::string eu_header = "TID " + std::to_string(pid) + ":";
  const std::string gdb_marker = "(LWP " + std::to_string(pid) + ")";
  for (const std::string& line : split_lines(stack)) {
    if (line.rfind("TID ", 0) == 0 || line.rfind("Thread ", 0) == 0) {
      in_main = line == eu_header || line.find(gdb_marker) != std::string::npos;
      continue;
    }
    if (!in_main || line.rfind("#", 0) != 0) continue;
    // eu-stack: "#2  0x00007f.. c10d::Work::wait(...)"; gdb: "#2  0x00007f.. in c10d::Work::wait (...) from ..."
    std::istringstream f(line);
    std::string index, word, rest;
    f >> index >> word;
    if (word.rfind("0x", 0) == 0) {
      std::getline(f, rest);
    } else {
      rest = word;  // gdb prints frame #0 without an address at times
      std::string more;
      std::getline(f, more);
      rest += more;
    }
    auto b = rest.find_first_not_of(' ');
    rest = b == std::string::npos ? "" : rest.substr(b);
    if (rest.rfind("in ", 0) == 0) rest = rest.substr(3);
    const auto paren = rest.find(" (");
    if (paren != std::string::npos) rest = rest.substr(0, paren);
    const auto open = rest.find('(');
    if (open != std::string::npos && open > 0) rest = rest.substr(0, open);
    out.push_back(rest.empty() ? "??" : rest);
  }
  return out;
}

bool is_comm_function(const std::string& f) {
  return f.find("c10d::") != std::string::npos || f.find("gloo::") != std::string::npos ||
         f.find("nccl") != std::string::npos || f.find("GlooBucketReducer") != std::string::npos;
}

bool is_wait_plumbing(const std::string& f) {
  static const char* kPlumbing[] = {"futex", "poll", "epoll", "nanosleep", "pthread_cond", "__GI_", "read",
                                    "recv", "select", "clock_nanosleep", "sleep", "syscall", "??", "std::"};
  for (const char* p : kPlumbing) {
    if (f.find(p) != std::string::npos) return true;
  }
  return f.rfind("0x", 0) == 0 || f.empty();
}

bool in_collective(const RankState& r) {
  if (r.in_collective) return true;
  for (const std::string& frame : python_main_frames(r.python_stack)) {
    if (frame.find("/torch/distributed/") != std::string::npos) return true;
  }
  const auto native = native_main_functions(r.native_stack, r.pid);
  return std::any_of(native.begin(), native.end(), is_comm_function);
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
  for (const std::string& line : split_lines(text)) out << "    | " << line << "\n";
}

}  // namespace

json to_json(const NodeDiagnosis& d) {
  json ranks = json::array();
  for (const RankState& r : d.ranks) {
    ranks.push_back({{"rank", r.rank}, {"local_rank", r.local_rank}, {"pid", r.pid}, {"exited", r.exited},
                     {"state", r.state}, {"wchan", r.wchan}, {"cpu_seconds", r.cpu_seconds},
                     {"reports_progress", r.reports_progress}, {"steps", r.steps}, {"in_collective", r.in_collective},
                     {"idle_seconds", r.idle_seconds}, {"store_endpoints", r.store_endpoints},
                     {"python_stack", r.python_stack}, {"native_stack", r.native_stack},
                     {"native_tool", r.native_tool}, {"problems", r.problems}, {"stack_file", r.stack_file}});
  }
  json j = {{"node", d.node}, {"host", d.host}, {"log_dir", d.log_dir}, {"ranks", ranks}};
  if (d.store) {
    json waits = json::array();
    for (const StoreWait& w : d.store->waits) waits.push_back({{"peer", w.peer}, {"keys", w.keys}, {"seconds", w.seconds}});
    json beats = json::object();
    for (const auto& [rank, count] : d.store->heartbeats) beats[std::to_string(rank)] = count;
    j["store"] = {{"endpoint", d.store->endpoint}, {"waits", waits}, {"clients", d.store->clients}, {"heartbeats", beats}};
  }
  return j;
}

NodeDiagnosis node_diagnosis_from_json(const json& j) {
  NodeDiagnosis d;
  if (!j.is_object()) return d;
  d.node = static_cast<int>(int_field(j, "node", -1));
  d.host = string_field(j, "host");
  d.log_dir = string_field(j, "log_dir");
  if (auto it = j.find("ranks"); it != j.end() && it->is_array()) {
    for (const json& r : *it) {
      if (!r.is_object()) continue;
      RankState s;
      s.rank = static_cast<int>(int_field(r, "rank", -1));
      s.local_rank = static_cast<int>(int_field(r, "local_rank", -1));
      s.pid = static_cast<pid_t>(int_field(r, "pid", -1));
      s.exited = bool_field(r, "exited");
      s.state = string_field(r, "state");
      s.wchan = string_field(r, "wchan");
      s.cpu_seconds = number_field(r, "cpu_seconds");
      s.reports_progress = bool_field(r, "reports_progress");
      s.steps = static_cast<uint64_t>(std::max<int64_t>(0, int_field(r, "steps", 0)));
      s.in_collective = bool_field(r, "in_collective");
      s.idle_seconds = number_field(r, "idle_seconds");
      s.store_endpoints = strings_field(r, "store_endpoints");
      s.python_stack = string_field(r, "python_stack");
      s.native_stack = string_field(r, "native_stack");
      s.native_tool = string_field(r, "native_tool");
      s.problems = strings_field(r, "problems");
      s.stack_file = string_field(r, "stack_file");
      d.ranks.push_back(std::move(s));
    }
  }
  if (auto it = j.find("store"); it != j.end() && it->is_object()) {
    StoreView v;
    v.endpoint = string_field(*it, "endpoint");
    v.clients = strings_field(*it, "clients");
    if (auto w = it->find("waits"); w != it->end() && w->is_array()) {
      for (const json& x : *w) {
        if (!x.is_object()) continue;
        v.waits.push_back({string_field(x, "peer"), strings_field(x, "keys"), number_field(x, "seconds")});
      }
    }
    if (auto h = it->find("heartbeats"); h != it->end() && h->is_object()) {
      for (const auto& [rank, count] : h->items()) {
        const auto r = to_int(rank);
        if (r && count.is_number_integer()) v.heartbeats[static_cast<int>(*r)] = count.get<int64_t>();
      }
    }
    d.store = std::move(v);
  }
  return d;
}

std::string rank_location(const RankState& r) {
  if (r.exited) return "exited";
  const auto py = python_main_frames(r.python_stack);
  if (!py.empty()) {
    // The innermost frame in torch.distributed, called from the program's own code.
    for (size_t i = 0; i < py.size(); ++i) {
      const PyFrame f = parse_py_frame(py[i]);
      if (f.path.find("/torch/distributed/") == std::string::npos) continue;
      std::string caller;
      for (size_t k = i + 1; k < py.size(); ++k) {
        const PyFrame c = parse_py_frame(py[k]);
        if (c.path.find("/torch/") == std::string::npos) {
          caller = c.where;
          break;
        }
      }
      // The outermost torch.distributed frame is the call the program made, less the decorators
      // PyTorch 2.x wraps its collectives in (c10d_logger.py's `wrapper`).
      size_t outer = i;
      while (outer + 1 < py.size() && parse_py_frame(py[outer + 1]).path.find("/torch/distributed/") != std::string::npos) {
        ++outer;
      }
      const auto decorator = [](const PyFrame& f) {
        return f.function == "wrapper" || f.path.find("/torch/distributed/c10d_logger.py") != std::string::npos;
      };
      while (outer > i && decorator(parse_py_frame(py[outer]))) --outer;
      return "in torch.distributed " + parse_py_frame(py[outer]).function + (caller.empty() ? "" : " (" + caller + ")");
    }
    const PyFrame top = parse_py_frame(py.front());
    return "in " + top.function + " (" + top.where + ")";
  }
  const auto native = native_main_functions(r.native_stack, r.pid);
  for (const std::string& f : native) {
    if (is_comm_function(f)) return "in " + f;
  }
  for (const std::string& f : native) {
    if (!is_wait_plumbing(f)) return "in " + f;
  }
  if (!native.empty()) return "in " + native.front();
  return r.wchan.empty() ? r.state : r.state + " in " + r.wchan;
}

namespace {

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
  const bool any_connected = std::any_of(ranks.begin(), ranks.end(), [](auto* r) { return !r->store_endpoints.empty(); });
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
    for (const auto& [rank, count] : store->heartbeats) steps[rank] = static_cast<uint64_t>(std::max<int64_t>(count, 0));
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
    (in_store.count(r->rank) || in_collective(*r) ? waiting : elsewhere).push_back(r->rank);
  }
  if (!waiting.empty() && !elsewhere.empty()) {
    out.facts.push_back(rank_list(waiting) + (waiting.size() == 1 ? " waits" : " wait") +
                        " for other ranks (in a collective or the store); " + rank_list(elsewhere) +
                        (elsewhere.size() == 1 ? " does" : " do") + " not");
    behind.insert(elsewhere.begin(), elsewhere.end());
  }
  if (behind.empty() && destroying.empty() && !ranks.empty()) {
    if (elsewhere.empty()) {
      out.facts.push_back("every rank waits for the others: they disagree on which collective comes next, or a "
                          "connection between them was lost");
    } else {
      out.facts.push_back("no rank waits in a collective or the store: each is stuck in its own code (a deadlock, a "
                          "blocking read, a sleep)");
    }
  }
  out.behind.assign(behind.begin(), behind.end());
  return out;
}

std::string hang_summary(const HangDiagnosis& d) {
  const HangFindings f = analyze_hang(d);
  std::string s = "no rank made progress for " + seconds(d.idle_seconds) + " (--hang_timeout " +
                  seconds_text(d.timeout) + ")";
  if (!f.behind.empty()) s += "; behind: " + rank_list(f.behind);
  return s;
}

std::string format_hang_report(const HangDiagnosis& d) {
  const HangFindings f = analyze_hang(d);
  std::ostringstream out;
  const std::string rule(72, '='), thin(72, '-');
  out << rule << "\n" << d.program << " HUNG: no rank made progress for " << seconds(d.idle_seconds)
      << " (--hang_timeout " << seconds_text(d.timeout) << ")\n" << thin << "\n";
  out << "detected   : " << format_time(d.detected_at) << " by "
      << (d.detector_node >= 0 ? "node " + std::to_string(d.detector_node) + " (" + d.detector_host + ")"
                               : d.detector_host)
      << "\n";
  if (!d.silent_nodes.empty()) {
    out << "missing    : no diagnosis from node" << (d.silent_nodes.size() > 1 ? "s " : " ") << join_ints(d.silent_nodes)
        << " in time\n";
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
        << seconds(r->cpu_seconds) << " CPU"
        << (r->reports_progress ? ", step " + std::to_string(r->steps) : "")
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
      if (frames.size() > kNativeLines) text += "... (" + std::to_string(frames.size() - kNativeLines) + " more frames)\n";
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

}  // namespace ddprun::launcher
