#include "launcher/etcd_client.hpp"

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

#include "common/log.hpp"

namespace ddprun::launcher::etcd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// gRPC status codes etcd answers with.
constexpr int kNotFound = 5;
constexpr int kUnavailable = 14;
constexpr int kUnauthenticated = 16;

std::string prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string base64_encode(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64_decode(const std::string& text) {
  if (text.empty()) return "";
  if (text.size() % 4 != 0) throw ProtocolError("etcd sent a base64 value whose length is not a multiple of 4");
  std::string out(3 * text.size() / 4, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) throw ProtocolError("etcd sent a value that is not base64");
  size_t len = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding as zero bytes.
  for (auto it = text.rbegin(); it != text.rend() && *it == '='; ++it) --len;
  out.resize(len);
  return out;
}

Endpoint parse_endpoint(const std::string& text) {
  Endpoint ep;
  std::string rest = text;
  if (rest.rfind("https://", 0) == 0) {
    ep.tls = true;
    rest = rest.substr(8);
  } else if (rest.rfind("http://", 0) == 0) {
    rest = rest.substr(7);
  } else if (rest.find("://") != std::string::npos) {
    throw ConfigError("etcd endpoint '" + text + "': the scheme must be http:// or https://");
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string port = "2379";
  if (!rest.empty() && rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos) throw ConfigError("etcd endpoint '" + text + "': unclosed '['");
    ep.host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw ConfigError("etcd endpoint '" + text + "': expected ':' after ']'");
      port = rest.substr(close + 2);
    }
  } else {
    const auto colon = rest.rfind(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) port = rest.substr(colon + 1);
  }
  const bool numeric = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (ep.host.empty() || !numeric || std::stoi(port) == 0 || std::stoi(port) > 65535) {
    throw ConfigError("etcd endpoint '" + text + "': expected host:port, http://host:port or https://host:port");
  }
  ep.port = port;
  const bool v6 = ep.host.find(':') != std::string::npos;
  ep.text = std::string(ep.tls ? "https://" : "http://") + (v6 ? "[" + ep.host + "]" : ep.host) + ":" + port;
  return ep;
}

namespace {

int64_t int64_of(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    try {
      return std::stoll(it->get<std::string>());
    } catch (const std::exception&) {
      throw ProtocolError(std::string("etcd sent a non-numeric ") + name);
    }
  }
  return 0;
}

KeyValue kv_of(const json& j) {
  KeyValue kv;
  kv.key = base64_decode(j.value("key", ""));
  kv.value = base64_decode(j.value("value", ""));
  kv.create_revision = int64_of(j, "create_revision");
  kv.mod_revision = int64_of(j, "mod_revision");
  kv.version = int64_of(j, "version");
  kv.lease = int64_of(j, "lease");
  return kv;
}

RangeResult range_of(const json& j) {
  RangeResult r;
  if (auto h = j.find("header"); h != j.end()) r.revision = int64_of(*h, "revision");
  if (auto kvs = j.find("kvs"); kvs != j.end() && kvs->is_array()) {
    for (const json& kv : *kvs) r.kvs.push_back(kv_of(kv));
  }
  r.count = int64_of(j, "count");
  return r;
}

json op_json(const Op& op) {
  switch (op.kind) {
    case Op::Kind::Put: {
      json p = {{"key", base64_encode(op.key)}, {"value", base64_encode(op.value)}};
      if (op.lease) p["lease"] = std::to_string(op.lease);
      return {{"request_put", p}};
    }
    case Op::Kind::Range: {
      json r = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) r["range_end"] = base64_encode(op.range_end);
      return {{"request_range", r}};
    }
    case Op::Kind::Delete: {
      json d = {{"key", base64_encode(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = base64_encode(op.range_end);
      return {{"request_delete_range", d}};
    }
  }
  return json::object();
}

// An error answer: {"error": ..., "message": ..., "code": N}.
std::pair<int, std::string> error_of(const std::string& text, int http_status) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_object() && j.contains("code")) {
    return {static_cast<int>(int64_of(j, "code")), j.value("message", j.value("error", std::string("(no message)")))};
  }
  return {http_status == 503 ? kUnavailable : -1,
          "HTTP " + std::to_string(http_status) + ": " + text.substr(0, 200)};
}

bool transient(int code, const std::string& message) {
  return code == kUnavailable || message.find("leader changed") != std::string::npos ||
         message.find("no leader") != std::string::npos || message.find("timed out") != std::string::npos ||
         message.find("not capable") != std::string::npos || message.find("too many requests") != std::string::npos;
}

}  // namespace

// The TLS settings shared by a client's connections and its watches.
class TlsContext {
 public:
  explicit TlsContext(const Options& o);
  asio::ssl::context ctx{asio::ssl::context::tls_client};
};

TlsContext::TlsContext(const Options& o) {
  boost::system::error_code ec;
  if (!o.ca_file.empty()) {
    ctx.load_verify_file(o.ca_file, ec);
    if (ec) throw ConfigError("etcd ca_file '" + o.ca_file + "': " + ec.message());
  } else {
    ctx.set_default_verify_paths(ec);
  }
  if (!o.cert_file.empty()) {
    ctx.use_certificate_chain_file(o.cert_file, ec);
    if (ec) throw ConfigError("etcd cert_file '" + o.cert_file + "': " + ec.message());
    ctx.use_private_key_file(o.key_file.empty() ? o.cert_file : o.key_file, asio::ssl::context::pem, ec);
    if (ec) throw ConfigError("etcd key_file '" + o.key_file + "': " + ec.message());
  }
  ctx.set_verify_mode(asio::ssl::verify_peer);
}

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

  // One request and its whole answer.
  std::pair<int, std::string> post(const std::string& target, const std::string& body, const std::string& token,
                                   Clock::time_point deadline) {
    send(target, body, token, deadline);
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    boost::system::error_code ec;
    bool done = false;
    lowest().expires_at(deadline);
    auto on_read = [&](const boost::system::error_code& e, size_t) {
      ec = e;
      done = true;
    };
    if (tls_) http::async_read(*tls_, buffer_, parser, on_read);
    else http::async_read(*tcp_, buffer_, parser, on_read);
    run(done);
    if (ec) fail("reading the answer of " + ep_.text, ec);
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
  bool open_ = false;
  bool reading_ = false;
  bool read_done_ = false;
  boost::system::error_code read_error_;
};

Client::Client(Options options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw ConfigError("no etcd endpoint: give --rdzv_endpoint host:port[,host:port...]");
  bool tls = false;
  for (const std::string& e : options_.endpoints) {
    endpoints_.push_back(parse_endpoint(e));
    tls = tls || endpoints_.back().tls;
  }
  if (!options_.user.empty() && options_.password.empty()) {
    throw ConfigError("etcd user '" + options_.user + "' needs a password (--rdzv_conf etcd_password_file=PATH)");
  }
  if (tls) tls_ = std::make_unique<TlsContext>(options_);
}

Client::~Client() { conn_.reset(); }

std::string Client::endpoints_text() const {
  std::string out;
  for (const auto& e : endpoints_) out += (out.empty() ? "" : ", ") + e.text;
  return out;
}

size_t Client::preferred_endpoint() const {
  std::lock_guard lock(mutex_);
  return current_;
}

std::string Client::authenticate(Deadline deadline) {
  const json body = {{"name", options_.user}, {"password", options_.password}};
  const std::string text = call("/v3/auth/authenticate", body.dump(), deadline, /*anonymous=*/true);
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("token") || !j["token"].is_string()) {
    throw ProtocolError("etcd's authenticate answer has no token");
  }
  return j["token"].get<std::string>();
}

std::string Client::token(Deadline deadline) {
  if (options_.user.empty()) return "";
  std::lock_guard lock(mutex_);
  if (token_.empty()) token_ = authenticate(deadline);
  return token_;
}

void Client::token_rejected(const std::string& token) {
  std::lock_guard lock(mutex_);
  if (token_ == token) token_.clear();
}

std::string Client::call(const std::string& path, const std::string& body, Deadline deadline, bool anonymous) {
  std::string last_error = "no attempt was made before the deadline";
  auto backoff = std::chrono::milliseconds(50);
  bool renewed_token = false;
  size_t tried = 0;
  for (;;) {
    const auto now = Clock::now();
    if (now >= deadline && tried > 0) {
      throw ConnectionError("etcd (" + endpoints_text() + ") did not answer " + path + " in time; last error: " + last_error);
    }
    const Endpoint& ep = endpoints_[current_];
    ++tried;
    try {
      const auto attempt_deadline = std::min(deadline, now + options_.attempt_timeout);
      if (!anonymous && !options_.user.empty() && token_.empty()) token_ = authenticate(deadline);
      if (!conn_ || !conn_->is_open()) {
        conn_ = std::make_unique<Connection>(ep, tls_.get());
        conn_->connect(attempt_deadline);
      }
      auto [status, text] = conn_->post(path, body, anonymous ? "" : token_, attempt_deadline);
      if (status == 200) return text;
      auto [code, message] = error_of(text, status);
      if (code == kUnauthenticated && !anonymous && !options_.user.empty() && !renewed_token) {
        token_.clear();  // expired: one new token, then the request again
        renewed_token = true;
        continue;
      }
      if (!transient(code, message)) throw EtcdError(code, "etcd at " + ep.text + ": " + message);
      last_error = ep.text + ": " + message;
    } catch (const EtcdError&) {
      throw;
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      last_error = e.what();
      conn_.reset();
    }
    // The next member, after a short pause (a leader election takes about a second).
    current_ = (current_ + 1) % endpoints_.size();
    conn_.reset();
    const auto pause = std::min<Clock::duration>(backoff, deadline - Clock::now());
    if (pause > Clock::duration::zero()) std::this_thread::sleep_for(pause);  // sleep override: backoff between members
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
}

RangeResult Client::range(const std::string& key, const std::string& range_end, Deadline deadline, bool keys_only) {
  json body = {{"key", base64_encode(key)}};
  if (!range_end.empty()) body["range_end"] = base64_encode(range_end);
  if (keys_only) body["keys_only"] = true;
  std::lock_guard lock(mutex_);
  return range_of(json::parse(call("/v3/kv/range", body.dump(), deadline)));
}

int64_t Client::put(const std::string& key, const std::string& value, int64_t lease, Deadline deadline) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  std::lock_guard lock(mutex_);
  const json j = json::parse(call("/v3/kv/put", body.dump(), deadline));
  return j.contains("header") ? int64_of(j["header"], "revision") : 0;
}

int64_t Client::erase(const std::string& key, const std::string& range_end, Deadline deadline) {
  json body = {{"key", base64_encode(key)}};
  if (!range_end.empty()) body["range_end"] = base64_encode(range_end);
  std::lock_guard lock(mutex_);
  return int64_of(json::parse(call("/v3/kv/deleterange", body.dump(), deadline)), "deleted");
}

TxnResult Client::txn(const std::vector<Compare>& compares, const std::vector<Op>& success,
                      const std::vector<Op>& failure, Deadline deadline) {
  json cmp = json::array();
  for (const Compare& c : compares) {
    json x = {{"key", base64_encode(c.key)}, {"result", "EQUAL"}};
    switch (c.target) {
      case Compare::Target::Create:
        x["target"] = "CREATE";
        x["create_revision"] = std::to_string(c.revision);
        break;
      case Compare::Target::Mod:
        x["target"] = "MOD";
        x["mod_revision"] = std::to_string(c.revision);
        break;
      case Compare::Target::Value:
        x["target"] = "VALUE";
        x["value"] = base64_encode(c.value);
        break;
    }
    cmp.push_back(std::move(x));
  }
  json ok = json::array(), ko = json::array();
  for (const Op& op : success) ok.push_back(op_json(op));
  for (const Op& op : failure) ko.push_back(op_json(op));
  const json body = {{"compare", cmp}, {"success", ok}, {"failure", ko}};
  std::lock_guard lock(mutex_);
  const json j = json::parse(call("/v3/kv/txn", body.dump(), deadline));
  TxnResult r;
  r.succeeded = j.value("succeeded", false);
  if (j.contains("header")) r.revision = int64_of(j["header"], "revision");
  if (auto resp = j.find("responses"); resp != j.end() && resp->is_array()) {
    for (const json& x : *resp) {
      if (auto rr = x.find("response_range"); rr != x.end()) r.ranges.push_back(range_of(*rr));
    }
  }
  return r;
}

std::string Client::create_or_get(const std::string& key, const std::string& value, int64_t lease, Deadline deadline) {
  const TxnResult r = txn({Compare::absent(key)}, {Op::put(key, value, lease)}, {Op::get(key)}, deadline);
  if (r.succeeded) return value;
  if (r.ranges.empty() || r.ranges[0].kvs.empty()) return create_or_get(key, value, lease, deadline);  // deleted meanwhile
  return r.ranges[0].kvs[0].value;
}

int64_t Client::lease_grant(std::chrono::seconds ttl, Deadline deadline) {
  const json body = {{"TTL", std::to_string(ttl.count())}};
  std::lock_guard lock(mutex_);
  const json j = json::parse(call("/v3/lease/grant", body.dump(), deadline));
  const int64_t id = int64_of(j, "ID");
  if (id == 0) throw ProtocolError("etcd granted a lease without an ID: " + j.dump().substr(0, 200));
  return id;
}

int64_t Client::lease_keepalive(int64_t id, Deadline deadline) {
  const json body = {{"ID", std::to_string(id)}};
  std::lock_guard lock(mutex_);
  const json j = json::parse(call("/v3/lease/keepalive", body.dump(), deadline));
  // A stream of one answer: {"result": {"ID": ..., "TTL": ...}}; no TTL: the lease is gone.
  const json& r = j.contains("result") ? j["result"] : j;
  return int64_of(r, "TTL");
}

void Client::lease_revoke(int64_t id, Deadline deadline) {
  const json body = {{"ID", std::to_string(id)}};
  std::lock_guard lock(mutex_);
  try {
    call("/v3/lease/revoke", body.dump(), deadline);
  } catch (const EtcdError& e) {
    if (e.code() != kNotFound) throw;  // expired already
  }
}

Watch::Watch(Client& client, std::string key, std::string range_end, int64_t start_revision,
             std::vector<std::string> present)
    : client_(client),
      key_(std::move(key)),
      range_end_(std::move(range_end)),
      next_revision_(start_revision),
      present_(present.begin(), present.end()) {
  endpoint_ = client_.preferred_endpoint();
}

std::vector<WatchEvent> Watch::resync(int64_t compacted, Client::Deadline deadline) {
  const RangeResult now = client_.range(key_, range_end_, deadline);
  log::warn("ddprun") << "etcd compacted its history past this watch (it resumes at revision " << next_revision_
                      << ", the oldest kept is " << compacted << "): read the keys afresh at revision " << now.revision;
  std::vector<WatchEvent> events;
  std::set<std::string> seen;
  for (const KeyValue& kv : now.kvs) {
    seen.insert(kv.key);
    if (kv.mod_revision >= next_revision_ || present_.count(kv.key) == 0) {
      WatchEvent ev;
      ev.type = WatchEvent::Type::Put;
      ev.kv = kv;
      events.push_back(std::move(ev));
    }
  }
  for (const std::string& k : present_) {
    if (seen.count(k) != 0) continue;
    WatchEvent ev;
    ev.type = WatchEvent::Type::Delete;
    ev.kv.key = k;
    ev.kv.mod_revision = now.revision;
    events.push_back(std::move(ev));
  }
  present_ = std::move(seen);
  next_revision_ = now.revision + 1;
  return events;
}

Watch::~Watch() = default;

bool Watch::open(Client::Deadline deadline) {
  const auto& eps = client_.endpoints();
  // progress_notify: an idle watch still learns how far etcd's history has gone (every 10 minutes
  // by default), so that resuming it elsewhere seldom needs a compacted revision.
  json create = {{"key", base64_encode(key_)}, {"start_revision", std::to_string(next_revision_)},
                 {"progress_notify", true}};
  if (!range_end_.empty()) create["range_end"] = base64_encode(range_end_);
  const std::string body = json{{"create_request", create}}.dump();
  for (size_t i = 0; i < eps.size(); ++i) {
    const Endpoint& ep = eps[endpoint_];
    try {
      const std::string token = client_.token(deadline);
      auto conn = std::make_unique<Connection>(ep, client_.tls());
      const auto attempt = std::min(deadline, Clock::now() + client_.options().attempt_timeout);
      conn->connect(attempt);
      const int status = conn->start_stream("/v3/watch", body, token, attempt);
      if (status == 401 && !token.empty()) client_.token_rejected(token);
      if (status == 200) {
        conn_ = std::move(conn);
        pending_.clear();
        return true;
      }
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      DDPRUN_LOG_DEBUG("ddprun") << "etcd watch on " << ep.text << ": " << e.what();
    }
    endpoint_ = (endpoint_ + 1) % eps.size();
  }
  return false;
}

std::vector<WatchEvent> Watch::next(std::chrono::milliseconds timeout, Client::Deadline give_up) {
  const auto until = Clock::now() + timeout;
  std::vector<WatchEvent> events;
  for (;;) {
    if (!conn_) {
      if (!open(std::max(until, std::min(give_up, Clock::now() + client_.options().attempt_timeout)))) {
        if (Clock::now() >= give_up) {
          throw ConnectionError("no etcd member (" + client_.endpoints_text() + ") serves a watch");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // sleep override: every member refused; retry
        if (Clock::now() >= until) return events;
        continue;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    try {
      pending_ += conn_->read_stream(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      // The member went away (or closed the stream): reopen on the next one from where we were.
      DDPRUN_LOG_DEBUG("ddprun") << "etcd watch: " << e.what() << "; reopening";
      conn_.reset();
      endpoint_ = (endpoint_ + 1) % client_.endpoints().size();
      if (Clock::now() >= until) return events;
      continue;
    }
    for (auto nl = pending_.find('\n'); nl != std::string::npos; nl = pending_.find('\n')) {
      const std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      const json j = json::parse(line, nullptr, false);
      if (!j.is_object()) throw ProtocolError("etcd sent a watch message that is not JSON: " + line.substr(0, 200));
      if (j.contains("error")) {
        auto [code, message] = error_of(line, 0);
        if (code == kUnauthenticated) {
          conn_.reset();
          client_.token_rejected(client_.token(give_up));
          break;
        }
        if (transient(code, message)) {
          conn_.reset();
          break;
        }
        throw EtcdError(code, "etcd watch: " + message);
      }
      const json& r = j.contains("result") ? j["result"] : j;
      if (r.value("canceled", false)) {
        const int64_t compacted = int64_of(r, "compact_revision");
        if (compacted > 0) {
          conn_.reset();
          for (auto& ev : resync(compacted, std::max(give_up, Clock::now() + client_.options().attempt_timeout))) {
            events.push_back(std::move(ev));
          }
          break;
        }
        throw EtcdError(11, "etcd canceled the watch" + (r.contains("cancel_reason")
                                                             ? ": " + r.value("cancel_reason", std::string())
                                                             : std::string()));
      }
      const auto evs = r.find("events");
      if (evs != r.end() && evs->is_array() && !evs->empty()) {
        for (const json& e : *evs) {
          WatchEvent ev;
          ev.type = e.value("type", std::string("PUT")) == "DELETE" ? WatchEvent::Type::Delete : WatchEvent::Type::Put;
          if (e.contains("kv")) ev.kv = kv_of(e["kv"]);
          next_revision_ = std::max(next_revision_, ev.kv.mod_revision + 1);
          if (ev.type == WatchEvent::Type::Put) present_.insert(ev.kv.key);
          else present_.erase(ev.kv.key);
          events.push_back(std::move(ev));
        }
      } else if (!r.value("created", false)) {
        // A progress notification: etcd sends one only to a watch that has every event up to its
        // header's revision.
        if (auto hdr = r.find("header"); hdr != r.end()) {
          next_revision_ = std::max(next_revision_, int64_of(*hdr, "revision") + 1);
        }
      }
    }
    if (!events.empty() || Clock::now() >= until) return events;
  }
}

}  // namespace ddprun::launcher::etcd
