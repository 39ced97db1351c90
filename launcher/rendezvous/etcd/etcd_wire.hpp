#pragma once
// Inside the etcd client (etcd_client.hpp): what Client and Watch share. The JSON shapes of etcd's
// gateway, the errors it answers with, and one HTTP/1.1 connection to one member, plain or TLS.
// Not for use outside launcher/etcd_*.cpp.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/printable.hpp"
#include "launcher/rendezvous/etcd/etcd_client.hpp"
#include "common/json_fields.hpp"

namespace ddprun::launcher::rendezvous::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// gRPC status codes etcd answers with.
constexpr int kNotFound = 5;
constexpr int kUnavailable = 14;
constexpr int kUnauthenticated = 16;

// An int64 field of etcd's JSON answers (they travel as strings), read without throwing: a
// missing field is etcd's way of saying zero. Other fields: common/json_fields.hpp.
int64_t int64_of(const json& j, const char* name);
KeyValue kv_of(const json& j);
RangeResult range_of(const json& j);
json op_json(const Op& op);
// The gRPC code and message of an error answer (from the HTTP status when the body has none).
std::pair<int, std::string> error_of(const std::string& text, int http_status);
// Whether another member, or the same one a moment later, may answer otherwise.
bool transient(int code, const std::string& message);

// The TLS settings shared by a client's connections and its watches.
class TlsContext {
 public:
  explicit TlsContext(const Options& o);
  asio::ssl::context ctx{asio::ssl::context::tls_client};
};

// One HTTP/1.1 connection to one member, plain or TLS, driven synchronously on an io_context of
// its own: each operation runs until it completes or its deadline passes.
class Connection {
 public:
  Connection(const Endpoint& ep, TlsContext* tls) : ep_(ep) {
    if (ep.tls) {
      tls_.emplace(io_, tls->ctx);
    } else {
      tcp_.emplace(io_);
    }
  }

  void connect(Clock::time_point deadline) {
    asio::ip::tcp::resolver resolver(io_);
    boost::system::error_code ec;
    const auto results = resolver.resolve(ep_.host, ep_.port, ec);
    if (ec) throw ConnectionError("cannot resolve " + ep_.text + ": " + ec.message());
    lowest().expires_at(deadline);
    bool done = false;
    lowest().async_connect(results, [&](const boost::system::error_code& e, const auto&) {
      ec = e;
      done = true;
    });
    run(done);
    refused_ = ec == asio::error::connection_refused;
    if (ec) throw ConnectionError("cannot connect to " + ep_.text + ": " + ec.message());
    if (tls_) {
      // SNI and the certificate's name (or IP address) checked against the endpoint.
      SSL_set_tlsext_host_name(tls_->native_handle(), ep_.host.c_str());
      tls_->set_verify_callback(asio::ssl::host_name_verification(ep_.host));
      lowest().expires_at(deadline);
      done = false;
      tls_->async_handshake(asio::ssl::stream_base::client, [&](const boost::system::error_code& e) {
        ec = e;
        done = true;
      });
      run(done);
      if (ec && ec.category() == asio::error::get_ssl_category() &&
          ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        // Not a member that is down: trying again or elsewhere cannot help.
        throw ConfigError("etcd at " + ep_.text + ": its TLS certificate does not verify (" + ec.message() +
                          "): give the CA that signed it with --rdzv_conf etcd_ca_file=PATH, and check that the "
                          "certificate names this host or address");
      }
      if (ec) throw ConnectionError("TLS handshake with " + ep_.text + " failed: " + ec.message());
    }
    open_ = true;
  }

  bool is_open() const { return open_; }
  // The last connect() was refused: nothing listens there (the member is not running).
  bool refused() const { return refused_; }

  // One request and its whole answer (at most 64 MiB).
  std::pair<int, std::string> post(const std::string& target, const std::string& body, const std::string& token,
                                   Clock::time_point deadline) {
    constexpr uint64_t kMostBody = 64u << 20;
    send(target, body, token, deadline);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMostBody);
    boost::system::error_code ec;
    bool done = false;
    lowest().expires_at(deadline);
    auto on_read = [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    };
    // The header on its own first: Boost 1.74's parser, given a body's start in the same read as
    // its header, reserves whatever Content-Length claims before it checks the body limit.
    if (tls_) http::async_read_header(*tls_, buffer_, parser, on_read);
    else http::async_read_header(*tcp_, buffer_, parser, on_read);
    run(done);
    if (ec) fail("reading the answer of " + ep_.text, ec);
    if (const auto length = parser.content_length(); length && *length > kMostBody) {
      open_ = false;
      throw ProtocolError(ep_.text + " announced an answer of " + std::to_string(*length) +
                          " bytes, more than etcd ever sends (64 MiB): not read");
    }
    if (!parser.is_done()) {
      done = false;
      if (tls_) http::async_read(*tls_, buffer_, parser, on_read);
      else http::async_read(*tcp_, buffer_, parser, on_read);
      run(done);
      if (ec) fail("reading the answer of " + ep_.text, ec);
    }
    if (!parser.keep_alive()) open_ = false;
    return {parser.get().result_int(), parser.get().body()};
  }

  // A streaming request: sends it and reads the answer's header; the body follows in read_stream.
  int start_stream(const std::string& target, const std::string& body, const std::string& token,
                   Clock::time_point deadline) {
    send(target, body, token, deadline);
    stream_.emplace();
    stream_->body_limit(boost::none);
    stream_->on_chunk_body(on_chunk_);  // the parser keeps a reference: a member outlives it
    boost::system::error_code ec;
    bool done = false;
    lowest().expires_at(deadline);
    auto on_header = [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    };
    if (tls_) http::async_read_header(*tls_, buffer_, *stream_, on_header);
    else http::async_read_header(*tcp_, buffer_, *stream_, on_header);
    run(done);
    if (ec) fail("reading the watch answer of " + ep_.text, ec);
    lowest().expires_never();
    return stream_->get().result_int();
  }

  // What the stream's body brought within `timeout` ("" if nothing yet). Throws ConnectionError
  // when the stream has ended or broken.
  std::string read_stream(std::chrono::milliseconds timeout) {
    if (!reading_) {
      reading_ = true;
      read_done_ = false;
      auto on_read = [this](const boost::system::error_code& e, size_t) {
        read_error_ = e;
        read_done_ = true;
        reading_ = false;
      };
      if (tls_) http::async_read_some(*tls_, buffer_, *stream_, on_read);
      else http::async_read_some(*tcp_, buffer_, *stream_, on_read);
    }
    io_.restart();
    io_.run_for(timeout);
    std::string out = std::move(chunks_);
    chunks_.clear();
    if (!stream_->chunked()) {  // a body delimited by the connection's end
      out += stream_->get().body();
      stream_->get().body().clear();
    }
    if (read_done_ && read_error_) fail("the watch stream from " + ep_.text, read_error_);
    if (read_done_ && stream_->is_done()) {
      open_ = false;
      if (out.empty()) throw ConnectionError("the watch stream from " + ep_.text + " ended");
    }
    return out;
  }

 private:
  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *tcp_; }

  void run(bool& done) {
    io_.restart();
    while (!done && io_.run_one() > 0) {
    }
  }

  [[noreturn]] void fail(const std::string& what, const boost::system::error_code& ec) {
    open_ = false;
    if (ec == beast::error::timeout) throw TimeoutError(what + ": no answer in time");
    throw ConnectionError(what + ": " + ec.message());
  }

  void send(const std::string& target, const std::string& body, const std::string& token, Clock::time_point deadline) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, ep_.host + ":" + ep_.port);
    req.set(http::field::content_type, "application/json");
    req.set(http::field::user_agent, "ddprun");
    if (!token.empty()) req.set(http::field::authorization, token);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    bool done = false;
    lowest().expires_at(deadline);
    auto on_write = [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    };
    if (tls_) http::async_write(*tls_, req, on_write);
    else http::async_write(*tcp_, req, on_write);
    run(done);
    if (ec) fail("sending to " + ep_.text, ec);
  }

  Endpoint ep_;
  asio::io_context io_{1};
  std::optional<beast::tcp_stream> tcp_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buffer_;
  std::optional<http::response_parser<http::string_body>> stream_;
  std::string chunks_;
  std::function<size_t(std::uint64_t, beast::string_view, boost::system::error_code&)> on_chunk_ =
      [this](std::uint64_t, beast::string_view data, boost::system::error_code&) {
        chunks_.append(data.data(), data.size());
        return data.size();
      };
  bool refused_ = false;
  bool open_ = false;
  bool reading_ = false;
  bool read_done_ = false;
  boost::system::error_code read_error_;
};

}  // namespace ddprun::launcher::rendezvous::etcd
