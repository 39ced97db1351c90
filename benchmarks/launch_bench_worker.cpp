// Worker for the launch benchmark. "exit": return at once. "barrier": connect to the store at
// MASTER_ADDR:MASTER_PORT (1.13 protocol, which both torchrun 1.13's store and ddprun's speak) and
// pass an add+wait barrier across WORLD_SIZE workers.
#include <cstdlib>
#include <iostream>
#include <string>

#include "rendezvous/client/client.hpp"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "exit";
  if (mode == "exit") return 0;
  if (mode != "barrier") {
    std::cerr << "usage: launch_bench_worker exit|barrier\n";
    return 2;
  }
  ddprun::rdzv::client::ClientOptions o;
  o.host = std::getenv("MASTER_ADDR");
  o.port = static_cast<uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
  o.dialect = ddprun::rdzv::core::Dialect::Legacy;
  o.timeout = std::chrono::seconds(120);
  ddprun::rdzv::client::Client c(o);
  const std::string prefix = "/bench/attempt_" + std::string(std::getenv("TORCHELASTIC_RESTART_COUNT"));
  if (c.add(prefix + "/arrived", 1) == std::atoi(std::getenv("WORLD_SIZE"))) c.set(prefix + "/go", "1");
  c.wait({prefix + "/go"});
  return 0;
}
