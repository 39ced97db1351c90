#pragma once
// Test helper: where the nodes of one elastic multi-node test meet, on either dynamic backend: the
// c10d store that node 0 hosts at a free port, or a real one-member etcd (tests run on both).

#include <memory>
#include <string>
#include <vector>

#include "tests/support/etcd_cluster.hpp"
#include "tests/support/free_port.hpp"
#include "tests/support/job_node.hpp"

namespace ddprun::test {

enum class Backend { Store, Etcd };

// Where the nodes of one test meet: the store that node 0 hosts at a free port, or one etcd member.
class Meeting {
 public:
  explicit Meeting(Backend b, const std::string& run_id) : backend_(b), run_id_(run_id) {
    if (b == Backend::Etcd) etcd_ = std::make_unique<EtcdCluster>(1);
  }
  std::vector<std::string> flags() const {
    return backend_ == Backend::Store ? at_store(port_, run_id_, /*c10d=*/true) : at_etcd(etcd_->endpoints(), run_id_);
  }
  // A job of 2 nodes at most that has no room for a third. On etcd a fixed --nnodes is a static
  // job (a lost node ends it; a third agent is refused), so there the job is elastic, 1:2, with a
  // last call long enough for the two nodes to start together.
  std::string nnodes() const { return backend_ == Backend::Store ? "2:2" : "1:2"; }
  // Quick liveness, so that a lost node is noticed in a few seconds (and a busy machine's hiccup is
  // not taken for one: the tests count the rounds).
  std::string conf() const {
    return "join_timeout=60," +
           std::string(backend_ == Backend::Store
                           ? "last_call_timeout=0.5,keep_alive_interval=0.5,keep_alive_max_attempt=6"
                           : "last_call_timeout=5,lease_ttl=4");
  }
  // The first node is up (on the store backend: it bound the endpoint, so it is group rank 0).
  bool first_node_up(Subprocess& n) {
    return backend_ == Backend::Etcd || n.wait_for([&] { return port_taken(port_); }, std::chrono::seconds(10));
  }

 private:
  Backend backend_;
  std::string run_id_;
  int port_ = free_port();
  std::unique_ptr<EtcdCluster> etcd_;
};

}  // namespace ddprun::test
