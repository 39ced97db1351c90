#include "rendezvous/server/web_page.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace ddprun::rdzv::server {

using json = nlohmann::json;

std::string render_page(const json& initial) {
  // Inside <script type="application/json">: a '<' written as \u003c cannot end the element.
  std::string data = initial.dump(-1, ' ', false, json::error_handler_t::replace);
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

std::string_view page_path(std::string_view target) {
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/ui/") return "/ui";  // the page's address with a trailing slash
  if (path.size() > 4 && path.substr(0, 4) == "/ui/") path.remove_prefix(3);  // /ui/ui.js: /ui.js
  return path;
}

std::string query_value(std::string_view target, std::string_view name) {
  const auto q = target.find('?');
  if (q == std::string_view::npos) return "";
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const auto amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    const auto eq = pair.find('=');
    if (pair.substr(0, eq) != name) continue;
    const std::string_view raw = eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      auto hex = [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; };
      if (raw[i] == '%' && i + 2 < raw.size() && hex(raw[i + 1]) && hex(raw[i + 2])) {
        out += static_cast<char>(std::stoi(std::string(raw.substr(i + 1, 2)), nullptr, 16));
        i += 2;
      } else {
        out += raw[i] == '+' ? ' ' : raw[i];
      }
    }
    return out;
  }
  return "";
}

HttpReply page_reply(std::string body, std::string content_type) {
  HttpReply r;
  r.content_type = std::move(content_type);
  r.body = std::move(body);
  r.headers = {{"Content-Security-Policy",
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
               {"X-Content-Type-Options", "nosniff"},
               {"Cache-Control", "no-store"},
               {"Referrer-Policy", "no-referrer"}};
  return r;
}

std::optional<HttpReply> page_file(std::string_view path) {
  if (path == "/ui.js") return page_reply(std::string(page_js()), "text/javascript; charset=utf-8");
  if (path == "/ui.css") return page_reply(std::string(page_css()), "text/css; charset=utf-8");
  return std::nullopt;
}

HttpReply json_reply(const json& view) {
  return page_reply(view.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
}

double rounded(double v, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

json to_json(const PageRank& r) {
  json x{{"rank", r.rank},
         {"node", r.node},
         {"local_rank", r.local_rank},
         {"pid", r.pid},
         {"alive", r.alive},
         {"step", r.step},
         {"idle_s", rounded(r.idle_seconds, 1)},
         {"waiting", r.waiting},
         {"straggler", r.straggler},
         {"steps_per_s", nullptr},
         {"step_ms", nullptr}};
  if (r.steps_per_second) x["steps_per_s"] = rounded(*r.steps_per_second, 2);
  if (r.step_ms) x["step_ms"] = rounded(*r.step_ms, 1);
  return x;
}

void order_for_page(std::vector<PageRank>& ranks) {
  std::stable_sort(ranks.begin(), ranks.end(), [](const PageRank& a, const PageRank& b) {
    if (a.straggler != b.straggler) return a.straggler;
    if (a.step != b.step) return a.step < b.step;
    if (std::abs(a.idle_seconds - b.idle_seconds) >= 1.0) return a.idle_seconds > b.idle_seconds;
    return a.rank < b.rank;
  });
}

json heat_map(const std::vector<HeatTrack>& tracks, size_t columns, size_t max_rows, int64_t tick_ms) {
  json heat{{"tick_ms", tick_ms}, {"columns", columns}, {"metric", "step_ms"}};
  const size_t per_row = tracks.empty() ? 1 : (tracks.size() + max_rows - 1) / max_rows;
  json row_ranks = json::array(), values = json::array();
  for (size_t first = 0; first < tracks.size(); first += per_row) {
    const size_t last = std::min(tracks.size(), first + per_row) - 1;
    row_ranks.push_back(json::array({tracks[first].rank, tracks[last].rank}));
    json v = json::array();
    for (size_t c = 0; c < columns; ++c) {
      float slowest = std::nanf("");
      for (size_t i = first; i <= last; ++i) {
        const std::deque<float>& h = *tracks[i].values;
        if (columns - c > h.size()) continue;  // a shorter track starts later
        const float x = h[h.size() - (columns - c)];
        if (!std::isnan(x) && (std::isnan(slowest) || x > slowest)) slowest = x;
      }
      if (std::isnan(slowest)) {
        v.push_back(nullptr);
      } else {
        v.push_back(rounded(slowest, 1));
      }
    }
    values.push_back(std::move(v));
  }
  heat["ranks_per_row"] = per_row;
  heat["rows"] = std::move(row_ranks);
  heat["values"] = std::move(values);
  return heat;
}

bool from_this_host(const boost::asio::ip::address& peer) {
  if (peer.is_loopback()) return true;
  if (peer.is_v6() && peer.to_v6().is_v4_mapped()) {
    return boost::asio::ip::make_address_v4(boost::asio::ip::v4_mapped, peer.to_v6()).is_loopback();
  }
  return false;
}

HttpReply refused_elsewhere(std::string_view what) {
  HttpReply r;
  r.status = 403;
  r.body = std::string(what) +
           ": it is served to this host only; from elsewhere, forward the port (ssh -L PORT:localhost:PORT HOST) and "
           "open http://localhost:PORT/ui\n";
  return r;
}

}  // namespace ddprun::rdzv::server
