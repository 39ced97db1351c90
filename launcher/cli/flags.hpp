#pragma once
// The table of ddprun's flags: one row per flag with its names, its value, its default (taken from
// LaunchOptions' own initializers where it is a value), its help, the environment variables that
// stand for it, and what its value does to the options. Parsing, --help (and the man page and
// shell completion generated from it) and the flag table of docs/guide.md (--help=markdown) all
// come from the rows; nothing else names a flag's conversion or default.

#include <span>
#include <string>

namespace ddprun::launcher::cli {

struct LaunchOptions;
struct HostFacts;

// A flag's value as given, for its row's `apply`.
struct FlagInput {
  const std::string& flag;  // as the user spelled it, or the environment variable it came from
  const std::string& text;  // the value; "1" for a switch given alone
  const HostFacts& host;
};

struct FlagDef {
  const char* name;   // canonical spelling, with underscores
  const char* alias;  // short form or other name, or nullptr
  // The value's placeholder in --help ("N", "SECONDS"); nullptr for a switch. With
  // `optional_value`, the placeholder of the value a switch may take inline.
  const char* value;
  // What the flag does, in `backticks` for names and values (--help prints them plain).
  const char* help;
  // The default as shown, from default-constructed options; nullptr where `note` says it instead.
  std::string (*shown)(const LaunchOptions& defaults);
  const char* note;  // the default in words (it depends on the run), "" for none
  // What the value does to the options. Rows are applied in table order, so a row may read what
  // earlier rows set (--node_rank's range is --nnodes's). Throws ConfigError naming `in.flag`.
  void (*apply)(const FlagInput& in, LaunchOptions& o);
  // Read when the flag is not given, after PET_<NAME>: another variable torchrun or ddprun reads
  // for it (DDPRUN_REPORT_FILE), or nullptr.
  const char* env = nullptr;
  // A switch that also takes a value inline (--local_rank_arg or --local_rank_arg=dash).
  bool optional_value = false;
  // In the docs' table: where the flag is explained at length (a Markdown link), or nullptr.
  const char* see = nullptr;

  bool takes_value() const { return value != nullptr && !optional_value; }
  // The key of the flag's value: its name without "--" (PET_<DEST in upper case> stands for it).
  std::string dest() const { return std::string(name + 2); }
  // The default as --help and the docs state it.
  std::string default_text() const;
};

// A --rdzv_conf key: every key torchrun 2.x accepts, and ddprun's own. --help and the docs' table
// of keys (--help=markdown) come from the rows, as the flags' do.
struct RdzvConfKey {
  const char* name;     // canonical spelling
  const char* aliases;  // other spellings (torchrun's), comma-separated, or ""
  bool etcd_only;       // meaningful with --rdzv_backend etcd alone
  const char* help;     // what the key does, in `backticks` for names and values
  // The default as shown, from default-constructed options; nullptr where `note` says it instead.
  std::string (*shown)(const LaunchOptions& defaults);
  const char* note;  // the default in words, "" for none
  // What the value does to the options; `where` ("--rdzv_conf KEY") names it in errors.
  void (*apply)(const std::string& where, const std::string& value, LaunchOptions& o);
  // In the docs' table: where the key is explained at length (a Markdown link), or nullptr.
  const char* see = nullptr;

  // The default as --help and the docs state it.
  std::string default_text() const;
};

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

// `ddprun --help=markdown`: the flags and the --rdzv_conf keys as the Markdown tables of docs/guide.md.
std::string flag_table_markdown();

}  // namespace ddprun::launcher::cli
