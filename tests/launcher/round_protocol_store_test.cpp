// The round protocol's suite (round_protocol_test.hpp) through the store backend, against a store
// in this process: in the unit binary (seconds).
#include <memory>
#include <string>

#include "launcher/rendezvous/store/store_rendezvous.hpp"
#include "rendezvous/client/client.hpp"
#include "rendezvous/jobs/job_keys.hpp"
#include "rendezvous/server/server.hpp"
#include "tests/launcher/round_protocol_test.hpp"

namespace ddprun::launcher::test_round_protocol {
namespace {

using rendezvous::store::StoreRendezvous;
using rendezvous::store::StoreRendezvousOptions;

class StoreBackend final : public Backend {
 public:
  StoreBackend() {
    rdzv::server::ServerOptions so;
    so.log_lifecycle = false;
    server_ = std::make_unique<rdzv::server::ServerThread>(so);
  }
  std::unique_ptr<RendezvousBackend> node(int rank, int nnodes, std::chrono::milliseconds join_timeout,
                                          const StopSignal& stop) override {
    StoreRendezvousOptions o;
    static_cast<rendezvous::JoinSettings&>(o) = join_settings(rank, nnodes, join_timeout);
    o.endpoint_host = "127.0.0.1";
    o.endpoint_port = server_->port();
    o.timeouts.keep_alive_interval = 100ms;
    o.timeouts.keep_alive_max_attempt = 3;
    return std::make_unique<StoreRendezvous>(o, stop);
  }
  int joined(RendezvousBackend& any) override {
    rdzv::client::ClientOptions co;
    co.host = "127.0.0.1";
    co.port = server_->port();
    rdzv::client::Client c(co);
    const std::string k = rdzv::jobs::JobKeys("job", generation(any)).round(0).joined();
    return static_cast<int>(c.add(k, 0));
  }
  int64_t generation(RendezvousBackend& r) override { return dynamic_cast<StoreRendezvous&>(r).generation(); }
  std::string lost_says() const override { return "sent no heartbeat for"; }
  std::string missing_says() const override { return "1 of 2 nodes joined; missing node_rank 1"; }

 private:
  std::unique_ptr<rdzv::server::ServerThread> server_;
};

INSTANTIATE_TEST_SUITE_P(Store, RoundProtocolTest,
                         ::testing::Values(RoundProtocolBackend{"store",
                                                                [] { return std::make_unique<StoreBackend>(); }}));

}  // namespace
}  // namespace ddprun::launcher::test_round_protocol
