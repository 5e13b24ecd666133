// Bytes that came from a file or the command line (a header's text, a name listed in a JSON
// file, a file name), made safe to quote in a one-line error message: an error is printed with
// printf("%s"), so a NUL byte would cut it short, a newline would split it, and bytes that are
// not UTF-8 garble the terminal and cannot go into JSON.
#pragma once

#include <string>
#include <string_view>

namespace moe {

// `bytes` with every control byte (below 0x20, and 0x7f) and every byte that is not part of a
// well-formed UTF-8 sequence written as \xNN (\n, \r, \t as such); valid UTF-8 text (accents,
// CJK) is kept as it is.
std::string printable(std::string_view bytes);

// Whether `bytes` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF), as JSON requires of its strings.
bool is_valid_utf8(std::string_view bytes);

}  // namespace moe
