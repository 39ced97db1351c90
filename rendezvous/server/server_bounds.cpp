// What the server's connections may hold (see server.hpp's ServerOptions): their input buffers
// together (an unfinished request, requests read behind unread replies), the copies of replies
// owed to them together, and an unfinished request's deadline. Past a bound, the connections that
// have held their bytes longest go first, until the rest fit. On the server's one thread.
#include <algorithm>
#include <string>
#include <vector>

#include "rendezvous/server/server.hpp"
#include "rendezvous/server/session.hpp"

namespace ddprun::rdzv::server {

using Clock = std::chrono::steady_clock;

void Server::note_partial(Session& s) {
  // Bytes left after a batch are an incomplete request, unless they wait for the client to read
  // its replies (no more is read meanwhile: at most a batch's read budget), which has no deadline.
  // A pending WAIT is no exception: the requests after it are decoded as they come (a client that
  // sends one has given up waiting), so bytes left behind it are as unfinished as any. Either way
  // the buffer counts in the total.
  if (s.input().empty() || s.flags.paused) {
    s.partial_since = {};
  } else if (s.partial_since == Clock::time_point{}) {
    s.partial_since = Clock::now();
  }
  const size_t held = s.input().empty() ? 0 : s.input().capacity();
  unfinished_bytes_ = unfinished_bytes_ - s.unfinished_counted + held;
  s.unfinished_counted = held;
}

void Server::note_owed(Session& s, bool progressed) {
  const core::OutputQueue& out = s.conn().output();
  if (out.empty()) {
    s.owed_since = {};
  } else if (progressed || s.owed_since == Clock::time_point{}) {
    s.owed_since = Clock::now();
  }
  owed_bytes_ = owed_bytes_ - s.owed_counted + out.owned();
  s.owed_counted = out.owned();
}

uint64_t Server::held_input_limit() const {
  // Never under two requests' limit: a buffer grows by doubling, so one whole request may hold that.
  return std::max(options_.max_unfinished_bytes, 2 * options_.limits.max_request_bytes);
}

uint64_t Server::owed_limit() const {
  // Never under two replies' limit: one client's largest reply, and another's, are owed at once.
  return std::max(options_.max_owed_bytes, 2 * options_.limits.max_reply_bytes);
}

void Server::shed(const uint64_t& total, uint64_t limit, size_t Session::*counted,
                  Clock::time_point (*since)(const Session&), CloseReason reason,
                  const std::function<std::string(Session&)>& why) {
  if (total <= limit) return;
  std::vector<Session*> holding;
  for (const auto& [ptr, session] : sessions_) {
    if (!session->flags.closing && (*session).*counted > 0) holding.push_back(session.get());
  }
  std::sort(holding.begin(), holding.end(),
            [since](const Session* a, const Session* b) { return since(*a) < since(*b); });
  for (Session* s : holding) {
    if (total <= limit) break;
    close_session(*s, reason, why(*s));  // lowers `total` by what it held
  }
}

void Server::enforce_unfinished_limit() {
  const uint64_t limit = held_input_limit();
  shed(
      unfinished_bytes_, limit, &Session::unfinished_counted, [](const Session& s) { return s.held_since(); },
      CloseReason::OverLimit,
      [&](Session& s) {
        const std::string what = s.flags.paused ? "sent " + std::to_string(s.input().size()) +
                                                      " bytes of requests behind replies it does not read"
                                                : "sent " + s.conn().describe_partial(s.input());
        return what + " while the requests held for all clients take " + std::to_string(unfinished_bytes_) +
               " bytes, over the limit of " + std::to_string(limit) +
               " (--max-unfinished-bytes); this one's were held first: closing the connection";
      });
}

void Server::enforce_owed_limit() {
  const uint64_t limit = owed_limit();
  const auto now = Clock::now();
  shed(
      owed_bytes_, limit, &Session::owed_counted, [](const Session& s) { return s.owed_since; },
      CloseReason::NotReading,
      [&](Session& s) {
        const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(now - s.owed_since).count();
        return "not reading its replies: " + std::to_string(s.conn().output().size()) + " bytes owed, none taken for " +
               std::to_string(idle) + " ms, while the replies owed to all clients hold " + std::to_string(owed_bytes_) +
               " bytes, over the limit of " + std::to_string(limit) +
               " (--max-owed-bytes); it took nothing for longest: closing the connection";
      });
}

void Server::enforce_request_deadline(std::chrono::steady_clock::time_point now) {
  const auto limit = options_.request_timeout;
  if (limit.count() <= 0) return;
  std::vector<Session*> late;
  for (const auto& [ptr, session] : sessions_) {
    const auto since = session->partial_since;
    if (!session->flags.closing && since != std::chrono::steady_clock::time_point{} && now - since >= limit) {
      late.push_back(session.get());
    }
  }
  for (Session* s : late) {
    close_session(*s, CloseReason::TimedOut,
                  "sent " + s->conn().describe_partial(s->input()) + " and not the rest within " +
                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(limit).count()) +
                      " ms (--request-timeout); closing the connection");
  }
}

}  // namespace ddprun::rdzv::server
