#include "launcher/top/top_fetch.hpp"

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "common/printable.hpp"

namespace ddprun::launcher::top {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;

namespace {

// Most JSON values in an answer: an honest job view has a few tens of thousands (ranks, heat map,
// timeline, report); a body of tiny values ("[[],[],...]") would otherwise cost some 50 bytes of
// memory per byte it has.
constexpr size_t kMaxValues = size_t{1} << 19;

// nlohmann's own DOM builder, told every event of the parse, which it stops (false) at the first
// array or object past `max_depth` or the first value past kMaxValues: the DOM never holds what a
// copy or a destructor would recurse through too deep, nor more values than a view has.
class BoundedDom {
 public:
  BoundedDom(json& result, size_t max_depth) : dom_(result, /*allow_exceptions_=*/false), max_depth_(max_depth) {}

  bool null() { return counted() && dom_.null(); }
  bool boolean(bool v) { return counted() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return counted() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return counted() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return counted() && dom_.number_float(v, s); }
  bool string(json::string_t& v) { return counted() && dom_.string(v); }
  bool binary(json::binary_t& v) { return counted() && dom_.binary(v); }
  bool start_object(size_t n) { return deeper() && dom_.start_object(n); }
  bool key(json::string_t& k) { return dom_.key(k); }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(size_t n) { return deeper() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);
  }

  bool too_deep() const { return too_deep_; }
  bool too_many() const { return too_many_; }

 private:
  bool counted() {
    if (++values_ <= kMaxValues) return true;
    too_many_ = true;
    return false;
  }
  bool deeper() {
    if (!counted()) return false;
    if (++depth_ <= max_depth_) return true;
    too_deep_ = true;
    return false;
  }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  const size_t max_depth_;
  size_t depth_ = 0;
  size_t values_ = 0;
  bool too_deep_ = false;
  bool too_many_ = false;
};

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

// The Host field for `host`:`port` (an IPv6 literal in brackets).
std::string host_field(const std::string& host, uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The start of an error's body, as one printable line.
std::string said(std::string_view body) {
  constexpr size_t kMost = 200;
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.remove_suffix(1);
  return printable_line(body.substr(0, kMost)) + (body.size() > kMost ? "..." : "");
}

}  // namespace

json parse_bounded(std::string_view text, size_t max_depth, bool* too_deep) {
  json result;
  BoundedDom sax(result, max_depth);
  const bool parsed = json::sax_parse(text.begin(), text.end(), &sax);
  if (too_deep) *too_deep = sax.too_deep() || sax.too_many();
  return parsed ? result : json(json::value_t::discarded);
}

std::optional<json> fetch_job_view(const std::string& host, uint16_t port, std::string& why,
                                   const FetchLimits& limits) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  // What the buffer holds is the header and the body's latest read (the parser moves the body out
  // as it goes): bounded, so that no read grows it past that.
  beast::flat_buffer buffer(limits.max_header + (size_t{64} << 10));
  http::request<http::empty_body> req(http::verb::get, "/api/job", 11);
  req.set(http::field::host, host_field(host, port));
  req.set(http::field::user_agent, "ddprun-top");
  // The limits hold while the answer is read, whatever Content-Length it claims (one larger than
  // the body limit fails at the header, before any of the body is stored) and however it arrives.
  http::response_parser<http::string_body> parser;
  parser.header_limit(limits.max_header);
  parser.body_limit(limits.max_body);
  asio::ip::tcp::resolver resolver(io);
  beast::error_code failed;
  stream.expires_after(limits.timeout);
  // Each step's error ends the chain in `failed`.
  auto read = [&](beast::error_code ec, size_t) { failed = ec; };
  // The header first, on its own: Beast 1.74's response parser, reading eagerly, goes on into a
  // body whose Content-Length it has just found over the limit when the body's start came in the
  // same read as the header (it reserves the length claimed, and stores the body whole).
  auto header = [&](beast::error_code ec, size_t) {
    const auto length = ec ? boost::none : parser.content_length();
    if (!ec && length && *length > limits.max_body) ec = http::error::body_limit;
    if (ec) {
      failed = ec;
    } else {
      http::async_read(stream, buffer, parser, read);
    }
  };
  auto write = [&](beast::error_code ec, size_t) {
    if (ec) {
      failed = ec;
    } else {
      http::async_read_header(stream, buffer, parser, header);
    }
  };
  auto connected = [&](beast::error_code ec, const asio::ip::tcp::endpoint&) {
    if (ec) {
      failed = ec;
    } else {
      http::async_write(stream, req, write);
    }
  };
  resolver.async_resolve(host, std::to_string(port),
                         [&](beast::error_code ec, const asio::ip::tcp::resolver::results_type& r) {
                           if (ec) {
                             failed = ec;
                           } else {
                             stream.async_connect(r, connected);
                           }
                         });
  io.run();
  const std::string not_ddprun = " (is this a ddprun's --http_port?)";
  if (failed == http::error::body_limit) {
    why = "the answer is larger than " + mib(limits.max_body) + ", far more than a job view" + not_ddprun;
    return std::nullopt;
  }
  if (failed == http::error::header_limit || failed == http::error::buffer_overflow) {
    why = "the answer's header is larger than " + std::to_string(limits.max_header >> 10) + " KiB" + not_ddprun;
    return std::nullopt;
  }
  if (failed == beast::error::timeout) {
    why = "no whole answer within " + std::to_string(limits.timeout.count() / 1000) + " s" + not_ddprun;
    return std::nullopt;
  }
  if (failed) {
    why = failed.message();
    return std::nullopt;
  }
  const auto& res = parser.get();
  if (res.result_int() != 200) {
    why = "HTTP " + std::to_string(res.result_int()) + ": " + said(res.body());
    return std::nullopt;
  }
  bool too_deep = false;
  json j = parse_bounded(res.body(), limits.max_depth, &too_deep);
  if (too_deep) {
    why = "the answer nests deeper than " + std::to_string(limits.max_depth) + " levels or holds more than " +
          std::to_string(kMaxValues) + " values, which no job view does" + not_ddprun;
    return std::nullopt;
  }
  const auto schema = j.is_object() ? j.find("schema") : j.end();
  if (!j.is_object() || schema == j.end() || *schema != "ddprun-job-view/1") {
    why = "the answer is no ddprun job view" + not_ddprun;
    return std::nullopt;
  }
  return j;
}

}  // namespace ddprun::launcher::top
