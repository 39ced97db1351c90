#pragma once
// Test helper: one node of a multi-node ddprun job, as every multi-node test starts them. Node
// `rank` plays a host of its own at 127.0.0.(rank+1) (--local_addr), or, named_host(), runs the
// command a user types on this host, which is known by its name; where the nodes meet is one of
// three: node 0's store (at_master), a store at an endpoint (at_store) or etcd (at_etcd).
//
//   auto node1 = JobNode(1).meet(at_master(port)).flags({"--max_restarts", "1"}).start({TEST_WORKER_BIN, "print", "1"});

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/ddprun_bin.hpp"
#include "tests/support/subprocess.hpp"

namespace ddprun::test {

// A static job whose node 0 hosts the store on 127.0.0.1:`port` (--master_addr, --master_port).
inline std::vector<std::string> at_master(int port) {
  return {"--master_addr", "127.0.0.1", "--master_port", std::to_string(port)};
}

// A job `run_id` ("": ddprun's default id) that meets at the store on 127.0.0.1:`port` (a
// ddprun-rendezvous daemon, or with c10d the node that binds it first); `c10d`: nodes join without
// ranks (--rdzv_backend c10d), else with their --node_rank.
inline std::vector<std::string> at_store(int port, const std::string& run_id, bool c10d = false) {
  std::vector<std::string> flags{"--rdzv_endpoint", "127.0.0.1:" + std::to_string(port)};
  if (!run_id.empty()) flags.insert(flags.end(), {"--rdzv_id", run_id});
  if (c10d) {
    flags.insert(flags.begin(), {"--rdzv_backend", "c10d"});
  } else {
    flags.insert(flags.end(), {"--master_addr", "127.0.0.1"});
  }
  return flags;
}

// A job `run_id` that meets in the etcd cluster at `endpoints` (comma-separated client URLs).
inline std::vector<std::string> at_etcd(const std::string& endpoints, const std::string& run_id) {
  return {"--rdzv_backend", "etcd", "--rdzv_endpoint", endpoints, "--rdzv_id", run_id};
}

class JobNode {
 public:
  // Node `rank`: the host it plays (127.0.0.(rank+1)), and its --node_rank unless without_rank().
  explicit JobNode(int rank) : rank_(rank) {}

  JobNode& nnodes(int n) { return nnodes(std::to_string(n)); }
  JobNode& nnodes(std::string spec) {  // --nnodes N or MIN:MAX (default 2)
    nnodes_ = std::move(spec);
    return *this;
  }
  JobNode& without_rank() {  // joins without --node_rank (c10d, etcd)
    rank_given_ = false;
    return *this;
  }
  JobNode& named_host() {  // no --local_addr: the node is this host, known by its name
    own_address_ = false;
    return *this;
  }
  JobNode& meet(std::vector<std::string> where) {  // at_master, at_store or at_etcd
    meet_ = std::move(where);
    return *this;
  }
  JobNode& conf(std::string rdzv_conf) {  // --rdzv_conf (default join_timeout=60)
    conf_ = std::move(rdzv_conf);
    return *this;
  }
  JobNode& flags(const std::vector<std::string>& more) {  // more flags, before the program
    flags_.insert(flags_.end(), more.begin(), more.end());
    return *this;
  }
  JobNode& env(const std::map<std::string, std::string>& more) {  // on top of the test's environment
    for (const auto& [k, v] : more) env_[k] = v;
    return *this;
  }

  // ddprun's command line running `program` (the program and its arguments).
  std::vector<std::string> argv(const std::vector<std::string>& program) const {
    std::vector<std::string> a{ddprun_bin(), "--nnodes", nnodes_};
    if (own_address_) a.insert(a.end(), {"--local_addr", "127.0.0." + std::to_string(rank_ + 1)});
    if (rank_given_) a.insert(a.end(), {"--node_rank", std::to_string(rank_)});
    a.insert(a.end(), meet_.begin(), meet_.end());
    if (!conf_.empty()) a.insert(a.end(), {"--rdzv_conf", conf_});
    a.insert(a.end(), flags_.begin(), flags_.end());
    a.insert(a.end(), program.begin(), program.end());
    return a;
  }

  std::unique_ptr<Subprocess> start(const std::vector<std::string>& program) const {
    return std::make_unique<Subprocess>(argv(program), env_);
  }

 private:
  int rank_;
  bool rank_given_ = true;
  bool own_address_ = true;
  std::string nnodes_ = "2";
  std::vector<std::string> meet_;
  std::string conf_ = "join_timeout=60";
  std::vector<std::string> flags_;
  std::map<std::string, std::string> env_;
};

}  // namespace ddprun::test
