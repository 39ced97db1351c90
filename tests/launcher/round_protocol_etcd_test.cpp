// The round protocol's suite (round_protocol_test.hpp) through the etcd backend, against a real
// etcd: in the end-to-end binary, since each test starts an etcd member.
#include <memory>
#include <stdexcept>
#include <string>

#include "launcher/rendezvous/etcd/etcd_rendezvous.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "tests/launcher/round_protocol_test.hpp"
#include "tests/support/etcd_cluster.hpp"

namespace ddprun::launcher::test_round_protocol {
namespace {

using rendezvous::etcd::EtcdRendezvous;
using rendezvous::etcd::EtcdRendezvousOptions;
namespace etcd = rendezvous::etcd;

class EtcdBackend final : public Backend {
 public:
  EtcdBackend() {
    if (!test::have_etcd()) throw std::runtime_error("etcd-server is not installed: run scripts/install_deps.sh");
    cluster_ = std::make_unique<test::EtcdCluster>(1);
  }
  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                          const StopSignal& stop) override {
    EtcdRendezvousOptions o;
    static_cast<rendezvous::JoinSettings&>(o) = join_settings(rank, nnodes, join_timeout);
    o.etcd.endpoints = {cluster_->endpoint(0)};
    o.lease_ttl = std::chrono::seconds(3);
    return std::make_unique<EtcdRendezvous>(o, stop);
  }
  int joined(RendezvousBackend& any) override {
    etcd::Options eo;
    eo.endpoints = {cluster_->endpoint(0)};
    etcd::Client c(eo);
    const std::string members =
        "/ddprun/job/g" + std::to_string(generation(any)) + "/r0/" + std::string(rdzv::jobs::round_names::kMember);
    return static_cast<int>(c.get_prefix(members, etcd::Client::after(5s), true).kvs.size());
  }
  int64_t generation(RendezvousBackend& r) override { return dynamic_cast<EtcdRendezvous&>(r).generation(); }
  std::string lost_says() const override { return "lost its etcd lease"; }
  std::string missing_says() const override { return "1 node(s) joined, 2 needed to start"; }

 private:
  std::unique_ptr<test::EtcdCluster> cluster_;
};

INSTANTIATE_TEST_SUITE_P(Etcd, RoundProtocolTest,
                         ::testing::Values(RoundProtocolBackend{"etcd",
                                                                [] { return std::make_unique<EtcdBackend>(); }}));

}  // namespace
}  // namespace ddprun::launcher::test_round_protocol
