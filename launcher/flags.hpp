#pragma once
// The table of ddprun's flags (names, aliases, defaults, help), shared by option parsing and the
// --help text (and the man page and shell completion generated from --help).

#include <span>
#include <string>

namespace ddprun::launcher {

struct FlagDef {
  const char* name;   // canonical spelling, with underscores
  const char* alias;  // short form or other name, or nullptr
  const char* dest;   // key in the parsed map; PET_<DEST> is the env fallback
  bool takes_value;
  const char* default_text;
  const char* help;
};

// Every flag ddprun accepts, in --help order.
std::span<const FlagDef> flag_table();
// The flag `spelled` names (dashes and underscores are interchangeable after the leading "--"),
// or nullptr.
const FlagDef* find_flag(const std::string& spelled);

}  // namespace ddprun::launcher
