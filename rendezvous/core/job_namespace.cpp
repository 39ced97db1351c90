#include "rendezvous/core/job_namespace.hpp"

namespace ddprun::rdzv::core {
namespace {

constexpr std::string_view kRefusalNote = "store_refusal";

bool run_id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == ':';
}

}  // namespace

bool valid_run_id(std::string_view run_id, std::string* why) {
  if (run_id.empty()) {
    if (why) *why = "it is empty";
    return false;
  }
  if (run_id.size() > 200) {
    if (why) *why = "it is longer than 200 characters";
    return false;
  }
  for (char c : run_id) {
    if (!run_id_char(c)) {
      if (why) *why = std::string("it contains '") + c + "'; use letters, digits and . _ - :";
      return false;
    }
  }
  return true;
}

std::string job_prefix(std::string_view run_id, std::string_view root) {
  std::string p(root);
  p.append(run_id).push_back('/');
  return p;
}

std::string refusal_note(std::string_view run_id) { return job_prefix(run_id) + std::string(kRefusalNote); }

bool is_refusal_note(std::string_view key) {
  const std::string_view run_id = job_of_key(key);
  return !run_id.empty() && key.substr(kRoot.size() + run_id.size() + 1) == kRefusalNote;
}

std::string_view job_of_key(std::string_view key) {
  if (!key.starts_with(kRoot)) return {};
  const std::string_view rest = key.substr(kRoot.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0) return {};
  return rest.substr(0, slash);
}

}  // namespace ddprun::rdzv::core
