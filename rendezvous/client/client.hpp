#pragma once
// ddprun's own store client, speaking the 2.x dialect (VALIDATE + PING on connect). Keys are sent as
// given: unlike PyTorch's client it adds no "/" prefix, so ddprun's keys never collide with
// PyTorch's ("/..." keys) on a shared store.
//
// Blocking, thread-safe (one request in flight per client, as in PyTorch's client). Every call has
// a deadline (ClientOptions::timeout unless given); a call that misses it throws TimeoutError and
// the connection is closed, since its reply may still arrive. Connection failures throw
// ConnectionError; the client reconnects on the next call.

#include <atomic>
#include <chrono>
#include <functional>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/errors.hpp"
#include "common/unique_fd.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::client {

// Connecting gave up at its deadline; cause() is what the last attempt met (a name that does not
// resolve, a refused connection, a failed handshake), for callers that retry and report it.
class ConnectTimeout : public TimeoutError {
 public:
  ConnectTimeout(const std::string& message, std::string cause) : TimeoutError(message), cause_(std::move(cause)) {}
  const std::string& cause() const { return cause_; }

 private:
  std::string cause_;
};

struct ClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  // How long the first connect (with backoff and jitter between attempts) may take.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Default deadline of each call.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds initial_backoff{std::chrono::milliseconds(10)};
  std::chrono::milliseconds max_backoff{std::chrono::seconds(1)};
  // V2 (default) works with ddprun's server and PyTorch >= 2.2. Legacy talks to PyTorch 1.13 servers:
  // no handshake, no APPEND/MULTI_*/queues/LIST/PING, and a timed-out WAIT closes the connection
  // (the 1.13 protocol cannot cancel one).
  core::Dialect dialect = core::Dialect::V2;
  // After a lost connection, connect again on the next call (true), or fail it with
  // ConnectionError (false: for watchers, to whom a lost store is the news).
  bool reconnect = true;
  // ddprun's secret handshake (rendezvous/core/auth.hpp), after VALIDATE and PING: learn whether the
  // store is protected and, if it is, prove `credentials` and check the store's proof in turn.
  // Off for stores that are not ddprun's (the 1.13 dialect never negotiates).
  bool negotiate_auth = true;
  std::optional<core::Credentials> credentials;
  // Appended to the error when a protected store meets a client without a secret: how to give one.
  std::string missing_secret_hint;
  // Where a store that refused a request leaves its reason (ddprun-rendezvous writes
  // /ddprun/<run id>/store_refusal: a job over its quota, a full store). When the store closes the
  // connection during a request, the client reads it over a new connection and adds it to the
  // error. Empty: not asked.
  std::string refusal_note_key;
  // Ride out an outage of a ddprun store (one that describes itself under core::kStoreInfoKey,
  // read at each connection): when the connection is lost, or a request gets no reply before its
  // deadline (a partition, a frozen host), connect again with backoff for up to this long and send
  // the request again, instead of failing it. Coming back to the same store (same boot id) goes on
  // as if nothing happened; to a restarted one only if it keeps its state (ddprun-rendezvous
  // --state-file). A store that refuses the reconnection (nothing listens on its port) and kept no
  // state is gone: the call fails at once, as does a store back without its state
  // (ConnectionError). Against such a store ADD goes as ADD_ONCE and SET, MULTI_SET, APPEND and
  // QUEUE_PUSH wait for the store's confirmation, so that a retried request is neither applied
  // twice nor lost (APPEND and QUEUE_PUSH, lost between the store's write and its confirmation,
  // can be applied twice). 0: never; also never against any other store.
  std::chrono::milliseconds outage_tolerance{0};
  // Called (on the calling thread) whenever a connection attempt is refused: the store's host
  // answered and nothing listens on its port, so the store itself is down (a daemon restarting),
  // not out of this client's reach. Its other clients cannot reach it either meanwhile.
  std::function<void()> on_refused;
};

class Client {
 public:
  using Duration = std::chrono::milliseconds;

  // Connects at once (retrying until connect_timeout); throws ConnectionError/TimeoutError, or
  // ConfigError for a protected store and no credentials. Credentials the store refuses throw
  // ConfigError from the first call that reads a reply (the proof is pipelined with it).
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void set(std::string_view key, std::string_view value);
  // Waits for the key (up to the deadline), then reads it.
  std::string get(std::string_view key, std::optional<Duration> timeout = std::nullopt);
  int64_t add(std::string_view key, int64_t delta);
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  bool check(const std::vector<std::string>& keys);
  // Returns when every key exists; on timeout sends CANCEL_WAIT and throws TimeoutError naming the
  // keys still missing.
  void wait(const std::vector<std::string>& keys, std::optional<Duration> timeout = std::nullopt);
  bool delete_key(std::string_view key);
  int64_t num_keys();
  void append(std::string_view key, std::string_view data);
  // Waits for all keys, then reads them in one round trip.
  std::vector<std::string> multi_get(const std::vector<std::string>& keys,
                                     std::optional<Duration> timeout = std::nullopt);
  // One MULTI_GET round trip without waiting for the keys: a missing key reads as empty (ddprun's
  // server, and PyTorch's libuv server, answer so).
  std::vector<std::string> multi_get_now(const std::vector<std::string>& keys);
  // Returns whether every key exists within `timeout`; a timeout is not an error here (the WAIT
  // is cancelled on the server and the connection stays usable).
  bool wait_for(const std::vector<std::string>& keys, Duration timeout);
  void multi_set(const std::vector<std::pair<std::string, std::string>>& entries);
  void queue_push(std::string_view key, std::string_view value);
  // Pops the front value; nullopt when the queue is empty.
  std::optional<std::string> queue_pop(std::string_view key);
  int64_t queue_len(std::string_view key);
  // Every key the store holds (a protected store: the job's), sorted.
  std::vector<std::string> list();
  // Round trip with a nonce; returns the measured time.
  Duration ping();

  const ClientOptions& options() const { return options_; }
  // Whether a lost connection is ridden out (outage_tolerance, against a ddprun store).
  bool rides_out_outages();
  // Connections made again after one was lost (callers that time what they see over the store
  // start over when it changes: an outage is no silence of the other clients).
  uint64_t reconnects() const { return reconnects_.load(); }
  // Whether the connection is up (it is re-established on the next call when reconnect is set).
  bool connected();
  std::string endpoint() const;

 private:
  using Clock = std::chrono::steady_clock;

  // Connects (with backoff until `deadline`, default connect_timeout from now) and does the
  // handshake; with outage_tolerance, learns whether the store keeps its state. With
  // `refused_is_final`, a refused connection (nothing listens on the port) ends the attempts at once
  // (ConnectionError): a store that kept no state is not coming back.
  void connect_locked(std::optional<Clock::time_point> deadline = std::nullopt, bool refused_is_final = false);
  // One attempt: resolves the host and tries each of its addresses until `deadline`; on failure
  // fd_ stays closed and `last_error` says why. Throws ConnectionError for a refusal with
  // `refused_is_final`.
  void open_socket_locked(Clock::time_point deadline, bool refused_is_final, std::string& last_error);
  // On a fresh socket: VALIDATE and PING (whose echo proves a store listens), AUTH_HELLO and the
  // proof when negotiating, then learn_durability_locked(). Nothing on the 1.13 dialect.
  void handshake_locked(Clock::time_point deadline);
  // Reads core::kStoreInfoKey on a fresh connection: durable_ and boot_.
  void learn_durability_locked(Clock::time_point deadline);
  // Runs `fn` (one request), connecting first; a lost connection (or a request without a reply)
  // is ridden out when tolerant_locked(): reconnect, then run `fn` again.
  template <typename Fn>
  auto retrying(Fn&& fn) -> decltype(fn());
  // Sends a request that has no reply; against a durable store, with a PING after it whose echo
  // confirms it (the store writes its state down before any reply).
  void send_write_locked(std::string req, Clock::time_point deadline, std::string_view what);
  std::string next_once_token();
  // The handshake's second half, after the AUTH_HELLO reply: sends AUTH_PROOF without waiting for
  // its answer, which settle_proof_locked() reads before the first reply the client reads (the
  // store answers in order and closes on a wrong proof), so a protected store costs no extra round
  // trip. Throws ConfigError when the store is protected and this client has no secret.
  void prove_locked(const std::string& client_nonce, Clock::time_point deadline);
  // Reads and checks the store's answer to AUTH_PROOF, if one is due: ConfigError (secret refused)
  // or ProtocolError (the store could not prove the secret).
  void settle_proof_locked(Clock::time_point deadline);
  void ensure_connected_locked();
  bool tolerant_locked() const { return !boot_.empty() && options_.outage_tolerance.count() > 0; }
  // ": the store refused it at <time>: <reason>" when the store left a reason under
  // refusal_note_key, else "".
  std::string refusal_reason() const;
  void close_locked();
  void send_locked(const std::string& bytes, Clock::time_point deadline, std::string_view what);
  void recv_locked(char* out, size_t n, Clock::time_point deadline, std::string_view what);
  // Bytes to read, buffered or on the socket, before the deadline.
  bool readable_locked(Clock::time_point deadline);
  uint8_t recv_u8(Clock::time_point deadline, std::string_view what);
  int64_t recv_i64(Clock::time_point deadline, std::string_view what);
  std::string recv_bytes(Clock::time_point deadline, std::string_view what);
  void wait_locked(const std::vector<std::string>& keys, Clock::time_point deadline, Duration timeout);
  // WAIT until the deadline; false (after cancelling it on the server) if it passed.
  bool timed_wait_locked(const std::vector<std::string>& keys, Clock::time_point deadline);
  std::vector<std::string> multi_get_locked(const std::vector<std::string>& keys, Clock::time_point deadline);
  Clock::time_point deadline(std::optional<Duration> timeout) const;
  std::string request(core::Op op) const;

  ClientOptions options_;
  std::mutex mutex_;
  UniqueFd fd_;
  std::optional<std::string> expected_server_mac_;  // AUTH_PROOF sent, its answer not read yet
  std::string unsent_proof_;                        // AUTH_PROOF, sent in one segment with the next request
  bool refusal_said_ = false;  // the store says a refused proof before closing (kAuthProveSaysRefusal)
  static constexpr size_t kReadBuffer = 4096;
  std::string rbuf_;  // bytes received and not consumed yet
  size_t rpos_ = 0;
  bool durable_ = false;  // the store says it keeps its state across restarts
  bool no_info_ = false;  // the store closed the connection when asked (an older ddprun-rendezvous)
  std::string boot_;      // the store's boot id: a ddprun store that describes itself
  std::atomic<uint64_t> reconnects_{0};
  std::string token_prefix_;  // this client's ADD_ONCE tokens: prefix + sequence
  uint64_t token_seq_ = 0;
};

}  // namespace ddprun::rdzv::client
