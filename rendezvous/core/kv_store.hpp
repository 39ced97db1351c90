#pragma once
// The store's state: keys and values, counters, FIFO queues, and the clients waiting on keys.
// Pure logic with no sockets. Not thread-safe: the server touches it from its one I/O thread only.
//
// Waiting works as in PyTorch's server: WAIT registers the client on every missing key; each key
// that appears decrements the client's count and the client is woken when it reaches zero. There
// is no server-side timeout; the client cancels (CANCEL_WAIT) or disconnects.
//
// Values are shared, immutable strings: a reply or a watch notification that carries a value holds
// a share of it instead of a copy, and a value is never changed in place while shared (APPEND on a
// shared value writes a new one). Store-wide limits bound the keys and bytes held; a change that
// would pass them throws LimitError and leaves the store as it was.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "rendezvous/core/output_queue.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::core {

// What the store calls back into for a client: wake-ups and (1.13) watch notifications. The
// object must outlive its registrations; call KvStore::forget() before destroying it.
class Waiter {
 public:
  virtual ~Waiter() = default;
  // Every key of the pending WAIT is now present.
  virtual void on_wait_complete() = 0;
  // A watched key changed (1.13 WATCH_KEY). `old_value`/`new_value` are null when absent.
  virtual void on_watch_event(uint8_t event, std::string_view key, const SharedBytes& old_value,
                              const SharedBytes& new_value) = 0;
};

// Told of every change clients make to the store's contents (SET, a COMPARE_SET that swaps, ADD of
// a non-zero delta, APPEND, MULTI_SET, DELETE, queue pushes and pops), never of reads or waits:
// how an embedding program sees that its clients make progress. Called on the store's thread.
class ChangeObserver {
 public:
  virtual ~ChangeObserver() = default;
  // `counter`: the counter's new value after an ADD, else nullptr. Called before or after the
  // change itself (read the store's state later, not here).
  virtual void on_change(std::string_view key, const int64_t* counter) = 0;
  // An ADD_ONCE token was recorded with its result (for a journal of the store's state).
  virtual void on_once(std::string_view /*token*/, int64_t /*result*/) {}
};

// Told when a key of the KV map comes to hold a value or stops holding one: created, removed, or
// set to or from the empty value (an empty value counts as none, as `ddprun-rendezvous status`
// reads the store), never of other changes or of reads: what an index of the keys present
// follows (the metrics' job states). Called on the store's thread, after the change; queues are
// not told.
class PresenceObserver {
 public:
  virtual ~PresenceObserver() = default;
  virtual void on_presence(std::string_view key, bool present) = 0;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Store-wide bounds (both count queues too). The defaults hold a large cluster's rendezvous with
// room to spare; ddprun-rendezvous sets them with --max-total-keys and --max-store-bytes.
struct StoreLimits {
  uint64_t max_total_keys = 1 << 20;
  uint64_t max_store_bytes = uint64_t{1} << 30;  // keys + values + queued items
  // Each ddprun job's share (the keys under /ddprun/<run id>/), so that one job cannot fill the
  // store for the others; 0: no quota (a store embedded in one job).
  uint64_t max_job_keys = 0;
  uint64_t max_job_bytes = 0;
};

// One pending WAIT, as the store sees it (for diagnostics: who waits on what).
struct PendingWaitInfo {
  const Waiter* waiter = nullptr;
  std::vector<std::string> missing;  // the keys still missing
  std::chrono::steady_clock::time_point since;
};

class KvStore {
 public:
  explicit KvStore(StoreLimits limits = {}) : limits_(limits) {}

  void set(std::string_view key, std::string_view value);
  // COMPARE_SET as PyTorch defines it; returns the bytes to send back.
  SharedBytes compare_set(std::string_view key, std::string_view expected, std::string_view desired);
  // nullptr when absent. get_shared() hands out a share for a reply.
  const std::string* get(std::string_view key) const;
  SharedBytes get_shared(std::string_view key) const;
  // Adds to a decimal-ASCII counter (absent = 0). Throws ProtocolError if the stored value is not
  // a decimal integer or the sum overflows; the store is left unchanged then.
  int64_t add(std::string_view key, int64_t delta);
  // ddprun's ADD_ONCE: an ADD a client may send again after losing the connection before the
  // reply. The first request with `token` adds; a later one with the same token adds nothing and
  // returns the first one's result. The last kOnceTokens tokens are remembered (a client retries
  // within seconds; at thousands of ADDs a second that is still minutes).
  int64_t add_once(std::string_view key, int64_t delta, std::string_view token);
  static constexpr size_t kOnceTokens = size_t{1} << 16;
  // Restores a remembered token (loading a saved state).
  void remember_once(std::string_view token, int64_t result);
  // The remembered tokens, oldest first.
  void for_each_once(const std::function<void(std::string_view, int64_t)>& fn) const;
  void append(std::string_view key, std::string_view data);
  // MULTI_SET: all entries or none (a limit is checked for the whole request first).
  void multi_set(std::span<const std::string_view> keys, std::span<const std::string_view> values);
  bool remove(std::string_view key);
  // Keys in the KV map (including PyTorch's "init/" counter); queues are not counted.
  size_t num_keys() const { return map_.size(); }
  // A key is present if it is in the KV map or names a non-empty queue.
  bool check(std::span<const std::string_view> keys) const;
  std::vector<std::string> list() const;
  // Bytes a LIST reply carries (u64 count + each key with its u64 length).
  uint64_t list_reply_bytes() const { return 8 + key_bytes_ + 8 * map_.size(); }
  // Calls `fn(key, value)` for every key that starts with `prefix`, in no particular order.
  void for_each(std::string_view prefix, const std::function<void(std::string_view, const std::string&)>& fn) const;

  // Registers `waiter` on the missing keys. Returns true if nothing is missing (reply at once);
  // otherwise on_wait_complete() follows later. A waiter has at most one wait pending.
  bool wait(Waiter& waiter, std::span<const std::string_view> keys);
  // Drops the pending wait of `waiter`; returns whether one was pending.
  bool cancel_wait(Waiter& waiter);
  bool has_pending_wait(const Waiter& waiter) const { return waits_.count(&waiter) != 0; }
  // Keys the pending wait of `waiter` still misses (for diagnostics).
  size_t missing_keys(const Waiter& waiter) const;
  // Every pending wait with the keys it still misses.
  std::vector<PendingWaitInfo> pending_waits() const;
  void watch(Waiter& waiter, std::string_view key);
  // Removes every registration of `waiter` (disconnect).
  void forget(Waiter& waiter);

  void queue_push(std::string_view key, std::string_view value);
  // Returns the queue's length before the pop and moves the front value into `value` if it was > 0.
  int64_t queue_pop(std::string_view key, std::string& value);
  int64_t queue_len(std::string_view key) const;
  // A queue's items, front first; nullptr when there is no such queue.
  const std::deque<std::string>* queue_items(std::string_view key) const;
  void for_each_queue(const std::function<void(std::string_view, const std::deque<std::string>&)>& fn) const;

  size_t waiting_clients() const { return waits_.size(); }
  // Keys in the KV map plus queues: what max_total_keys bounds.
  size_t total_keys() const { return map_.size() + queues_.size(); }
  // Requests served by every connection so far (for status, metrics and benchmarks).
  void count_request(Op op) {
    ++requests_;
    ++requests_by_op_[static_cast<size_t>(op)];
  }
  uint64_t requests() const { return requests_; }
  uint64_t requests(Op op) const { return requests_by_op_[static_cast<size_t>(op)]; }
  uint64_t stored_bytes() const { return stored_bytes_; }
  const StoreLimits& limits() const { return limits_; }
  // Changes the limits; what is stored already stays even if it is over them.
  void set_limits(StoreLimits limits) { limits_ = limits; }
  // `observer` (not owned; nullptr for none) is told of every change from now on.
  void set_observer(ChangeObserver* observer) { observer_ = observer; }
  ChangeObserver* observer() const { return observer_; }
  // `observer` (not owned; nullptr for none) is told of keys that come and go from now on.
  void set_presence_observer(PresenceObserver* observer) { presence_ = observer; }

 private:
  using Value = std::shared_ptr<std::string>;
  using Map = std::unordered_map<std::string, Value, StringHash, std::equal_to<>>;
  // The clients waiting on one key, in arrival order (QUEUE_PUSH wakes the first). Each entry
  // knows its registration in the waiter's PendingWait, and each registration its list position,
  // so that cancelling, waking and disconnecting cost O(the waiter's own keys), never O(all
  // waiters on a key): 16K ranks leaving a barrier at once stay linear.
  struct WaitEntry {
    Waiter* waiter;
    size_t reg;  // index into PendingWait::regs
  };
  using WaitList = std::list<WaitEntry>;
  using WaitLists = std::unordered_map<std::string, WaitList, StringHash, std::equal_to<>>;
  using WatchLists = std::unordered_map<std::string, std::vector<Waiter*>, StringHash, std::equal_to<>>;

  struct PendingWait {
    struct Registration {
      std::string key;
      WaitList::iterator pos;
      bool live = true;  // false once the key has arrived
    };
    size_t missing = 0;
    std::vector<Registration> regs;
    std::chrono::steady_clock::time_point since;
  };

  bool present(std::string_view key) const;
  // Throws LimitError unless `new_keys` more keys and `more_bytes` more bytes fit, in the store and
  // in the quota of the job `key` belongs to; a refusal of a job's key leaves its reason under
  // /ddprun/<run id>/store_refusal, where the job's agents read it.
  void reserve(size_t new_keys, int64_t more_bytes, std::string_view what, std::string_view key);
  void reserve_in_store(size_t new_keys, int64_t more_bytes, std::string_view what, std::string_view key);
  void reserve_for_job(std::string_view job, size_t new_keys, int64_t more_bytes, std::string_view what,
                       std::string_view key);
  [[noreturn]] void refuse(std::string_view job, const std::string& why);
  // Counts a change of `keys` keys and `bytes` bytes, in the store and in the key's job.
  void account(std::string_view key, int64_t keys, int64_t bytes);
  // Stores `value` under `key` (checked against the limits first) and wakes waiters and watchers.
  void store(std::string_view key, std::string_view value);
  // A key appeared: decrement every waiter on it (or only the first, for a queue push).
  void key_arrived(std::string_view key, bool wake_one);
  void notify_watchers(std::string_view key, const SharedBytes& old_value, const SharedBytes& new_value);
  void changed(std::string_view key, const int64_t* counter) {
    if (observer_) observer_->on_change(key, counter);
  }
  void presence(std::string_view key, bool before, bool after) {
    if (presence_ && before != after) presence_->on_presence(key, after);
  }

  StoreLimits limits_;
  Map map_;
  std::unordered_map<std::string, std::deque<std::string>, StringHash, std::equal_to<>> queues_;
  WaitLists waiting_on_;
  std::unordered_map<const Waiter*, PendingWait> waits_;
  WatchLists watchers_;
  std::unordered_map<const Waiter*, std::vector<std::string>> watching_;  // a watcher's keys
  uint64_t stored_bytes_ = 0;
  uint64_t key_bytes_ = 0;  // of the KV map's keys, for LIST
  struct JobUsage {
    uint64_t keys = 0;
    uint64_t bytes = 0;
  };
  std::unordered_map<std::string, JobUsage, StringHash, std::equal_to<>> jobs_;
  bool unlimited_ = false;  // storing a refusal note
  size_t notes_ = 0;        // refusal notes stored (at most kMaxNotes)
  std::unordered_map<std::string, int64_t, StringHash, std::equal_to<>> once_;  // ADD_ONCE token -> result
  std::deque<std::string> once_order_;                                          // oldest first
  uint64_t requests_ = 0;
  uint64_t requests_by_op_[kOpCount] = {};
  ChangeObserver* observer_ = nullptr;
  PresenceObserver* presence_ = nullptr;
};

}  // namespace ddprun::rdzv::core
