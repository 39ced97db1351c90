#pragma once
// The TCPStore-compatible server: a listening socket, its sessions, and the KvStore they share.
//
// Server runs on a caller-supplied io_context and must only be touched from that io_context's
// thread once start() has run (use post). ServerThread is the embeddable form: it owns an
// io_context and one thread, binds in its constructor (so the port is known at once and no other
// process can take it in between) and stops cleanly in stop() or its destructor.
//
// How it serves, and why not with Asio's per-socket operations: SET has no reply, so a client's
// set() returns as soon as its bytes are written, and the client may then ask something through
// another connection. Asio completes each socket's read on its own (speculatively, as soon as a
// read is started), so the second connection's request could be applied before the SET that
// reached the server first was even read. Here the sockets sit in an epoll set of the server's
// own, which Asio watches as one descriptor; each batch
//   1. reads every ready socket (in rounds, until no socket has anything more, each connection up
//      to a per-batch budget so that one fast client cannot starve the others),
//   2. applies, connection by connection, the leading requests that have no reply (SET, APPEND,
//      MULTI_SET, QUEUE_PUSH), then everything else, each connection's requests in order,
//   3. sends the replies and wake-ups, pausing a connection's reading while it owes its client
//      more than Limits::output_high_water.
// A request applied in a batch was read after every byte that reached the server before it, so a
// set() that had returned before another client sent its request is always visible to it.
//
// On a busy node: woken while other threads wait for this CPU, the server lets them run first
// (sched_yield, once per wake-up), then serves everything that arrived meanwhile in one turn.
// Serving each request the moment it arrives preempts whoever runs (a client that holds its
// interpreter's lock, a worker) for a few microseconds of work, thousands of times per barrier of
// a thousand clients, and each preempted thread then waits its turn behind the node's busy
// processes; ceding makes the turns fewer and fuller, and lets the client that just sent a request
// get on to reading the reply. On an idle CPU the yield returns at once; what it costs there (a
// lone client's round trip about 5 us longer here) and what it saves are in docs/benchmarks.md
// (ServerOptions::cede_when_busy).
//
// Under faults: every descriptor is close-on-exec; accepted sockets get TCP keepalive, so a
// crashed or partitioned client's connection (and its pending WAIT) is reclaimed; out of file
// descriptors, a spare descriptor is given up to accept and close the newcomer at once (it gets an
// error instead of waiting forever), logged once per episode; no exception from one connection
// ends the loop: that connection is closed, logged once per address, reason and window. A protected store admits only the
// handshake's frames before the secret is proved, gives the proof a deadline, caps connections that
// have not proved it (at the cap, a newcomer pushes out the oldest once it has had a short grace),
// and logs refusals once per address and window. A store with an allow list holds a stranger's
// connection unread for a grace (the host may learn of a new node after that node does) and resets
// it if its address is still not allowed then.

#include <utility>  // before Asio (Boost 1.74 quirk)

#include <sys/socket.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/unique_fd.hpp"
#include "rendezvous/server/janitor.hpp"
#include "rendezvous/server/refusal_log.hpp"
#include "rendezvous/server/state_journal.hpp"
#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/core/protocol.hpp"
#include "rendezvous/core/store_connection.hpp"

namespace ddprun::rdzv::server {

class Session;

struct ServerOptions {
  // Address to bind: a numeric IPv4/IPv6 address or a host name. "::" listens on IPv6 and IPv4.
  std::string host = "127.0.0.1";
  // 0 lets the kernel pick a free port; read it back with port().
  uint16_t port = 0;
  core::Limits limits;
  core::StoreLimits store_limits;
  // Log "listening on" / "stopped" at INFO (the daemon) or DEBUG (embedded in the launcher).
  bool log_lifecycle = true;
  // TCP keepalive of accepted connections: first probe after `keepalive_idle` of silence, then every
  // `keepalive_interval`; the connection is dropped after `keepalive_probes` unanswered probes
  // (about 2 minutes with the defaults).
  std::chrono::seconds keepalive_idle{60};
  std::chrono::seconds keepalive_interval{10};
  int keepalive_probes = 6;
  // Forget ddprun jobs that are over (see JobJanitor): 0 leaves every key alone (a store embedded
  // in one job's ddprun); the daemon sets --job-ttl.
  std::chrono::milliseconds job_ttl{0};
  // A protected store: clients must prove this secret before any key operation, and are bound to
  // one job's keys (rendezvous/core/auth.hpp). Without it the store is open, as PyTorch's is.
  std::optional<core::StoreSecret> secret;
  // Only these peer addresses (numeric, plus loopback) may connect; others are closed before a
  // byte is read. Unset: anyone. Can be replaced later with Server::allow_peers.
  std::optional<std::vector<std::string>> allowed_peers;
  // A connection from an address not allowed (yet) is held, unread, for up to this long: admitted
  // the moment Server::allow_peers names its address, closed (reset) once the time is up. A peer
  // may learn that it belongs (a round, a quorum) before the store's host does, and connect first.
  // At most max_held_not_allowed are held at once (fewer under a low descriptor limit: a quarter
  // of it); beyond them, and with a zero grace, a stranger is closed at once.
  std::chrono::milliseconds admission_grace{std::chrono::seconds(10)};
  size_t max_held_not_allowed = 1024;
  // A protected store's connections that have not proved the secret: closed `handshake_timeout`
  // after they connected, and at most `max_pending_handshakes` at a time (fewer under a low
  // descriptor limit: a quarter of it). At that many, a newcomer closes the oldest of them once
  // that one has had `handshake_grace` (a client with the secret proves it in two round trips,
  // milliseconds); while all are younger, accepting waits (newcomers wait in the kernel's backlog,
  // which the listener asks to be as long as net.core.somaxconn allows). So peers that never
  // prove the secret hold a place for a grace each, not for the deadline, whatever they send:
  // the backlog moves at `max_pending_handshakes` per grace, and a client with the secret that
  // reaches the front is through before it can be pushed out; a burst of honest clients larger
  // than the cap is admitted as fast as they prove the secret.
  std::chrono::milliseconds handshake_timeout{std::chrono::seconds(2)};
  size_t max_pending_handshakes = 256;
  std::chrono::milliseconds handshake_grace{500};
  // A request must arrive whole within this of the first byte that is still waiting for the rest
  // (a client that sends a request sends it at once), else the connection is closed (TimedOut):
  // an unfinished request holds its bytes (up to the request limit) for no one. 0: no deadline.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(30)};
  // The input buffers of all connections together hold at most this many bytes (never under two
  // requests of limits.max_request_bytes): an unfinished request, or requests read that wait for
  // their client to read its replies. Past it, the connection that has held its bytes longest is
  // closed (OverLimit), until they fit. A client sends a request at once, so its own is the
  // youngest; peers that hold requests half-sent or unread on many connections lose theirs first.
  uint64_t max_unfinished_bytes = uint64_t{256} << 20;
  // The replies owed to all connections together hold at most this many bytes of copies (never
  // under two replies of limits.max_reply_bytes; a large value is shared with the store, not
  // copied): past it, the connection that has taken nothing of its replies for longest is closed
  // (NotReading), until they fit. A client that reads its replies is never the one.
  uint64_t max_owed_bytes = uint64_t{512} << 20;
  // Refused connections, and other connections closed for what their peer did, are logged once
  // per address (and reason) and window, then counted (RefusalLog).
  std::chrono::seconds refusal_log_window{60};
  // Keep the store's contents in this file across restarts (StateJournal): loaded before the
  // server listens, every change written before the reply that tells of it. Empty: memory only.
  std::string state_file;
  // Answer CHECK and GET of core::kStoreInfoKey (whether the store keeps its state, and an id of
  // this start; no key of the store, so PyTorch clients that count keys see nothing new), so that
  // ddprun's clients ride out a lost connection (rdzv::client::ClientOptions::outage_tolerance):
  // ddprun-rendezvous and the rendezvous store an agent hosts. Always with a state_file.
  bool describe_self = false;
  // Woken, let the threads waiting for this CPU run first, then serve what arrived meanwhile in
  // one turn (see the top of this file). Off: every wake-up is served at once.
  bool cede_when_busy = true;
};

// Why connections were closed, for metrics.
enum class CloseReason {
  PeerClosed,
  BadRequest,
  OverLimit,
  NotReading,
  WriteFailed,
  Unauthorized,
  NoHandshake,  // a protected store's client that did not prove the secret in time, or made room
  TimedOut,     // a request that did not arrive whole within ServerOptions::request_timeout
  Shutdown,
};
inline constexpr size_t kCloseReasonCount = static_cast<size_t>(CloseReason::Shutdown) + 1;
std::string_view close_reason_name(CloseReason reason);

// A snapshot of the server's state, for status queries, metrics and tests.
struct ServerStats {
  size_t connections = 0;
  size_t waiting_clients = 0;
  size_t keys = 0;
  uint64_t stored_bytes = 0;
  uint64_t requests = 0;  // served since start
  uint64_t accepted = 0;
  uint64_t refused_out_of_fds = 0;   // accepted and closed at once while out of descriptors
  uint64_t refused_not_allowed = 0;  // closed unread: the peer's address was not allowed in time
  size_t held_not_allowed = 0;       // held now, unread, for their address to be allowed
  uint64_t admitted_late = 0;        // held, then admitted when their address was allowed
  uint64_t bytes_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t closed[kCloseReasonCount] = {};
  uint64_t jobs_forgotten = 0;    // job generations deleted by the janitor
  uint64_t turns = 0;             // batches served: each reads, applies and answers what is ready
  uint64_t ceded_turns = 0;       // wake-ups on which the server let waiting threads run first
  uint64_t held_input_bytes = 0;  // the input buffers' memory (ServerOptions::max_unfinished_bytes)
  uint64_t held_input_limit = 0;
  uint64_t owed_bytes = 0;  // copies of replies not yet sent (ServerOptions::max_owed_bytes)
  uint64_t owed_limit = 0;
};

// A connected client, for diagnostics: who it is and what it waits for.
struct ClientInfo {
  std::string peer;                  // "127.0.0.1:41234"
  std::vector<std::string> waiting;  // keys its pending WAIT still misses (empty: none pending)
  std::chrono::steady_clock::time_point waiting_since;
};

class Server {
 public:
  // Binds and listens at once; throws ConnectionError naming the address if that fails.
  Server(boost::asio::io_context& io, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void start();
  // Stops accepting and closes every connection. Call on the io_context thread.
  void stop();

  uint16_t port() const { return port_; }
  const boost::asio::ip::tcp::endpoint& endpoint() const { return endpoint_; }
  ServerStats stats() const;
  // Every connected client, with its pending wait if any.
  std::vector<ClientInfo> clients() const;
  core::KvStore& store() { return store_; }
  const core::KvStore& store() const { return store_; }
  // Replaces the allowed peers (numeric addresses; loopback is always allowed). Connections open
  // already are not affected; held ones from an address now allowed are admitted.
  void allow_peers(const std::vector<std::string>& addresses);
  bool protected_store() const { return options_.secret.has_value(); }
  // Whether the store takes connections from `peer` (allow_peers; anyone when no list was given).
  bool admits(const boost::asio::ip::address& peer) const;

 private:
  void arm();
  // `woken`: the batch follows a wait for the epoll set (not a continuation of work under way).
  void run_batch(bool woken);
  // One epoll_wait(0) and the reads it allows; true if any bytes arrived or a client connected.
  bool gather_round();
  void on_readable(Session& s);
  void apply(Session& s, core::StoreConnection::Stage stage);
  void send(Session& s);
  void update_interest(Session& s);
  void accept_pending();
  // Serves an accepted connection from `addr`.
  void open_session(UniqueFd fd, const sockaddr_storage& addr);
  // An accepted connection from an address not allowed: held for ServerOptions::admission_grace
  // if there is room, else closed.
  void hold_or_refuse(UniqueFd fd, const sockaddr_storage& addr);
  // Closes a connection from an address not allowed, unread (a reset), and logs it once per address.
  void refuse_not_allowed(UniqueFd fd, const std::string& who);
  // Admits the held connections whose address is allowed now; closes those whose time is up.
  void settle_held();
  void arm_admission_timer();
  // Accepts one waiting connection and closes it at once; false when none was waiting.
  bool refuse_one();
  void pause_accepting();
  void mark_dirty(Session& s);
  void close_session(Session& s, CloseReason reason, const std::string& why);
  // Logs why `s` was closed, once per address, reason and window (RefusalLog).
  void log_close(Session& s, CloseReason reason, const std::string& why);
  // Notes when `s`'s incomplete request began (after a batch), and closes the connections whose
  // request has not arrived whole within ServerOptions::request_timeout (housekeeping).
  void note_partial(Session& s);
  // Closes the connections that have held their input longest while all of them together hold
  // more than ServerOptions::max_unfinished_bytes (after each batch).
  void enforce_unfinished_limit();
  uint64_t held_input_limit() const;
  // After a send: what `s` is owed, and whether it took some (`progressed`).
  void note_owed(Session& s, bool progressed);
  // Closes the connections that have taken nothing for longest while the replies owed to all of
  // them hold more than ServerOptions::max_owed_bytes (after each batch).
  void enforce_owed_limit();
  uint64_t owed_limit() const;
  // Closes the sessions that hold bytes (their `counted`), the one whose `since` is oldest first,
  // until `total` (which each close lowers) is at most `limit`; `why` says why, for each.
  void shed(const uint64_t& total, uint64_t limit, size_t Session::*counted,
            std::chrono::steady_clock::time_point (*since)(const Session&), CloseReason reason,
            const std::function<std::string(Session&)>& why);
  void enforce_request_deadline(std::chrono::steady_clock::time_point now);
  void arm_janitor();
  // Protected stores: the connections that have not proved the secret yet.
  void add_pending_handshake(Session& s);
  void drop_pending_handshake(Session& s);
  // Closes the oldest connection that has not proved the secret if it has had
  // ServerOptions::handshake_grace; false if there is none.
  bool evict_oldest_pending(const std::string& why);
  // Whether a protected store may take one more connection that has not proved the secret now,
  // making room (evict_oldest_pending) if it can; holds accepting when it cannot.
  bool room_for_handshake();
  // Stops or resumes watching the listener: it is watched unless paused (out of descriptors) or
  // held (the handshake cap is reached).
  void watch_listener();
  void hold_accepting();
  void release_accepting();
  void arm_housekeeping();
  // --state-file: restores the store from the file and journals it from now on.
  void open_state();
  // Makes the description that core::kStoreInfoKey reads as (ServerOptions::describe_self).
  void describe_self();

  boost::asio::io_context& io_;
  ServerOptions options_;
  UniqueFd listen_fd_;
  UniqueFd spare_fd_;  // given up to accept-and-close when out of descriptors
  boost::asio::posix::stream_descriptor epoll_;
  boost::asio::steady_timer accept_retry_;
  boost::asio::steady_timer hold_timer_;       // resumes a held accept when the oldest pending may go
  boost::asio::steady_timer admission_timer_;  // closes held connections whose grace is over
  boost::asio::steady_timer janitor_timer_;
  boost::asio::steady_timer housekeeping_timer_;
  std::list<Session*> pending_handshakes_;  // oldest first
  size_t pending_cap_ = 0;                  // at most this many (ServerOptions::max_pending_handshakes)
  RefusalLog refusals_;                     // Unauthorized, NoHandshake
  RefusalLog closes_;                       // the other reasons, per address and reason
  std::unique_ptr<JobJanitor> janitor_;
  boost::asio::ip::tcp::endpoint endpoint_;
  uint16_t port_ = 0;
  core::KvStore store_;
  core::SharedBytes description_;          // what core::kStoreInfoKey reads as (describe_self), or none
  std::unique_ptr<StateJournal> journal_;  // after store_: destroyed (and flushed) before it
  std::unordered_map<Session*, std::unique_ptr<Session>> sessions_;
  std::vector<std::unique_ptr<Session>> closed_;  // destroyed at the end of the batch
  std::vector<Session*> batch_;                   // sessions with bytes to apply, in arrival order
  std::vector<Session*> dirty_;                   // sessions with bytes to send
  std::vector<char> scratch_;
  std::optional<std::set<std::string>> allowed_;
  // Connections from addresses not allowed yet, oldest first (ServerOptions::admission_grace).
  struct Held {
    UniqueFd fd;
    sockaddr_storage addr{};
    std::string who;
    std::chrono::steady_clock::time_point since;
  };
  std::list<Held> held_;
  size_t held_cap_ = 0;
  std::set<std::string> refused_logged_;  // one line per refused address
  bool accept_paused_ = false;
  bool accept_held_ = false;  // at the cap of connections that have not proved the secret
  bool out_of_fds_ = false;   // an episode is under way (logged once)
  uint64_t refused_in_episode_ = 0;
  ServerStats counters_;
  uint64_t unfinished_bytes_ = 0;  // what the input buffers hold (Session::unfinished_counted)
  uint64_t owed_bytes_ = 0;        // the replies' copies owed (Session::owed_counted)
  bool stopped_ = false;
  bool started_ = false;
};

class ServerThread {
 public:
  explicit ServerThread(ServerOptions options);
  ~ServerThread();
  ServerThread(const ServerThread&) = delete;
  ServerThread& operator=(const ServerThread&) = delete;

  uint16_t port() const { return port_; }
  const boost::asio::ip::tcp::endpoint& endpoint() const { return endpoint_; }
  // Closes all connections and joins the thread; idempotent.
  void stop();
  // Taken on the server thread; blocks until it answers.
  ServerStats stats();
  // Runs `fn` on the server thread with the server, and waits for it.
  void with_server(const std::function<void(Server&)>& fn);
  // Thread-safe Server::allow_peers.
  void allow_peers(const std::vector<std::string>& addresses);

 private:
  boost::asio::io_context io_{1};
  std::unique_ptr<Server> server_;
  boost::asio::ip::tcp::endpoint endpoint_;
  uint16_t port_ = 0;
  std::thread thread_;
};

// "127.0.0.1:29500" or "[::1]:29500".
std::string format_endpoint(const boost::asio::ip::tcp::endpoint& ep);

}  // namespace ddprun::rdzv::server
