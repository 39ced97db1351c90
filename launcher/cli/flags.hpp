#pragma once
// The table of ddprun's flags: one row per flag with its names, its value, its default (taken from
// LaunchOptions' own initializers where it is a value), its help, the environment variables that
// stand for it, and what its value does to the options. Parsing, --help (and the man page and
// shell completion generated from it) and the flag table of docs/guide.md (--help=markdown) all
// come from the rows; nothing else names a flag's conversion or default.

#include <span>
#include <string>

#include "common/option_rows.hpp"

namespace ddprun::launcher::cli {

struct LaunchOptions;
struct HostFacts;

// A flag's value as given, for its row's conversion: the flag as the user spelled it (or the
// environment variable it came from), the value ("1" for a switch given alone), and this host.
struct FlagInput : options::OptionInput {
  const HostFacts& host;
};

// A flag: its row (common/option_rows.hpp). Rows are applied in table order, so a row may read
// what earlier rows set (--node_rank's range is --nnodes's). `env` is read when the flag is not
// given, after PET_<NAME>: another variable torchrun or ddprun reads for it (DDPRUN_REPORT_FILE).
using FlagDef = options::OptionRow<LaunchOptions, FlagInput>;
// The key of a flag's value: its name without "--" (PET_<DEST in upper case> stands for it).
inline std::string flag_dest(const FlagDef& f) { return std::string(f.name + 2); }

// A --rdzv_conf key (`flag` in its input is "--rdzv_conf KEY"): every key torchrun 2.x accepts, and
// ddprun's own. --help and the docs' table of keys (--help=markdown) come from the rows, as the flags' do.
using RdzvConfKey = options::OptionRow<LaunchOptions>;

// Every --rdzv_conf key, in --help order.
std::span<const RdzvConfKey> rdzv_conf_keys();
// The key `spelled` names (canonical or alias), or nullptr.
const RdzvConfKey* find_rdzv_conf_key(const std::string& spelled);
// The known key (name or alias) one or two edits from `spelled` (a typo), or "" when none is.
std::string nearest_rdzv_conf_key(const std::string& spelled);

// Every flag ddprun accepts, in --help order (and the order their values are applied in).
std::span<const FlagDef> flag_table();
// The flag `spelled` names (dashes and underscores are interchangeable after the leading "--"),
// or nullptr.
const FlagDef* find_flag(const std::string& spelled);
// argparse's abbreviations: the name of the one flag (or --help, --version) that `spelled` is a
// prefix of ("--nproc" -> "--nproc_per_node"), "" when none is. Throws ConfigError naming the
// candidates when several are.
std::string abbreviated_flag(const std::string& spelled);

// `ddprun --help=markdown`: the flags and the --rdzv_conf keys as the Markdown tables of docs/guide.md.
std::string flag_table_markdown();

}  // namespace ddprun::launcher::cli
