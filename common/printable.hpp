#pragma once
// The start of a text that came from outside (a peer's reply, a file a program wrote), fit to be
// shown in one line of a message: control characters become spaces, and it is cut at `max`.

#include <string>
#include <string_view>

namespace ddprun {

// Quoted ('...'), "..." after a cut; "(nothing)" for an empty text.
inline std::string printable_start(std::string_view text, size_t max = 160) {
  std::string out;
  for (const char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  if (text.size() > max) out += "...";
  return out.empty() ? "(nothing)" : "'" + out + "'";
}

}  // namespace ddprun
