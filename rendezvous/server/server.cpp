#include "rendezvous/server/server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/hex.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/server/server_socket.hpp"
#include "rendezvous/server/session.hpp"

namespace ddprun::rdzv::server {

namespace asio = boost::asio;

namespace {

constexpr size_t kReadChunk = size_t{64} << 10;
// Bytes read from one connection per batch: a client that sends without pause is served in
// slices, between which every other connection gets its turn.
constexpr size_t kReadBudget = size_t{256} << 10;
// Gathering stops after this many epoll rounds even if clients keep sending.
constexpr int kMaxGatherRounds = 8;
constexpr int kMaxEvents = 256;

}  // namespace

std::string_view close_reason_name(CloseReason reason) {
  switch (reason) {
    case CloseReason::PeerClosed: return "peer_closed";
    case CloseReason::BadRequest: return "bad_request";
    case CloseReason::OverLimit: return "over_limit";
    case CloseReason::NotReading: return "not_reading";
    case CloseReason::WriteFailed: return "write_failed";
    case CloseReason::Unauthorized: return "unauthorized";
    case CloseReason::NoHandshake: return "no_handshake";
    case CloseReason::TimedOut: return "timed_out";
    case CloseReason::Shutdown: return "shutdown";
  }
  return "?";
}

Server::Server(asio::io_context& io, ServerOptions options)
    : io_(io),
      options_(std::move(options)),
      epoll_(io),
      accept_retry_(io),
      hold_timer_(io),
      admission_timer_(io),
      janitor_timer_(io),
      housekeeping_timer_(io),
      refusals_(options_.refusal_log_window, "refused connections from more addresses than 1024 at once",
                "(failed or missing handshakes, requests outside a client's job)"),
      closes_(options_.refusal_log_window, "connections closed, of more addresses and reasons than 1024 at once", ""),
      store_(options_.store_limits) {
  if (options_.job_ttl.count() > 0) janitor_ = std::make_unique<JobJanitor>(options_.job_ttl);
  // Under a low descriptor limit, unproven peers and held strangers get at most a quarter of it each.
  const uint64_t quarter = std::max<uint64_t>(8, open_file_limit() / 4);
  pending_cap_ = std::max<size_t>(1, std::min<size_t>(options_.max_pending_handshakes, quarter));
  held_cap_ = std::min<size_t>(options_.max_held_not_allowed, quarter);
  if (options_.allowed_peers) allow_peers(*options_.allowed_peers);
  if (!options_.state_file.empty()) open_state();  // before listening: no client sees an empty store
  if (options_.describe_self || !options_.state_file.empty()) describe_self();
  sockaddr_storage bound{};
  socklen_t len = 0;
  listen_fd_ = listen_on(options_.host, options_.port, bound, len);
  endpoint_ = to_endpoint(bound, len);
  port_ = endpoint_.port();
  // Accepted sockets inherit these from the listener (Linux copies the socket's state): no
  // per-connection system calls.
  set_keepalive(listen_fd_.get(), options_);
  const int epfd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd < 0) {
    const int err = errno;
    listen_fd_.reset();
    throw ConnectionError(std::string("cannot create the store's epoll set: ") + std::strerror(err));
  }
  epoll_.assign(epfd);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the listening socket
  ::epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd_.get(), &ev);
  spare_fd_ = open_spare();
  scratch_.resize(kReadChunk);
}

void Server::open_state() {
  journal_ = std::make_unique<StateJournal>(options_.state_file, store_);
  store_.set_observer(journal_.get());
  const StateJournal::Loaded& got = journal_->loaded();
  log::info("store") << "state file " << options_.state_file << ": "
                     << (got.keys + got.queues == 0 ? std::string("nothing to restore")
                                                    : "restored " + std::to_string(got.keys) + " key(s) and " +
                                                          std::to_string(got.queues) + " queue(s)");
}

void Server::describe_self() {
  // Clients that ride out an outage read this on each connection (rdzv::client::ClientOptions): the same
  // boot id means the same store, its contents intact; another one with "durable" a restart that
  // kept them.
  const nlohmann::json info{{"durable", journal_ != nullptr}, {"boot", to_hex(core::random_nonce().substr(0, 8))}};
  description_ = std::make_shared<const std::string>(info.dump());
  // Answered by each connection, not kept as a key (StoreConnection::describe_store); a state file
  // of an earlier version may hold it as one.
  store_.remove(core::kStoreInfoKey);
}

Server::~Server() { stop(); }

void Server::start() {
  if (options_.log_lifecycle) log::info("store") << "listening on " << format_endpoint(endpoint_);
  else DDPRUN_LOG_DEBUG("store") << "listening on " << format_endpoint(endpoint_);
  started_ = true;
  arm();
  arm_janitor();
  arm_housekeeping();
}

void Server::arm_janitor() {
  if (!janitor_ || stopped_) return;
  // Done jobs go within a second; the TTL's resolution is a quarter of it.
  const auto period = std::clamp<std::chrono::milliseconds>(options_.job_ttl / 4, std::chrono::milliseconds(50),
                                                            std::chrono::seconds(1));
  janitor_timer_.expires_after(period);
  janitor_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    try {
      counters_.jobs_forgotten += janitor_->sweep(store_, std::chrono::steady_clock::now()).generations_forgotten;
    } catch (const std::exception& e) {
      log::error("store") << "forgetting finished jobs failed: " << e.what();
    }
    arm_janitor();
  });
}

void Server::arm() {
  if (stopped_) return;
  // Asio watches the epoll set edge-triggered: if events are already waiting, run now rather
  // than wait for an edge that has passed.
  pollfd p{epoll_.native_handle(), POLLIN, 0};
  if (!batch_.empty() || ::poll(&p, 1, 0) > 0) {
    asio::post(io_, [this] { run_batch(false); });
    return;
  }
  epoll_.async_wait(asio::posix::stream_descriptor::wait_read, [this](const boost::system::error_code& ec) {
    if (!ec) run_batch(true);
  });
}

void Server::run_batch(bool woken) {
  if (stopped_) return;
  ++counters_.turns;
  if (woken && options_.cede_when_busy) {
    // Let whoever waits for this CPU (the client that woke the server among them) run first, and
    // serve what arrives meanwhile in this turn. Returns at once when no other thread is runnable
    // here (see server.hpp).
    ::sched_yield();
    ++counters_.ceded_turns;
  }
  try {
    // 1. Read every socket that has something, until none has more.
    for (int round = 0; round < kMaxGatherRounds; ++round) {
      if (!gather_round()) break;
    }
    // 2. Apply: first the requests nobody waits for an answer to, then the rest.
    for (Session* s : batch_) apply(*s, core::StoreConnection::Stage::NoReply);
    // Each connection's replies leave as soon as its requests are applied: its client goes on with
    // its next request while the others' are served, rather than after the whole batch (under CPU
    // contention the batch can be preempted many times before it ends).
    for (size_t i = 0; i < batch_.size(); ++i) {
      Session& s = *batch_[i];
      apply(s, core::StoreConnection::Stage::All);
      if (!s.flags.closing && !s.conn().output().empty()) send(s);
      // At once, not at the batch's end: a batch of many large replies would otherwise all be
      // built before any is given up (100 LISTs of 8 MiB: 818 MB where the limit is 512 MiB).
      if (owed_bytes_ > owed_limit()) enforce_owed_limit();
    }
    // 3. Send, and settle each connection's state.
    for (Session* s : batch_) {
      s->flags.in_batch = false;
      if (s->flags.closing) continue;
      s->flags.paused = s->conn().blocked();
      if (s->flags.peer_closed) {
        send(*s);  // the client may have shut down only its sending side
        if (s->flags.closing) continue;
        const std::string_view partial = s->input();
        if (!partial.empty()) {
          close_session(*s, CloseReason::PeerClosed,
                        "disconnected mid-request (" + s->conn().describe_partial(partial) + ")");
        } else if (s->conn().waiting()) {
          close_session(*s, CloseReason::PeerClosed,
                        "disconnected while waiting on " + std::to_string(s->conn().missing_keys()) + " key(s)");
        } else {
          close_session(*s, CloseReason::PeerClosed, "");
        }
        continue;
      }
      s->trim_input();
      note_partial(*s);
      mark_dirty(*s);
    }
    enforce_unfinished_limit();
    batch_.clear();
    // Sending may resume a paused connection with requests already read: they go to batch_ and
    // are applied in the next batch, which arm() starts at once.
    for (size_t i = 0; i < dirty_.size(); ++i) {
      Session* s = dirty_[i];
      s->flags.dirty = false;
      if (!s->flags.closing) send(*s);
    }
    dirty_.clear();
    enforce_owed_limit();
  } catch (const std::exception& e) {
    // Not expected (each connection's errors are handled where they happen), but no error may end
    // the loop that serves every job.
    log::error("store") << "unexpected error while serving a batch: " << e.what();
    for (Session* s : batch_) s->flags.in_batch = false;
    for (Session* s : dirty_) s->flags.dirty = false;
    batch_.clear();
    dirty_.clear();
  }
  closed_.clear();
  arm();
}

bool Server::gather_round() {
  epoll_event events[kMaxEvents];
  const int n = retry_eintr([&] { return ::epoll_wait(epoll_.native_handle(), events, kMaxEvents, 0); });
  bool progress = false;
  for (int i = 0; i < n; ++i) {
    auto* s = static_cast<Session*>(events[i].data.ptr);
    if (s == nullptr) {
      const uint64_t before = counters_.accepted;
      accept_pending();
      progress = progress || counters_.accepted != before;
      continue;
    }
    if (s->flags.closing) continue;
    if (events[i].events & EPOLLOUT) send(*s);
    if (s->flags.closing) continue;
    if ((events[i].events & (EPOLLHUP | EPOLLERR)) && (s->flags.paused || s->flags.peer_closed)) {
      // Not reading it, and epoll reports a hang-up regardless: it is gone.
      close_session(*s, CloseReason::PeerClosed, s->conn().output().empty() ? "" : "disconnected with replies unread");
      continue;
    }
    if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) && !s->flags.paused &&
        !s->flags.peer_closed) {
      const size_t before = s->input().size();
      on_readable(*s);
      progress = progress || s->input().size() != before || s->flags.peer_closed;
    }
  }
  return progress;
}

void Server::on_readable(Session& s) {
  // Budget per batch, not per call: a connection read in an earlier round of this batch gets
  // what is left of it.
  size_t received = 0;
  const size_t already = s.flags.in_batch ? s.input().size() : 0;
  const size_t budget = already >= kReadBudget ? 0 : kReadBudget - already;
  if (budget == 0) return;
  const Session::ReadStatus st = s.read(scratch_, budget, received);
  counters_.bytes_received += received;
  if (st == Session::ReadStatus::Closed) s.flags.peer_closed = true;
  if ((received > 0 || s.flags.peer_closed) && !s.flags.in_batch) {
    s.flags.in_batch = true;
    batch_.push_back(&s);
  }
  if (s.flags.peer_closed) update_interest(s);
}

void Server::apply(Session& s, core::StoreConnection::Stage stage) {
  if (s.flags.closing) return;
  try {
    const size_t used = s.conn().consume(s.input(), stage);
    s.consume_input(used);
    if (used > 0) s.partial_since = {};  // what is left began after the request just applied
    if (s.handshake.pending && !s.conn().awaiting_proof()) drop_pending_handshake(s);
  } catch (const AccessDenied& e) {
    close_session(s, CloseReason::Unauthorized, std::string("access denied, closing the connection: ") + e.what());
  } catch (const LimitError& e) {
    close_session(s, CloseReason::OverLimit,
                  std::string("refused a request over a limit, closing the connection: ") + e.what());
  } catch (const ProtocolError& e) {
    close_session(s, CloseReason::BadRequest, std::string("bad request, closing the connection: ") + e.what());
  } catch (const std::bad_alloc&) {
    close_session(s, CloseReason::OverLimit, "out of memory while serving a request, closing the connection");
  } catch (const std::exception& e) {
    close_session(s, CloseReason::BadRequest,
                  std::string("error while serving a request, closing the connection: ") + e.what());
  }
}

void Server::mark_dirty(Session& s) {
  if (s.flags.dirty || s.flags.closing) return;
  s.flags.dirty = true;
  dirty_.push_back(&s);
}

void Server::send(Session& s) {
  // What a client is about to hear of is in the state file first.
  if (journal_) journal_->flush();
  if (s.conn().overflowed()) {
    close_session(s, CloseReason::NotReading,
                  "not reading what it is sent: " + std::to_string(s.conn().output().size()) +
                      " bytes of wake-ups and watch notifications unread, over the limit of " +
                      std::to_string(options_.limits.max_output_backlog) + "; closing the connection");
    return;
  }
  size_t sent = 0;
  int error = 0;
  const bool ok = s.flush(sent, error);
  counters_.bytes_sent += sent;
  note_owed(s, sent > 0);
  if (!ok) {
    close_session(s, CloseReason::WriteFailed,
                  error == EPIPE || error == ECONNRESET ? "" : std::string("write failed: ") + std::strerror(error));
    return;
  }
  // The client read its backlog: take up its waiting request again, in the batch under way.
  if (s.flags.paused && s.conn().output().size() <= options_.limits.output_high_water) {
    s.flags.paused = false;
    if (!s.flags.in_batch && !s.input().empty()) {
      s.flags.in_batch = true;
      batch_.push_back(&s);
    }
  }
  update_interest(s);
}

void Server::update_interest(Session& s) {
  if (s.flags.closing) return;
  uint32_t want = 0;
  if (!s.flags.paused && !s.flags.peer_closed) want |= EPOLLIN | EPOLLRDHUP;
  if (!s.conn().output().empty()) want |= EPOLLOUT;
  if (want == s.flags.registered) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &s;
  ::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_MOD, s.fd(), &ev);
  s.flags.registered = want;
}

void Server::close_session(Session& s, CloseReason reason, const std::string& why) {
  if (s.flags.closing) return;
  s.flags.closing = true;
  drop_pending_handshake(s);
  unfinished_bytes_ -= s.unfinished_counted;
  s.unfinished_counted = 0;
  owed_bytes_ -= s.owed_counted;
  s.owed_counted = 0;
  ++counters_.closed[static_cast<size_t>(reason)];
  log_close(s, reason, why);
  if (reason != CloseReason::PeerClosed && reason != CloseReason::WriteFailed && reason != CloseReason::NotReading) {
    // The replies to the requests applied before the bad one are the client's: send what the
    // socket takes now (never blocking), so it learns what happened before the close.
    size_t sent = 0;
    int error = 0;
    s.flush(sent, error);
    counters_.bytes_sent += sent;
  }
  ::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_DEL, s.fd(), nullptr);
  // Clears this client's waits and watches now; the object goes at the end of the batch, since
  // the batch's lists may still point at it. What it was owed and what it sent go now too: a
  // batch that closes many connections gives their memory back as it goes.
  s.conn().release();
  s.conn().output().clear();
  std::string().swap(s.input());
  auto it = sessions_.find(&s);
  if (it != sessions_.end()) {
    // The descriptor goes now, not at the end of the batch: a connection evicted to make room
    // when out of descriptors frees one for the newcomer at once.
    ::shutdown(s.fd(), SHUT_RDWR);
    s.close_socket();
    closed_.push_back(std::move(it->second));
    sessions_.erase(it);
  }
}

void Server::log_close(Session& s, CloseReason reason, const std::string& why) {
  if (why.empty()) {
    DDPRUN_LOG_DEBUG("store") << "client " << s.peer() << " disconnected after " << s.conn().requests() << " requests";
    return;
  }
  // A peer decides how often its connections are closed: one line per address and reason, the
  // rest counted (a peer looping connect-send-close in 5 s once wrote 7.5 MB of these).
  const std::string host = peer_host(s.peer());
  const std::string line = "client " + s.peer() + ": " + why;
  const auto now = std::chrono::steady_clock::now();
  if (reason == CloseReason::Unauthorized || reason == CloseReason::NoHandshake) {
    refusals_.note(host, line, "refused connections from " + host, now);
    return;
  }
  const std::string name(close_reason_name(reason));
  std::string kind = name;
  if (reason == CloseReason::OverLimit) {
    // One line per limit (the flag that sets it, which the operator needs), then counted: a
    // peer looping over requests past a limit once wrote a line per connection.
    const auto flag = why.rfind("(--");
    if (flag != std::string::npos) kind += " " + why.substr(flag, why.find(')', flag) - flag + 1);
  }
  closes_.note(kind + " " + host, line, "connections from " + host + " closed (" + kind + ")", now);
}

std::vector<ClientInfo> Server::clients() const {
  std::unordered_map<const core::Waiter*, const core::PendingWaitInfo*> waits;
  const std::vector<core::PendingWaitInfo> pending = store_.pending_waits();
  for (const core::PendingWaitInfo& w : pending) waits[w.waiter] = &w;
  std::vector<ClientInfo> out;
  out.reserve(sessions_.size());
  for (const auto& [ptr, session] : sessions_) {
    if (session->flags.closing) continue;
    ClientInfo c;
    c.peer = session->peer();
    if (auto it = waits.find(&session->conn()); it != waits.end()) {
      c.waiting = it->second->missing;
      c.waiting_since = it->second->since;
    }
    out.push_back(std::move(c));
  }
  return out;
}

ServerStats Server::stats() const {
  ServerStats st = counters_;
  st.connections = sessions_.size();
  st.held_not_allowed = held_.size();
  st.waiting_clients = store_.waiting_clients();
  st.keys = store_.num_keys();
  st.stored_bytes = store_.stored_bytes();
  st.requests = store_.requests();
  st.held_input_bytes = unfinished_bytes_;
  st.held_input_limit = held_input_limit();
  st.owed_bytes = owed_bytes_;
  st.owed_limit = owed_limit();
  return st;
}

void Server::stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ignored;
  accept_retry_.cancel();
  hold_timer_.cancel();
  admission_timer_.cancel();
  held_.clear();  // closed unread
  janitor_timer_.cancel();
  housekeeping_timer_.cancel();
  epoll_.cancel(ignored);
  std::vector<Session*> all;
  for (auto& [ptr, session] : sessions_) all.push_back(ptr);
  for (Session* s : all) close_session(*s, CloseReason::Shutdown, "");
  closed_.clear();
  batch_.clear();
  dirty_.clear();
  refusals_.flush(std::chrono::steady_clock::now(), /*all=*/true);
  closes_.flush(std::chrono::steady_clock::now(), /*all=*/true);
  if (journal_) journal_->flush();
  epoll_.close(ignored);
  listen_fd_.reset();
  if (!started_) return;
  if (options_.log_lifecycle) log::info("store") << "stopped serving " << format_endpoint(endpoint_);
  else DDPRUN_LOG_DEBUG("store") << "stopped serving " << format_endpoint(endpoint_);
}

}  // namespace ddprun::rdzv::server
