// Server's admission of connections: accepting them (a batch at a time), refusing newcomers when
// out of descriptors, the allowed peers (a stranger held for a grace, then admitted or reset), and
// a protected store's connections that have not proved the secret yet (their deadline; their cap,
// at which a newcomer pushes out the oldest once it has had its grace). See server.hpp.
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"
#include "common/unique_fd.hpp"
#include "rendezvous/server/server.hpp"
#include "rendezvous/server/server_socket.hpp"
#include "rendezvous/server/session.hpp"

namespace ddprun::rdzv::server {

namespace {

// New connections accepted per batch, so a connect storm does not stall the served ones.
constexpr int kAcceptPerBatch = 1024;

}  // namespace

void Server::arm_housekeeping() {
  if (stopped_) return;  // on any store: the counts of closes not logged come out when due
  const auto period =
      std::clamp<std::chrono::milliseconds>(options_.secret ? options_.handshake_timeout / 4 : std::chrono::seconds(1),
                                            std::chrono::milliseconds(50), std::chrono::seconds(1));
  housekeeping_timer_.expires_after(period);
  housekeeping_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    const auto now = std::chrono::steady_clock::now();
    while (!pending_handshakes_.empty() &&
           now - pending_handshakes_.front()->handshake.since >= options_.handshake_timeout) {
      Session& s = *pending_handshakes_.front();
      close_session(
          s, CloseReason::NoHandshake,
          "did not prove the store's secret within " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(options_.handshake_timeout).count()) +
              " s, closing the connection");
    }
    enforce_request_deadline(now);
    refusals_.flush(now);
    closes_.flush(now);
    if (journal_) journal_->retry_if_broken();
    arm_housekeeping();
  });
}

void Server::add_pending_handshake(Session& s) {
  s.handshake.pending = true;
  s.handshake.since = std::chrono::steady_clock::now();
  s.handshake.at = pending_handshakes_.insert(pending_handshakes_.end(), &s);
}

void Server::drop_pending_handshake(Session& s) {
  if (!s.handshake.pending) return;
  pending_handshakes_.erase(s.handshake.at);
  s.handshake.pending = false;
  // A place under the cap: the connections waiting in the backlog may come in.
  if (accept_held_ && pending_handshakes_.size() < pending_cap_) release_accepting();
}

bool Server::evict_oldest_pending(const std::string& why) {
  if (pending_handshakes_.empty()) return false;
  Session& oldest = *pending_handshakes_.front();
  // Whatever it has sent: a peer that sends a byte and stops looks like a client in the middle of
  // its handshake, and one that holds the secret is through long before its grace ends.
  if (std::chrono::steady_clock::now() - oldest.handshake.since < options_.handshake_grace) return false;
  close_session(oldest, CloseReason::NoHandshake, why + "; closing the connection");
  return true;
}

bool Server::room_for_handshake() {
  if (!options_.secret || pending_handshakes_.size() < pending_cap_) return true;
  if (evict_oldest_pending("had not proved the store's secret after " +
                           std::to_string(options_.handshake_grace.count()) + " ms, the oldest of " +
                           std::to_string(pending_handshakes_.size()) +
                           " such connections (the most allowed at once), made room for a newer one")) {
    return true;
  }
  hold_accepting();
  return false;
}

void Server::watch_listener() {
  epoll_event ev{};
  ev.events = accept_paused_ || accept_held_ ? 0u : static_cast<uint32_t>(EPOLLIN);
  ev.data.ptr = nullptr;
  ::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
}

void Server::hold_accepting() {
  if (accept_held_ || stopped_) return;
  accept_held_ = true;
  watch_listener();
  // Nothing else wakes a held listener when no pending connection proves the secret or goes: look
  // again once the oldest may make room.
  hold_timer_.expires_at(pending_handshakes_.empty()
                             ? std::chrono::steady_clock::now()
                             : pending_handshakes_.front()->handshake.since + options_.handshake_grace);
  hold_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_ || !accept_held_) return;
    release_accepting();
  });
}

void Server::release_accepting() {
  if (!accept_held_) return;
  accept_held_ = false;
  hold_timer_.cancel();
  watch_listener();  // level-triggered: a non-empty backlog is reported at once
}

void Server::accept_pending() {
  for (int i = 0; i < kAcceptPerBatch && !accept_paused_; ++i) {
    if (!room_for_handshake()) return;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    UniqueFd fd(::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The oldest connection that has not proved the secret makes room; without one, the
        // newcomer is refused. accept(2) fails this way whether or not a connection is waiting.
        if (evict_oldest_pending("had not proved the store's secret, and made room for a newer connection: out "
                                 "of file descriptors")) {
          continue;
        }
        if (!refuse_one()) return;
        continue;
      }
      log::warn("store") << "accept failed: " << std::strerror(errno);
      pause_accepting();
      return;
    }
    if (out_of_fds_) {
      out_of_fds_ = false;
      log::info("store") << "accepting connections again (" << refused_in_episode_
                         << " refused while out of file descriptors)";
      refused_in_episode_ = 0;
    }
    if (allowed_ && !allowed_->count(peer_address(addr))) {
      hold_or_refuse(std::move(fd), addr);
      continue;
    }
    open_session(std::move(fd), addr);
  }
}

void Server::open_session(UniqueFd fd, const sockaddr_storage& addr) {
  auto session = std::make_unique<Session>(
      std::move(fd), format_sockaddr(&addr), store_, options_.limits, [this](Session& s) { mark_dirty(s); },
      options_.secret ? &*options_.secret : nullptr);
  Session* raw = session.get();
  if (description_) raw->conn().describe_store(description_);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.ptr = raw;
  if (::epoll_ctl(epoll_.native_handle(), EPOLL_CTL_ADD, raw->fd(), &ev) != 0) {
    log::warn("store") << "cannot watch client " << raw->peer() << ": " << std::strerror(errno);
    return;  // the session's destructor closes the socket
  }
  raw->flags.registered = ev.events;
  sessions_.emplace(raw, std::move(session));
  if (options_.secret) add_pending_handshake(*raw);
  ++counters_.accepted;
  DDPRUN_LOG_DEBUG("store") << "client " << raw->peer() << " connected";
}

void Server::hold_or_refuse(UniqueFd fd, const sockaddr_storage& addr) {
  std::string who = peer_address(addr);
  if (options_.admission_grace.count() <= 0 || held_.size() >= held_cap_) {
    refuse_not_allowed(std::move(fd), who);
    return;
  }
  // Not one of the job's nodes yet: never read; it waits for allow_peers or its time.
  DDPRUN_LOG_DEBUG("store") << "holding a connection from " << who << " until it is named one of this job's nodes";
  held_.push_back(Held{std::move(fd), addr, std::move(who), std::chrono::steady_clock::now()});
  if (held_.size() == 1) arm_admission_timer();
}

void Server::refuse_not_allowed(UniqueFd fd, const std::string& who) {
  if (refused_logged_.insert(who).second && refused_logged_.size() <= 1000) {
    log::warn("store") << "refused a connection from " << who << ": not one of this job's nodes";
  }
  const linger reset{1, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  fd.reset();
  ++counters_.refused_not_allowed;
}

void Server::settle_held() {
  const auto now = std::chrono::steady_clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (!allowed_ || allowed_->count(it->who)) {
      DDPRUN_LOG_DEBUG("store") << "admitting the connection from " << it->who << " held for "
                                << std::chrono::duration_cast<std::chrono::milliseconds>(now - it->since).count()
                                << " ms: its address is one of this job's nodes now";
      ++counters_.admitted_late;
      open_session(std::move(it->fd), it->addr);
      it = held_.erase(it);
    } else if (now - it->since >= options_.admission_grace) {
      refuse_not_allowed(std::move(it->fd), it->who);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::arm_admission_timer() {
  if (held_.empty() || stopped_) return;
  // The oldest is the first whose time is up (one grace for all).
  admission_timer_.expires_at(held_.front().since + options_.admission_grace);
  admission_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    settle_held();
    arm_admission_timer();
  });
}

bool Server::refuse_one() {
  if (!spare_fd_) {
    pause_accepting();
    return false;
  }
  // The reserve-descriptor idiom: give up the spare, take the newcomer and close it at once, so
  // it learns now (connection reset) rather than waiting in the backlog forever.
  spare_fd_.reset();
  UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const int err = errno;
  const bool accepted = static_cast<bool>(fd);
  if (accepted) {
    const linger reset{1, 0};
    ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    fd.reset();
    ++counters_.refused_out_of_fds;
    ++refused_in_episode_;
    if (!out_of_fds_) {
      out_of_fds_ = true;
      log::warn("store") << "out of file descriptors (" << sessions_.size() << " clients, limit " << open_file_limit()
                         << "): new clients are refused until some disconnect; raise the limit (ulimit -n, "
                            "LimitNOFILE=) to serve more";
    }
  }
  spare_fd_ = open_spare();
  if (!accepted && err != EAGAIN && err != EWOULDBLOCK) pause_accepting();
  return accepted;
}

void Server::pause_accepting() {
  // Without a spare descriptor the pending connection cannot be taken: stop watching the
  // listener for a moment rather than spin on it.
  if (accept_paused_) return;
  accept_paused_ = true;
  watch_listener();
  accept_retry_.expires_after(std::chrono::milliseconds(100));
  accept_retry_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    accept_paused_ = false;
    if (!spare_fd_) spare_fd_ = open_spare();
    watch_listener();
  });
}

bool Server::admits(const boost::asio::ip::address& peer) const {
  return !allowed_ || allowed_->count(normalize_address(peer.to_string())) > 0;
}

void Server::allow_peers(const std::vector<std::string>& addresses) {
  std::set<std::string> allowed{"127.0.0.1", "::1"};
  for (const std::string& a : addresses) allowed.insert(normalize_address(a));
  allowed_ = std::move(allowed);
  if (!held_.empty()) {
    settle_held();
    arm_admission_timer();
  }
}

}  // namespace ddprun::rdzv::server
