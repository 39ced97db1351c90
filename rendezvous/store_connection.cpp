#include "rendezvous/store_connection.hpp"

#include "common/errors.hpp"
#include "common/log.hpp"

namespace ddprun::rdzv {

StoreConnection::StoreConnection(KvStore& store, const Limits& limits, std::function<void()> on_async_output)
    : store_(store), limits_(limits), on_async_output_(std::move(on_async_output)) {}

StoreConnection::~StoreConnection() { release(); }

void StoreConnection::release() {
  if (released_) return;
  released_ = true;
  store_.forget(*this);
}

size_t StoreConnection::consume(std::string_view input) {
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
    const DecodeResult r = decode_request(*dialect_, input.substr(used), limits_, request_);
    switch (r.status) {
      case DecodeStatus::Incomplete: return used;
      case DecodeStatus::Error: throw ProtocolError(r.error);
      case DecodeStatus::Complete: break;
    }
    apply(request_);
    ++requests_;
    store_.count_request();
    used += r.consumed;
  }
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

void StoreConnection::apply(const Request& req) {
  // Clients have one request outstanding: a new request while a WAIT is pending means the client
  // gave up on it (a 1.13 client's socket timeout sends no cancel). Dropping the stale wait keeps
  // a late STOP_WAITING byte from being read as the reply to this request.
  if (req.op != Op::CancelWait && store_.has_pending_wait(*this)) {
    DDPRUN_LOG_DEBUG("store") << "dropping a stale WAIT: the client sent " << op_name(req.op);
    store_.cancel_wait(*this);
  }
  switch (req.op) {
    case Op::Validate:
      if (req.number != kValidateMagic) {
        throw ProtocolError("VALIDATE with wrong magic " + std::to_string(req.number));
      }
      break;
    case Op::Ping:
      put_u32(out_, req.number);
      break;
    case Op::Set:
      store_.set(req.keys[0], req.values[0]);
      break;
    case Op::CompareSet:
      put_bytes(out_, store_.compare_set(req.keys[0], req.values[0], req.values[1]));
      break;
    case Op::Get: {
      // PyTorch's clients WAIT before GET; a key deleted in between reads as empty (as libuv does).
      const std::string* v = store_.get(req.keys[0]);
      put_bytes(out_, v ? std::string_view(*v) : std::string_view());
      break;
    }
    case Op::Add:
      put_i64(out_, store_.add(req.keys[0], req.delta));
      break;
    case Op::Check:
      put_u8(out_, store_.check(req.keys) ? kCheckReady : kCheckNotReady);
      break;
    case Op::Wait:
      if (store_.wait(*this, req.keys)) put_u8(out_, kStopWaiting);
      break;
    case Op::GetNumKeys:
      put_i64(out_, static_cast<int64_t>(store_.num_keys()));
      break;
    case Op::WatchKey:
      store_.watch(*this, req.keys[0]);
      put_u8(out_, kWatchCallbackRegistered);
      break;
    case Op::DeleteKey:
      put_i64(out_, store_.remove(req.keys[0]) ? 1 : 0);
      break;
    case Op::Append:
      store_.append(req.keys[0], req.values[0]);
      break;
    case Op::MultiGet:
      for (std::string_view key : req.keys) {
        const std::string* v = store_.get(key);
        put_bytes(out_, v ? std::string_view(*v) : std::string_view());
      }
      break;
    case Op::MultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) store_.set(req.keys[i], req.values[i]);
      break;
    case Op::CancelWait:
      store_.cancel_wait(*this);
      put_u8(out_, kWaitCanceled);
      break;
    case Op::QueuePush:
      store_.queue_push(req.keys[0], req.values[0]);
      break;
    case Op::QueuePop: {
      const int64_t before = store_.queue_pop(req.keys[0], scratch_);
      put_i64(out_, before);
      if (before > 0) put_bytes(out_, scratch_);
      break;
    }
    case Op::QueueLen:
      put_i64(out_, store_.queue_len(req.keys[0]));
      break;
    case Op::List: {
      const std::vector<std::string> keys = store_.list();
      put_i64(out_, static_cast<int64_t>(keys.size()));
      for (const std::string& k : keys) put_bytes(out_, k);
      break;
    }
  }
}

void StoreConnection::on_wait_complete() {
  put_u8(out_, kStopWaiting);
  if (on_async_output_) on_async_output_();
}

void StoreConnection::on_watch_event(uint8_t event, std::string_view key, std::string_view old_value,
                                     std::string_view new_value) {
  put_u8(out_, event);
  put_bytes(out_, key);
  put_bytes(out_, old_value);
  put_bytes(out_, new_value);
  if (on_async_output_) on_async_output_();
}

}  // namespace ddprun::rdzv
