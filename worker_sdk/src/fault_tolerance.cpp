// The C++ worker's side of ddprun's replica groups (include/ddprun/worker/fault_tolerance.hpp): the
// same keys, JSON and wire as Python's ddprun_ft (launcher/workers/python_hook/ddprun_ft.py).
#include "ddprun/worker/fault_tolerance.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/ft_wire.hpp"
#include "common/hex.hpp"
#include "ddprun/worker/serialize.hpp"
#include "ddprun/worker/tcp_store.hpp"
#include "agent_watch.hpp"
#include "state_transfer.hpp"

namespace ddprun::worker::ft {

using nlohmann::json;

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }

// "host:port" (host may be "[v6]") -> its parts.
std::pair<std::string, uint16_t> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) throw std::runtime_error("not host:port: '" + address + "'");
  std::string host = address.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, static_cast<uint16_t>(std::stoi(address.substr(colon + 1)))};
}

Quorum quorum_of(const json& j) {
  Quorum q;
  q.seq = j.at("seq").get<int64_t>();
  q.quorum_id = j.at("quorum_id").get<int64_t>();
  q.replica_rank = j.at("replica_rank").get<int>();
  q.replica_world_size = j.at("replica_world_size").get<int>();
  q.participants = j.value("participants", q.replica_world_size);
  q.participant_rank = j.value("participant_rank", q.replica_rank);
  q.max_step = j.at("max_step").get<int64_t>();
  q.heal = j.at("heal").get<bool>();
  q.recover_from = j.value("recover_from", -1);
  q.recover_addresses = j.value("recover_addresses", std::vector<std::string>{});
  q.serves = j.value("serves", std::vector<int>{});
  q.store = j.at("store").get<std::string>();
  q.groups = j.value("groups", std::vector<int>{});
  q.reconfigure = j.value("reconfigure", false);
  return q;
}

}  // namespace

struct Manager::Impl {
  StateFn state;
  LoadFn load;
  ManagerOptions options;
  int group = 0;
  int rank = 0;
  int world_size = 1;
  std::string node;
  c10::intrusive_ptr<c10d::Store> store;  // the group's worker store, without prefixes
  std::chrono::milliseconds store_timeout{0};
  std::string key;  // the round's key (DDPRUN_FT_KEY): every value this rank reads or writes is sealed
  std::unique_ptr<detail::StateServer> server;
  std::unique_ptr<detail::AgentWatch> watch;  // this rank leaves when its ddprun stops answering
  int64_t n = 0;                              // quorums asked for
  int64_t step = 0;
  int healed = 0;
  Quorum quorum;
  bool have_quorum = false;
  std::mutex mutex;                      // resolve() may run on DDP's hook thread
  bool pending = false;                  // asked, the answer not read yet
  bool heal_due = false;                 // this step's quorum says heal; done before the vote
  std::exception_ptr fatal;              // the job's end or no quorum: thrown on the training thread
  c10::intrusive_ptr<CommGroup> across;  // the process group across the groups
  int64_t across_id = -1;
  std::optional<std::string> error;  // what failed in this step
  bool last_ok = true;
  std::string said;

  void say(const std::string& text) {
    if (text != said) std::cerr << "ddprun_ft: replica group " << group << ": " << text << std::endl;
    said = text;
  }

  // Sets `name` (as PyTorch's client names it: no leading "/") to `body`, sealed.
  void write_sealed(const std::string& name, const std::string& body) {
    store->set(name, bytes_of(ft_wire::seal(key, name, body)));
  }

  // The body of `name` as its writer (the agent, or a rank of the group) sealed it. Any local
  // process may write the worker store: a value it wrote there is waited past until the real one
  // replaces it, or until the store's timeout.
  std::string read_sealed(const std::string& name) {
    const auto deadline = std::chrono::steady_clock::now() + store_timeout;
    for (;;) {
      if (auto body = ft_wire::unseal(key, name, text_of(store->get(name)))) return *body;
      say("the worker store holds a value for " + name.substr(0, name.rfind('/')) +
          "/... that its agent or its group did not seal (another process writes into the worker store): ignored, "
          "waiting for theirs");
      if (std::chrono::steady_clock::now() >= deadline)
        throw std::runtime_error("replica group " + std::to_string(group) + ": the worker store held only values for " +
                                 name + " that nobody of the group sealed, until the store's timeout");
      // The store cannot wait for a key to change: look again shortly.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // sleep override: polling with a deadline
    }
  }

  void heal() {
    const auto address = quorum.recover_addresses.size() > static_cast<size_t>(rank)
                             ? quorum.recover_addresses[static_cast<size_t>(rank)]
                             : std::string();
    // "host:port#<the peer rank's key, masked for this group>"
    const auto hash = address.find('#');
    const auto masked = hash == std::string::npos ? std::nullopt : from_hex(std::string_view(address).substr(hash + 1));
    if (!masked || masked->size() != ft_wire::kKeyBytes)
      throw std::runtime_error("replica group " + std::to_string(group) + " must heal from group " +
                               std::to_string(quorum.recover_from) + ", whose rank " + std::to_string(rank) +
                               " serves no state");
    const std::string peer_key =
        ft_wire::mask(key, "ddprun_ft/quorum/" + std::to_string(n), static_cast<size_t>(rank), *masked);
    std::vector<char> bytes =
        detail::fetch_state(address.substr(0, hash), peer_key, quorum.max_step, options.timeout());
    load(torch_load_bytes(bytes, "the state of replica group " + std::to_string(quorum.recover_from)));
    step = quorum.max_step;
    ++healed;
  }

  // Reads the pending quorum's answer; what must stop the worker (the job's end, no quorum) is
  // kept for throw_fatal(), on the training thread.
  void resolve() {
    std::lock_guard lock(mutex);
    if (!pending) return;
    const json view = json::parse(read_sealed("ddprun_ft/quorum/" + std::to_string(n)));
    pending = false;
    if (view.contains("finished")) {
      const json& f = view["finished"];
      const int64_t at_step = f.at("step").get<int64_t>();
      const int by = f.at("group").get<int>();
      const std::string what = "the job finished at step " + std::to_string(at_step) + " (replica group " +
                               std::to_string(by) + ", " + f.value("at", std::string()) +
                               ") and no other group is left: nothing to train";
      say(what);
      fatal = std::make_exception_ptr(JobFinished("replica group " + std::to_string(group) + ": " + what, at_step, by));
      return;
    }
    if (view.contains("error")) {
      fatal = std::make_exception_ptr(std::runtime_error("replica group " + std::to_string(group) +
                                                         " got no quorum: " + view["error"].get<std::string>()));
      return;
    }
    quorum = quorum_of(view);
    have_quorum = true;
    heal_due = quorum.heal;
    if (!quorum.serves.empty() && server) server->offer(step, torch_save_bytes(state()));
    // What depends on the peers never throws here: a failure means no commit this step, and the
    // next quorum tries again (a rank that threw would end its group, and stall its peers).
    // Rebuilt on every member at the same quorum: when the membership changed, or when a member's
    // last step failed (its collectives may have left the old group broken).
    if (!across || quorum.quorum_id != across_id || quorum.reconfigure) {
      try {
        configure();
      } catch (const std::exception& e) {
        across.reset();
        across_id = -1;
        if (!error) error = std::string("the process group across the replica groups: ") + e.what();
      }
    }
  }

  void throw_fatal() {
    if (!fatal) return;
    server.reset();  // nothing more to serve: the worker ends
    std::rethrow_exception(fatal);
  }

  void heal_if_due() {
    if (!heal_due) return;
    heal_due = false;
    try {
      heal();
    } catch (const std::exception& e) {
      if (!error) error = std::string("healing: ") + e.what();
    }
  }

  void configure() {
    across.reset();
    across_id = -1;
    if (quorum.replica_world_size > 1) {
      const auto [host, port] = split_address(quorum.store);
      auto leader = c10::make_intrusive<c10d::TCPStore>(host, tcp_store_client_options(port, options.timeout()));
      const std::string prefix = "ddprun_ft/pg/" + std::to_string(quorum.quorum_id) + "/" + std::to_string(quorum.seq) +
                                 "/" + std::to_string(rank);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, leader);
      auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout());
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(node));
      across =
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, quorum.replica_rank, quorum.replica_world_size, opts);
    }
    across_id = quorum.quorum_id;
  }
};

Manager::Manager(const Distributed& dist, StateFn state, LoadFn load, const ManagerOptions& options)
    : impl_(std::make_unique<Impl>()) {
  const char* group = std::getenv("DDPRUN_REPLICA_GROUP");
  if (group == nullptr || *group == '\0')
    throw std::invalid_argument(
        "ft::Manager needs a worker of a replica group: start it with ddprun --replica_group ID --rdzv_backend c10d "
        "--rdzv_endpoint HOST:PORT ...");
  Impl& m = *impl_;
  m.state = std::move(state);
  m.load = std::move(load);
  m.options = options;
  m.group = std::stoi(group);
  m.rank = dist.rank();
  m.world_size = dist.world_size();
  m.node = env_or("DDPRUN_NODE_ADDR", dist.env().master_addr);
  // The agent answers every ask within its quorum timeout (join_timeout; an error when it had
  // none): a quorum may take that long (a partition, groups still starting), and no reply after it
  // and this rank's own timeout means the agent is gone.
  const auto quorum_timeout = std::chrono::seconds(std::stoll(env_or("DDPRUN_FT_QUORUM_TIMEOUT", "600")));
  const auto key = ft_wire::key_of(env_or(ft_wire::kKeyVariable, ""));
  if (!key)
    throw std::invalid_argument(std::string("ft::Manager needs the round's key in ") + ft_wire::kKeyVariable +
                                " (64 hex digits), which ddprun --replica_group gives its workers: run the worker "
                                "under a ddprun as recent as this SDK");
  m.key = *key;
  m.store_timeout = options.timeout() + quorum_timeout;
  m.store = c10::make_intrusive<c10d::TCPStore>(dist.env().master_addr,
                                                tcp_store_client_options(dist.env().master_port, m.store_timeout));
  if (m.state) m.server = std::make_unique<detail::StateServer>(m.node, ft_wire::state_key(m.key, m.rank));
  if (const auto patience = std::chrono::seconds(std::stoll(env_or("DDPRUN_FT_AGENT_TIMEOUT", "0")));
      patience.count() > 0)
    m.watch = std::make_unique<detail::AgentWatch>(dist.env().master_addr,
                                                   static_cast<uint16_t>(dist.env().master_port), patience);
}

Manager::~Manager() = default;

void Manager::start_quorum_async() {
  Impl& m = *impl_;
  if (m.pending) m.resolve();  // the answers come in order: the previous one is read first
  m.throw_fatal();
  m.error.reset();
  ++m.n;
  const json ask{{"step", m.step},
                 {"recovery", m.server ? m.server->address() : std::string()},
                 {"shrink_only", m.options.shrink_only()},
                 {"pg_ok", m.last_ok}};
  m.write_sealed("ddprun_ft/ask/" + std::to_string(m.n) + "/" + std::to_string(m.rank), ask.dump());
  m.pending = true;
}

const Quorum& Manager::start_quorum() {
  start_quorum_async();
  impl_->resolve();
  impl_->heal_if_due();
  return quorum();
}

c10::intrusive_ptr<c10::ivalue::Future> Manager::allreduce_async(at::Tensor t) {
  Impl& m = *impl_;
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  m.resolve();
  if (m.fatal || !m.have_quorum || m.quorum.replica_world_size <= 1) {
    done->markCompleted(c10::IValue(t));
    return done;
  }
  c10::intrusive_ptr<c10d::Work> work;
  try {
    if (!m.across) throw std::runtime_error("no process group across the replica groups");
    // A group that heals this step (or failed to) adds nothing: its gradients come from another
    // state than its peers'. It applies the average of those at max_step.
    if (m.quorum.heal || m.error) t.zero_();
    std::vector<at::Tensor> tensors{t};
    work = m.across->allreduce(tensors);
  } catch (const std::exception& e) {
    if (!m.error) m.error = std::string("all-reduce across the replica groups: ") + e.what();
    done->markCompleted(c10::IValue(t));
    return done;
  }
  const int participants = std::max(m.quorum.participants, 1);
  return work->getFuture()->then(
      [this, t, participants](c10::ivalue::Future& f) {
        if (f.hasError()) {
          if (!impl_->error) impl_->error = "all-reduce across the replica groups: " + f.tryRetrieveErrorMessage();
        } else {
          t.div_(participants);
        }
        return c10::IValue(t);
      },
      c10::TensorType::get());
}

void Manager::allreduce_(at::Tensor& t) { allreduce_async(t)->wait(); }

void Manager::report_error(const std::string& what) {
  if (!impl_->error) impl_->error = what;
}

bool Manager::should_commit() {
  Impl& m = *impl_;
  m.resolve();
  m.throw_fatal();
  m.heal_if_due();
  const bool ok = !m.error.has_value();
  const std::string prefix = "ddprun_ft/commit/" + std::to_string(m.n) + "/";
  m.write_sealed(prefix + std::to_string(m.rank), ok ? "1" : "0");
  bool commit = ok;
  if (m.world_size > 1) {  // (a group of one rank has its vote; the agent reads it at the end)
    std::vector<std::string> keys;
    for (int r = 0; r < m.world_size; ++r) keys.push_back(prefix + std::to_string(r));
    m.store->wait(keys);
    for (const auto& k : keys) commit = commit && m.read_sealed(k) == "1";
  }
  m.last_ok = commit;
  if (!ok) {
    m.say("step " + std::to_string(m.step + 1) + " not committed: " + *m.error);
  } else if (!commit) {
    m.say("step " + std::to_string(m.step + 1) + " not committed: another rank of the group failed its step");
  }
  if (commit) ++m.step;
  return commit;
}

int64_t Manager::step() const { return impl_->step; }
int Manager::group() const { return impl_->group; }
int Manager::rank() const { return impl_->rank; }
int Manager::world_size() const { return impl_->world_size; }
bool Manager::has_quorum() const { return impl_->have_quorum || impl_->pending; }
int Manager::healed() const { return impl_->healed; }
const Quorum& Manager::quorum() const {
  impl_->resolve();
  impl_->throw_fatal();
  return impl_->quorum;
}

detail::Hook detail::allreduce_hook(const c10::DDPLoggingData& ddp_data, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                    std::shared_ptr<Manager> manager) {
  const auto it = ddp_data.ints_map.find("find_unused_parameters");
  if (it == ddp_data.ints_map.end() || it->second == 0)
    throw std::invalid_argument(
        "ft::register_hook: the DDP must keep its first bucket layout (DdpOptions().find_unused_parameters(true)), "
        "so that every replica group's buckets hold the same parameters in the same order");
  // The collective across the groups starts here, on the thread that runs DDP's hooks in bucket
  // order, so that every group starts its buckets' in the same order (they match by order); the
  // group's own sum is waited for first.
  return [group = std::move(group), manager = std::move(manager)](c10d::GradBucket& bucket) {
    at::Tensor buffer = bucket.getBufferRef();
    const int size = group->getSize();
    if (size > 1) {
      std::vector<at::Tensor> tensors{buffer};
      group->allreduce(tensors)->wait();
      buffer.div_(size);
    }
    return manager->allreduce_async(buffer);
  };
}

Sampler::Sampler(int64_t length, int64_t batch_size, uint64_t seed)
    : length_(length), batch_size_(batch_size), seed_(seed) {
  if (length <= 0 || batch_size <= 0)
    throw std::invalid_argument("ft::Sampler needs a dataset and a batch size above 0 (got " + std::to_string(length) +
                                " and " + std::to_string(batch_size) + ")");
}

int64_t Sampler::step_samples(const Manager& manager) const {
  return std::max(manager.quorum().participants, 1) * static_cast<int64_t>(manager.world_size()) * batch_size_;
}

SamplerPosition Sampler::position(const Manager& manager) const {
  const int64_t total = step_samples(manager);
  if (total > length_)
    throw std::invalid_argument("ft::Sampler: a step takes " + std::to_string(total) + " samples (" +
                                std::to_string(std::max(manager.quorum().participants, 1)) + " groups x " +
                                std::to_string(manager.world_size()) + " ranks x " + std::to_string(batch_size_) +
                                "), more than the dataset's " + std::to_string(length_));
  if (cursor_ + total > length_) return {epoch_ + 1, 0};
  return {epoch_, cursor_};
}

std::vector<int64_t> Sampler::indices(const Manager& manager) {
  if (!manager.has_quorum()) throw std::logic_error("ft::Sampler::indices: call manager.start_quorum() first");
  const Quorum& q = manager.quorum();
  if (q.participant_rank < 0) return {};
  const SamplerPosition at = position(manager);
  if (order_epoch_ != at.epoch) {
    // Python's torch.randperm(length, generator=torch.Generator().manual_seed(seed + epoch)).
    at::Generator gen = at::detail::createCPUGenerator(seed_ + static_cast<uint64_t>(at.epoch));
    order_ = at::randperm(length_, gen, at::TensorOptions().dtype(at::kLong));
    order_epoch_ = at.epoch;
  }
  const int64_t first =
      at.cursor + (q.participant_rank * static_cast<int64_t>(manager.world_size()) + manager.rank()) * batch_size_;
  const int64_t count = std::min(batch_size_, length_ - first);
  if (count <= 0) return {};
  const int64_t* data = order_.data_ptr<int64_t>();
  return {data + first, data + first + count};
}

void Sampler::commit(const Manager& manager) {
  const SamplerPosition at = position(manager);
  epoch_ = at.epoch;
  cursor_ = at.cursor + step_samples(manager);
}

c10::IValue Sampler::state_dict() const {
  c10::impl::GenericDict d(c10::StringType::get(), c10::IntType::get());
  d.insert("epoch", epoch_);
  d.insert("cursor", cursor_);
  return d;
}

void Sampler::load_state_dict(const c10::IValue& state) {
  const auto d = state.toGenericDict();
  const int64_t epoch = d.at("epoch").toInt(), cursor = d.at("cursor").toInt();
  if (epoch < 0 || cursor < 0 || cursor > length_)
    throw std::invalid_argument("ft::Sampler::load_state_dict: epoch " + std::to_string(epoch) + ", cursor " +
                                std::to_string(cursor) + " is no position in a dataset of " + std::to_string(length_));
  epoch_ = epoch;
  cursor_ = cursor;
}

std::string parameters_digest(const torch::nn::Module& model) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    throw std::runtime_error("parameters_digest: OpenSSL has no SHA-256 here");
  }
  for (const auto& p : model.parameters()) {
    const at::Tensor t = p.detach().to(at::kCPU).contiguous();
    EVP_DigestUpdate(ctx, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  return to_hex(std::string_view(reinterpret_cast<const char*>(digest), std::min(len, 8u)));
}

Manager::StateFn model_state(torch::nn::Module& model, torch::optim::Optimizer& optimizer, Sampler* sampler) {
  return [&model, &optimizer, sampler] {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert("model", state_dict(model));
    d.insert("optimizer", state_dict(optimizer));
    if (sampler) d.insert("sampler", sampler->state_dict());
    return c10::IValue(d);
  };
}

Manager::LoadFn load_model_state(torch::nn::Module& model, torch::optim::Optimizer& optimizer, Sampler* sampler) {
  return [&model, &optimizer, sampler](const c10::IValue& v) {
    const auto d = v.toGenericDict();
    load_state_dict(model, d.at("model"));
    load_state_dict(optimizer, d.at("optimizer"));
    if (sampler) {
      if (!d.contains("sampler"))
        throw std::runtime_error(
            "the peer's state has no \"sampler\": its workers must put their sampler's "
            "state_dict() there, as this group's do");
      sampler->load_state_dict(d.at("sampler"));
    }
  };
}

}  // namespace ddprun::worker::ft
