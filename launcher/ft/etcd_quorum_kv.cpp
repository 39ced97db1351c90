#include "launcher/ft/etcd_quorum_kv.hpp"

#include <algorithm>
#include <charconv>
#include <thread>

namespace ddprun::launcher::ft {

namespace etcd = rendezvous::etcd;

EtcdQuorumKv::EtcdQuorumKv(const etcd::Options& options, std::chrono::milliseconds timeout)
    : client_(std::make_unique<etcd::Client>(options)), timeout_(timeout) {}

EtcdQuorumKv::~EtcdQuorumKv() = default;

void EtcdQuorumKv::put(const std::string& key, const std::string& value) { client_->put(key, value, 0, deadline()); }

std::vector<std::optional<std::string>> EtcdQuorumKv::read(const std::vector<std::string>& keys) {
  std::vector<std::optional<std::string>> out;
  if (keys.empty()) return out;
  // One round trip: a transaction without conditions whose operations are the reads.
  std::vector<etcd::Op> gets;
  for (const std::string& k : keys) gets.push_back(etcd::Op::get(k));
  const etcd::TxnResult r = client_->txn({}, gets, {}, deadline());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i < r.ranges.size() && !r.ranges[i].kvs.empty()) {
      out.emplace_back(r.ranges[i].kvs.front().value);
    } else {
      out.emplace_back(std::nullopt);
    }
  }
  return out;
}

std::string EtcdQuorumKv::create_or_get(const std::string& key, const std::string& value) {
  return client_->create_or_get(key, value, 0, deadline());
}

bool EtcdQuorumKv::wait_for(const std::string& key, std::chrono::milliseconds slice) {
  const auto end = std::chrono::steady_clock::now() + slice;
  for (;;) {
    if (!client_->get(key, deadline()).kvs.empty()) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    // sleep override: etcd answers a read, not a wait; the slice is the coordinator's poll
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(slice, std::chrono::milliseconds(20)));
  }
}

void EtcdQuorumKv::erase(const std::string& key) { client_->erase(key, "", deadline()); }

void EtcdQuorumKv::register_group(const std::string& registry, int group) {
  client_->put(registry + "/" + std::to_string(group), "1", 0, deadline());
}

std::vector<int> EtcdQuorumKv::groups(const std::string& registry) {
  std::vector<int> out;
  const std::string prefix = registry + "/";
  for (const etcd::KeyValue& kv : client_->get_prefix(prefix, deadline(), true).kvs) {
    const std::string_view id = std::string_view(kv.key).substr(prefix.size());
    int g = 0;
    const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), g);
    if (ec == std::errc() && end == id.data() + id.size()) out.push_back(g);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ddprun::launcher::ft
