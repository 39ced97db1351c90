#include "rendezvous/client/client.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/host_port.hpp"
#include "common/errors.hpp"
#include "common/hex.hpp"
#include "common/system.hpp"
#include "common/unique_fd.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::client {

namespace {

using Clock = std::chrono::steady_clock;
// The longest one connection attempt lasts before a fresh one is made (Client::connect_locked).
constexpr std::chrono::seconds kConnectAttempt{3};

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline; false on timeout. Retries EINTR.
bool poll_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw std::system_error(errno, std::generic_category(), "poll");
  }
}

// One non-blocking connect attempt to one address; returns the socket, or none with `err` set.
UniqueFd try_connect(const addrinfo* ai, Clock::time_point deadline, int& err) {
  UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!fd) {
    err = errno;
    return fd;
  }
  int rc = retry_eintr([&] { return ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen); });
  if (rc < 0 && errno == EINPROGRESS) {
    if (!poll_fd(fd.get(), POLLOUT, deadline)) {
      err = ETIMEDOUT;
      return UniqueFd();
    }
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    rc = err == 0 ? 0 : -1;
  } else if (rc < 0) {
    err = errno;
  }
  if (rc < 0) return UniqueFd();
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

Client::Client(ClientOptions options) : options_(std::move(options)) {
  std::lock_guard lock(mutex_);
  connect_locked();
}

Client::~Client() {
  std::lock_guard lock(mutex_);
  close_locked();
}

std::string Client::endpoint() const { return format_host_port(options_.host, options_.port); }

bool Client::connected() {
  std::lock_guard lock(mutex_);
  return static_cast<bool>(fd_);
}

void Client::close_locked() {
  fd_.reset();
  refusal_said_ = false;
  expected_server_mac_.reset();
  unsent_proof_.clear();
  rbuf_.clear();
  rpos_ = 0;
}

bool Client::rides_out_outages() {
  std::lock_guard lock(mutex_);
  return tolerant_locked();
}

void Client::learn_durability_locked(Clock::time_point deadline) {
  if (options_.outage_tolerance.count() <= 0 || options_.dialect == core::Dialect::Legacy || no_info_) return;
  const std::string_view key = core::kStoreInfoKey;
  std::string check = request(core::Op::Check);
  core::put_u64(check, 1);
  core::put_bytes(check, key);
  send_locked(check, deadline, "CHECK");
  // The handshake's proof went out with the CHECK: its answer comes first, and a connection lost
  // there says nothing about the store's age.
  settle_proof_locked(deadline);
  std::string info;
  try {
    if (recv_u8(deadline, "CHECK") == core::kCheckReady) {
      std::string get = request(core::Op::Get);
      core::put_bytes(get, key);
      send_locked(get, deadline, "GET");
      info = recv_bytes(deadline, "GET");
    }
  } catch (const ConnectionError&) {
    // An older ddprun-rendezvous closes a job-scoped client that reads outside its job: it keeps
    // no state, and the next connection does not ask again.
    no_info_ = true;
    durable_ = false;
    boot_.clear();
    throw;
  }
  const nlohmann::json j = nlohmann::json::parse(info, nullptr, /*allow_exceptions=*/false);
  const bool object = j.is_object();
  durable_ = object && j.contains("durable") && j["durable"].is_boolean() && j["durable"].get<bool>();
  boot_ = object && j.contains("boot") && j["boot"].is_string() ? j["boot"].get<std::string>() : std::string();
  // Tokens that make a retried ADD count once (ADD_ONCE): unique to this client.
  if (!boot_.empty() && token_prefix_.empty()) token_prefix_ = to_hex(core::random_nonce().substr(0, 12)) + ":";
}

std::string Client::next_once_token() { return token_prefix_ + std::to_string(++token_seq_); }

void Client::open_socket_locked(Clock::time_point deadline, bool refused_is_final, std::string& last_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(options_.host.c_str(), std::to_string(options_.port).c_str(), &hints, &res);
  if (gai != 0) {
    last_error = std::string("cannot resolve host: ") + ::gai_strerror(gai);
    return;
  }
  // Every address the name has (IPv6 and IPv4). An attempt lasts a few seconds at most: the
  // kernel's SYN retries back off to many seconds, and a fresh attempt gets through as soon as a
  // path to the store is back (a healed partition).
  const auto attempt_deadline = std::min(deadline, Clock::now() + kConnectAttempt);
  bool refused = false;
  for (addrinfo* ai = res; ai != nullptr && !fd_; ai = ai->ai_next) {
    int err = 0;
    fd_ = try_connect(ai, attempt_deadline, err);
    if (!fd_) last_error = std::strerror(err);
    refused = refused || (!fd_ && err == ECONNREFUSED);
  }
  ::freeaddrinfo(res);
  if (!fd_ && refused && options_.on_refused) options_.on_refused();
  if (!fd_ && refused && refused_is_final) {
    throw ConnectionError("store " + endpoint() + " refused the connection (nothing listens there any more)");
  }
}

void Client::handshake_locked(Clock::time_point deadline) {
  if (options_.dialect == core::Dialect::Legacy) return;  // 1.13 has no handshake
  // 2.x handshake: VALIDATE (no reply), then PING, whose echo proves a store is listening, then
  // (one round trip for both) ddprun's AUTH_HELLO.
  std::string hello = request(core::Op::Validate);
  core::put_u32(hello, core::kValidateMagic);
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  hello += request(core::Op::Ping);
  core::put_u32(hello, nonce);
  const std::string client_nonce = options_.negotiate_auth ? core::random_nonce() : std::string();
  if (options_.negotiate_auth) {
    hello += request(core::Op::AuthHello);
    core::put_u32(hello, core::kAuthVersion);
    core::put_bytes(hello, options_.credentials ? std::string_view(options_.credentials->scope) : std::string_view());
    core::put_bytes(hello, client_nonce);
  }
  const auto hello_deadline = std::max(deadline, Clock::now() + std::chrono::seconds(5));
  send_locked(hello, hello_deadline, "handshake");
  char echo[4];
  recv_locked(echo, 4, hello_deadline, "handshake");
  if (core::load_u32(echo) != nonce) {
    close_locked();
    throw ProtocolError("the server at " + endpoint() + " answered PING with a wrong nonce; is it a store?");
  }
  if (options_.negotiate_auth) prove_locked(client_nonce, hello_deadline);
  learn_durability_locked(hello_deadline);
}

void Client::connect_locked(std::optional<Clock::time_point> until, bool refused_is_final) {
  const auto start = Clock::now();
  const auto deadline = until.value_or(start + options_.connect_timeout);
  // Seeded once per thread: std::random_device costs a system call (and more) each time.
  thread_local std::mt19937 rng(std::random_device{}());
  auto backoff = options_.initial_backoff;
  int attempts = 0;
  std::string last_error = "no attempt made";
  for (;;) {
    ++attempts;
    open_socket_locked(deadline, refused_is_final, last_error);
    if (fd_) {
      try {
        handshake_locked(deadline);
        return;
      } catch (const ConnectionError& e) {
        last_error = e.what();
        close_locked();
      }
    }
    if (Clock::now() >= deadline) break;
    // Exponential backoff with full jitter, so many clients that start together spread out.
    std::uniform_int_distribution<long> jitter(backoff.count() / 2, backoff.count());
    auto sleep = std::chrono::milliseconds(jitter(rng));
    sleep = std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    // sleep override: backoff between connection attempts.
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  throw ConnectTimeout("connect to store " + endpoint() + " timed out after " +
                           seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - start)) +
                           " (" + std::to_string(attempts) + " attempts): " + last_error,
                       last_error);
}

void Client::prove_locked(const std::string& client_nonce, Clock::time_point deadline) {
  uint8_t mode;
  std::string server_nonce;
  try {
    mode = recv_u8(deadline, "AUTH_HELLO");
    server_nonce = recv_bytes(deadline, "AUTH_HELLO");
  } catch (const ConnectionError&) {
    throw ProtocolError("the store at " + endpoint() +
                        " closed the connection at ddprun's handshake: is it an "
                        "older ddprun, or another program's store?");
  }
  if (mode == core::kAuthOpen) return;
  refusal_said_ = mode == core::kAuthProveSaysRefusal;
  if (!options_.credentials) {
    close_locked();
    throw ConfigError("the store at " + endpoint() + " is protected by a secret, and this client has none" +
                      (options_.missing_secret_hint.empty() ? "" : ": " + options_.missing_secret_hint));
  }
  const core::Credentials& c = *options_.credentials;
  unsent_proof_ = request(core::Op::AuthProof);
  core::put_bytes(unsent_proof_, core::client_mac(c.key, c.scope, client_nonce, server_nonce));
  expected_server_mac_ = core::server_mac(c.key, c.scope, client_nonce, server_nonce);
}

void Client::settle_proof_locked(Clock::time_point deadline) {
  if (!expected_server_mac_) return;
  const std::string expected = std::move(*expected_server_mac_);
  expected_server_mac_.reset();  // before reading: recv_locked comes back here
  const core::Credentials& c = *options_.credentials;
  std::string theirs;
  bool refused = false;
  const bool refusal_said = refusal_said_;  // a lost connection clears it
  try {
    refused = recv_u8(deadline, "AUTH_PROOF") != core::kProofAccepted;
    if (!refused) theirs = recv_bytes(deadline, "AUTH_PROOF");
  } catch (const ConnectionError&) {
    // A store that says its refusals did not refuse: the connection was lost (a partition, a
    // restart), and that is an outage to ride out, not a wrong secret.
    if (refusal_said) throw;
    refused = true;
  }
  if (refused) {
    close_locked();
    throw ConfigError("the store at " + endpoint() + " refused this client's secret for " +
                      (c.scope == core::kAllJobs ? std::string("every job") : "job '" + c.scope + "'") +
                      ": is the token file the store's own secret, or a token for this job?");
  }
  if (!core::same_mac(theirs, expected)) {
    close_locked();
    throw ProtocolError("the store at " + endpoint() +
                        " could not prove that it holds the secret: it is not the "
                        "store this client's token belongs to");
  }
}

std::string Client::refusal_reason() const {
  if (options_.refusal_note_key.empty()) return "";
  try {
    ClientOptions o = options_;
    o.refusal_note_key.clear();
    o.reconnect = false;
    o.outage_tolerance = std::chrono::milliseconds(0);
    o.connect_timeout = std::chrono::seconds(2);
    o.timeout = std::chrono::seconds(2);
    Client asker(o);
    if (!asker.check({options_.refusal_note_key})) return "";
    return ": the store refused it " + asker.get(options_.refusal_note_key);  // "at TIME: why"
  } catch (const std::exception&) {
    return "";  // the store is gone altogether: nothing more to say
  }
}

void Client::ensure_connected_locked() {
  if (fd_) return;
  if (!options_.reconnect && !tolerant_locked()) {
    throw ConnectionError("the connection to store " + endpoint() + " was lost");
  }
  connect_locked();
}

void Client::send_locked(const std::string& request_bytes, Clock::time_point deadline, std::string_view what) {
  // The handshake's proof goes out with the first request: one segment, no extra round trip.
  std::string with_proof;
  if (!unsent_proof_.empty()) {
    with_proof = std::move(unsent_proof_) + request_bytes;
    unsent_proof_.clear();
  }
  const std::string& bytes = with_proof.empty() ? request_bytes : with_proof;
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (poll_fd(fd_.get(), POLLOUT, deadline)) continue;
      close_locked();
      throw TimeoutError("sending " + std::string(what) + " to store " + endpoint() + " timed out");
    }
    const int err = errno;
    close_locked();
    throw ConnectionError("sending " + std::string(what) + " to store " + endpoint() + " failed: " +
                          std::strerror(err) + (err == EPIPE || err == ECONNRESET ? refusal_reason() : std::string()));
  }
}

void Client::recv_locked(char* out, size_t n, Clock::time_point deadline, std::string_view what) {
  settle_proof_locked(deadline);
  size_t off = 0;
  while (off < n) {
    // Buffered: a reply's small fields (and a pipelined answer before it) come in one recv.
    if (rpos_ < rbuf_.size()) {
      const size_t take = std::min(n - off, rbuf_.size() - rpos_);
      std::memcpy(out + off, rbuf_.data() + rpos_, take);
      rpos_ += take;
      off += take;
      if (rpos_ == rbuf_.size()) {
        rbuf_.clear();
        rpos_ = 0;
      }
      continue;
    }
    // Large values go straight to their destination; small reads fill the buffer.
    const size_t want = n - off;
    char* dst = out + off;
    size_t cap = want;
    if (want < kReadBuffer) {
      rbuf_.resize(kReadBuffer);
      dst = rbuf_.data();
      cap = kReadBuffer;
    }
    const ssize_t r = ::recv(fd_.get(), dst, cap, 0);
    if (r > 0) {
      if (dst == out + off) {
        off += static_cast<size_t>(r);
      } else {
        rbuf_.resize(static_cast<size_t>(r));
        rpos_ = 0;
      }
      continue;
    }
    if (dst != out + off) rbuf_.clear();
    if (r == 0) {
      close_locked();
      throw ConnectionError("store " + endpoint() + " closed the connection during " + std::string(what) +
                            refusal_reason());
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (poll_fd(fd_.get(), POLLIN, deadline)) continue;
      close_locked();
      throw TimeoutError("no reply to " + std::string(what) + " from store " + endpoint() + " within the deadline");
    }
    const int err = errno;
    close_locked();
    throw ConnectionError("reading " + std::string(what) + " from store " + endpoint() +
                          " failed: " + std::strerror(err));
  }
}

bool Client::readable_locked(Clock::time_point deadline) {
  return rpos_ < rbuf_.size() || poll_fd(fd_.get(), POLLIN, deadline);
}

uint8_t Client::recv_u8(Clock::time_point deadline, std::string_view what) {
  char c;
  recv_locked(&c, 1, deadline, what);
  return static_cast<uint8_t>(c);
}

int64_t Client::recv_i64(Clock::time_point deadline, std::string_view what) {
  char b[8];
  recv_locked(b, 8, deadline, what);
  return static_cast<int64_t>(core::load_u64(b));
}

std::string Client::recv_bytes(Clock::time_point deadline, std::string_view what) {
  char b[8];
  recv_locked(b, 8, deadline, what);
  const uint64_t len = core::load_u64(b);
  if (len > (uint64_t{1} << 34)) {
    close_locked();
    throw ProtocolError("store " + endpoint() + " sent a " + std::to_string(len) + "-byte value for " +
                        std::string(what));
  }
  std::string v(len, '\0');
  if (len > 0) recv_locked(v.data(), len, deadline, what);
  return v;
}

}  // namespace ddprun::rdzv::client
