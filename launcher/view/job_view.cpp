#include "launcher/view/job_view.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/prometheus.hpp"
#include "common/system.hpp"
#include "rendezvous/server/web_page.hpp"

namespace ddprun::launcher::view {

using json = nlohmann::json;
using rdzv::server::rounded;

namespace {

constexpr float kNone = std::numeric_limits<float>::quiet_NaN();

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

JobView::JobView(ViewSettings s) : s_(s) {}

void JobView::set_identity(std::string run_id, std::string host, int node, int nodes) {
  std::lock_guard lock(mutex_);
  run_id_ = std::move(run_id);
  host_ = std::move(host);
  node_ = node;
  nodes_ = nodes;
}

void JobView::set_phase(std::string phase, std::string detail, bool ok, int round) {
  std::lock_guard lock(mutex_);
  if (phase != phase_) phase_since_ = Clock::now();
  phase_ = std::move(phase);
  detail_ = std::move(detail);
  ok_ = ok;
  if (round >= 0) round_ = round;
}

void JobView::new_round(int round, int world_size, int restarts) {
  std::lock_guard lock(mutex_);
  round_ = round;
  world_size_ = world_size;
  restarts_ = restarts;
  for (auto& [rank, t] : tracks_) {
    t.current = false;
    t.points.clear();
    t.previous.reset();
  }
}

void JobView::update(Clock::time_point now, const std::vector<RankReading>& ranks) {
  std::lock_guard lock(mutex_);
  const size_t filled = std::min(ticks_, s_.history);
  for (const RankReading& r : ranks) {
    auto [it, fresh] = tracks_.try_emplace(r.rank);
    Track& t = it->second;
    if (fresh) t.heat.assign(filled, kNone);
    if (t.current && t.latest.pid != r.pid) {
      // Another process for this rank (a restart within the round is not one, but a zygote's
      // fork may reuse nothing): its counters start again.
      t.points.clear();
      t.previous.reset();
    }
    t.current = true;
    t.latest = r;
    const Point p{now, r.last_step != Clock::time_point{} ? r.last_step : now, r.steps, r.wait_ns};
    float value = kNone;
    if (t.previous && p.steps > t.previous->steps && p.at > t.previous->at) {
      value = static_cast<float>(*watchdog::step_time_ms(
          p.at - t.previous->at, p.steps - t.previous->steps,
          p.wait_ns >= t.previous->wait_ns ? p.wait_ns - t.previous->wait_ns : 0, r.reports_waits));
    }
    t.heat.push_back(value);
    t.previous = p;
    t.points.push_back(p);
    while (t.points.size() > s_.window + 1) t.points.pop_front();
  }
  // Every row gets a column for this tick: ranks not read now (another round's) get a gap.
  ++ticks_;
  for (auto& [rank, t] : tracks_) {
    if (t.heat.size() < std::min(ticks_, s_.history)) t.heat.push_back(kNone);
    while (t.heat.size() > s_.history) t.heat.pop_front();
  }
  last_tick_ = now;
}

void JobView::event(std::string kind, std::string text) {
  std::lock_guard lock(mutex_);
  json e{{"t_ms", now_ms()}, {"kind", std::move(kind)}, {"text", std::move(text)}};
  if (first_event_.is_null()) {
    first_event_ = std::move(e);
    return;
  }
  events_.push_back(std::move(e));
  while (events_.size() + 1 > s_.max_events) {
    events_.pop_front();
    ++events_dropped_;
  }
}

void JobView::set_report(json report) {
  std::lock_guard lock(mutex_);
  report_ = std::move(report);
}

void JobView::set_hang_report_file(std::string path) {
  std::lock_guard lock(mutex_);
  hang_report_file_ = std::move(path);
}

std::string JobView::hang_report_file() const {
  std::lock_guard lock(mutex_);
  return hang_report_file_;
}

std::optional<double> JobView::window_step_ms(const Track& t) {
  if (t.points.size() < 2) return std::nullopt;
  const Point& a = t.points.front();
  const Point& b = t.points.back();
  if (b.steps <= a.steps || b.at <= a.at) return std::nullopt;
  return watchdog::step_time_ms(b.at - a.at, b.steps - a.steps, b.wait_ns >= a.wait_ns ? b.wait_ns - a.wait_ns : 0,
                                t.latest.reports_waits);
}

std::optional<double> JobView::window_rate(const Track& t) {
  if (t.points.size() < 2) return std::nullopt;
  const Point& a = t.points.front();
  const Point& b = t.points.back();
  if (b.tick <= a.tick) return std::nullopt;
  return static_cast<double>(b.steps >= a.steps ? b.steps - a.steps : 0) / seconds(b.tick - a.tick);
}

std::vector<RankRow> JobView::rows_locked(Clock::time_point now) const {
  std::vector<RankRow> rows;
  std::vector<watchdog::RankRate> rates;
  for (const auto& [rank, t] : tracks_) {
    if (!t.current) continue;
    RankRow row;
    row.rank = rank;
    row.node = node_;
    row.local_rank = t.latest.local_rank;
    row.pid = t.latest.pid;
    row.alive = t.latest.alive;
    row.reports = t.latest.reports;
    row.step = t.latest.steps;
    row.waiting = t.latest.waiting;
    if (t.latest.last_progress != Clock::time_point{}) {
      row.idle_seconds = std::max(0.0, seconds(now - t.latest.last_progress));
    }
    row.steps_per_second = window_rate(t);
    row.step_ms = window_step_ms(t);
    if (row.alive && row.step_ms) {
      watchdog::RankRate rate;
      rate.rank = rank;
      rate.compute_ms_per_step = row.step_ms;
      rate.steps_per_second = row.steps_per_second.value_or(0);
      rates.push_back(rate);
    }
    rows.push_back(row);
  }
  for (const int slow : rdzv::jobs::marked_stragglers(rates, s_.straggler_factor)) {
    for (auto& row : rows) row.straggler = row.straggler || row.rank == slow;
  }
  rdzv::server::order_for_page(rows);
  return rows;
}

std::vector<RankRow> JobView::rows() const {
  std::lock_guard lock(mutex_);
  return rows_locked(Clock::now());
}

json JobView::snapshot() const {
  std::lock_guard lock(mutex_);
  const auto now = Clock::now();
  const std::vector<RankRow> rows = rows_locked(now);
  json j{{"schema", "ddprun-job-view/1"},
         {"time_ms", now_ms()},
         {"run_id", run_id_},
         {"host", host_},
         {"node", node_},
         {"nodes", nodes_},
         {"phase",
          {{"name", phase_},
           {"detail", detail_},
           {"ok", ok_},
           {"seconds", static_cast<int64_t>(seconds(now - phase_since_))}}},
         {"round", round_},
         {"restarts", restarts_},
         {"world_size", world_size_}};
  int alive = 0, stragglers = 0;
  json listed = json::array();
  for (const RankRow& r : rows) {
    alive += r.alive ? 1 : 0;
    stragglers += r.straggler ? 1 : 0;
    if (listed.size() < s_.max_listed) listed.push_back(rdzv::server::to_json(r));
  }
  j["ranks_here"] = rows.size();
  j["workers_alive"] = alive;
  j["stragglers"] = stragglers;
  j["ranks"] = std::move(listed);
  j["ranks_not_listed"] = rows.size() - j["ranks"].size();

  // The heat map: rows of ranks (binned above max_rows), columns of ticks, oldest first.
  std::vector<rdzv::server::HeatTrack> tracks;
  for (const auto& [rank, t] : tracks_) tracks.push_back({rank, &t.heat});
  j["heat"] = rdzv::server::heat_map(tracks, std::min(ticks_, s_.history), s_.max_rows, 1000);

  json timeline = json::array();
  if (!first_event_.is_null()) timeline.push_back(first_event_);
  for (const auto& e : events_) timeline.push_back(e);
  j["timeline"] = std::move(timeline);
  j["timeline_dropped"] = events_dropped_;
  j["report"] = report_;
  j["hang_report"] = !hang_report_file_.empty();
  return j;
}

std::string JobView::metrics() const {
  using prometheus::label;
  std::lock_guard lock(mutex_);
  const std::vector<RankRow> rows = rows_locked(Clock::now());
  prometheus::Exposition e;
  e.family("ddprun_agent_phase", "gauge", "The agent's phase: 1 for the current one.");
  for (const char* p :
       {"connecting", "rendezvous", "joined", "running", "stopping", "finishing", "restarting", "hung", "ending"}) {
    e.sample("ddprun_agent_phase", phase_ == p ? 1 : 0, label("phase", p));
  }
  e.single("ddprun_agent_round", "gauge", "The rendezvous round being joined or run (-1 before the first).", round_);
  e.single("ddprun_agent_restarts_total", "counter", "Restarts of the worker group since ddprun started.", restarts_);
  int alive = 0;
  for (const auto& r : rows) alive += r.alive ? 1 : 0;
  e.single("ddprun_workers", "gauge", "This node's workers in the current round.", rows.size());
  e.single("ddprun_workers_alive", "gauge", "This node's workers whose process runs.", alive);
  auto by_rank = [&](const char* name, const char* type, const char* help, auto value) {
    e.family(name, type, help);
    for (const auto& r : rows) {
      if (const auto v = value(r)) e.sample(name, *v, label("rank", std::to_string(r.rank)));
    }
  };
  by_rank("ddprun_rank_steps_total", "counter", "Steps the rank's process completed (its progress page).",
          [](const RankRow& r) -> std::optional<double> {
            return r.reports ? std::optional<double>(static_cast<double>(r.step)) : std::nullopt;
          });
  by_rank("ddprun_rank_steps_per_second", "gauge", "The rank's steps per second over the latest seconds.",
          [](const RankRow& r) { return r.steps_per_second; });
  by_rank("ddprun_rank_step_seconds", "gauge",
          "The rank's time per step without its waits on other ranks, over the latest seconds.",
          [](const RankRow& r) -> std::optional<double> {
            return r.step_ms ? std::optional<double>(*r.step_ms / 1e3) : std::nullopt;
          });
  by_rank("ddprun_rank_seconds_since_progress", "gauge", "Seconds since the rank's latest sign of progress.",
          [](const RankRow& r) { return std::optional<double>(rounded(r.idle_seconds, 3)); });
  by_rank("ddprun_rank_waiting", "gauge", "1 when the rank is blocked on other ranks (a collective, the store).",
          [](const RankRow& r) { return std::optional<int>(r.waiting ? 1 : 0); });
  by_rank("ddprun_rank_straggler", "gauge", "1 when the rank's step time is well above the median rank's.",
          [](const RankRow& r) { return std::optional<int>(r.straggler ? 1 : 0); });
  by_rank("ddprun_rank_alive", "gauge", "1 while the rank's process runs.",
          [](const RankRow& r) { return std::optional<int>(r.alive ? 1 : 0); });
  return e.str();
}

}  // namespace ddprun::launcher::view
