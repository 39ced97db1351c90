#include "rendezvous/protocol.hpp"

#include <cstring>

namespace ddprun::rdzv {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "TCPStore sends host-order integers; ddprun supports little-endian hosts only");

// Legacy (1.13) numbering: SET=0 .. DELETE_KEY=8.
constexpr Op kLegacyOps[] = {Op::Set,   Op::CompareSet, Op::Get,      Op::Add,       Op::Check,
                             Op::Wait,  Op::GetNumKeys, Op::WatchKey, Op::DeleteKey};

// 2.x numbering: VALIDATE=0 .. LIST=17.
constexpr Op kV2Ops[] = {Op::Validate,   Op::Set,      Op::CompareSet, Op::Get,        Op::Add,
                         Op::Check,      Op::Wait,     Op::GetNumKeys, Op::DeleteKey,  Op::Append,
                         Op::MultiGet,   Op::MultiSet, Op::CancelWait, Op::Ping,       Op::QueuePush,
                         Op::QueuePop,   Op::QueueLen, Op::List};

// Cursor over a request's bytes. The first short read marks the request Incomplete; the first
// limit violation marks it Error. Later reads are no-ops, so decoders read fields unconditionally.
class Reader {
 public:
  Reader(std::string_view in, const Limits& limits) : in_(in), limits_(limits) {}

  bool ok() const { return status_ == DecodeStatus::Complete; }
  DecodeStatus status() const { return status_; }
  const std::string& error() const { return error_; }
  size_t pos() const { return pos_; }

  uint8_t u8() {
    if (!need(1)) return 0;
    return static_cast<uint8_t>(in_[pos_++]);
  }
  uint32_t u32() {
    if (!need(4)) return 0;
    uint32_t v = load_u32(in_.data() + pos_);
    pos_ += 4;
    return v;
  }
  uint64_t u64() {
    if (!need(8)) return 0;
    uint64_t v = load_u64(in_.data() + pos_);
    pos_ += 8;
    return v;
  }
  std::string_view bytes(uint64_t max, const char* what) {
    uint64_t len = u64();
    if (!ok()) return {};
    if (len > max) {
      fail(std::string(what) + " of " + std::to_string(len) + " bytes is over the limit of " + std::to_string(max));
      return {};
    }
    if (!need(len)) return {};
    std::string_view v = in_.substr(pos_, len);
    pos_ += len;
    return v;
  }
  uint64_t count(const char* what) {
    uint64_t n = u64();
    if (ok() && n > limits_.max_keys_per_request) {
      fail(std::string(what) + " count " + std::to_string(n) + " is over the limit of " +
           std::to_string(limits_.max_keys_per_request) + " keys per request");
    }
    return n;
  }
  std::string_view key() { return bytes(limits_.max_key_bytes, "key"); }
  std::string_view value() { return bytes(limits_.max_value_bytes, "value"); }

  void fail(std::string message) {
    if (status_ == DecodeStatus::Error) return;
    status_ = DecodeStatus::Error;
    error_ = std::move(message);
  }

 private:
  bool need(uint64_t n) {
    if (!ok()) return false;
    // Checked before the bytes arrive: a request that can never fit is an error now, not a
    // buffer that grows until it does.
    if (pos_ + n > limits_.max_request_bytes) {
      fail("request of at least " + std::to_string(pos_ + n) + " bytes is over the limit of " +
           std::to_string(limits_.max_request_bytes));
      return false;
    }
    if (in_.size() - pos_ < n) {
      status_ = DecodeStatus::Incomplete;
      return false;
    }
    return true;
  }

  std::string_view in_;
  const Limits& limits_;
  size_t pos_ = 0;
  DecodeStatus status_ = DecodeStatus::Complete;
  std::string error_;
};

void read_keys(Reader& r, Request& out, const char* what) {
  const uint64_t n = r.count(what);
  for (uint64_t i = 0; i < n && r.ok(); ++i) out.keys.push_back(r.key());
}

}  // namespace

std::optional<Op> op_from_wire(Dialect dialect, uint8_t code) {
  switch (dialect) {
    case Dialect::Legacy:
      if (code < std::size(kLegacyOps)) return kLegacyOps[code];
      return std::nullopt;
    case Dialect::V2:
      if (code < std::size(kV2Ops)) return kV2Ops[code];
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
    case Dialect::V2: return find(kV2Ops);
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

DecodeResult decode_request(Dialect dialect, std::string_view input, const Limits& limits, Request& out) {
  out.clear();
  DecodeResult result;
  Reader r(input, limits);
  const uint8_t code = r.u8();
  if (!r.ok()) return result;
  const std::optional<Op> op = op_from_wire(dialect, code);
  if (!op) {
    result.status = DecodeStatus::Error;
    result.error = "unknown command byte " + std::to_string(code) + " for the " +
                   std::string(dialect_name(dialect)) + " protocol";
    return result;
  }
  out.op = *op;
  switch (*op) {
    case Op::Validate:
    case Op::Ping:
      out.number = r.u32();
      break;
    case Op::Set:
    case Op::Append:
    case Op::QueuePush:
      out.keys.push_back(r.key());
      out.values.push_back(r.value());
      break;
    case Op::CompareSet:
      out.keys.push_back(r.key());
      out.values.push_back(r.value());
      out.values.push_back(r.value());
      break;
    case Op::Get:
    case Op::WatchKey:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
      out.keys.push_back(r.key());
      break;
    case Op::Add:
      out.keys.push_back(r.key());
      out.delta = static_cast<int64_t>(r.u64());
      break;
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet:
      read_keys(r, out, "key");
      break;
    case Op::MultiSet: {
      const uint64_t n = r.count("MULTI_SET entry");
      for (uint64_t i = 0; i < n && r.ok(); ++i) {
        out.keys.push_back(r.key());
        out.values.push_back(r.value());
      }
      break;
    }
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::List:
      break;
  }
  result.status = r.status();
  if (result.status == DecodeStatus::Complete) result.consumed = r.pos();
  if (result.status == DecodeStatus::Error) result.error = std::string(op_name(*op)) + ": " + r.error();
  return result;
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

}  // namespace ddprun::rdzv
