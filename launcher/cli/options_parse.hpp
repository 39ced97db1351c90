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

inline std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(trim(item));
  return out;
}

[[noreturn]] inline void bad(const std::string& flag, const std::string& expected, const std::string& got) {
  throw ConfigError(flag + ": expected " + expected + ", got '" + got + "'");
}

inline long long parse_int(const std::string& flag, const std::string& text, long long lo, long long hi,
                           const std::string& expected) {
  const auto v = to_int(text);
  if (v && *v >= lo && *v <= hi) return *v;
  bad(flag, expected, text);
}

inline std::chrono::milliseconds parse_seconds(const std::string& flag, const std::string& text, bool allow_zero) {
  const auto v = to_double(text);
  if (v && (*v > 0 || (allow_zero && *v == 0)) && *v < 1e7) {
    return std::chrono::milliseconds(static_cast<long long>(*v * 1000));
  }
  bad(flag, allow_zero ? "a number of seconds >= 0" : "a number of seconds > 0", text);
}

inline std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

inline std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return s;
}

// 1.5 -> "1.5", 30.0 -> "30": a number as the user would write it.
inline std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline std::string seconds_text(std::chrono::milliseconds ms) {
  return number_text(static_cast<double>(ms.count()) / 1000);
}

// torchrun's RendezvousParameters.get_as_bool: 1/true/yes/on or 0/false/no/off, any case.
inline bool parse_bool(const std::string& flag, const std::string& text) {
  const std::string v = lower(trim(text));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  bad(flag, "a boolean (1, true, yes, on or 0, false, no, off)", text);
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

}  // namespace ddprun::launcher::cli::options_detail
