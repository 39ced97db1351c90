#pragma once
// Fields of a JSON value written by another process, read without a library exception: a field
// that is absent or of the wrong type reads as the fallback. Every record decoder uses these.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ddprun {

inline int64_t int_field(const nlohmann::json& j, const char* name, int64_t fallback) {
  auto it = j.find(name);  // find on a non-object finds nothing
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

inline std::string string_field(const nlohmann::json& j, const char* name, const std::string& fallback = {}) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

inline bool bool_field(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// An array's strings; an element that is not a string reads as its JSON text.
inline std::vector<std::string> strings_field(const nlohmann::json& j, const char* name) {
  std::vector<std::string> out;
  auto it = j.find(name);
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) out.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  return out;
}

}  // namespace ddprun
