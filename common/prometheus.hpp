#pragma once
// Prometheus' text exposition format (version 0.0.4), as the daemon's and the agent's /metrics
// write it: a family's HELP and TYPE lines, then its samples, labels quoted and escaped.

#include <sstream>
#include <string>
#include <string_view>

namespace ddprun::prometheus {

inline constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

// key="value", with the value's backslashes, quotes and newlines escaped as the format asks.
inline std::string label(std::string_view key, std::string_view value) {
  std::string out(key);
  out += "=\"";
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

class Exposition {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
  }
  template <typename V>
  void sample(const char* name, V value, const std::string& labels = "") {
    out_ << name;
    if (!labels.empty()) out_ << '{' << labels << '}';
    out_ << ' ' << value << '\n';
  }
  template <typename V>
  void single(const char* name, const char* type, const char* help, V value) {
    family(name, type, help);
    sample(name, value);
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace ddprun::prometheus
