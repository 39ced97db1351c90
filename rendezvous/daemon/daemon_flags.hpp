#pragma once
// ddprun-rendezvous's command line: one table of the server's flags (name, value, help, the
// default as the server really starts with it, and what the value does), from which both the
// parsing and --help come, and the flags of the status and token subcommands. The split into
// flags and values is common/command_line's, as ddprun's own.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/server/server.hpp"

namespace ddprun::rdzv::daemon {

// What the server's flags say.
struct ServeConfig {
  server::ServerOptions options;
  std::string port_file;
  std::optional<std::string> token_file;
  std::optional<uint16_t> metrics_port;
  std::vector<std::string> metrics_allowed_hosts;  // besides this host's own names (server/host_check.hpp)
  bool insecure = false;
  bool help = false;
  bool help_markdown = false;  // --help=markdown
  bool version = false;
};

// The daemon's defaults: a daemon serves many jobs, each with a share, so that one cannot fill the
// store for the others; agents ride out a partition or a restart (describe_self).
ServeConfig serve_defaults();

// The server's command line (args: argv[1..]). Throws ConfigError naming the flag and what it
// expects.
ServeConfig parse_serve_flags(const std::vector<std::string>& args);

// `ddprun-rendezvous status` and `token` (args: after the subcommand's name).
struct StatusFlags {
  std::string endpoint;
  std::optional<std::string> token_file;  // DDPRUN_TOKEN_FILE when not given
};
StatusFlags parse_status_flags(const std::vector<std::string>& args);
struct TokenFlags {
  std::optional<std::string> token_file;  // DDPRUN_TOKEN_FILE when not given
  std::string run_id;
  std::string output;
};
TokenFlags parse_token_flags(const std::vector<std::string>& args);

// --help: the usage, every server flag with its real default, and the subcommands.
std::string usage_text();
// --help=markdown: the server's flags as the Markdown table of docs/operations.md.
std::string flag_table_markdown();

}  // namespace ddprun::rdzv::daemon
