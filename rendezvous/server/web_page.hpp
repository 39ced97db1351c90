#pragma once
// The job page (docs/job-views.md): its files (page/job.{html,js,css}, carried in the binary) and
// the parts of its answers that ddprun's agent (--http_port) and the daemon (--metrics-port) share.
// The page is self-contained: it loads nothing from elsewhere, and every answer carries a
// Content-Security-Policy that says so. It polls api/job (an agent's job, or a daemon's with the
// page's own query: api/job?job=RUN_ID) or, on a daemon's list of jobs, api/jobs.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/ip/address.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/server/http_server.hpp"

namespace ddprun::rdzv::server {

std::string_view page_html();
std::string_view page_js();
std::string_view page_css();

// The page with `initial` (a job's snapshot, "ddprun-job-view/1", or a list of jobs,
// "ddprun-jobs/1") in it, so that it shows something before its first poll.
std::string render_page(const nlohmann::json& initial);

// A request's path without its query; /ui/X is /X (a link relative to /ui/ still works).
std::string_view page_path(std::string_view target);
// The value of `name` in the request's query ("" when absent), %-decoded.
std::string query_value(std::string_view target, std::string_view name);

// An answer with the page's header fields (the CSP, no caching, no sniffing, no referrer).
HttpReply page_reply(std::string body, std::string content_type);
// The answer for /ui.js and /ui.css; nullopt for any other path.
std::optional<HttpReply> page_file(std::string_view path);
// `view` as JSON, with the page's header fields.
HttpReply json_reply(const nlohmann::json& view);

// A loopback peer (IPv4-mapped ones too): someone on this host, or a tunnel to it.
bool from_this_host(const boost::asio::ip::address& peer);
// 403, with what the page holds and how to reach it anyway (ssh -L to this host).
HttpReply refused_elsewhere(std::string_view what);

}  // namespace ddprun::rdzv::server
