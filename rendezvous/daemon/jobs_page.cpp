#include "rendezvous/daemon/jobs_page.hpp"

#include <boost/asio/post.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "common/json_fields.hpp"
#include "common/system.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/daemon/job_summary.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/jobs/records.hpp"
#include "rendezvous/server/web_page.hpp"

namespace ddprun::rdzv::daemon {

using json = nlohmann::json;
using server::HttpReply;
using server::HttpRequest;
namespace names = jobs::round_names;

namespace {

constexpr float kNone = std::numeric_limits<float>::quiet_NaN();

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// The names of the keys the page reads: the others (heartbeats, counters, assignments) change
// often and say nothing it shows.
bool followed(std::string_view name) {
  return starts_with(name, names::kRates) || starts_with(name, names::kNode) || starts_with(name, names::kMember) ||
         name == names::kComplete || name == names::kClosed || name == names::kEnd || name == names::kHang ||
         name == jobs::job_names::kEnded || name == jobs::job_names::kGeneration;
}

// A rank is judged (straggler or not) on its figures over the latest publications covering about
// this long, and only once they cover at least kLeastSecondsJudged.
constexpr double kWindowSeconds = 5;
constexpr double kLeastSecondsJudged = 1;

// The seconds the rates in `rates` cover, but the first `skip`.
double span_of(const std::deque<jobs::RankRate>& rates, size_t skip) {
  double seconds = 0;
  for (size_t i = skip; i < rates.size(); ++i) seconds += rates[i].seconds;
  return seconds;
}

// The rates of consecutive windows as one: steps and seconds add up, compute time per step is
// weighted by steps (absent if any window lacks it), the latest window's step, idleness and wait.
jobs::RankRate over_window(const std::deque<jobs::RankRate>& rates) {
  jobs::RankRate out = rates.back();
  out.steps = 0;
  out.seconds = 0;
  double compute_ms = 0;
  bool every_compute = true;
  for (const auto& r : rates) {
    out.steps += r.steps;
    out.seconds += r.seconds;
    if (r.compute_ms_per_step) {
      compute_ms += *r.compute_ms_per_step * static_cast<double>(r.steps);
    } else {
      every_compute = false;
    }
  }
  out.steps_per_second = out.seconds > 0 ? static_cast<double>(out.steps) / out.seconds : 0;
  out.compute_ms_per_step.reset();
  if (every_compute && out.steps > 0) out.compute_ms_per_step = compute_ms / static_cast<double>(out.steps);
  return out;
}

// A state that is not a failure (so far).
bool good_state(const std::string& state) { return state == "joining" || state == "running" || state == "succeeded"; }

}  // namespace

JobsPage::JobsPage(boost::asio::io_context& io, server::Server& server, JobsPageSettings settings)
    : io_(io),
      server_(server),
      s_(std::move(settings)),
      hosts_(s_.allowed_hosts, "--metrics-allowed-hosts"),
      next_(server.store().observer()) {
  server_.store().set_observer(this);
}

JobsPage::~JobsPage() { server_.store().set_observer(next_); }

void JobsPage::on_change(std::string_view key, const int64_t* counter) {
  if (next_) next_->on_change(key, counter);
  if (!starts_with(key, core::kRoot)) return;
  const std::string_view name = key.substr(key.rfind('/', key.size() - 1) + 1);
  // A cheap look at the last part first: most changes are heartbeats and counters.
  if (name != names::kEnd && name != names::kHang && name != names::kComplete && name != names::kClosed &&
      name != jobs::job_names::kEnded && name != jobs::job_names::kGeneration && key.find("/rates/") == key.npos &&
      key.find("/node/") == key.npos && key.find("/member/") == key.npos) {
    return;
  }
  if (pending_set_.insert(std::string(key)).second) pending_.emplace_back(key);
  if (!posted_) {
    posted_ = true;
    boost::asio::post(io_, [this] { catch_up(); });
  }
}

void JobsPage::on_once(std::string_view token, int64_t result) {
  if (next_) next_->on_once(token, result);
}

void JobsPage::catch_up() {
  posted_ = false;
  const int64_t now = now_ms();
  std::vector<std::string> keys;
  keys.swap(pending_);
  pending_set_.clear();
  for (const std::string& key : keys) apply(key, server_.store().get(key), now);
  // The jobs followed: the ones changed least recently go first.
  while (jobs_.size() > s_.max_jobs) {
    auto oldest = std::min_element(jobs_.begin(), jobs_.end(),
                                   [](const auto& a, const auto& b) { return a.second.touched < b.second.touched; });
    jobs_.erase(oldest);
  }
}

JobsPage::JobTrack* JobsPage::track(const std::string& run_id, int64_t generation, int64_t now) {
  JobTrack& t = jobs_[run_id];
  if (generation < t.generation) return nullptr;  // an older run's key, read late
  if (generation > t.generation) {
    // A new run of the job id: its own page.
    t = JobTrack{};
    t.generation = generation;
    t.state_since_ms = now;
    event(t, now, "start", "run " + std::to_string(generation) + " of job " + run_id + " began");
  }
  t.touched = ++changes_;
  return &t;
}

void JobsPage::event(JobTrack& t, int64_t now, std::string kind, std::string text) {
  json e{{"t_ms", now}, {"kind", std::move(kind)}, {"text", std::move(text)}};
  if (t.first_event.is_null()) {
    t.first_event = std::move(e);
    return;
  }
  t.events.push_back(std::move(e));
  while (t.events.size() + 1 > s_.max_events) {
    t.events.pop_front();
    ++t.dropped;
  }
}

void JobsPage::apply(std::string_view key, const std::string* value, int64_t now) {
  const auto parsed = jobs::parse_key(key, nullptr);
  if (!parsed || !followed(parsed->name)) return;
  if (!parsed->generation) {
    // The job id's counter goes last when the janitor forgets a job: so does its page.
    if (!value && parsed->name == jobs::job_names::kGeneration) jobs_.erase(parsed->run_id);
    return;
  }
  if (!value) return;  // deleted
  JobTrack* t = track(parsed->run_id, *parsed->generation, now);
  if (!t) return;
  const std::string& name = parsed->name;
  const std::string round = parsed->round ? "round " + std::to_string(*parsed->round) + ": " : "";
  if (starts_with(name, names::kRates)) {
    const json record = json::parse(*value, nullptr, false);
    if (!record.is_object() || !record.contains("ranks") || !record["ranks"].is_array()) return;
    if (record.value("whole_run", false)) return;  // the end's averages: no column of their own
    for (const json& r : record["ranks"]) {
      const auto rate = jobs::rank_rate_from_json(r);
      if (!rate) continue;
      RankTrack& rt = t->ranks[rate->rank];
      // The nodes' period, as the daemon sees their records arrive (a record's own span is shorter
      // at the start of a run).
      if (rt.at_ms > 0 && now > rt.at_ms) t->period_s = static_cast<double>(now - rt.at_ms) / 1e3;
      rt.latest = *rate;
      rt.at_ms = now;
      rt.recent.push_back(*rate);
      while (rt.recent.size() > 1 && span_of(rt.recent, 1) >= kWindowSeconds) rt.recent.pop_front();
      float ms = kNone;
      if (rate->compute_ms_per_step) {
        ms = static_cast<float>(*rate->compute_ms_per_step);
      } else if (rate->steps_per_second > 0) {
        ms = static_cast<float>(1e3 / rate->steps_per_second);
      }
      rt.heat.push_back(ms);
      while (rt.heat.size() > s_.history) rt.heat.pop_front();
    }
  } else if (starts_with(name, names::kNode) || starts_with(name, names::kMember)) {
    const auto node = jobs::decode_node_record(*value);
    if (!node) return;
    const std::string who = starts_with(name, names::kNode)
                                ? "node " + name.substr(names::kNode.size()) + " (" + node->host + ")"
                                : node->host;
    event(*t, now, "nodes",
          round + who + " joined (" + std::to_string(node->nproc) + " worker" + (node->nproc == 1 ? "" : "s") +
              (node->restarts > 0 ? ", " + std::to_string(node->restarts) + " restarts so far" : "") + ")");
  } else if (name == names::kComplete || name == names::kClosed) {
    event(*t, now, "rendezvous", round + "every node is in: the workers start");
    t->state_since_ms = now;
  } else if (name == names::kHang) {
    event(*t, now, "hang", round + "no rank progressed: node " + *value + " diagnoses the hang");
  } else if (name == names::kEnd || name == jobs::job_names::kEnded) {
    const jobs::Outcome o = jobs::decode_outcome(*value);
    const bool final = name == jobs::job_names::kEnded;
    std::string text = round + std::string(jobs::state_name(o.kind));
    if (!o.detail.empty()) text += ": " + o.detail;
    event(*t, now, final ? "exit" : o.kind == jobs::Outcome::Kind::Success ? "end" : "restart", text);
    t->state_since_ms = now;
  }
}

bool JobsPage::may_look(const boost::asio::ip::address& peer) const {
  return server::from_this_host(peer) || (!server_.protected_store() && server_.admits(peer));
}

json JobsPage::jobs(int64_t now) {
  catch_up();
  std::vector<std::pair<std::string, std::string>> entries;
  server_.store().for_each(core::kRoot, [&](std::string_view k, const std::string& v) { entries.emplace_back(k, v); });
  const json summary = summarize_jobs(entries, now);
  // The latest run of each job id.
  std::map<std::string, const json*> latest;
  for (const json& j : summary["jobs"]) {
    const std::string id = j.value("run_id", "");
    auto& slot = latest[id];
    if (!slot || j.value("generation", int64_t{0}) > slot->value("generation", int64_t{0})) slot = &j;
  }
  json list = json::array();
  for (const auto& [id, j] : latest) {
    json line{{"run_id", id},
              {"generation", j->value("generation", int64_t{0})},
              {"state", j->value("state", "joining")},
              {"round", j->value("round", int64_t{-1})},
              {"nnodes", j->value("nnodes", 0)},
              {"joined", j->value("joined", 0)},
              {"world_size", j->value("world_size", 0)},
              {"stragglers", 0},
              {"ranks_reporting", 0}};
    if (auto view = job(id, now)) {
      line["stragglers"] = (*view)["stragglers"];
      line["ranks_reporting"] = (*view)["ranks_here"];
      line["restarts"] = (*view)["restarts"];
    }
    list.push_back(std::move(line));
  }
  return {{"schema", "ddprun-jobs/1"}, {"time_ms", now}, {"jobs", std::move(list)}};
}

std::optional<json> JobsPage::job(const std::string& run_id, int64_t now) {
  catch_up();
  std::string why;
  if (!core::valid_run_id(run_id, &why)) return std::nullopt;
  std::vector<std::pair<std::string, std::string>> entries;
  server_.store().for_each(core::job_prefix(run_id),
                           [&](std::string_view k, const std::string& v) { entries.emplace_back(k, v); });
  const json summary = summarize_jobs(entries, now);
  const json* found = nullptr;
  for (const json& j : summary["jobs"]) {
    if (j.value("run_id", "") != run_id) continue;
    if (!found || j.value("generation", int64_t{0}) > found->value("generation", int64_t{0})) found = &j;
  }
  if (!found) return std::nullopt;
  const json& s = *found;
  const int64_t generation = s.value("generation", int64_t{0});
  const std::string state = s.value("state", "joining");
  auto it = jobs_.find(run_id);
  JobTrack empty;
  JobTrack& t = it != jobs_.end() && it->second.generation == generation ? it->second : empty;
  int restarts = 0;
  for (const json& n : s["nodes"]) restarts = std::max(restarts, static_cast<int>(int_field(n, "restarts", 0)));
  const int nnodes = s.value("nnodes", 0), joined = s.value("joined", 0);
  std::string detail;
  if (state == "joining") {
    detail = std::to_string(joined) + " of " + std::to_string(nnodes) + " nodes joined";
  } else if (state == "running") {
    detail = std::to_string(s.value("world_size", 0)) + " ranks on " + std::to_string(joined) + " nodes";
  } else if (s.contains("end")) {
    const json& end = s["end"];
    detail = end.is_string() ? end.get<std::string>() : end.is_object() ? end.value("detail", end.dump()) : "";
  }

  // The ranks, as their nodes last published them.
  std::vector<server::PageRank> rows;
  std::vector<jobs::RankRate> live;
  for (const auto& [rank, rt] : t.ranks) {
    server::PageRank r;
    r.rank = rank;
    r.node = rt.latest.node;
    r.reports = true;
    // Alive while the job runs and its node keeps publishing (three periods' grace).
    const double age_s = static_cast<double>(now - rt.at_ms) / 1e3;
    r.alive = state == "running" && age_s < 3 * t.period_s + 5;
    r.step = rt.latest.step.value_or(0);
    r.idle_seconds = rt.latest.idle_seconds ? *rt.latest.idle_seconds + std::max(0.0, age_s) : std::max(0.0, age_s);
    r.waiting = rt.latest.waiting.value_or(false);
    // The figures over the latest publications (about kWindowSeconds, as the agent's page): one
    // publication may cover a fraction of a second (a run's first), too little to judge a rank by.
    const jobs::RankRate window = over_window(rt.recent);
    r.steps_per_second = window.steps_per_second;
    r.step_ms = window.compute_ms_per_step;
    if (!r.step_ms && window.steps_per_second > 0) r.step_ms = 1e3 / window.steps_per_second;
    if (r.alive && window.seconds >= kLeastSecondsJudged) live.push_back(window);
    rows.push_back(r);
  }
  for (const int slow : jobs::marked_stragglers(live, s_.straggler_factor)) {
    for (auto& r : rows) r.straggler = r.straggler || r.rank == slow;
  }
  server::order_for_page(rows);
  int alive = 0, stragglers = 0;
  json listed = json::array();
  for (const auto& r : rows) {
    alive += r.alive ? 1 : 0;
    stragglers += r.straggler ? 1 : 0;
    if (listed.size() < s_.max_listed) listed.push_back(server::to_json(r));
  }
  std::vector<server::HeatTrack> tracks;
  size_t columns = 0;
  for (const auto& [rank, rt] : t.ranks) {
    tracks.push_back({rank, &rt.heat});
    columns = std::max(columns, rt.heat.size());
  }

  json timeline = json::array();
  if (!t.first_event.is_null()) timeline.push_back(t.first_event);
  for (const auto& e : t.events) timeline.push_back(e);
  json report = nullptr;
  if (s.contains("end")) {
    const json& end = s["end"];
    report = {{"outcome", state}};
    if (state == "hung") {
      report["hang"] = {{"summary", detail}};
    } else if (end.is_object() && end.contains("rank")) {
      report["root_cause"] = end;
    } else {
      report["message"] = detail;
    }
  }
  json nodes = json::array();
  for (const json& n : s["nodes"]) {
    json x{{"host", n.value("host", "")}, {"node_rank", n.value("node_rank", -1)}, {"nproc", n.value("nproc", 0)}};
    if (n.contains("last_heartbeat_age_s")) x["heartbeat_age_s"] = n["last_heartbeat_age_s"];
    nodes.push_back(std::move(x));
  }
  return json{{"schema", "ddprun-job-view/1"},
              {"source", "daemon"},
              {"time_ms", now},
              {"run_id", run_id},
              {"generation", generation},
              {"host", ""},
              {"node", -1},
              {"nodes", nnodes},
              {"node_list", std::move(nodes)},
              {"phase",
               {{"name", state},
                {"detail", detail},
                {"ok", good_state(state)},
                {"seconds", t.state_since_ms > 0 ? (now - t.state_since_ms) / 1000 : 0}}},
              {"round", s.value("round", int64_t{-1})},
              {"restarts", restarts},
              {"world_size", s.value("world_size", 0)},
              {"publish_period_s", server::rounded(t.period_s, 1)},
              {"ranks_here", rows.size()},
              {"workers_alive", alive},
              {"stragglers", stragglers},
              {"ranks", listed},
              {"ranks_not_listed", rows.size() - listed.size()},
              {"heat", server::heat_map(tracks, columns, s_.max_rows, static_cast<int64_t>(t.period_s * 1000))},
              {"timeline", std::move(timeline)},
              {"timeline_dropped", t.dropped},
              {"report", std::move(report)},
              {"hang_report", false}};
}

std::optional<HttpReply> JobsPage::serve(const HttpRequest& request) {
  const std::string_view path = server::page_path(request.target);
  if (path != "/ui" && path != "/ui.js" && path != "/ui.css" && path != "/api/jobs" && path != "/api/job") {
    return std::nullopt;
  }
  if (!may_look(request.peer)) {
    return server::refused_elsewhere(
        server_.protected_store() ? "the jobs' page names the jobs of a protected store, their hosts and failures"
                                  : "the jobs' page is for the peers this store admits");
  }
  if (auto refused = hosts_.refuse(request)) return refused;
  if (auto file = server::page_file(path)) return file;
  const int64_t now = now_ms();
  if (path == "/api/jobs") return server::json_reply(jobs(now));
  const std::string id = server::query_value(request.target, "job");
  if (path == "/ui" && id.empty())
    return server::page_reply(server::render_page(jobs(now)), "text/html; charset=utf-8");
  HttpReply missing;
  missing.status = id.empty() ? 400 : 404;
  missing.body = id.empty() ? "which job? /api/job?job=RUN_ID (the jobs: /api/jobs)\n"
                            : "no job '" + id + "' on this store (the jobs it holds: /api/jobs, or /ui)\n";
  const auto view = id.empty() ? std::nullopt : job(id, now);
  if (!view) return missing;
  if (path == "/api/job") return server::json_reply(*view);
  return server::page_reply(server::render_page(*view), "text/html; charset=utf-8");
}

}  // namespace ddprun::rdzv::daemon
