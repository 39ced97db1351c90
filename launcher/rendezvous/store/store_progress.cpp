// The hang watchdog's job-wide channel over the rendezvous store (see rendezvous_backend.hpp,
// ProgressChannel, and the round keys in rendezvous/jobs/job_keys.hpp): a progress counter every node
// bumps when its ranks progress, the claim of the node that diagnoses a hang, the nodes' parts of
// the diagnosis, and each node's step rates. Its own connection: the watchdog's thread must never
// wait behind the agent's long WAITs.
#include <thread>

#include "common/log.hpp"
#include "common/numbers.hpp"
#include "launcher/rendezvous/round_records.hpp"
#include "launcher/rendezvous/store/store_rendezvous.hpp"

namespace ddprun::launcher::rendezvous::store {

using rendezvous::hang_outcome;
using rendezvous::parse_round_end;
using rendezvous::ProgressChannel;
using rendezvous::RoundEnd;

using json = nlohmann::json;

namespace {

class StoreProgressChannel final : public ProgressChannel {
 public:
  StoreProgressChannel(std::shared_ptr<rdzv::client::Client> client, rdzv::jobs::RoundKeys keys, int node, int nodes)
      : c_(std::move(client)), rk_(std::move(keys)), node_(node), nodes_(nodes) {}

  Pulse pulse(bool progressed, bool heartbeat_mode) override {
    Pulse p;
    p.job_progress = c_->add(rk_.progress(), progressed ? 1 : 0);
    if (heartbeat_mode && !heartbeat_mode_published_) {
      c_->set(rk_.heartbeat_mode(), "1");
      heartbeat_mode_published_ = true;
    }
    const auto values = c_->multi_get_now({rk_.hang(), rk_.heartbeat_mode()});
    if (!values[0].empty()) {
      const auto by = to_int(values[0]);
      p.hang_claimed_by = by ? static_cast<int>(*by) : -1;
    }
    p.heartbeat_mode = !values[1].empty();
    return p;
  }

  void publish_rates(const json& record) override { c_->set(rk_.rates(node_), record.dump()); }

  std::map<int, json> rates() override {
    std::vector<std::string> keys;
    for (int k = 0; k < nodes_; ++k) keys.push_back(rk_.rates(k));
    const auto values = c_->multi_get_now(keys);
    std::map<int, json> out;
    for (int k = 0; k < nodes_; ++k) {
      if (values[static_cast<size_t>(k)].empty()) continue;
      json j = json::parse(values[static_cast<size_t>(k)], nullptr, false);
      if (j.is_object()) out[k] = std::move(j);
    }
    return out;
  }

  bool claim_hang() override {
    const std::string me = std::to_string(node_);
    return c_->compare_set(rk_.hang(), "", me) == me;
  }

  void put_diagnosis(const json& diagnosis) override {
    c_->set(rk_.diagnosis(node_), diagnosis.dump(-1, ' ', false, json::error_handler_t::replace));
  }

  std::map<int, json> gather_diagnoses(std::chrono::steady_clock::time_point deadline) override {
    std::vector<std::string> keys;
    for (int k = 0; k < nodes_; ++k) keys.push_back(rk_.diagnosis(k));
    // Waits in slices until every node's part is there or the deadline passes.
    while (std::chrono::steady_clock::now() < deadline) {
      if (c_->wait_for(keys, std::min<std::chrono::milliseconds>(std::chrono::milliseconds(500),
                                                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                                                     deadline - std::chrono::steady_clock::now())))) {
        break;
      }
    }
    std::map<int, json> out;
    const auto values = c_->multi_get_now(keys);
    for (int k = 0; k < nodes_; ++k) {
      const std::string& v = values[static_cast<size_t>(k)];
      if (v.empty()) continue;
      json j = json::parse(v, nullptr, false);
      if (j.is_object()) out[k] = std::move(j);
    }
    // The report carries what matters; the parts would only weigh on `status` and the janitor.
    for (const auto& k : keys) c_->delete_key(k);
    return out;
  }

  RoundEnd report_hang(const std::string& summary, const std::string& report) override {
    const std::string proposal = rdzv::jobs::encode_outcome(hang_outcome(summary, report, node_));
    return parse_round_end(c_->compare_set(rk_.end(), "", proposal));
  }

  int nodes() const override { return nodes_; }
  int node() const override { return node_; }

 private:
  std::shared_ptr<rdzv::client::Client> c_;
  rdzv::jobs::RoundKeys rk_;
  int node_;
  int nodes_;
  bool heartbeat_mode_published_ = false;
};

}  // namespace

std::unique_ptr<ProgressChannel> StoreRendezvous::open_progress_channel(int round, int node, int nodes) {
  return std::make_unique<StoreProgressChannel>(side_connection(), keys_.round(round), node, nodes);
}

}  // namespace ddprun::launcher::rendezvous::store
