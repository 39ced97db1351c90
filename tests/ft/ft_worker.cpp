// The C++ twin of tests/python/ft_worker.py: a worker of a fault-tolerant replica group with the
// worker SDK's ft::Manager, the same model, batches, log lines and parameter hash, so that one job
// may mix C++ and Python groups and their commits be compared bit for bit.
//   ft_worker STEPS OUT_DIR [SECONDS_PER_STEP [HOLD_STEP]]
// DDPRUN_FT_TEST_ASYNC=1: start_quorum_async(), as ft_worker.py.
// DDPRUN_FT_TEST_PAUSE_ASKED=N: the first worker asks for its quorum after N commits, writes
// OUT_DIR/asked and waits for OUT_DIR/go before reading the answer, as ft_worker.py.
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "ddprun/worker/ddp.hpp"
#include "ddprun/worker/distributed.hpp"
#include "ddprun/worker/fault_tolerance.hpp"

namespace fs = std::filesystem;
using namespace ddprun::worker;
using nlohmann::json;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: ft_worker STEPS OUT_DIR [SECONDS_PER_STEP [HOLD_STEP]]\n";
    return 2;
  }
  const int64_t steps = std::stoll(argv[1]);
  const fs::path out_dir = argv[2];
  const double pause = argc > 3 ? std::stod(argv[3]) : 0.05;
  const int64_t hold = argc > 4 ? std::stoll(argv[4]) : 0;
  const char* async_env = std::getenv("DDPRUN_FT_TEST_ASYNC");
  const bool asynchronous = async_env != nullptr && std::string(async_env) == "1";
  const char* pause_env = std::getenv("DDPRUN_FT_TEST_PAUSE_ASKED");
  torch::set_num_threads(1);
  Distributed dist = Distributed::init(InitOptions().backend("gloo"));
  const int rank = dist.rank();
  const int group = std::stoi(std::getenv("DDPRUN_REPLICA_GROUP"));
  const fs::path log_path = out_dir / ("g" + std::to_string(group) + "r" + std::to_string(rank) + ".log");
  // A line torn by the SIGKILL of the previous process (the kernel stops a write at a page boundary)
  // is ended first, so that this process's lines stay whole (ft_worker.py does the same).
  bool torn = false;
  if (std::ifstream in(log_path, std::ios::binary | std::ios::ate); in && in.tellg() > 0) {
    in.seekg(-1, std::ios::end);
    torn = in.get() != '\n';
  }
  std::ofstream log(log_path, std::ios::app);
  if (torn) log << '\n';
  const auto say = [&log](const json& event) { log << event.dump() << std::endl; };
  say(json{{"event", "start"}, {"pid", ::getpid()}, {"restart", dist.env().restart_count}, {"lang", "c++"}});

  torch::manual_seed(0);
  // One statement per layer: a function's arguments are evaluated in no set order, and each layer
  // draws its initial parameters from the generator in turn, as Python's do.
  // 1.1 MB of parameters in buckets of 256 KB, as ft_worker.py: several buckets.
  torch::nn::Linear fc1(64, 4096);
  torch::nn::Linear fc2(4096, 4);
  torch::nn::Sequential model(fc1, torch::nn::ReLU(), fc2);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto manager = std::make_shared<ft::Manager>(dist, ft::model_state(*model, opt), ft::load_model_state(*model, opt),
                                               ft::ManagerOptions().timeout(std::chrono::seconds(20)));
  DistributedDataParallel ddp(model, dist, DdpOptions().find_unused_parameters(true).bucket_cap_bytes(256 << 10));
  ft::register_hook(ddp, manager);
  const int64_t pause_asked = pause_env != nullptr && dist.env().restart_count == 0 ? std::stoll(pause_env) : 0;
  int64_t asks = 0;  // quorums this rank asked for (every step asks one)
  while (manager->step() < steps) {
    while (hold > 0 && manager->step() == hold && !fs::exists(out_dir / "release"))
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // sleep override: waiting for the test's file
    int place = group;
    ++asks;
    if (pause_asked > 0 && manager->step() == pause_asked) {
      manager->start_quorum_async();
      { std::ofstream(out_dir / "asked.tmp") << json{{"port", dist.env().master_port}, {"n", asks}}.dump(); }
      fs::rename(out_dir / "asked.tmp", out_dir / "asked");
      while (!fs::exists(out_dir / "go"))
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // sleep override: waiting for the test's file
      place = manager->quorum().replica_rank;
    } else if (asynchronous) {
      manager->start_quorum_async();
    } else {
      place = manager->start_quorum().replica_rank;
    }
    // The batch follows the committed step (and this rank's place), as in ft_worker.py.
    auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(manager->step() * 1000 + place * 10 + rank));
    const at::Tensor x = torch::randn({8, 64}, gen);
    const at::Tensor y = torch::randn({8, 4}, gen);
    const at::Tensor loss = (ddp.forward(x) - y).pow(2).mean();
    loss.backward();
    if (manager->should_commit()) {
      opt.step();
      const ft::Quorum& q = manager->quorum();
      say(json{{"event", "commit"},
               {"step", manager->step()},
               {"seq", q.seq},
               {"quorum_id", q.quorum_id},
               {"groups", q.groups},
               {"healed", q.heal},
               {"hash", ft::parameters_digest(*model)},
               {"pid", ::getpid()}});
    }
    opt.zero_grad();
    std::this_thread::sleep_for(std::chrono::duration<double>(pause));  // sleep override: the step's length
  }
  return 0;
}
