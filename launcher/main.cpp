// ddprun: starts and supervises the workers of a distributed training job (torchrun-compatible).
#include <unistd.h>

#include <csignal>
#include <iostream>

#include "common/command_line.hpp"
#include "common/errors.hpp"
#include "common/log.hpp"
#include "launcher/agent/run_agent.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options.hpp"

#ifndef DDPRUN_VERSION
#define DDPRUN_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  using namespace ddprun;
  std::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  launcher::cli::LaunchOptions options;
  try {
    const auto env = launcher::cli::process_env();
    options = launcher::cli::parse_options(args, env, launcher::cli::detect_host(env));
  } catch (const ConfigError& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 2;
  }
  for (const std::string& key : options.ignored_rdzv_conf) {
    log::warn("ddprun") << "ignoring --rdzv_conf key '" << key
                        << "': ddprun does not know it (torchrun ignores such keys too; see --help for the known ones)";
  }
  if (options.help) {
    std::cout << (options.help_markdown ? launcher::cli::flag_table_markdown()
                                        : launcher::cli::usage_text(
                                              command_line::help_width(STDOUT_FILENO, launcher::cli::process_env())));
    return 0;
  }
  if (options.version) {
    std::cout << "ddprun " << DDPRUN_VERSION << "\n";
    return 0;
  }
  try {
    return launcher::agent::run_agent(options);
  } catch (const ConfigError& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    log::error("ddprun") << e.what();
    return 1;
  }
}
