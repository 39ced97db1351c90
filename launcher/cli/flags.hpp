#pragma once
// The table of ddprun's flags (names, aliases, defaults, help), shared by option parsing and the
// --help text (and the man page and shell completion generated from --help).

#include <span>
#include <string>

namespace ddprun::launcher::cli {

struct LaunchOptions;

struct FlagDef {
  const char* name;   // canonical spelling, with underscores
  const char* alias;  // short form or other name, or nullptr
  const char* dest;   // key in the parsed map; PET_<DEST> is the env fallback
  bool takes_value;
  const char* default_text;
  const char* help;
  // A flag without a value that also takes one inline (--local_rank_arg or --local_rank_arg=dash).
  bool optional_value = false;
};

// A --rdzv_conf key: every key torchrun 2.x accepts, and ddprun's own.
struct RdzvConfKey {
  const char* name;     // canonical spelling
  const char* aliases;  // other spellings (torchrun's), comma-separated, or ""
  bool etcd_only;       // meaningful with --rdzv_backend etcd alone
  const char* meaning;  // for --help and the docs
  // What the value does to the options; `where` ("--rdzv_conf KEY") names it in errors.
  void (*apply)(const std::string& where, const std::string& value, LaunchOptions& o);
};

// Every --rdzv_conf key, in --help order.
std::span<const RdzvConfKey> rdzv_conf_keys();
// The key `spelled` names (canonical or alias), or nullptr.
const RdzvConfKey* find_rdzv_conf_key(const std::string& spelled);
// The known key (name or alias) one or two edits from `spelled` (a typo), or "" when none is.
std::string nearest_rdzv_conf_key(const std::string& spelled);

// Every flag ddprun accepts, in --help order.
std::span<const FlagDef> flag_table();
// The flag `spelled` names (dashes and underscores are interchangeable after the leading "--"),
// or nullptr.
const FlagDef* find_flag(const std::string& spelled);

}  // namespace ddprun::launcher::cli
