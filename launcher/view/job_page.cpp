#include "launcher/view/job_page.hpp"

#include <boost/asio/ip/address.hpp>
#include <fstream>
#include <sstream>

#include "common/prometheus.hpp"

namespace ddprun::launcher::view {

using json = nlohmann::json;
using rdzv::server::HttpReply;
using rdzv::server::HttpRequest;

namespace {

// The hang report is text a person reads; a bigger one is cut (its file has it all).
constexpr size_t kMaxHangReport = size_t{4} << 20;

bool from_this_host(const boost::asio::ip::address& peer) {
  if (peer.is_loopback()) return true;
  if (peer.is_v6() && peer.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, peer.to_v6()).is_loopback();
  }
  return false;
}

HttpReply page_reply(std::string body, const char* type) {
  HttpReply r;
  r.content_type = type;
  r.body = std::move(body);
  r.headers = {{"Content-Security-Policy",
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
               {"X-Content-Type-Options", "nosniff"},
               {"Cache-Control", "no-store"},
               {"Referrer-Policy", "no-referrer"}};
  return r;
}

}  // namespace

std::string render_page(const json& snapshot) {
  // Inside <script type="application/json">: a '<' written as \u003c cannot end the element.
  std::string data = snapshot.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string safe;
  safe.reserve(data.size());
  for (const char c : data) {
    if (c == '<') {
      safe += "\\u003c";
    } else {
      safe += c;
    }
  }
  std::string page(page_html());
  if (const auto at = page.find("@INITIAL@"); at != std::string::npos) page.replace(at, 9, safe);
  return page;
}

std::optional<HttpReply> serve_view(const JobView& view, const HttpRequest& request) {
  std::string_view path = request.target.substr(0, request.target.find('?'));
  if (path.size() > 4 && path.substr(0, 4) == "/ui/") path.remove_prefix(3);  // /ui/ui.js: /ui.js
  if (path == "/metrics") {
    HttpReply r;
    r.content_type = prometheus::kContentType;
    r.body = view.metrics();
    return r;
  }
  const bool page =
      path == "/ui" || path == "/ui.js" || path == "/ui.css" || path == "/api/job" || path == "/hang_report";
  if (!page) return std::nullopt;  // (the health endpoint answers any other path)
  if (!from_this_host(request.peer)) {
    HttpReply r;
    r.status = 403;
    r.body =
        "the job page holds the workers' output and stacks: it is served to this host only; from elsewhere, "
        "forward the port (ssh -L PORT:localhost:PORT HOST) and open http://localhost:PORT/ui\n";
    return r;
  }
  if (path == "/ui") return page_reply(render_page(view.snapshot()), "text/html; charset=utf-8");
  if (path == "/ui.js") return page_reply(std::string(page_js()), "text/javascript; charset=utf-8");
  if (path == "/ui.css") return page_reply(std::string(page_css()), "text/css; charset=utf-8");
  if (path == "/api/job") {
    return page_reply(view.snapshot().dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
  }
  // /hang_report
  const std::string file = view.hang_report_file();
  HttpReply r = page_reply("", "text/plain; charset=utf-8");
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
