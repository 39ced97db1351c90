#pragma once
// parse_options driven with a fake environment and host, for the option tests.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "launcher/cli/options.hpp"

namespace ddprun::launcher::test_options {

using cli::HostFacts;
using cli::LaunchOptions;

inline LaunchOptions parse(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                           HostFacts host = {8, 0}) {
  return cli::parse_options(
      args,
      [env](const std::string& k) -> std::optional<std::string> {
        auto it = env.find(k);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      host);
}

inline std::string error_of(std::vector<std::string> args, std::map<std::string, std::string> env = {},
                            HostFacts host = {8, 0}) {
  try {
    parse(std::move(args), std::move(env), host);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace ddprun::launcher::test_options
