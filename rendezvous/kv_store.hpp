#pragma once
// The store's state: keys and values, counters, FIFO queues, and the clients waiting on keys.
// Pure logic with no sockets. Not thread-safe: the server touches it from its one I/O thread only.
//
// Waiting works as in PyTorch's server: WAIT registers the client on every missing key; each key
// that appears decrements the client's count and the client is woken when it reaches zero. There
// is no server-side timeout; the client cancels (CANCEL_WAIT) or disconnects.

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ddprun::rdzv {

// What the store calls back into for a client: wake-ups and (1.13) watch notifications. The
// object must outlive its registrations; call KvStore::forget() before destroying it.
class Waiter {
 public:
  virtual ~Waiter() = default;
  // Every key of the pending WAIT is now present.
  virtual void on_wait_complete() = 0;
  // A watched key changed (1.13 WATCH_KEY). `old_value`/`new_value` are empty when absent.
  virtual void on_watch_event(uint8_t event, std::string_view key, std::string_view old_value,
                              std::string_view new_value) = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

class KvStore {
 public:
  void set(std::string_view key, std::string_view value);
  // COMPARE_SET as PyTorch defines it; returns the bytes to send back.
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  // nullptr when absent.
  const std::string* get(std::string_view key) const;
  // Adds to a decimal-ASCII counter (absent = 0). Throws ProtocolError if the stored value is not
  // a decimal integer or the sum overflows; the store is left unchanged then.
  int64_t add(std::string_view key, int64_t delta);
  void append(std::string_view key, std::string_view data);
  bool remove(std::string_view key);
  // Keys in the KV map (including PyTorch's "init/" counter); queues are not counted.
  size_t num_keys() const { return map_.size(); }
  // A key is present if it is in the KV map or names a non-empty queue.
  bool check(std::span<const std::string_view> keys) const;
  std::vector<std::string> list() const;

  // Registers `waiter` on the missing keys. Returns true if nothing is missing (reply at once);
  // otherwise on_wait_complete() follows later. A waiter has at most one wait pending.
  bool wait(Waiter& waiter, std::span<const std::string_view> keys);
  // Drops the pending wait of `waiter`; returns whether one was pending.
  bool cancel_wait(Waiter& waiter);
  bool has_pending_wait(const Waiter& waiter) const { return waits_.count(&waiter) != 0; }
  // Keys the pending wait of `waiter` still misses (for diagnostics).
  size_t missing_keys(const Waiter& waiter) const;
  void watch(Waiter& waiter, std::string_view key);
  // Removes every registration of `waiter` (disconnect).
  void forget(Waiter& waiter);

  void queue_push(std::string_view key, std::string_view value);
  // Returns the queue's length before the pop and moves the front value into `value` if it was > 0.
  int64_t queue_pop(std::string_view key, std::string& value);
  int64_t queue_len(std::string_view key) const;

  size_t waiting_clients() const { return waits_.size(); }
  // Requests served by every connection so far (for status and benchmarks).
  void count_request() { ++requests_; }
  uint64_t requests() const { return requests_; }
  uint64_t stored_bytes() const { return stored_bytes_; }

 private:
  using Map = std::unordered_map<std::string, std::string, StringHash, std::equal_to<>>;
  using WaiterLists = std::unordered_map<std::string, std::vector<Waiter*>, StringHash, std::equal_to<>>;

  struct PendingWait {
    size_t missing = 0;
    std::vector<std::string> keys;  // keys registered on, to unregister on cancel
  };

  bool present(std::string_view key) const;
  // A key appeared: decrement every waiter on it (or only the first, for a queue push).
  void key_arrived(std::string_view key, bool wake_one);
  void notify_watchers(std::string_view key, const std::string* old_value, const std::string* new_value);
  std::string& slot(std::string_view key, bool& created);

  Map map_;
  std::unordered_map<std::string, std::deque<std::string>, StringHash, std::equal_to<>> queues_;
  WaiterLists waiting_on_;
  std::unordered_map<const Waiter*, PendingWait> waits_;
  WaiterLists watchers_;
  uint64_t stored_bytes_ = 0;
  uint64_t requests_ = 0;
};

}  // namespace ddprun::rdzv
