#pragma once
// PyTorch c10d TCPStore wire format (as PyTorch's TCPStore.cpp and TCPStoreBackend.cpp speak it):
// opcodes of both dialects, the incremental request decoder, and the little helpers that encode
// fields. No I/O here.
//
// A request is one command byte followed by fields; integers are little-endian, strings and byte
// vectors are a u64 length followed by raw bytes:
//
//   SET          cmd | u64 klen | key | u64 vlen | value                      -> (no reply)
//   COMPARE_SET  cmd | str key | bytes expected | bytes desired               -> bytes
//   GET          cmd | str key                                                -> bytes
//   ADD          cmd | str key | i64 delta                                    -> i64
//   CHECK, WAIT  cmd | u64 n | n x str key                                    -> u8
//   MULTI_GET    cmd | u64 n | n x str key                                    -> n x bytes
//   MULTI_SET    cmd | i64 n | n x (str key | bytes value)                    -> (no reply)
//   GETNUMKEYS, CANCEL_WAIT, LIST: cmd alone; PING, VALIDATE: cmd | u32
//   AUTH_HELLO   cmd | u32 version | str scope | bytes nonce  (ddprun's, 2.x only) -> u8 | bytes
//   AUTH_PROOF   cmd | bytes mac                              (ddprun's, 2.x only) -> u8 | bytes
//   ADD_ONCE     cmd | str key | i64 delta | bytes token      (ddprun's, 2.x only) -> i64
//                an ADD the client may send again after a lost connection: a token seen before
//                returns the first result and adds nothing (ddprun-rendezvous --state-file)
//
// Two numberings exist. 1.13 ("legacy") starts at SET=0 and has WATCH_KEY=7, DELETE_KEY=8. 2.x
// ("v2") starts every connection with VALIDATE=0 and the magic 0x3C85F7CE, and numbers SET=1 ..
// LIST=17. detect_dialect() tells them apart from a connection's first bytes.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun::rdzv::core {

// Every operation either dialect can carry, named independently of its wire number.
enum class Op : uint8_t {
  Validate,
  Set,
  CompareSet,
  Get,
  Add,
  Check,
  Wait,
  GetNumKeys,
  WatchKey,
  DeleteKey,
  Append,
  MultiGet,
  MultiSet,
  CancelWait,
  Ping,
  QueuePush,
  QueuePop,
  QueueLen,
  List,
  // ddprun's extension of the 2.x dialect: the secret handshake (rendezvous/core/auth.hpp).
  AuthHello,
  AuthProof,
  // ddprun's retry-safe ADD (KvStore::add_once).
  AddOnce,
};
inline constexpr size_t kOpCount = static_cast<size_t>(Op::AddOnce) + 1;
// Wire bytes of the handshake, far above PyTorch's numbering (which ends at 17).
inline constexpr uint8_t kAuthHelloWire = 0x60;
inline constexpr uint8_t kAuthProofWire = 0x61;
inline constexpr uint8_t kAddOnceWire = 0x62;
// An ADD_ONCE token's longest length.
inline constexpr size_t kMaxOnceToken = 64;

enum class Dialect : uint8_t {
  Legacy,  // PyTorch 1.13 / 2.0 numbering, no handshake.
  V2,      // PyTorch 2.2+ numbering, VALIDATE first.
};

inline constexpr uint32_t kValidateMagic = 0x3C85F7CE;

// Response codes (u8).
inline constexpr uint8_t kCheckReady = 0;
inline constexpr uint8_t kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0;
inline constexpr uint8_t kWaitCanceled = 1;
inline constexpr uint8_t kWatchKeyUpdated = 0;
inline constexpr uint8_t kWatchKeyCreated = 1;
inline constexpr uint8_t kWatchKeyDeleted = 2;
inline constexpr uint8_t kWatchCallbackRegistered = 3;

// Maps a wire byte to an operation; nullopt for a number the dialect does not define.
std::optional<Op> op_from_wire(Dialect dialect, uint8_t code);
// The wire byte of `op` in `dialect`; nullopt when the dialect has no such operation.
std::optional<uint8_t> op_to_wire(Dialect dialect, Op op);
std::string_view op_name(Op op);
std::string_view dialect_name(Dialect dialect);

// Per-connection bounds. The field limits match what PyTorch's libuv server accepts; the whole
// request is also bounded so that one connection cannot make the server buffer without limit, and
// so is what one request may ask to be sent back and what a client may leave unread.
struct Limits {
  uint64_t max_key_bytes = uint64_t{8} << 10;
  uint64_t max_value_bytes = uint64_t{8} << 20;
  uint64_t max_keys_per_request = uint64_t{128} << 10;
  uint64_t max_request_bytes = uint64_t{64} << 20;
  // The largest reply one request may produce (counted before it is built): GET, MULTI_GET, LIST.
  uint64_t max_reply_bytes = uint64_t{256} << 20;
  // While more than this is owed to a client, its next request that has a reply waits (its bytes
  // stay in the kernel's socket buffer: TCP back-pressure).
  uint64_t output_high_water = uint64_t{1} << 20;
  // Wake-ups and watch notifications are not requests and cannot wait: a client that lets more
  // than this pile up unread is disconnected (a 1.13 watcher that never reads).
  uint64_t max_output_backlog = uint64_t{64} << 20;
};

// One decoded request. The views point into the decoder's input and are valid until that input
// changes; clear() keeps the vectors' capacity so steady-state decoding allocates nothing.
struct Request {
  Op op = Op::GetNumKeys;
  std::vector<std::string_view> keys;
  // SET/APPEND/QUEUE_PUSH: {value}; COMPARE_SET: {expected, desired}; MULTI_SET: one per key.
  std::vector<std::string_view> values;
  int64_t delta = 0;    // ADD
  uint32_t number = 0;  // VALIDATE magic, PING nonce

  void clear() {
    keys.clear();
    values.clear();
    delta = 0;
    number = 0;
  }
};

enum class DecodeStatus { Complete, Incomplete, Error };

struct DecodeResult {
  DecodeStatus status = DecodeStatus::Incomplete;
  size_t consumed = 0;  // bytes of `input` that formed the request (Complete only)
  std::string error;    // what was wrong (Error only)
};

// Decodes one request at a time from a buffer that grows as its bytes arrive, and remembers where
// it stopped: each call resumes at the first field it has not finished, so the work done over a
// request is linear in its size however it is segmented (a WAIT of 131072 keys sent 200 bytes at a
// time costs what it costs sent at once). Keys and values are remembered as offsets from the
// request's first byte, so the caller may move or grow its buffer between calls, as long as the
// buffer keeps starting at the request's first byte.
//
// Not thread-safe; one decoder per connection.
class RequestDecoder {
 public:
  // Decodes the request that starts at input[0]. Complete: `out` holds it (views into `input`) and
  // `consumed` its size; further calls return it again (cheaply) until done() moves on to the next
  // request, which starts at input[consumed]. Incomplete: call again with the same bytes and more.
  // Error: the connection must be closed.
  DecodeResult decode(Dialect dialect, std::string_view input, const Limits& limits, Request& out);
  // The complete request was handled; the next call starts a new one.
  void done() { reset(); }
  // Bytes of the current request already parsed into complete fields (0 between requests).
  size_t parsed() const { return pos_; }
  // The operation of the request being assembled, once its command byte has been read.
  std::optional<Op> op() const { return started_ ? std::optional<Op>(op_) : std::nullopt; }
  void reset();

 private:
  void fill(std::string_view in, Request& out) const;

  struct Span {
    size_t offset = 0;
    size_t size = 0;
  };

  bool started_ = false;
  bool complete_ = false;
  Op op_ = Op::GetNumKeys;
  size_t pos_ = 0;            // bytes of fields fully parsed
  uint8_t step_ = 0;          // index into the operation's field layout
  uint64_t remaining_ = 0;    // list entries still to parse
  bool entry_value_ = false;  // MULTI_SET: the key of the current entry is parsed, its value is next
  uint32_t number_ = 0;
  int64_t delta_ = 0;
  std::vector<Span> keys_;
  std::vector<Span> values_;
};

// Decodes the first request in `input` from scratch (a fresh RequestDecoder). Incomplete means more
// bytes are needed.
DecodeResult decode_request(Dialect dialect, std::string_view input, const Limits& limits, Request& out);

// True for operations that are answered (every one but SET, APPEND, MULTI_SET, QUEUE_PUSH and
// VALIDATE, which a client sends and forgets).
bool op_has_reply(Op op);

enum class HandshakeStatus { NeedMore, Legacy, V2 };

struct Handshake {
  HandshakeStatus status = HandshakeStatus::NeedMore;
  size_t consumed = 0;  // 5 for a VALIDATE + magic, else 0
};

// Classifies a new connection from its first bytes: a first byte other than 0 is a legacy command;
// 0 followed by the magic is a 2.x VALIDATE (consumed); 0 followed by anything else is a legacy SET
// whose key length happens to start there.
Handshake detect_dialect(std::string_view input);

// Field encoders shared by the server's replies and the client's requests.
void put_u8(std::string& out, uint8_t value);
void put_u32(std::string& out, uint32_t value);
void put_u64(std::string& out, uint64_t value);
void put_i64(std::string& out, int64_t value);
void put_bytes(std::string& out, std::string_view bytes);  // u64 length + bytes

// Reads a little-endian integer from the first bytes of `in` (the caller checked the size).
uint64_t load_u64(const char* in);
uint32_t load_u32(const char* in);

}  // namespace ddprun::rdzv::core
