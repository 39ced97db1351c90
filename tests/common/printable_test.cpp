// Text from outside, fit to be shown (common/printable.hpp): control characters visible, UTF-8 and
// tabs as they are.
#include "common/printable.hpp"

#include <gtest/gtest.h>

#include <string>

namespace ddprun {
namespace {

TEST(PrintableTest, ControlCharactersAreShownAndTextStays) {
  struct Row {
    std::string text, want;
  };
  const Row rows[] = {
      {"plain text, tab\there", "plain text, tab\there"},
      {"\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"},  // ESC, CSI, OSC, BEL
      {"a\rb\nc\x7f", "a\\x0db\\x0ac\\x7f"},                      // CR, LF, DEL
      {"\xc2\x9b"
       "31m",
       "\\xc2\\x9b31m"},  // C1 CSI, as UTF-8
      {"\x9b"
       "31m",
       "\\x9b31m"},  // C1 CSI, a raw byte
      {"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
       "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80"},
      {"\xc3", "\\xc3"},                             // a cut sequence
      {"\xc0\xaf", "\\xc0\\xaf"},                    // an overlong '/'
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},           // a surrogate
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  // above U+10FFFF
      {std::string("nul\0byte", 8), "nul\\x00byte"},
      {"back\\slash", "back\\slash"},
      // Bidirectional overrides and isolates reorder the rest of the line ("Trojan Source").
      {"ok \xe2\x80\xae"
       "txt.exe",
       "ok \\xe2\\x80\\xaetxt.exe"},                                   // U+202E RIGHT-TO-LEFT OVERRIDE
      {"\xe2\x80\xaa\xe2\x80\xac", "\\xe2\\x80\\xaa\\xe2\\x80\\xac"},  // U+202A, U+202C
      {"\xe2\x81\xa6\xe2\x81\xa9", "\\xe2\\x81\\xa6\\xe2\\x81\\xa9"},  // U+2066, U+2069
      {"\xe2\x80\xa9\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa",
       "\xe2\x80\xa9\xe2\x80\xaf\xe2\x81\xa5\xe2\x81\xaa"},  // their neighbours stay
  };
  for (const Row& r : rows) EXPECT_EQ(printable_line(r.text), r.want) << r.want;
  EXPECT_EQ(printable_lines("one\x1b[A\ntwo\n"), "one\\x1b[A\ntwo\n");
}

}  // namespace
}  // namespace ddprun
