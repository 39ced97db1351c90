#pragma once
// The protocol side of one client connection: detects the dialect, decodes requests, applies them
// to the KvStore and encodes the replies into an output buffer. No sockets, so the fuzzer and the
// unit tests drive it directly; rendezvous/session.* moves its bytes over TCP.
//
// Not thread-safe (same thread as its KvStore). Unregisters itself from the store on destruction.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "rendezvous/kv_store.hpp"
#include "rendezvous/protocol.hpp"

namespace ddprun::rdzv {

class StoreConnection final : public Waiter {
 public:
  // `on_async_output` runs when bytes are queued outside consume() (a wake-up or watch event).
  StoreConnection(KvStore& store, const Limits& limits, std::function<void()> on_async_output);
  ~StoreConnection() override;
  StoreConnection(const StoreConnection&) = delete;
  StoreConnection& operator=(const StoreConnection&) = delete;

  // Processes every complete request at the front of `input` and returns the bytes used; the rest
  // is an incomplete request to be offered again with more bytes. Throws ProtocolError on bad
  // input: the connection must then be closed (its store state is already consistent).
  size_t consume(std::string_view input);

  // Reply bytes not yet sent; the caller takes them (e.g. by swapping) and sends them.
  std::string& output() { return out_; }
  const std::string& output() const { return out_; }

  // Drops this client's waits and watches from the store (disconnect); idempotent.
  void release();

  std::optional<Dialect> dialect() const { return dialect_; }
  bool waiting() const { return store_.has_pending_wait(*this); }
  size_t missing_keys() const { return store_.missing_keys(*this); }
  uint64_t requests() const { return requests_; }
  // Describes the request being assembled from `partial` (for "disconnected mid-request" logs).
  std::string describe_partial(std::string_view partial) const;

  void on_wait_complete() override;
  void on_watch_event(uint8_t event, std::string_view key, std::string_view old_value,
                      std::string_view new_value) override;

 private:
  void apply(const Request& req);

  KvStore& store_;
  const Limits& limits_;
  std::function<void()> on_async_output_;
  std::optional<Dialect> dialect_;
  Request request_;
  std::string out_;
  std::string scratch_;
  uint64_t requests_ = 0;
  bool released_ = false;
};

}  // namespace ddprun::rdzv
