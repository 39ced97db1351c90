// The list-valued flags of the restart policy and the health checks (see options_parse.hpp).
#include <cctype>
#include <cstdint>

#include "launcher/cli/options_parse.hpp"

namespace ddprun::launcher::cli::options_detail {

void set_no_restart_exit_codes(const FlagInput& in, LaunchOptions& o) {
  o.no_restart_exit_codes.clear();
  if (trim(in.text) == "none") return;
  const auto codes = split(in.text, ',');
  const char* expected = "exit codes from 1 to 255, comma-separated, or none";
  if (codes.empty()) bad_value(in.flag, expected, in.text);
  for (const std::string& code : codes) {
    const auto c = to_int(code);
    if (!c || *c < 1 || *c > 255) bad_value(in.flag, expected, in.text);
    o.no_restart_exit_codes.push_back(static_cast<int>(*c));
  }
}

std::string show_no_restart_exit_codes(const LaunchOptions& d) {
  std::string codes;
  for (const int c : d.no_restart_exit_codes) codes += (codes.empty() ? "" : ",") + std::to_string(c);
  return codes.empty() ? std::string("none") : codes;
}

void set_free_space_checks(const FlagInput& in, LaunchOptions& o) {
  o.check_free_space.clear();
  if (trim(in.text) == "none") return;
  const char* expected = "PATH:SIZE pairs, comma-separated, e.g. /ckpt:10G, or none";
  for (const std::string& item : split(in.text, ',')) {
    const auto colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0) bad_value(in.flag, expected, in.text);
    std::string size = trim(item.substr(colon + 1));
    uint64_t unit = 1;
    if (!size.empty()) {
      const std::string units = "KMGT";  // powers of 1024
      if (const auto u = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(size.back()))));
          u != std::string::npos) {
        unit = uint64_t{1} << (10 * (u + 1));
        size.pop_back();
      }
    }
    const auto n = to_double(size);
    if (!n || *n < 0 || *n * static_cast<double>(unit) > 1e18) bad_value(in.flag, expected, in.text);
    o.check_free_space.push_back({trim(item.substr(0, colon)), static_cast<uint64_t>(*n * static_cast<double>(unit))});
  }
  if (o.check_free_space.empty()) bad_value(in.flag, expected, in.text);
}

void set_interface_checks(const FlagInput& in, LaunchOptions& o) {
  o.check_interfaces.clear();
  if (trim(in.text) == "none") return;
  const char* expected = "network interface names, comma-separated, e.g. eth0,ib0";
  for (const std::string& name : split(in.text, ',')) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      bad_value(in.flag, expected, in.text);
    o.check_interfaces.push_back(name);
  }
  if (o.check_interfaces.empty()) bad_value(in.flag, expected, in.text);
}

}  // namespace ddprun::launcher::cli::options_detail
