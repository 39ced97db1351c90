#pragma once
// The protocol side of one client connection: detects the dialect, decodes requests (resumably, see
// RequestDecoder), applies them to the KvStore and queues the replies. No sockets, so the fuzzer and
// the unit tests drive it directly; rendezvous/session.* moves its bytes over TCP.
//
// What a connection may cost is bounded here: a request whose reply would be larger than
// Limits::max_reply_bytes is refused (LimitError) before anything is built; while more than
// Limits::output_high_water is owed to the client, the next request that has a reply waits; and
// wake-ups or watch notifications that pile up past Limits::max_output_backlog mark the connection
// overflowed, to be closed by its owner.
//
// Not thread-safe (same thread as its KvStore). Unregisters itself from the store on destruction.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "rendezvous/core/auth.hpp"
#include "rendezvous/core/kv_store.hpp"
#include "rendezvous/core/output_queue.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::core {

class StoreConnection final : public Waiter {
 public:
  // Which requests consume() may apply.
  enum class Stage {
    // Only the leading requests that have no reply (SET, APPEND, MULTI_SET, QUEUE_PUSH, VALIDATE):
    // a server applies these from every connection first, so a set() that has returned in one
    // client is seen by whatever another client asks next (see Server).
    NoReply,
    All,
  };

  // `on_async_output` runs when bytes are queued outside consume() (a wake-up or watch event).
  // With a `secret` (not owned; it outlives the connection) the store is protected: every request
  // but VALIDATE, PING and the handshake needs a proof first (rendezvous/core/auth.hpp), and an
  // authenticated connection touches only its scope's keys. Violations throw AccessDenied.
  StoreConnection(KvStore& store, const Limits& limits, std::function<void()> on_async_output,
                  const StoreSecret* secret = nullptr);
  ~StoreConnection() override;
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  // Applies the complete requests at the front of `input` (as far as `stage` and the output
  // backlog allow) and returns the bytes used; the rest must be offered again, unchanged at its
  // front, with any bytes that arrive after it. Throws ProtocolError on bad input and LimitError
  // for a request over a limit: the connection must then be closed (the store is consistent).
  size_t consume(std::string_view input, Stage stage = Stage::All);

  // Reply bytes not yet sent; the owner sends them and consumes what was sent.
  OutputQueue& output() { return out_; }
  // A complete request waits for the client to read what it is owed (see Limits::output_high_water).
  bool blocked() const { return blocked_; }
  // Wake-ups or watch events piled up past Limits::max_output_backlog: close the connection.
  bool overflowed() const { return overflowed_; }

  // Drops this client's waits and watches from the store (disconnect); idempotent.
  void release();

  // A store that describes itself (ServerOptions::describe_self): CHECK and GET of
  // core::kStoreInfoKey answer `description`, which is no key of the store, so that PyTorch clients
  // that count or list keys see nothing new.
  void describe_store(SharedBytes description) { description_ = std::move(description); }

  std::optional<Dialect> dialect() const { return dialect_; }
  // A protected store's connection that has not yet proved the secret: it may send only the
  // handshake's frames (VALIDATE, PING, AUTH_HELLO, AUTH_PROOF), each within handshake_limits().
  bool awaiting_proof() const { return auth_ == AuthState::Required || auth_ == AuthState::Challenged; }
  static const Limits& handshake_limits();
  // The scope this connection proved ("*" or a run id); empty until then (or on an open store).
  const std::string& scope() const { return scope_; }
  bool waiting() const { return store_.has_pending_wait(*this); }
  size_t missing_keys() const { return store_.missing_keys(*this); }
  uint64_t requests() const { return requests_; }
  // Describes the request being assembled from `partial` (for "disconnected mid-request" logs).
  std::string describe_partial(std::string_view partial) const;

  void on_wait_complete() override;
  void on_watch_event(uint8_t event, std::string_view key, const SharedBytes& old_value,
                      const SharedBytes& new_value) override;

 private:
  // The gate (handshake, access, a stale WAIT, the reply's size), then execute.
  void apply(const Request& req);
  void execute(const Request& req);
  // `keys` without core::kStoreInfoKey when the store describes itself (that key is always there).
  std::span<const std::string_view> stored_keys(const std::vector<std::string_view>& keys);
  // The handshake, and the gate every other request passes first.
  void authenticate(const Request& req);
  void check_access(const Request& req) const;
  static bool allowed_before_handshake(Op op);
  [[noreturn]] static void throw_before_handshake(Op op);
  // Bytes the reply to `req` will carry, from the store's current state; throws LimitError if it
  // is over Limits::max_reply_bytes.
  void check_reply_size(const Request& req) const;
  void async_output();

  KvStore& store_;
  const Limits& limits_;
  std::function<void()> on_async_output_;
  std::optional<Dialect> dialect_;
  RequestDecoder decoder_;
  Request request_;
  OutputQueue out_;
  std::string scratch_;
  uint64_t requests_ = 0;
  // Protected stores only.
  enum class AuthState { Open, Required, Challenged, Authenticated };
  const StoreSecret* secret_;
  SharedBytes description_;                         // describe_store()
  std::vector<std::string_view> described_others_;  // stored_keys()' scratch
  AuthState auth_;
  std::string scope_;
  std::string client_nonce_;
  std::string server_nonce_;
  bool blocked_ = false;
  bool overflowed_ = false;
  bool released_ = false;
};

}  // namespace ddprun::rdzv::core
