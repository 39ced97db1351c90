#include "launcher/view/job_page.hpp"

#include <fstream>

#include "common/prometheus.hpp"
#include "rendezvous/server/web_page.hpp"

namespace ddprun::launcher::view {

using rdzv::server::HttpReply;
using rdzv::server::HttpRequest;

namespace {

// The hang report is text a person reads; a bigger one is cut (its file has it all).
constexpr size_t kMaxHangReport = size_t{4} << 20;

}  // namespace

std::optional<HttpReply> serve_view(const JobView& view, const HttpRequest& request,
                                    const rdzv::server::HostCheck& hosts) {
  const std::string_view path = rdzv::server::page_path(request.target);
  if (path == "/metrics") {
    HttpReply r;
    r.content_type = prometheus::kContentType;
    r.body = view.metrics();
    return r;
  }
  const bool page =
      path == "/ui" || path == "/ui.js" || path == "/ui.css" || path == "/api/job" || path == "/hang_report";
  if (!page) return std::nullopt;  // (the health endpoint answers any other path)
  if (!rdzv::server::from_this_host(request.peer)) {
    return rdzv::server::refused_elsewhere("the job page holds the workers' output and stacks");
  }
  if (auto refused = hosts.refuse(request)) return refused;
  if (auto file = rdzv::server::page_file(path)) return file;
  if (path == "/ui")
    return rdzv::server::page_reply(rdzv::server::render_page(view.snapshot()), "text/html; charset=utf-8");
  if (path == "/api/job") return rdzv::server::json_reply(view.snapshot());
  // /hang_report
  const std::string file = view.hang_report_file();
  HttpReply r = rdzv::server::page_reply("", "text/plain; charset=utf-8");
  std::ifstream in(file, std::ios::binary);
  if (file.empty() || !in) {
    r.status = 404;
    r.body = file.empty() ? "no hang report: the job has not hung\n" : "the hang report " + file + " cannot be read\n";
    return r;
  }
  r.body.resize(kMaxHangReport);
  in.read(r.body.data(), static_cast<std::streamsize>(r.body.size()));
  r.body.resize(static_cast<size_t>(in.gcount()));
  if (r.body.size() == kMaxHangReport) r.body += "\n[cut at 4 MiB: the whole report is in " + file + "]\n";
  return r;
}

}  // namespace ddprun::launcher::view
