#include "rendezvous/core/kv_store.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <ctime>
#include <utility>

#include "common/errors.hpp"
#include "rendezvous/core/job_namespace.hpp"
#include "rendezvous/core/protocol.hpp"

namespace ddprun::rdzv::core {

namespace {

// Refusal notes kept at once (one per job at most): a client holding the cluster secret could
// otherwise grow the store past its limits with notes of made-up jobs.
constexpr size_t kMaxNotes = 1024;

std::string shown(std::string_view key) { return std::string(key.substr(0, 64)) + (key.size() > 64 ? "..." : ""); }

}  // namespace

void KvStore::account(std::string_view key, int64_t keys, int64_t bytes) {
  stored_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(stored_bytes_) + bytes);
  const std::string_view job = core::job_of_key(key);
  if (job.empty()) return;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) it = jobs_.emplace(std::string(job), JobUsage{}).first;
  it->second.keys = static_cast<uint64_t>(static_cast<int64_t>(it->second.keys) + keys);
  it->second.bytes = static_cast<uint64_t>(static_cast<int64_t>(it->second.bytes) + bytes);
  if (it->second.keys == 0 && it->second.bytes == 0) jobs_.erase(it);
}

void KvStore::refuse(std::string_view job, const std::string& why) {
  if (!job.empty()) {
    // Where the job's agents look when the store closes their connection (rdzv::client::Client).
    const std::string note = core::refusal_note(job);
    if (map_.count(note) != 0 || notes_ < kMaxNotes) {
      const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      char when[32];
      tm utc{};
      ::gmtime_r(&now, &utc);
      std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
      unlimited_ = true;
      store(note, "at " + std::string(when) + ": " + why);
      unlimited_ = false;
    }
  }
  throw LimitError(why);
}

void KvStore::reserve(size_t new_keys, int64_t more_bytes, std::string_view what, std::string_view key) {
  reserve_in_store(new_keys, more_bytes, what, key);
  if (const std::string_view job = core::job_of_key(key); !job.empty()) {
    reserve_for_job(job, new_keys, more_bytes, what, key);
  }
}

void KvStore::reserve_in_store(size_t new_keys, int64_t more_bytes, std::string_view what, std::string_view key) {
  if (unlimited_) return;
  const std::string_view job = core::job_of_key(key);
  if (new_keys > 0 && total_keys() + new_keys > limits_.max_total_keys) {
    refuse(job, "store full: " + std::string(what) + " of key '" + shown(key) + "' would make " +
                    std::to_string(total_keys() + new_keys) + " keys, over the store's limit of " +
                    std::to_string(limits_.max_total_keys) + " (--max-total-keys)");
  }
  if (more_bytes > 0 && stored_bytes_ + static_cast<uint64_t>(more_bytes) > limits_.max_store_bytes) {
    refuse(job, "store full: " + std::string(what) + " of key '" + shown(key) + "' would make " +
                    std::to_string(stored_bytes_ + static_cast<uint64_t>(more_bytes)) +
                    " bytes stored, over the store's limit of " + std::to_string(limits_.max_store_bytes) +
                    " (--max-store-bytes)");
  }
}

void KvStore::reserve_for_job(std::string_view job, size_t new_keys, int64_t more_bytes, std::string_view what,
                              std::string_view key) {
  if (unlimited_ || (limits_.max_job_keys == 0 && limits_.max_job_bytes == 0)) return;
  JobUsage used;
  if (auto it = jobs_.find(job); it != jobs_.end()) used = it->second;
  if (limits_.max_job_keys > 0 && new_keys > 0 && used.keys + new_keys > limits_.max_job_keys) {
    refuse(job, "job '" + std::string(job) + "' over its quota: " + std::string(what) + " of key '" + shown(key) +
                    "' would make it hold " + std::to_string(used.keys + new_keys) + " keys, over its quota of " +
                    std::to_string(limits_.max_job_keys) + " (--job-max-keys)");
  }
  if (limits_.max_job_bytes > 0 && more_bytes > 0 &&
      used.bytes + static_cast<uint64_t>(more_bytes) > limits_.max_job_bytes) {
    refuse(job, "job '" + std::string(job) + "' over its quota: " + std::string(what) + " of key '" + shown(key) +
                    "' would make it hold " + std::to_string(used.bytes + static_cast<uint64_t>(more_bytes)) +
                    " bytes, over its quota of " + std::to_string(limits_.max_job_bytes) + " (--job-max-bytes)");
  }
}

void KvStore::store(std::string_view key, std::string_view value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    reserve(1, static_cast<int64_t>(key.size() + value.size()), "SET", key);
    it = map_.emplace(std::string(key), std::make_shared<std::string>(value)).first;
    account(key, 1, static_cast<int64_t>(key.size() + value.size()));
    key_bytes_ += key.size();
    if (unlimited_) ++notes_;
    if (!watchers_.empty()) notify_watchers(key, nullptr, it->second);
    presence(key, false, !value.empty());
    key_arrived(key, /*wake_one=*/false);
    return;
  }
  Value& slot = it->second;
  reserve(0, static_cast<int64_t>(value.size()) - static_cast<int64_t>(slot->size()), "SET", key);
  account(key, 0, static_cast<int64_t>(value.size()) - static_cast<int64_t>(slot->size()));
  const bool had_value = !slot->empty();
  const bool watched = !watchers_.empty() && watchers_.count(key) != 0;
  if (!watched && slot.use_count() == 1) {
    slot->assign(value.data(), value.size());  // nobody else holds it: reuse the buffer
  } else {
    const Value old = std::exchange(slot, std::make_shared<std::string>(value));
    if (watched) notify_watchers(key, old, slot);
  }
  presence(key, had_value, !value.empty());
}

void KvStore::set(std::string_view key, std::string_view value) {
  store(key, value);
  changed(key, nullptr);
}

SharedBytes KvStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    // Missing key: only an empty `expected` creates it; otherwise the caller gets `expected` back.
    if (!expected.empty()) return std::make_shared<const std::string>(expected);
    store(key, desired);
    changed(key, nullptr);
    return map_.find(key)->second;
  }
  if (*it->second == expected) {
    store(key, desired);
    changed(key, nullptr);
  }
  return map_.find(key)->second;
}

const std::string* KvStore::get(std::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second.get();
}

SharedBytes KvStore::get_shared(std::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

int64_t KvStore::add(std::string_view key, int64_t delta) {
  auto it = map_.find(key);
  int64_t current = 0;
  if (it != map_.end()) {
    const std::string& text = *it->second;
    const char* first = text.data();
    const char* last = first + text.size();
    if (first != last && *first == '+') ++first;  // std::stoll accepts a leading '+'
    auto [ptr, ec] = std::from_chars(first, last, current);
    if (ec != std::errc() || ptr != last || first == last) {
      throw ProtocolError("ADD on key '" + std::string(key) + "' whose value is not a decimal integer (" +
                          std::to_string(text.size()) + " bytes)");
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    throw ProtocolError("ADD of " + std::to_string(delta) + " to key '" + std::string(key) + "' (value " +
                        std::to_string(current) + ") overflows a 64-bit integer");
  }
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, sum);
  store(key, std::string_view(buf, static_cast<size_t>(end - buf)));
  if (delta != 0) changed(key, &sum);  // ADD 0 only reads a counter
  return sum;
}

int64_t KvStore::add_once(std::string_view key, int64_t delta, std::string_view token) {
  if (auto it = once_.find(token); it != once_.end()) return it->second;  // a retry: already added
  const int64_t sum = add(key, delta);
  remember_once(token, sum);
  if (observer_) observer_->on_once(token, sum);
  return sum;
}

void KvStore::remember_once(std::string_view token, int64_t result) {
  auto [it, inserted] = once_.try_emplace(std::string(token), result);
  if (!inserted) {
    it->second = result;
    return;
  }
  once_order_.emplace_back(token);
  if (once_order_.size() > kOnceTokens) {
    once_.erase(once_order_.front());
    once_order_.pop_front();
  }
}

void KvStore::for_each_once(const std::function<void(std::string_view, int64_t)>& fn) const {
  for (const std::string& token : once_order_) fn(token, once_.find(token)->second);
}

void KvStore::append(std::string_view key, std::string_view data) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    store(key, data);
    changed(key, nullptr);
    return;
  }
  Value& slot = it->second;
  reserve(0, static_cast<int64_t>(data.size()), "APPEND", key);
  changed(key, nullptr);
  account(key, 0, static_cast<int64_t>(data.size()));
  const bool had_value = !slot->empty();
  const bool watched = !watchers_.empty() && watchers_.count(key) != 0;
  if (!watched && slot.use_count() == 1) {
    slot->append(data.data(), data.size());
  } else {
    auto grown = std::make_shared<std::string>();
    grown->reserve(slot->size() + data.size());
    grown->append(*slot).append(data.data(), data.size());
    const Value old = std::exchange(slot, std::move(grown));
    if (watched) notify_watchers(key, old, slot);
  }
  presence(key, had_value, had_value || !data.empty());
}

void KvStore::multi_set(std::span<const std::string_view> keys, std::span<const std::string_view> values) {
  // One check for the whole request, and one for each job's share of it (over-estimates when a
  // key repeats), so that either every entry is stored or none is.
  struct Share {
    size_t new_keys = 0;
    int64_t bytes = 0;
    std::string_view first_key;
  };
  Share total;
  std::unordered_map<std::string_view, Share> per_job;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string* old = get(keys[i]);
    const size_t n = old == nullptr ? 1 : 0;
    const int64_t bytes = old == nullptr ? static_cast<int64_t>(keys[i].size() + values[i].size())
                                         : static_cast<int64_t>(values[i].size()) - static_cast<int64_t>(old->size());
    total.new_keys += n;
    total.bytes += bytes;
    if (const std::string_view job = core::job_of_key(keys[i]); !job.empty()) {
      Share& s = per_job[job];
      if (s.first_key.empty()) s.first_key = keys[i];
      s.new_keys += n;
      s.bytes += bytes;
    }
  }
  if (!keys.empty()) reserve_in_store(total.new_keys, total.bytes, "MULTI_SET", keys[0]);
  for (const auto& [job, share] : per_job)
    reserve_for_job(job, share.new_keys, share.bytes, "MULTI_SET", share.first_key);
  for (size_t i = 0; i < keys.size(); ++i) store(keys[i], values[i]);
  for (size_t i = 0; i < keys.size(); ++i) changed(keys[i], nullptr);
}

bool KvStore::remove(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  changed(key, nullptr);
  account(key, -1, -static_cast<int64_t>(it->first.size() + it->second->size()));
  key_bytes_ -= it->first.size();
  if (core::is_refusal_note(key)) --notes_;
  // `key` may be a view of the map's own key: the observer is told with a copy, after the erase.
  const std::string told = presence_ && !it->second->empty() ? it->first : std::string();
  if (!watchers_.empty() && watchers_.count(key) != 0) {
    const Value old = std::move(it->second);
    const std::string name = it->first;
    map_.erase(it);
    notify_watchers(name, old, nullptr);
  } else {
    map_.erase(it);
  }
  if (!told.empty()) presence(told, true, false);
  return true;
}

bool KvStore::present(std::string_view key) const {
  if (map_.find(key) != map_.end()) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

bool KvStore::check(std::span<const std::string_view> keys) const {
  return std::all_of(keys.begin(), keys.end(), [this](std::string_view k) { return present(k); });
}

std::vector<std::string> KvStore::list() const {
  std::vector<std::string> keys;
  keys.reserve(map_.size());
  for (const auto& kv : map_) keys.push_back(kv.first);
  std::sort(keys.begin(), keys.end());
  return keys;
}

void KvStore::for_each(std::string_view prefix,
                       const std::function<void(std::string_view, const std::string&)>& fn) const {
  for (const auto& [key, value] : map_) {
    if (std::string_view(key).substr(0, prefix.size()) == prefix) fn(key, *value);
  }
}

bool KvStore::wait(Waiter& waiter, std::span<const std::string_view> keys) {
  cancel_wait(waiter);
  PendingWait pending;
  for (std::string_view key : keys) {
    if (present(key)) continue;
    auto it = waiting_on_.find(key);
    if (it == waiting_on_.end()) it = waiting_on_.emplace(std::string(key), WaitList()).first;
    const auto pos = it->second.insert(it->second.end(), WaitEntry{&waiter, pending.regs.size()});
    pending.regs.push_back({std::string(key), pos, true});
    ++pending.missing;
  }
  if (pending.missing == 0) return true;
  pending.since = std::chrono::steady_clock::now();
  waits_.emplace(&waiter, std::move(pending));
  return false;
}

bool KvStore::cancel_wait(Waiter& waiter) {
  auto it = waits_.find(&waiter);
  if (it == waits_.end()) return false;
  for (const PendingWait::Registration& reg : it->second.regs) {
    if (!reg.live) continue;
    auto list = waiting_on_.find(reg.key);
    if (list == waiting_on_.end()) continue;
    list->second.erase(reg.pos);
    if (list->second.empty()) waiting_on_.erase(list);
  }
  waits_.erase(it);
  return true;
}

size_t KvStore::missing_keys(const Waiter& waiter) const {
  auto it = waits_.find(&waiter);
  return it == waits_.end() ? 0 : it->second.missing;
}

std::vector<PendingWaitInfo> KvStore::pending_waits() const {
  std::vector<PendingWaitInfo> out;
  out.reserve(waits_.size());
  for (const auto& [waiter, pending] : waits_) {
    PendingWaitInfo info;
    info.waiter = waiter;
    info.since = pending.since;
    for (const auto& reg : pending.regs) {
      if (reg.live) info.missing.push_back(reg.key);
    }
    out.push_back(std::move(info));
  }
  return out;
}

void KvStore::key_arrived(std::string_view key, bool wake_one) {
  auto list = waiting_on_.find(key);
  if (list == waiting_on_.end()) return;
  WaitList woken;
  if (wake_one) {
    woken.splice(woken.end(), list->second, list->second.begin());
  } else {
    woken.swap(list->second);
  }
  if (list->second.empty()) waiting_on_.erase(list);
  for (const WaitEntry& e : woken) {
    auto it = waits_.find(e.waiter);
    if (it == waits_.end()) continue;
    it->second.regs[e.reg].live = false;
    if (--it->second.missing > 0) continue;
    waits_.erase(it);
    // The callback may queue bytes or even start another wait; the store is consistent here.
    e.waiter->on_wait_complete();
  }
}

void KvStore::watch(Waiter& waiter, std::string_view key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) it = watchers_.emplace(std::string(key), std::vector<Waiter*>()).first;
  if (std::find(it->second.begin(), it->second.end(), &waiter) == it->second.end()) {
    it->second.push_back(&waiter);
    watching_[&waiter].emplace_back(key);
  }
}

void KvStore::notify_watchers(std::string_view key, const SharedBytes& old_value, const SharedBytes& new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  const uint8_t event = old_value == nullptr   ? kWatchKeyCreated
                        : new_value == nullptr ? kWatchKeyDeleted
                                               : kWatchKeyUpdated;
  const std::vector<Waiter*> targets = it->second;  // a callback may unregister
  for (Waiter* w : targets) w->on_watch_event(event, key, old_value, new_value);
}

void KvStore::forget(Waiter& waiter) {
  cancel_wait(waiter);
  auto mine = watching_.find(&waiter);
  if (mine == watching_.end()) return;
  for (const std::string& key : mine->second) {
    auto it = watchers_.find(key);
    if (it == watchers_.end()) continue;
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), &waiter), v.end());
    if (v.empty()) watchers_.erase(it);
  }
  watching_.erase(mine);
}

void KvStore::queue_push(std::string_view key, std::string_view value) {
  auto it = queues_.find(key);
  const bool created = it == queues_.end();
  reserve(created ? 1 : 0, static_cast<int64_t>((created ? key.size() : 0) + value.size()), "QUEUE_PUSH", key);
  if (created) {
    it = queues_.emplace(std::string(key), std::deque<std::string>()).first;
    account(key, 1, static_cast<int64_t>(key.size()));
  }
  it->second.emplace_back(value);
  account(key, 0, static_cast<int64_t>(value.size()));
  changed(key, nullptr);
  key_arrived(key, /*wake_one=*/true);
}

const std::deque<std::string>* KvStore::queue_items(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? nullptr : &it->second;
}

void KvStore::for_each_queue(const std::function<void(std::string_view, const std::deque<std::string>&)>& fn) const {
  for (const auto& [key, items] : queues_) fn(key, items);
}

int64_t KvStore::queue_pop(std::string_view key, std::string& value) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return 0;
  const auto before = static_cast<int64_t>(it->second.size());
  changed(key, nullptr);
  value = std::move(it->second.front());
  account(key, 0, -static_cast<int64_t>(value.size()));
  it->second.pop_front();
  if (it->second.empty()) {
    account(key, -1, -static_cast<int64_t>(it->first.size()));
    queues_.erase(it);
  }
  return before;
}

int64_t KvStore::queue_len(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace ddprun::rdzv::core
