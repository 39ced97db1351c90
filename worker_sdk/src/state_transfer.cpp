#include "state_transfer.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <utility>  // before Boost.Asio (Boost 1.74's headers use std::exchange without it)
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <stdexcept>

#include "common/hex.hpp"

namespace ddprun::worker::ft::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr const char* kMacHeader = "X-Ddprun-Mac";

std::string mac_of(const std::string& key, const char* data, size_t n) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data), n, out,
           &len) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return to_hex(std::string_view(reinterpret_cast<const char*>(out), len));
}

// "[v6]" or "v4" -> the address as Asio reads it.
std::string bare_host(const std::string& host) {
  return host.size() > 1 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
}

}  // namespace

struct StateServer::Impl {
  asio::io_context io{1};
  tcp::acceptor acceptor{io};
  std::string key;
  std::mutex mutex;
  int64_t step = -1;
  std::shared_ptr<const std::vector<char>> bytes;
  std::string mac;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) serve(std::move(socket));
      accept();
    });
  }

  // One request, answered on the server's thread: its peers are the few healing ranks of a job.
  // A peer that sends nothing is cut off after a few seconds (a receive timeout on its socket).
  void serve(tcp::socket socket) {
    boost::system::error_code ec;
    timeval tv{5, 0};
    ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    beast::flat_buffer buffer;
    http::request_parser<http::empty_body> parser;
    parser.header_limit(8 * 1024);
    http::read(socket, buffer, parser, ec);
    if (ec) return;
    std::shared_ptr<const std::vector<char>> body;
    std::string body_mac;
    int64_t served = -1;
    {
      std::lock_guard lock(mutex);
      body = bytes;
      body_mac = mac;
      served = step;
    }
    const std::string wanted = "/state/" + std::to_string(served);
    if (!body || parser.get().target() != wanted) {
      http::response<http::string_body> res{http::status::not_found, 11};
      res.body() = "this rank serves step " + (served < 0 ? std::string("None") : std::to_string(served));
      res.prepare_payload();
      http::write(socket, res, ec);
      return;
    }
    http::response<http::buffer_body> res{http::status::ok, 11};
    res.set(kMacHeader, body_mac);
    res.body().data = const_cast<char*>(body->data());
    res.body().size = body->size();
    res.body().more = false;
    res.content_length(body->size());
    http::write(socket, res, ec);
    socket.shutdown(tcp::socket::shutdown_both, ec);
  }
};

StateServer::StateServer(const std::string& host) : impl_(std::make_unique<Impl>()) {
  unsigned char raw[32];
  if (RAND_bytes(raw, sizeof raw) != 1) throw std::runtime_error("no random bytes for the state key");
  impl_->key.assign(reinterpret_cast<const char*>(raw), sizeof raw);
  const std::string address_text = bare_host(host);
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(address_text, ec);
  if (ec) throw std::runtime_error("cannot serve state on '" + host + "': " + ec.message());
  tcp::endpoint ep(ip, 0);
  impl_->acceptor.open(ep.protocol());
  impl_->acceptor.set_option(tcp::acceptor::reuse_address(true));
  impl_->acceptor.bind(ep, ec);
  if (ec) throw std::runtime_error("cannot serve state on " + host + ": " + ec.message());
  impl_->acceptor.listen();
  ::fcntl(impl_->acceptor.native_handle(), F_SETFD, FD_CLOEXEC);
  const uint16_t port = impl_->acceptor.local_endpoint().port();
  address_ =
      (ip.is_v6() ? "[" + address_text + "]" : address_text) + ":" + std::to_string(port) + "#" + to_hex(impl_->key);
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

StateServer::~StateServer() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void StateServer::offer(int64_t step, std::vector<char> bytes) {
  std::string mac = mac_of(impl_->key, bytes.data(), bytes.size());
  auto shared = std::make_shared<const std::vector<char>>(std::move(bytes));
  std::lock_guard lock(impl_->mutex);
  impl_->step = step;
  impl_->bytes = std::move(shared);
  impl_->mac = std::move(mac);
}

std::vector<char> fetch_state(const std::string& address, int64_t step, std::chrono::milliseconds timeout) {
  const auto hash = address.find('#');
  const auto colon = address.rfind(':', hash);
  if (hash == std::string::npos || colon == std::string::npos || colon == 0)
    throw std::runtime_error("a peer's state address must be host:port#key, not '" + address + "'");
  const std::string host = bare_host(address.substr(0, colon));
  const std::string port = address.substr(colon + 1, hash - colon - 1);
  const auto key_bytes = from_hex(address.substr(hash + 1));
  if (!key_bytes) throw std::runtime_error("a peer's state key must be hex digits, in '" + address + "'");
  const std::string& key = *key_bytes;
  const std::string where = address.substr(0, hash);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    asio::io_context io;
    tcp::socket stream(io);
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    const auto results = resolver.resolve(host, port, ec);
    if (!ec) asio::connect(stream, results, ec);
    if (!ec) {
      // Blocking reads and writes, each bounded by what is left of the timeout.
      const auto left = std::max<std::chrono::milliseconds>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
          std::chrono::milliseconds(100));
      timeval tv{static_cast<time_t>(left.count() / 1000), static_cast<suseconds_t>((left.count() % 1000) * 1000)};
      ::setsockopt(stream.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      ::setsockopt(stream.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    http::response_parser<http::vector_body<char>> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (!ec) {
      http::request<http::empty_body> req{http::verb::get, "/state/" + std::to_string(step), 11};
      req.set(http::field::host, where);
      http::write(stream, req, ec);
    }
    beast::flat_buffer buffer;
    if (!ec) http::read(stream, buffer, parser, ec);
    if (ec)
      throw std::runtime_error("fetching step " + std::to_string(step) + "'s state from " + where + ": " +
                               ec.message());
    auto& res = parser.get();
    if (res.result() == http::status::not_found && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(10));  // sleep override: the peer has not read the quorum yet
      continue;
    }
    if (res.result() != http::status::ok)
      throw std::runtime_error("fetching step " + std::to_string(step) + "'s state from " + where + ": HTTP " +
                               std::to_string(res.result_int()));
    std::vector<char> body = std::move(res.body());
    const std::string mac = std::string(res[kMacHeader]);
    const std::string expected = mac_of(key, body.data(), body.size());
    if (mac.size() != expected.size() || CRYPTO_memcmp(mac.data(), expected.data(), mac.size()) != 0)
      throw std::runtime_error("the state served at " + where + " for step " + std::to_string(step) +
                               " does not carry its peer's MAC: not loaded");
    return body;
  }
}

}  // namespace ddprun::worker::ft::detail
