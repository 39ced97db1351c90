#include "rendezvous/kv_store.hpp"

#include <algorithm>
#include <charconv>

#include "common/errors.hpp"
#include "rendezvous/protocol.hpp"

namespace ddprun::rdzv {

std::string& KvStore::slot(std::string_view key, bool& created) {
  auto it = map_.find(key);
  created = it == map_.end();
  if (created) {
    it = map_.emplace(std::string(key), std::string()).first;
    stored_bytes_ += key.size();
  }
  return it->second;
}

void KvStore::set(std::string_view key, std::string_view value) {
  bool created = false;
  std::string& v = slot(key, created);
  std::string old;
  const bool watched = !watchers_.empty() && watchers_.count(key) != 0;
  if (watched && !created) old = v;
  stored_bytes_ = stored_bytes_ - v.size() + value.size();
  v.assign(value.data(), value.size());
  if (watched) notify_watchers(key, created ? nullptr : &old, &v);
  if (created) key_arrived(key, /*wake_one=*/false);
}

std::string KvStore::compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    // Missing key: only an empty `expected` creates it; otherwise the caller gets `expected` back.
    if (!expected.empty()) return std::string(expected);
    set(key, desired);
    return std::string(desired);
  }
  if (it->second == expected) {
    std::string old = it->second;
    stored_bytes_ = stored_bytes_ - it->second.size() + desired.size();
    it->second.assign(desired.data(), desired.size());
    if (!watchers_.empty()) notify_watchers(key, &old, &it->second);
  }
  return it->second;
}

const std::string* KvStore::get(std::string_view key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

int64_t KvStore::add(std::string_view key, int64_t delta) {
  auto it = map_.find(key);
  int64_t current = 0;
  if (it != map_.end()) {
    const std::string& text = it->second;
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
  set(key, std::string_view(buf, static_cast<size_t>(end - buf)));
  return sum;
}

void KvStore::append(std::string_view key, std::string_view data) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    set(key, data);
    return;
  }
  std::string old;
  const bool watched = !watchers_.empty() && watchers_.count(key) != 0;
  if (watched) old = it->second;
  it->second.append(data.data(), data.size());
  stored_bytes_ += data.size();
  if (watched) notify_watchers(key, &old, &it->second);
}

bool KvStore::remove(std::string_view key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  stored_bytes_ -= it->first.size() + it->second.size();
  if (!watchers_.empty() && watchers_.count(key) != 0) {
    std::string old = std::move(it->second);
    std::string name = it->first;
    map_.erase(it);
    notify_watchers(name, &old, nullptr);
  } else {
    map_.erase(it);
  }
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

bool KvStore::wait(Waiter& waiter, std::span<const std::string_view> keys) {
  cancel_wait(waiter);
  PendingWait pending;
  for (std::string_view key : keys) {
    if (present(key)) continue;
    auto it = waiting_on_.find(key);
    if (it == waiting_on_.end()) it = waiting_on_.emplace(std::string(key), std::vector<Waiter*>()).first;
    it->second.push_back(&waiter);
    pending.keys.emplace_back(key);
    ++pending.missing;
  }
  if (pending.missing == 0) return true;
  waits_.emplace(&waiter, std::move(pending));
  return false;
}

bool KvStore::cancel_wait(Waiter& waiter) {
  auto it = waits_.find(&waiter);
  if (it == waits_.end()) return false;
  for (const std::string& key : it->second.keys) {
    auto list = waiting_on_.find(key);
    if (list == waiting_on_.end()) continue;
    auto& v = list->second;
    v.erase(std::remove(v.begin(), v.end(), &waiter), v.end());
    if (v.empty()) waiting_on_.erase(list);
  }
  waits_.erase(it);
  return true;
}

size_t KvStore::missing_keys(const Waiter& waiter) const {
  auto it = waits_.find(&waiter);
  return it == waits_.end() ? 0 : it->second.missing;
}

void KvStore::key_arrived(std::string_view key, bool wake_one) {
  auto list = waiting_on_.find(key);
  if (list == waiting_on_.end()) return;
  std::vector<Waiter*> woken;
  if (wake_one) {
    woken.push_back(list->second.front());
    list->second.erase(list->second.begin());
    if (list->second.empty()) waiting_on_.erase(list);
  } else {
    woken = std::move(list->second);
    waiting_on_.erase(list);
  }
  for (Waiter* w : woken) {
    auto it = waits_.find(w);
    if (it == waits_.end()) continue;
    if (--it->second.missing > 0) continue;
    waits_.erase(it);
    // The callback may send bytes or even start another wait; the store is consistent here.
    w->on_wait_complete();
  }
}

void KvStore::watch(Waiter& waiter, std::string_view key) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) it = watchers_.emplace(std::string(key), std::vector<Waiter*>()).first;
  if (std::find(it->second.begin(), it->second.end(), &waiter) == it->second.end()) it->second.push_back(&waiter);
}

void KvStore::notify_watchers(std::string_view key, const std::string* old_value, const std::string* new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  const uint8_t event = old_value == nullptr ? kWatchKeyCreated
                        : new_value == nullptr ? kWatchKeyDeleted
                                               : kWatchKeyUpdated;
  const std::vector<Waiter*> targets = it->second;  // a callback may unregister
  for (Waiter* w : targets) {
    w->on_watch_event(event, key, old_value ? std::string_view(*old_value) : std::string_view(),
                      new_value ? std::string_view(*new_value) : std::string_view());
  }
}

void KvStore::forget(Waiter& waiter) {
  cancel_wait(waiter);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), &waiter), v.end());
    it = v.empty() ? watchers_.erase(it) : std::next(it);
  }
}

void KvStore::queue_push(std::string_view key, std::string_view value) {
  auto it = queues_.find(key);
  if (it == queues_.end()) it = queues_.emplace(std::string(key), std::deque<std::string>()).first;
  it->second.emplace_back(value);
  stored_bytes_ += value.size();
  key_arrived(key, /*wake_one=*/true);
}

int64_t KvStore::queue_pop(std::string_view key, std::string& value) {
  auto it = queues_.find(key);
  if (it == queues_.end() || it->second.empty()) return 0;
  const auto before = static_cast<int64_t>(it->second.size());
  value = std::move(it->second.front());
  stored_bytes_ -= value.size();
  it->second.pop_front();
  if (it->second.empty()) queues_.erase(it);
  return before;
}

int64_t KvStore::queue_len(std::string_view key) const {
  auto it = queues_.find(key);
  return it == queues_.end() ? 0 : static_cast<int64_t>(it->second.size());
}

}  // namespace ddprun::rdzv
