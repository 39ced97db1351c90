#pragma once
// The job page (docs/job-views.md): its files (page/job.{html,js,css}, carried in the binary) and
// the parts of its answers that ddprun's agent (--http_port) and the daemon (--metrics-port) share.
// The page is self-contained: it loads nothing from elsewhere, and every answer carries a
// Content-Security-Policy that says so. It polls api/job (an agent's job, or a daemon's with the
// page's own query: api/job?job=RUN_ID) or, on a daemon's list of jobs, api/jobs.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/server/http_server.hpp"

namespace ddprun::rdzv::server {

std::string_view page_html();
std::string_view page_js();
std::string_view page_css();

// The page with `initial` (a job's snapshot, "ddprun-job-view/1", or a list of jobs,
// "ddprun-jobs/1") in it, so that it shows something before its first poll.
std::string render_page(const nlohmann::json& initial);

// A request's path without its query; /ui/ is /ui and /ui/X is /X (a link relative to /ui/ still works).
std::string_view page_path(std::string_view target);
// The value of `name` in the request's query ("" when absent), %-decoded.
std::string query_value(std::string_view target, std::string_view name);

// An answer with the page's header fields (the CSP, no caching, no sniffing, no referrer).
HttpReply page_reply(std::string body, std::string content_type);
// The answer for /ui.js and /ui.css; nullopt for any other path.
std::optional<HttpReply> page_file(std::string_view path);
// `view` as JSON, with the page's header fields.
HttpReply json_reply(const nlohmann::json& view);

// What the page shows of one rank: an element of "ranks" in "ddprun-job-view/1".
struct PageRank {
  int rank = 0;
  int node = -1;
  int local_rank = -1;  // -1: not known (the daemon's page)
  int pid = -1;         // -1: not known (the daemon's page)
  bool alive = false;
  bool reports = false;
  uint64_t step = 0;
  double idle_seconds = 0;                 // since its latest sign of progress
  bool waiting = false;                    // blocked on other ranks now
  std::optional<double> steps_per_second;  // over the latest seconds
  std::optional<double> step_ms;           // step time without its waits on the others
  bool straggler = false;
};
nlohmann::json to_json(const PageRank& r);
// Whom the others wait for first: stragglers, then the fewest steps, then the longest without
// progress, then rank order.
void order_for_page(std::vector<PageRank>& ranks);

// One rank's row of the heat map: a value per tick, oldest first (NaN: no step ended then).
struct HeatTrack {
  int rank = 0;
  const std::deque<float>* values = nullptr;
};
// The "heat" object of "ddprun-job-view/1": `tracks` in rank order, the latest `columns` ticks of
// `tick_ms` each (a shorter track starts later); above `max_rows` tracks, each row is the slowest
// of a run of consecutive ranks.
nlohmann::json heat_map(const std::vector<HeatTrack>& tracks, size_t columns, size_t max_rows, int64_t tick_ms);

// A figure for JSON: rounded to `decimals` places, what a person reads (and what keeps a big
// snapshot small).
double rounded(double v, int decimals);

// A loopback peer (IPv4-mapped ones too): someone on this host, or a tunnel to it.
bool from_this_host(const boost::asio::ip::address& peer);
// 403, with what the page holds and how to reach it anyway (ssh -L to this host).
HttpReply refused_elsewhere(std::string_view what);

}  // namespace ddprun::rdzv::server
