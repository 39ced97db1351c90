#include "rendezvous/core/store_connection.hpp"

#include <algorithm>

#include "common/errors.hpp"
#include "common/log.hpp"
#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/job_namespace.hpp"

namespace ddprun::rdzv::core {

StoreConnection::StoreConnection(KvStore& store, const Limits& limits, std::function<void()> on_async_output,
                                 const StoreSecret* secret)
    : store_(store),
      limits_(limits),
      on_async_output_(std::move(on_async_output)),
      secret_(secret),
      auth_(secret ? AuthState::Required : AuthState::Open) {}

StoreConnection::~StoreConnection() { release(); }

void StoreConnection::release() {
  if (released_) return;
  released_ = true;
  store_.forget(*this);
}

size_t StoreConnection::consume(std::string_view input, Stage stage) {
  blocked_ = false;
  size_t used = 0;
  if (!dialect_) {
    const Handshake hs = detect_dialect(input);
    switch (hs.status) {
      case HandshakeStatus::NeedMore: return 0;
      case HandshakeStatus::Legacy: dialect_ = Dialect::Legacy; break;
      case HandshakeStatus::V2: dialect_ = Dialect::V2; break;
    }
    used = hs.consumed;
  }
  while (used < input.size()) {
    // Before the handshake, a protected store takes only the handshake's frames, at the
    // handshake's sizes: anything else is refused at its first byte, before it costs memory.
    const bool gated = awaiting_proof();
    if (gated) {
      const std::optional<Op> op = op_from_wire(*dialect_, static_cast<uint8_t>(input[used]));
      if (op && !allowed_before_handshake(*op)) throw_before_handshake(*op);
    }
    const DecodeResult r =
        decoder_.decode(*dialect_, input.substr(used), gated ? handshake_limits() : limits_, request_);
    switch (r.status) {
      case DecodeStatus::Incomplete: return used;
      case DecodeStatus::Error: throw ProtocolError(r.error);
      case DecodeStatus::Complete: break;
    }
    if (op_has_reply(request_.op)) {
      if (stage == Stage::NoReply) return used;
      if (out_.size() > limits_.output_high_water) {
        blocked_ = true;  // the decoder keeps the request for the next call
        return used;
      }
    }
    apply(request_);
    decoder_.done();
    ++requests_;
    store_.count_request(request_.op);
    used += r.consumed;
  }
  // A request with very many keys should not leave its vectors' memory with an idle connection.
  if (request_.keys.capacity() > 1024 || request_.values.capacity() > 1024) request_ = Request();
  return used;
}

std::string StoreConnection::describe_partial(std::string_view partial) const {
  if (partial.empty()) return "no partial request";
  std::string what = "unknown command";
  if (dialect_) {
    if (auto op = op_from_wire(*dialect_, static_cast<uint8_t>(partial[0]))) what = std::string(op_name(*op));
  } else {
    what = "handshake";
  }
  return std::to_string(partial.size()) + " bytes of an incomplete " + what + " request";
}

void StoreConnection::check_reply_size(const Request& req) const {
  uint64_t bytes = 0;
  switch (req.op) {
    case Op::Get:
    case Op::MultiGet:
      for (std::string_view key : req.keys) {
        const std::string* v = store_.get(key);
        bytes += 8 + (v ? v->size() : 0);
      }
      break;
    case Op::List: bytes = store_.list_reply_bytes(); break;
    default: return;  // fixed-size replies, or a single value bounded by the value limit
  }
  if (bytes > limits_.max_reply_bytes) {
    throw LimitError(std::string(op_name(req.op)) + " of " + std::to_string(req.keys.size()) +
                     " key(s) would produce a reply of " + std::to_string(bytes) + " bytes, over the limit of " +
                     std::to_string(limits_.max_reply_bytes) + " (--max-reply-bytes)");
  }
}

void StoreConnection::authenticate(const Request& req) {
  if (req.op == Op::AuthHello) {
    if (auth_ == AuthState::Open) {
      out_.put_u8(kAuthOpen);  // nothing to prove
      out_.put_bytes("");
      return;
    }
    if (auth_ != AuthState::Required) throw AccessDenied("AUTH_HELLO sent twice");
    const std::string_view scope = req.keys[0];
    if (req.number != kAuthVersion) {
      throw AccessDenied("AUTH_HELLO of version " + std::to_string(req.number) + "; this store speaks version " +
                         std::to_string(kAuthVersion));
    }
    if (req.values[0].size() != kNonceBytes) throw AccessDenied("AUTH_HELLO with a nonce that is not 32 bytes");
    // An empty scope is a client without a secret asking whether it needs one: it is challenged
    // like any other, and learns so (it can never pass the proof).
    scope_ = std::string(scope);
    client_nonce_ = std::string(req.values[0]);
    server_nonce_ = random_nonce();
    auth_ = AuthState::Challenged;
    out_.put_u8(kAuthProveSaysRefusal);
    out_.put_bytes(server_nonce_);
    return;
  }
  // AUTH_PROOF
  if (auth_ == AuthState::Open) throw AccessDenied("AUTH_PROOF to a store that needs none");
  if (auth_ != AuthState::Challenged) throw AccessDenied("AUTH_PROOF without AUTH_HELLO first");
  if (scope_ != kAllJobs && !core::valid_run_id(scope_)) {
    out_.put_u8(kProofRefused);
    throw AccessDenied("AUTH_PROOF for scope '" + scope_.substr(0, 64) + "', which is no job id");
  }
  const std::optional<std::string> key_for_scope = secret_->key_for(scope_);
  if (!key_for_scope) {
    out_.put_u8(kProofRefused);  // said before the close (kAuthProveSaysRefusal)
    throw AccessDenied("AUTH_PROOF for " + (scope_ == kAllJobs ? std::string("every job") : "job '" + scope_ + "'") +
                       ", which this store does not serve");
  }
  const std::string& key = *key_for_scope;
  if (!same_mac(req.values[0], client_mac(key, scope_, client_nonce_, server_nonce_))) {
    scope_.clear();
    out_.put_u8(kProofRefused);
    throw AccessDenied("wrong proof of the secret (a wrong token file, or a token for another job)");
  }
  auth_ = AuthState::Authenticated;
  out_.put_u8(kProofAccepted);
  out_.put_bytes(server_mac(key, scope_, client_nonce_, server_nonce_));
  DDPRUN_LOG_DEBUG("store") << "client authenticated for " << (scope_ == kAllJobs ? "every job" : "job " + scope_);
}

const Limits& StoreConnection::handshake_limits() {
  // A scope is a job id (at most 200 bytes) or "*"; nonces and proofs are 32 bytes.
  static const Limits limits = [] {
    Limits l;
    l.max_key_bytes = 256;
    l.max_value_bytes = 64;
    l.max_keys_per_request = 1;
    l.max_request_bytes = 1024;
    return l;
  }();
  return limits;
}

bool StoreConnection::allowed_before_handshake(Op op) {
  return op == Op::Validate || op == Op::Ping || op == Op::AuthHello || op == Op::AuthProof;
}

void StoreConnection::throw_before_handshake(Op op) {
  throw AccessDenied("sent " + std::string(op_name(op)) +
                     " before proving it holds the store's secret (this store is protected)");
}

void StoreConnection::check_access(const Request& req) const {
  switch (auth_) {
    case AuthState::Open: return;
    case AuthState::Required:
    case AuthState::Challenged: throw_before_handshake(req.op);
    case AuthState::Authenticated: break;
  }
  if (scope_ == kAllJobs) return;
  const std::string prefix = core::job_prefix(scope_);
  const bool reads = req.op == Op::Check || req.op == Op::Get || req.op == Op::MultiGet || req.op == Op::Wait;
  for (std::string_view key : req.keys) {
    if (reads && key == core::kStoreInfoKey) continue;  // the store's own description, for everyone
    if (key.substr(0, prefix.size()) != prefix) {
      throw AccessDenied("authenticated for job '" + scope_ + "' but sent " + std::string(op_name(req.op)) +
                         " on key '" + std::string(key.substr(0, 80)) + "', outside that job");
    }
  }
}

std::span<const std::string_view> StoreConnection::stored_keys(const std::vector<std::string_view>& keys) {
  if (!description_ || std::find(keys.begin(), keys.end(), core::kStoreInfoKey) == keys.end()) return keys;
  described_others_.clear();
  for (std::string_view k : keys) {
    if (k != core::kStoreInfoKey) described_others_.push_back(k);
  }
  return described_others_;
}

void StoreConnection::apply(const Request& req) {
  switch (req.op) {
    case Op::Validate:
    case Op::Ping: break;  // allowed before the handshake: they touch nothing
    case Op::AuthHello:
    case Op::AuthProof: authenticate(req); return;
    default: check_access(req); break;
  }
  // Clients have one request outstanding: a new request while a WAIT is pending means the client
  // gave up on it (a 1.13 client's socket timeout sends no cancel). Dropping the stale wait keeps
  // a late STOP_WAITING byte from being read as the reply to this request.
  if (req.op != Op::CancelWait && store_.has_pending_wait(*this)) {
    DDPRUN_LOG_DEBUG("store") << "dropping a stale WAIT: the client sent " << op_name(req.op);
    store_.cancel_wait(*this);
  }
  check_reply_size(req);
  execute(req);
}

// One case per command of the wire protocol (protocol.hpp's Op), in one switch so
// that the compiler checks every Op is handled; each case is a call into the store and its reply.
void StoreConnection::execute(const Request& req) {
  switch (req.op) {
    case Op::Validate:
      if (req.number != kValidateMagic) {
        throw ProtocolError("VALIDATE with wrong magic " + std::to_string(req.number));
      }
      break;
    case Op::Ping: out_.put_u32(req.number); break;
    case Op::Set: store_.set(req.keys[0], req.values[0]); break;
    case Op::CompareSet: out_.put_value(store_.compare_set(req.keys[0], req.values[0], req.values[1])); break;
    case Op::Get:
      if (description_ && req.keys[0] == core::kStoreInfoKey) {
        out_.put_value(description_);
        break;
      }
      // PyTorch's clients WAIT before GET; a key deleted in between reads as empty (as libuv does).
      out_.put_value(store_.get_shared(req.keys[0]));
      break;
    case Op::Add: out_.put_i64(store_.add(req.keys[0], req.delta)); break;
    case Op::AddOnce:
      if (req.values[0].empty() || req.values[0].size() > kMaxOnceToken) {
        throw ProtocolError("ADD_ONCE with a " + std::to_string(req.values[0].size()) + "-byte token (1 to " +
                            std::to_string(kMaxOnceToken) + " bytes)");
      }
      out_.put_i64(store_.add_once(req.keys[0], req.delta, req.values[0]));
      break;
    case Op::Check: {
      const auto keys = stored_keys(req.keys);
      out_.put_u8(keys.empty() || store_.check(keys) ? kCheckReady : kCheckNotReady);
      break;
    }
    case Op::Wait: {
      const auto keys = stored_keys(req.keys);
      if (keys.empty() || store_.wait(*this, keys)) out_.put_u8(kStopWaiting);
      break;
    }
    case Op::GetNumKeys:
      if (auth_ == AuthState::Authenticated && scope_ != kAllJobs) {
        int64_t n = 0;  // a job sees its own keys only
        store_.for_each(core::job_prefix(scope_), [&](std::string_view, const std::string&) { ++n; });
        out_.put_i64(n);
      } else {
        out_.put_i64(static_cast<int64_t>(store_.num_keys()));
      }
      break;
    case Op::WatchKey:
      store_.watch(*this, req.keys[0]);
      out_.put_u8(kWatchCallbackRegistered);
      break;
    case Op::DeleteKey: out_.put_i64(store_.remove(req.keys[0]) ? 1 : 0); break;
    case Op::Append: store_.append(req.keys[0], req.values[0]); break;
    case Op::MultiGet:
      for (std::string_view key : req.keys) out_.put_value(store_.get_shared(key));
      break;
    case Op::MultiSet: store_.multi_set(req.keys, req.values); break;
    case Op::CancelWait:
      store_.cancel_wait(*this);
      out_.put_u8(kWaitCanceled);
      break;
    case Op::QueuePush: store_.queue_push(req.keys[0], req.values[0]); break;
    case Op::QueuePop: {
      const int64_t before = store_.queue_pop(req.keys[0], scratch_);
      out_.put_i64(before);
      if (before > 0) out_.put_value(std::make_shared<const std::string>(std::move(scratch_)));
      scratch_.clear();
      break;
    }
    case Op::QueueLen: out_.put_i64(store_.queue_len(req.keys[0])); break;
    case Op::List: {
      // Straight from the map, in its order (PyTorch's store answers unordered too; ddprun's
      // client sorts): no copy of the keys and no sort, so 800,000 keys hold the store's thread
      // for about 0.15 s, not 0.6 (docs/benchmarks.md).
      const std::string prefix =
          auth_ == AuthState::Authenticated && scope_ != kAllJobs ? core::job_prefix(scope_) : std::string();
      int64_t n = static_cast<int64_t>(store_.num_keys());
      if (!prefix.empty()) {
        n = 0;
        store_.for_each(prefix, [&](std::string_view, const std::string&) { ++n; });
      }
      out_.put_i64(n);
      store_.for_each(prefix, [&](std::string_view key, const std::string&) { out_.put_bytes(key); });
      break;
    }
    case Op::AuthHello:
    case Op::AuthProof: break;  // handled above
  }
}

void StoreConnection::async_output() {
  if (out_.size() > limits_.max_output_backlog) overflowed_ = true;
  if (on_async_output_) on_async_output_();
}

void StoreConnection::on_wait_complete() {
  out_.put_u8(kStopWaiting);
  async_output();
}

void StoreConnection::on_watch_event(uint8_t event, std::string_view key, const SharedBytes& old_value,
                                     const SharedBytes& new_value) {
  if (overflowed_) return;  // about to be closed: queue nothing more
  out_.put_u8(event);
  out_.put_bytes(key);
  out_.put_value(old_value);
  out_.put_value(new_value);
  async_output();
}

}  // namespace ddprun::rdzv::core
