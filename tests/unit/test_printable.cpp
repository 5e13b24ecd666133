// Bytes quoted in error messages (moe/core/printable.h): a NUL, a newline or a byte that is not
// UTF-8 becomes \xNN text, so a one-line message stays whole and readable; UTF-8 text is kept.
#include <gtest/gtest.h>

#include <string>

#include "moe/core/printable.h"

namespace moe {
namespace {

using namespace std::string_literals;

TEST(Printable, control_bytes_and_broken_utf8_become_escapes_and_text_is_kept) {
  EXPECT_EQ(printable("'<u2', 'shape': (3,)"), "'<u2', 'shape': (3,)");
  EXPECT_EQ(printable("<u\0" "2"s), "<u\\x002");
  EXPECT_EQ(printable("a\nb\r\tc\x7f\x1b"), "a\\nb\\r\\tc\\x7f\\x1b");
  EXPECT_EQ(printable("donn\xc3\xa9" "es \xe6\x97\xa5 \xf0\x9f\x99\x82"), "donn\xc3\xa9" "es \xe6\x97\xa5 \xf0\x9f\x99\x82");
  EXPECT_EQ(printable("caf\xe9.txt"), "caf\\xe9.txt");               // Latin-1, not UTF-8
  EXPECT_EQ(printable("\xc3"), "\\xc3");                             // cut-off sequence
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a UTF-16 surrogate
  EXPECT_EQ(printable("\x93NUMPY"), "\\x93NUMPY");
  // The result is itself valid UTF-8 with no control bytes.
  const std::string all = [] {
    std::string s;
    for (int c = 0; c < 256; ++c) s += static_cast<char>(c);
    return s;
  }();
  const std::string p = printable(all);
  EXPECT_TRUE(is_valid_utf8(p));
  for (char c : p) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7f) << p;
}

TEST(Printable, utf8_validity_follows_the_standard) {
  EXPECT_TRUE(is_valid_utf8(""));
  EXPECT_TRUE(is_valid_utf8("plain.txt"));
  EXPECT_TRUE(is_valid_utf8("\xc3\xa9\xe2\x82\xac\xf4\x8f\xbf\xbf"));  // é € U+10FFFF
  EXPECT_FALSE(is_valid_utf8("bad\xffname"));
  EXPECT_FALSE(is_valid_utf8("caf\xe9.txt"));
  EXPECT_FALSE(is_valid_utf8("\x80"));
  EXPECT_FALSE(is_valid_utf8("\xe2\x82"));
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xe0\x80\xaf"));      // overlong
}

}  // namespace
}  // namespace moe
