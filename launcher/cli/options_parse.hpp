#pragma once
// Inside parse_options (options.cpp, options_rendezvous.cpp, host_facts.cpp): what the command line and the
// environment gave, and the checks every flag's value goes through. Not for use elsewhere.

#include <chrono>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/numbers.hpp"
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
  bool version = false;

  bool has(const char* dest) const { return values.count(dest) != 0; }
  const std::string& operator[](const char* dest) const { return values.at(dest); }
  std::string flag(const char* dest) const {
    auto it = spelled.find(dest);
    return it != spelled.end() ? it->second : std::string("--") + dest;
  }
  void set(const std::string& dest, const std::string& value, const std::string& from) {
    values[dest] = value;
    spelled[dest] = from;
  }
};

// 3b. How the nodes find each other (options_rendezvous.cpp).
void resolve_rendezvous(const Given& g, const EnvLookup& env, LaunchOptions& o);

}  // namespace ddprun::launcher::cli::options_detail
