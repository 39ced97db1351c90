#pragma once
// The round protocol's test suite (round_protocol_test.cpp), one fixture for both multi-node
// backends: each backend's file (round_protocol_store_test.cpp in the unit binary,
// round_protocol_etcd_test.cpp in the end-to-end one, since each of its tests starts an etcd
// member) implements Backend and instantiates the suite with it.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "common/stop_signal.hpp"
#include "launcher/rendezvous/join_settings.hpp"
#include "launcher/rendezvous/rendezvous_backend.hpp"

namespace ddprun::launcher::test_round_protocol {

using rendezvous::ProgressMark;
using rendezvous::RendezvousBackend;
using rendezvous::RoundEnd;
using rendezvous::World;
using namespace std::chrono_literals;

// What either backend is told for node `rank` of the suite's job ("job", `nnodes` nodes, all of
// them needed): this host's address, a host name of its own (host-a, host-b, ...).
inline rendezvous::JoinSettings join_settings(int rank, int nnodes, std::chrono::milliseconds join_timeout) {
  rendezvous::JoinSettings j;
  j.run_id = "job";
  j.max_nodes = j.min_nodes = nnodes;
  j.node_rank = rank;
  j.advertise_addr = "127.0.0.1";
  j.host = std::string("host-") + static_cast<char>('a' + rank);
  j.timeouts.join_timeout = join_timeout;
  return j;
}

// Where the nodes rendezvous, and what the tests need to see of it.
class Backend {
 public:
  virtual ~Backend() = default;
  // Node `rank` of a job of `nnodes` (all of them needed).
  virtual std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                                  const StopSignal& stop) = 0;
  // How many nodes have joined round 0 of `any`'s generation so far.
  virtual int joined(RendezvousBackend& any) = 0;
  virtual int64_t generation(RendezvousBackend& r) = 0;
  // What the end says of a lost node, and the join timeout of the nodes that are missing.
  virtual std::string lost_says() const = 0;
  virtual std::string missing_says() const = 0;
};

// A backend as the suite's parameter: its name (in failure messages) and how to start one.
struct RoundProtocolBackend {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};
inline std::ostream& operator<<(std::ostream& os, const RoundProtocolBackend& b) { return os << b.name; }

class RoundProtocolTest : public ::testing::TestWithParam<RoundProtocolBackend> {
 protected:
  void SetUp() override {
    backend_ = GetParam().make();
    ASSERT_TRUE(backend_) << GetParam().name;
  }

  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes = 2, std::chrono::milliseconds join_timeout = 20s) {
    return backend_->node(rank, nnodes, join_timeout, stop_);
  }

  static std::variant<World, RoundEnd> join(RendezvousBackend& r, int nproc, const StopSignal& stop) {
    return r.join(
        0, nproc,
        [] {
          return rendezvous::HostedStore{4242, {}};
        },
        stop);
  }

  // Joins round 0 with both nodes at once (2 and 3 workers); node 0 hosts the worker store.
  std::pair<World, World> join_both(RendezvousBackend& a, RendezvousBackend& b) {
    auto world = [this](RendezvousBackend& r, int nproc) {
      auto result = join(r, nproc, stop_);
      if (!std::holds_alternative<World>(result)) throw std::runtime_error(std::get<RoundEnd>(result).detail);
      return std::get<World>(result);
    };
    auto wa = std::async(std::launch::async, world, std::ref(a), 2);
    auto wb = std::async(std::launch::async, world, std::ref(b), 3);
    return {wa.get(), wb.get()};
  }

  std::unique_ptr<Backend> backend_;
  StopSignal stop_;
};

}  // namespace ddprun::launcher::test_round_protocol
