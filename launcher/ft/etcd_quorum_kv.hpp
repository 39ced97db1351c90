#pragma once
// The quorum's key-value interface (coordinator.hpp) on etcd v3: the coordinator then lives as
// long as the etcd cluster does, which survives the loss of any minority of its members (the
// client fails over to the next endpoint). Reads of several keys are one transaction, a creation
// is a transaction on the key's absence, the registry of groups is a key per group under a prefix.
// A wait for a key polls it within its slice (the coordinator's slices are short).
//
// Thread-safety: as the etcd client's (one request at a time); the coordinator gives its heartbeat
// thread an instance of its own.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "launcher/ft/coordinator.hpp"
#include "launcher/rendezvous/etcd/etcd_client.hpp"

namespace ddprun::launcher::ft {

class EtcdQuorumKv : public QuorumKv {
 public:
  // `timeout`: each request's deadline (the client fails over across the members within it).
  EtcdQuorumKv(const rendezvous::etcd::Options& options, std::chrono::milliseconds timeout);
  ~EtcdQuorumKv() override;
  void put(const std::string& key, const std::string& value) override;
  std::vector<std::optional<std::string>> read(const std::vector<std::string>& keys) override;
  std::string create_or_get(const std::string& key, const std::string& value) override;
  bool wait_for(const std::string& key, std::chrono::milliseconds slice) override;
  void erase(const std::string& key) override;
  void register_group(const std::string& registry, int group) override;
  std::vector<int> groups(const std::string& registry) override;

 private:
  rendezvous::etcd::Client::Deadline deadline() const { return rendezvous::etcd::Client::after(timeout_); }

  std::unique_ptr<rendezvous::etcd::Client> client_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ddprun::launcher::ft
