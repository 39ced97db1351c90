#include "rendezvous/core/protocol.hpp"

#include <cstring>
#include <span>

namespace ddprun::rdzv::core {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "TCPStore sends host-order integers; ddprun supports little-endian hosts only");

// Legacy (1.13) numbering: SET=0 .. DELETE_KEY=8.
constexpr Op kLegacyOps[] = {Op::Set,  Op::CompareSet, Op::Get,      Op::Add,      Op::Check,
                             Op::Wait, Op::GetNumKeys, Op::WatchKey, Op::DeleteKey};

// 2.x numbering: VALIDATE=0 .. LIST=17.
constexpr Op kV2Ops[] = {Op::Validate,   Op::Set,        Op::CompareSet, Op::Get,      Op::Add,      Op::Check,
                         Op::Wait,       Op::GetNumKeys, Op::DeleteKey,  Op::Append,   Op::MultiGet, Op::MultiSet,
                         Op::CancelWait, Op::Ping,       Op::QueuePush,  Op::QueuePop, Op::QueueLen, Op::List};

// What follows the command byte of each operation, in order.
enum class Field : uint8_t {
  U32,  // VALIDATE magic, PING nonce
  I64,  // ADD delta
  Key,
  Value,
  KeyCount,    // u64 n, then Keys
  Keys,        // n keys
  EntryCount,  // MULTI_SET: i64 n, then Entries
  Entries,     // n (key, value) pairs
};

std::span<const Field> layout(Op op) {
  static constexpr Field kNumber[] = {Field::U32};
  static constexpr Field kKeyValue[] = {Field::Key, Field::Value};
  static constexpr Field kCompareSet[] = {Field::Key, Field::Value, Field::Value};
  static constexpr Field kKey[] = {Field::Key};
  static constexpr Field kAdd[] = {Field::Key, Field::I64};
  static constexpr Field kKeyList[] = {Field::KeyCount, Field::Keys};
  static constexpr Field kEntryList[] = {Field::EntryCount, Field::Entries};
  static constexpr Field kAuthHello[] = {Field::U32, Field::Key, Field::Value};
  static constexpr Field kAuthProof[] = {Field::Value};
  static constexpr Field kAddOnce[] = {Field::Key, Field::I64, Field::Value};
  switch (op) {
    case Op::Validate:
    case Op::Ping: return kNumber;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: return kKeyValue;
    case Op::CompareSet: return kCompareSet;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen: return kKey;
    case Op::Add: return kAdd;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet: return kKeyList;
    case Op::MultiSet: return kEntryList;
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::List: return {};
    case Op::AuthHello: return kAuthHello;
    case Op::AuthProof: return kAuthProof;
    case Op::AddOnce: return kAddOnce;
  }
  return {};
}

}  // namespace

std::optional<Op> op_from_wire(Dialect dialect, uint8_t code) {
  switch (dialect) {
    case Dialect::Legacy:
      if (code < std::size(kLegacyOps)) return kLegacyOps[code];
      return std::nullopt;
    case Dialect::V2:
      if (code < std::size(kV2Ops)) return kV2Ops[code];
      if (code == kAuthHelloWire) return Op::AuthHello;
      if (code == kAuthProofWire) return Op::AuthProof;
      if (code == kAddOnceWire) return Op::AddOnce;
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<uint8_t> op_to_wire(Dialect dialect, Op op) {
  auto find = [op](const auto& table) -> std::optional<uint8_t> {
    for (size_t i = 0; i < std::size(table); ++i) {
      if (table[i] == op) return static_cast<uint8_t>(i);
    }
    return std::nullopt;
  };
  switch (dialect) {
    case Dialect::Legacy: return find(kLegacyOps);
    case Dialect::V2:
      if (op == Op::AuthHello) return kAuthHelloWire;
      if (op == Op::AuthProof) return kAuthProofWire;
      if (op == Op::AddOnce) return kAddOnceWire;
      return find(kV2Ops);
  }
  return std::nullopt;
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Validate: return "VALIDATE";
    case Op::Set: return "SET";
    case Op::CompareSet: return "COMPARE_SET";
    case Op::Get: return "GET";
    case Op::Add: return "ADD";
    case Op::Check: return "CHECK";
    case Op::Wait: return "WAIT";
    case Op::GetNumKeys: return "GETNUMKEYS";
    case Op::WatchKey: return "WATCH_KEY";
    case Op::DeleteKey: return "DELETE_KEY";
    case Op::Append: return "APPEND";
    case Op::MultiGet: return "MULTI_GET";
    case Op::MultiSet: return "MULTI_SET";
    case Op::CancelWait: return "CANCEL_WAIT";
    case Op::Ping: return "PING";
    case Op::QueuePush: return "QUEUE_PUSH";
    case Op::QueuePop: return "QUEUE_POP";
    case Op::QueueLen: return "QUEUE_LEN";
    case Op::List: return "LIST";
    case Op::AuthHello: return "AUTH_HELLO";
    case Op::AuthProof: return "AUTH_PROOF";
    case Op::AddOnce: return "ADD_ONCE";
  }
  return "?";
}

std::string_view dialect_name(Dialect dialect) {
  switch (dialect) {
    case Dialect::Legacy: return "1.13";
    case Dialect::V2: return "2.x";
  }
  return "?";
}

void RequestDecoder::reset() {
  started_ = false;
  complete_ = false;
  pos_ = 0;
  step_ = 0;
  remaining_ = 0;
  entry_value_ = false;
  number_ = 0;
  delta_ = 0;
  keys_.clear();
  values_.clear();
  // A request with very many keys should not leave its spans' memory with an idle connection.
  if (keys_.capacity() > 1024) std::vector<Span>().swap(keys_);
  if (values_.capacity() > 1024) std::vector<Span>().swap(values_);
}

// One function of ~110 lines: the resumable walk over the command's field layout, whose helpers
// (have, field, count) share the input, the position and the first error; this is the fuzz target's
// path (tests/fuzz), kept in one piece so each early return leaves the decoder resumable.
DecodeResult RequestDecoder::decode(Dialect dialect, std::string_view in, const Limits& limits, Request& out) {
  DecodeResult result;  // Incomplete until proven otherwise
  auto fail = [&](const std::string& message) {
    result.status = DecodeStatus::Error;
    result.error = started_ ? std::string(op_name(op_)) + ": " + message : message;
    reset();
    return result;
  };
  if (complete_) {
    fill(in, out);
    result.status = DecodeStatus::Complete;
    result.consumed = pos_;
    return result;
  }
  if (!started_) {
    if (in.empty()) return result;
    const auto code = static_cast<uint8_t>(in[0]);
    const std::optional<Op> op = op_from_wire(dialect, code);
    if (!op) {
      return fail("unknown command byte " + std::to_string(code) + " for the " + std::string(dialect_name(dialect)) +
                  " protocol");
    }
    reset();
    started_ = true;
    op_ = *op;
    pos_ = 1;
  }
  // Whether the next `n` bytes are here. A request that can never fit is an error as soon as its
  // header says so, not a buffer that grows until it does.
  std::string error;
  auto have = [&](uint64_t n) {
    if (pos_ + n > limits.max_request_bytes) {
      error = "request of at least " + std::to_string(pos_ + n) + " bytes is over the limit of " +
              std::to_string(limits.max_request_bytes);
      return false;
    }
    return in.size() - pos_ >= n;
  };
  // A length-prefixed field; true when it is complete (recorded in `into`).
  auto field = [&](uint64_t max, const char* what, std::vector<Span>& into) {
    if (!have(8)) return false;
    const uint64_t len = load_u64(in.data() + pos_);
    if (len > max) {
      error = std::string(what) + " of " + std::to_string(len) + " bytes is over the limit of " + std::to_string(max);
      return false;
    }
    if (!have(8 + len)) return false;
    into.push_back({pos_ + 8, static_cast<size_t>(len)});
    pos_ += 8 + len;
    return true;
  };
  auto count = [&](const char* what) {
    if (!have(8)) return false;
    const uint64_t n = load_u64(in.data() + pos_);
    if (n > limits.max_keys_per_request) {
      error = std::string(what) + " count " + std::to_string(n) + " is over the limit of " +
              std::to_string(limits.max_keys_per_request) + " keys per request";
      return false;
    }
    remaining_ = n;
    pos_ += 8;
    return true;
  };
  const std::span<const Field> fields = layout(op_);
  for (; step_ < fields.size(); ++step_) {
    bool done = false;
    switch (fields[step_]) {
      case Field::U32:
        if ((done = have(4))) {
          number_ = load_u32(in.data() + pos_);
          pos_ += 4;
        }
        break;
      case Field::I64:
        if ((done = have(8))) {
          delta_ = static_cast<int64_t>(load_u64(in.data() + pos_));
          pos_ += 8;
        }
        break;
      case Field::Key: done = field(limits.max_key_bytes, "key", keys_); break;
      case Field::Value: done = field(limits.max_value_bytes, "value", values_); break;
      case Field::KeyCount: done = count("key"); break;
      case Field::EntryCount: done = count("MULTI_SET entry"); break;
      case Field::Keys:
        while (remaining_ > 0 && field(limits.max_key_bytes, "key", keys_)) --remaining_;
        done = remaining_ == 0;
        break;
      case Field::Entries:
        while (remaining_ > 0) {
          if (!entry_value_) {
            if (!field(limits.max_key_bytes, "key", keys_)) break;
            entry_value_ = true;
          }
          if (!field(limits.max_value_bytes, "value", values_)) break;
          entry_value_ = false;
          --remaining_;
        }
        done = remaining_ == 0;
        break;
    }
    if (!error.empty()) return fail(error);
    if (!done) return result;
  }
  complete_ = true;
  fill(in, out);
  result.status = DecodeStatus::Complete;
  result.consumed = pos_;
  return result;
}

void RequestDecoder::fill(std::string_view in, Request& out) const {
  out.clear();
  out.op = op_;
  out.number = number_;
  out.delta = delta_;
  out.keys.reserve(keys_.size());
  for (const Span& k : keys_) out.keys.push_back(in.substr(k.offset, k.size));
  out.values.reserve(values_.size());
  for (const Span& v : values_) out.values.push_back(in.substr(v.offset, v.size));
}

DecodeResult decode_request(Dialect dialect, std::string_view input, const Limits& limits, Request& out) {
  RequestDecoder decoder;
  return decoder.decode(dialect, input, limits, out);
}

bool op_has_reply(Op op) {
  switch (op) {
    case Op::Validate:
    case Op::Set:
    case Op::Append:
    case Op::MultiSet:
    case Op::QueuePush: return false;
    case Op::CompareSet:
    case Op::Get:
    case Op::Add:
    case Op::Check:
    case Op::Wait:
    case Op::GetNumKeys:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::MultiGet:
    case Op::CancelWait:
    case Op::Ping:
    case Op::QueuePop:
    case Op::QueueLen:
    case Op::List:
    case Op::AuthHello:
    case Op::AuthProof:
    case Op::AddOnce: return true;
  }
  return true;
}

Handshake detect_dialect(std::string_view input) {
  if (input.empty()) return {};
  if (input[0] != 0) return {HandshakeStatus::Legacy, 0};
  if (input.size() < 5) return {};
  if (load_u32(input.data() + 1) == kValidateMagic) return {HandshakeStatus::V2, 5};
  return {HandshakeStatus::Legacy, 0};
}

void put_u8(std::string& out, uint8_t value) { out.push_back(static_cast<char>(value)); }

void put_u32(std::string& out, uint32_t value) {
  char b[4];
  std::memcpy(b, &value, 4);
  out.append(b, 4);
}

void put_u64(std::string& out, uint64_t value) {
  char b[8];
  std::memcpy(b, &value, 8);
  out.append(b, 8);
}

void put_i64(std::string& out, int64_t value) { put_u64(out, static_cast<uint64_t>(value)); }

void put_bytes(std::string& out, std::string_view bytes) {
  put_u64(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

uint64_t load_u64(const char* in) {
  uint64_t v;
  std::memcpy(&v, in, 8);
  return v;
}

uint32_t load_u32(const char* in) {
  uint32_t v;
  std::memcpy(&v, in, 4);
  return v;
}

}  // namespace ddprun::rdzv::core
