#pragma once
// Inside parse_options (options.cpp, options_rendezvous.cpp, host_facts.cpp) and the flag table
// (flags.cpp): what the command line and the environment gave, the checks every flag's value goes
// through, and the conversions of the flags whose rows do more than a line. Not for use elsewhere.

#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/numbers.hpp"
#include "launcher/cli/flags.hpp"
#include "launcher/cli/options.hpp"

namespace ddprun::launcher::cli::options_detail {

using options::trim;

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(trim(item));
  return out;
}

// The one wording of a bad value and the typed parsers of every option table (common/option_rows.hpp).
using options::bad_value;
using options::number_text;
using options::parse_seconds;
using options::parse_whole;
using options::seconds_text;

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

inline std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

// torchrun's RendezvousParameters.get_as_bool: 1/true/yes/on or 0/false/no/off, any case.
inline bool parse_bool(const std::string& flag, const std::string& text) {
  const std::string v = lower(trim(text));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad_value(flag, "a boolean (1, true, yes, on or 0, false, no, off)", text);
}

// What the command line and the environment gave, before anything is checked: flag dest -> value,
// and how the user spelled it (for error messages).
struct Given {
  std::map<std::string, std::string> values;
  std::map<std::string, std::string> spelled;
  std::string program;
  std::vector<std::string> program_args;
  bool help = false;
  bool help_markdown = false;
  bool version = false;

  bool has(const std::string& dest) const { return values.count(dest) != 0; }
  const std::string& operator[](const std::string& dest) const { return values.at(dest); }
  std::string flag(const std::string& dest) const {
    auto it = spelled.find(dest);
    return it != spelled.end() ? it->second : std::string("--") + dest;
  }
  void set(const std::string& dest, const std::string& value, const std::string& from) {
    values[dest] = value;
    spelled[dest] = from;
  }
};

// The values of --redirects/--tee, the duplicate filters, --preload and --signals_to_handle, as
// given and as shown (options.cpp).
StreamSelection parse_streams(const std::string& flag, const std::string& text);
std::string streams_text(const StreamSelection& s);
std::vector<std::string> parse_filters(const std::string& flag, const std::string& text);
std::vector<std::string> parse_preload(const std::string& where, const std::string& text);
std::string signals_text(const std::vector<int>& signals);

// The rows that need more than a line (options.cpp: the layout; options_rendezvous.cpp: how the
// nodes find each other).
void apply_nproc_per_node(const FlagInput& in, LaunchOptions& o);
void apply_nnodes(const FlagInput& in, LaunchOptions& o);
void apply_signals(const FlagInput& in, LaunchOptions& o);
void apply_rdzv_backend(const FlagInput& in, LaunchOptions& o);
void apply_rdzv_endpoint(const FlagInput& in, LaunchOptions& o);
void apply_rdzv_conf(const FlagInput& in, LaunchOptions& o);

// The list-valued flags of the restart policy and the health checks (flag_values.cpp): each takes
// `none` for an empty list.
void set_no_restart_exit_codes(const FlagInput& in, LaunchOptions& o);
std::string show_no_restart_exit_codes(const LaunchOptions& d);
void set_free_space_checks(const FlagInput& in, LaunchOptions& o);  // --check_free_space PATH:SIZE,...
void set_interface_checks(const FlagInput& in, LaunchOptions& o);   // --check_interface NAME,...
inline std::string show_none(const LaunchOptions&) { return "none"; }

}  // namespace ddprun::launcher::cli::options_detail
