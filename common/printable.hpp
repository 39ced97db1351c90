#pragma once
// Text that came from outside (a peer's reply, a file a program wrote, a worker's stderr), fit to
// be shown: printable_start() cuts it to the start of one line of a message; printable_line()
// keeps it whole but makes every control character visible, so that what a program wrote cannot
// move the cursor, retitle the window, clear the screen or hide a line of ddprun's report.

#include <cstdio>
#include <string>
#include <string_view>

namespace ddprun {

// Quoted ('...'), "..." after a cut; "(nothing)" for an empty text. Control characters become
// spaces.
inline std::string printable_start(std::string_view text, size_t max = 160) {
  std::string out;
  for (const char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  if (text.size() > max) out += "...";
  return out.empty() ? "(nothing)" : "'" + out + "'";
}

namespace printable_detail {

// The length of the UTF-8 sequence that starts `text` at `i` and is a printable character; 0 when
// it is none: a C1 control (U+0080..U+009F, which terminals act on as ESC + a letter) or a
// bidirectional embedding, override or isolate (U+202A..U+202E, U+2066..U+2069), which reorders
// what follows it on the line, so that a text can show other words than it holds.
inline size_t printable_sequence(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0u; };
  const auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) { return at(k) >= lo && at(k) <= hi; };
  const unsigned b = at(0);
  if (b >= 0xc2 && b <= 0xdf) return cont(1) && !(b == 0xc2 && at(1) <= 0x9f) ? 2 : 0;
  if (b == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;  // no overlong form
  if (b == 0xe2 && ((at(1) == 0x80 && cont(2, 0xaa, 0xae)) || (at(1) == 0x81 && cont(2, 0xa6, 0xa9)))) return 0;
  if (b == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;  // no surrogate
  if (b >= 0xe1 && b <= 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (b == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;  // no overlong form
  if (b >= 0xf1 && b <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (b == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;  // at most U+10FFFF
  return 0;
}

enum class Newlines { Escape, Keep };

inline void append_printable(std::string& out, std::string_view text, Newlines newlines) {
  for (size_t i = 0; i < text.size();) {
    const auto u = static_cast<unsigned char>(text[i]);
    if ((u >= 0x20 && u < 0x7f) || u == '\t' || (newlines == Newlines::Keep && u == '\n')) {
      out.push_back(text[i++]);
      continue;
    }
    if (const size_t n = u >= 0x80 ? printable_sequence(text, i) : 0; n > 0) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    char hex[5];
    std::snprintf(hex, sizeof hex, "\\x%02x", u);
    out += hex;
    ++i;
  }
}

}  // namespace printable_detail

// `text` with every control character shown as \xNN (ESC as \x1b, a CR as \x0d, a newline as
// \x0a; C1 controls, bidirectional controls and bytes that are no UTF-8 as each of their bytes'
// \xNN); tabs, printable ASCII and UTF-8 text stay as they are, and a backslash is left alone (the
// text is for a person).
inline std::string printable_line(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  printable_detail::append_printable(out, text, printable_detail::Newlines::Escape);
  return out;
}

// The same, but newlines stay: text of several lines, each made printable.
inline std::string printable_lines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  printable_detail::append_printable(out, text, printable_detail::Newlines::Keep);
  return out;
}

}  // namespace ddprun
