// The store's operations over a Client's connection (client.hpp); client.cpp has the connection
// itself: connecting with backoff, the secret handshake, framing and deadlines.
#include "rendezvous/client/client.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "common/system.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::client {

Client::Clock::time_point Client::deadline(std::optional<Duration> timeout) const {
  return Clock::now() + timeout.value_or(options_.timeout);
}

std::string Client::request(core::Op op) const {
  const auto code = core::op_to_wire(options_.dialect, op);
  if (!code) {
    throw ProtocolError(std::string(core::op_name(op)) + " is not available in the " +
                        std::string(core::dialect_name(options_.dialect)) + " store protocol");
  }
  std::string req;
  req.reserve(64);
  core::put_u8(req, *code);
  return req;
}

template <typename Fn>
auto Client::retrying(Fn&& fn) -> decltype(fn()) {
  std::optional<Clock::time_point> give_up;
  std::string first_error;
  bool closed_by_live_store = false;  // reconnected to the same store instance, not a restarted one
  const auto outage = [&](const std::exception& e) {
    if (give_up) return;
    give_up = Clock::now() + options_.outage_tolerance;
    first_error = e.what();
    log::warn("store") << first_error << "; reconnecting for up to " << seconds_text(options_.outage_tolerance);
  };
  for (;;) {
    try {
      ensure_connected_locked();
      return fn();
    } catch (const ConnectionError& e) {
      if (!tolerant_locked()) throw;
      // The store that closed the connection is up and closes it again: it refuses the request
      // (access, a limit, a quota), and sending it once more would not change that.
      if (closed_by_live_store) throw;
      outage(e);
    } catch (const TimeoutError& e) {
      // No reply before the deadline cost the connection (a partition, a frozen store host); a
      // timed WAIT that simply ran out keeps it, and its error is the caller's.
      if (!tolerant_locked() || fd_) throw;
      outage(e);
    }
    close_locked();
    const std::string boot = boot_;
    const bool was_durable = durable_;
    try {
      // A store without state that refuses the connection has ended: nothing to wait for.
      connect_locked(*give_up, /*refused_is_final=*/!was_durable);
    } catch (const TimeoutError&) {
      throw ConnectionError(first_error + "; it did not come back within " + seconds_text(options_.outage_tolerance));
    } catch (const ConnectionError& e) {
      throw ConnectionError(first_error + "; " + e.what());
    }
    ++reconnects_;
    if (boot_ != boot && !durable_) {
      close_locked();
      throw ConnectionError(first_error + (was_durable ? "; it came back without the state it kept (restarted "
                                                         "without its --state-file?)"
                                                       : "; it restarted, and forgot every job (a store keeps "
                                                         "them across restarts with --state-file)"));
    }
    closed_by_live_store = boot_ == boot;
    log::info("store") << "connected to store " << endpoint() << " again"
                       << (boot_ != boot ? " (it restarted, and kept its state)" : "");
  }
}

void Client::send_write_locked(std::string req, Clock::time_point dl, std::string_view what) {
  const bool confirm = tolerant_locked();
  constexpr uint32_t kNonce = 0xC0FF1E;
  if (confirm) {
    req += request(core::Op::Ping);
    core::put_u32(req, kNonce);
  }
  send_locked(req, dl, what);
  if (!confirm) return;
  char echo[4];
  recv_locked(echo, 4, dl, what);
  if (core::load_u32(echo) != kNonce) {
    close_locked();
    throw ProtocolError("store " + endpoint() + " confirmed " + std::string(what) + " with a wrong PING nonce");
  }
}

void Client::set(std::string_view key, std::string_view value) {
  std::lock_guard lock(mutex_);
  retrying([&] {
    std::string req = request(core::Op::Set);
    core::put_bytes(req, key);
    core::put_bytes(req, value);
    send_write_locked(std::move(req), deadline(std::nullopt), "SET");
  });
}

std::string Client::get(std::string_view key, std::optional<Duration> timeout) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(timeout);
    wait_locked({std::string(key)}, dl, timeout.value_or(options_.timeout));
    std::string req = request(core::Op::Get);
    core::put_bytes(req, key);
    send_locked(req, dl, "GET");
    return recv_bytes(dl, "GET");
  });
}

int64_t Client::add(std::string_view key, int64_t delta) {
  std::lock_guard lock(mutex_);
  std::string token;  // one per call: a retry sends the same one
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    const bool once = delta != 0 && tolerant_locked();
    std::string req = request(once ? core::Op::AddOnce : core::Op::Add);
    core::put_bytes(req, key);
    core::put_i64(req, delta);
    if (once) {
      if (token.empty()) token = next_once_token();
      core::put_bytes(req, token);
    }
    send_locked(req, dl, "ADD");
    return recv_i64(dl, "ADD");
  });
}

std::string Client::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::CompareSet);
    core::put_bytes(req, key);
    core::put_bytes(req, expected);
    core::put_bytes(req, desired);
    send_locked(req, dl, "COMPARE_SET");
    return recv_bytes(dl, "COMPARE_SET");
  });
}

bool Client::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::Check);
    core::put_u64(req, keys.size());
    for (const auto& k : keys) core::put_bytes(req, k);
    send_locked(req, dl, "CHECK");
    return recv_u8(dl, "CHECK") == core::kCheckReady;
  });
}

void Client::wait(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  std::lock_guard lock(mutex_);
  retrying([&] { wait_locked(keys, deadline(timeout), timeout.value_or(options_.timeout)); });
}

bool Client::timed_wait_locked(const std::vector<std::string>& keys, Clock::time_point dl) {
  std::string req = request(core::Op::Wait);
  core::put_u64(req, keys.size());
  for (const auto& k : keys) core::put_bytes(req, k);
  send_locked(req, dl, "WAIT");
  settle_proof_locked(dl);  // so that readiness below means the WAIT's answer
  if (readable_locked(dl)) {
    if (recv_u8(dl, "WAIT") != core::kStopWaiting) {
      close_locked();
      throw ProtocolError("store " + endpoint() + " answered WAIT with an unexpected byte");
    }
    return true;
  }
  if (options_.dialect == core::Dialect::Legacy) {
    // No CANCEL_WAIT in 1.13: a late STOP_WAITING would desynchronise the connection, so drop it.
    close_locked();
    throw TimeoutError("waited on store " + endpoint() + " for " + std::to_string(keys.size()) +
                       " key(s) past the deadline");
  }
  // Deadline passed: cancel on the server. A STOP_WAITING that raced the cancel means the keys
  // did arrive; WAIT_CANCELED always follows.
  const auto cancel_deadline = Clock::now() + std::chrono::seconds(10);
  send_locked(request(core::Op::CancelWait), cancel_deadline, "CANCEL_WAIT");
  uint8_t reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  const bool arrived = reply == core::kStopWaiting;
  if (arrived) reply = recv_u8(cancel_deadline, "CANCEL_WAIT");
  if (reply != core::kWaitCanceled) {
    close_locked();
    throw ProtocolError("store " + endpoint() + " answered CANCEL_WAIT with an unexpected byte");
  }
  return arrived;
}

bool Client::wait_for(const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard lock(mutex_);
  return retrying([&] { return timed_wait_locked(keys, Clock::now() + timeout); });
}

void Client::wait_locked(const std::vector<std::string>& keys, Clock::time_point dl, Duration timeout) {
  if (timed_wait_locked(keys, dl)) return;
  const auto cancel_deadline = Clock::now() + std::chrono::seconds(10);
  // Name what is missing, so the error says what never came.
  std::string missing;
  size_t n_missing = 0;
  for (const auto& k : keys) {
    std::string chk = request(core::Op::Check);
    core::put_u64(chk, 1);
    core::put_bytes(chk, k);
    send_locked(chk, cancel_deadline, "CHECK");
    if (recv_u8(cancel_deadline, "CHECK") == core::kCheckReady) continue;
    if (n_missing++ < 8) missing += (missing.empty() ? "" : ", ") + k;
  }
  if (n_missing > 8) missing += ", ...";
  throw TimeoutError("waited " + seconds_text(timeout) + " on store " + endpoint() + " for " +
                     std::to_string(keys.size()) + " key(s); " + std::to_string(n_missing) +
                     " still missing: " + missing);
}

bool Client::delete_key(std::string_view key) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::DeleteKey);
    core::put_bytes(req, key);
    send_locked(req, dl, "DELETE_KEY");
    return recv_i64(dl, "DELETE_KEY") == 1;
  });
}

int64_t Client::num_keys() {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    send_locked(request(core::Op::GetNumKeys), dl, "GETNUMKEYS");
    return recv_i64(dl, "GETNUMKEYS");
  });
}

void Client::append(std::string_view key, std::string_view data) {
  std::lock_guard lock(mutex_);
  retrying([&] {
    std::string req = request(core::Op::Append);
    core::put_bytes(req, key);
    core::put_bytes(req, data);
    send_write_locked(std::move(req), deadline(std::nullopt), "APPEND");
  });
}

std::vector<std::string> Client::multi_get(const std::vector<std::string>& keys, std::optional<Duration> timeout) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(timeout);
    wait_locked(keys, dl, timeout.value_or(options_.timeout));
    return multi_get_locked(keys, dl);
  });
}

std::vector<std::string> Client::multi_get_now(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return retrying([&] { return multi_get_locked(keys, deadline(std::nullopt)); });
}

std::vector<std::string> Client::multi_get_locked(const std::vector<std::string>& keys, Clock::time_point dl) {
  std::string req = request(core::Op::MultiGet);
  core::put_u64(req, keys.size());
  for (const auto& k : keys) core::put_bytes(req, k);
  send_locked(req, dl, "MULTI_GET");
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) values.push_back(recv_bytes(dl, "MULTI_GET"));
  return values;
}

void Client::multi_set(const std::vector<std::pair<std::string, std::string>>& entries) {
  std::lock_guard lock(mutex_);
  retrying([&] {
    std::string req = request(core::Op::MultiSet);
    core::put_i64(req, static_cast<int64_t>(entries.size()));
    for (const auto& [k, v] : entries) {
      core::put_bytes(req, k);
      core::put_bytes(req, v);
    }
    send_write_locked(std::move(req), deadline(std::nullopt), "MULTI_SET");
  });
}

void Client::queue_push(std::string_view key, std::string_view value) {
  std::lock_guard lock(mutex_);
  retrying([&] {
    std::string req = request(core::Op::QueuePush);
    core::put_bytes(req, key);
    core::put_bytes(req, value);
    send_write_locked(std::move(req), deadline(std::nullopt), "QUEUE_PUSH");
  });
}

std::optional<std::string> Client::queue_pop(std::string_view key) {
  std::lock_guard lock(mutex_);
  return retrying([&]() -> std::optional<std::string> {
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::QueuePop);
    core::put_bytes(req, key);
    send_locked(req, dl, "QUEUE_POP");
    if (recv_i64(dl, "QUEUE_POP") <= 0) return std::nullopt;
    return recv_bytes(dl, "QUEUE_POP");
  });
}

int64_t Client::queue_len(std::string_view key) {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::QueueLen);
    core::put_bytes(req, key);
    send_locked(req, dl, "QUEUE_LEN");
    return recv_i64(dl, "QUEUE_LEN");
  });
}

std::vector<std::string> Client::list() {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto dl = deadline(std::nullopt);
    send_locked(request(core::Op::List), dl, "LIST");
    const int64_t n = recv_i64(dl, "LIST");
    std::vector<std::string> keys;
    for (int64_t i = 0; i < n; ++i) keys.push_back(recv_bytes(dl, "LIST"));
    std::sort(keys.begin(), keys.end());  // the store answers in its map's order
    return keys;
  });
}

Client::Duration Client::ping() {
  std::lock_guard lock(mutex_);
  return retrying([&] {
    const auto start = Clock::now();
    const auto dl = deadline(std::nullopt);
    std::string req = request(core::Op::Ping);
    const uint32_t nonce = 0x5eed;
    core::put_u32(req, nonce);
    send_locked(req, dl, "PING");
    char echo[4];
    recv_locked(echo, 4, dl, "PING");
    if (core::load_u32(echo) != nonce) throw ProtocolError("store " + endpoint() + " echoed a wrong PING nonce");
    return std::chrono::duration_cast<Duration>(Clock::now() - start);
  });
}

}  // namespace ddprun::rdzv::client
