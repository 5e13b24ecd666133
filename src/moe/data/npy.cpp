#include "moe/data/npy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string_view>
#include <utility>
#include <vector>

#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/core/rename_no_replace.h"

namespace moe {

static_assert(std::endian::native == std::endian::little, "token files are read as little-endian");

namespace {


// A tiny reader for the Python dict literal in the header, e.g.
// {'descr': '<u2', 'fortran_order': False, 'shape': (1000,), }
class HeaderDict {
 public:
  HeaderDict(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape, bool& has_descr,
             bool& has_fortran, bool& has_shape) {
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        descr = parse_string();
        has_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = parse_bool();
        has_fortran = true;
      } else if (key == "shape") {
        shape = parse_tuple();
        has_shape = true;
      } else {
        MOE_FAIL(path_, ": unexpected key '", printable(key), "' in .npy header");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_ws();
      MOE_CHECK(peek() == '}', path_, ": malformed .npy header dict near offset ", pos_);
    }
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    MOE_CHECK(peek() == c, path_, ": malformed .npy header: expected '", c, "' at offset ", pos_,
              " of \"", printable(s_), "\"");
    ++pos_;
  }
  std::string parse_string() {
    const char q = peek();
    MOE_CHECK(q == '\'' || q == '"', path_, ": malformed .npy header: expected a quoted string at offset ",
              pos_);
    ++pos_;
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != q) out += s_[pos_++];
    expect(q);
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    MOE_FAIL(path_, ": malformed .npy header: expected True or False at offset ", pos_);
  }
  std::vector<int64_t> parse_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    while (true) {
      skip_ws();
      if (peek() == ')') break;
      MOE_CHECK(std::isdigit(static_cast<unsigned char>(peek())), path_,
                ": malformed .npy header: expected a dimension at offset ", pos_);
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        MOE_CHECK(v < (int64_t{1} << 56), path_, ": .npy shape dimension too large");
        v = v * 10 + (s_[pos_++] - '0');
      }
      if (peek() == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(v);
      skip_ws();
      if (peek() == ',') ++pos_;
    }
    expect(')');
    return dims;
  }

  std::string_view s_;
  const std::string& path_;
  size_t pos_ = 0;
};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) s += ",";
  return s + ")";
}

template <typename T>
void write_npy_impl(const std::string& path, const char* descr, std::span<const T> values,
                    const std::vector<int64_t>& shape = {}, bool via_temp = true, bool replace = true) {
  std::string shape_text;
  if (shape.empty()) {
    shape_text = std::to_string(values.size()) + ",";
  } else {
    for (size_t i = 0; i < shape.size(); ++i) shape_text += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) shape_text += ",";
  }
  std::string dict = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + shape_text + "), }";
  // magic(6) + version(2) + header_len(2) + dict + padding + '\n', total a multiple of 64.
  size_t total = kNpyMagicLen + 2 + 2 + dict.size() + 1;
  const size_t padded = (total + 63) / 64 * 64;
  dict.append(padded - total, ' ');
  dict += '\n';
  const uint16_t header_len = static_cast<uint16_t>(dict.size());
  MOE_CHECK(dict.size() < 65536, path, ": .npy header too long");

  // Written under a temporary name and renamed when complete: a reader never sees half a file
  // (unless the caller renames it itself).
  const std::string tmp = via_temp ? path + ".tmp-" + std::to_string(::getpid()) : path;
  std::FILE* f = std::fopen(tmp.c_str(), "wbx");
  MOE_CHECK(f != nullptr, "cannot create ", tmp, via_temp ? " (to write " + path + ")" : std::string(), ": ",
            std::strerror(errno));
  const unsigned char version[2] = {1, 0};
  const unsigned char len_le[2] = {static_cast<unsigned char>(header_len & 0xff),
                                   static_cast<unsigned char>(header_len >> 8)};
  // errno is cleared first: a small file fails only when its buffered bytes are flushed, and the
  // reason must be that call's, not one left by an earlier call ("No such file or directory" for a
  // full disk). Fsynced before the caller renames it, so a write error the file system reports
  // only at writeback is caught here too.
  errno = 0;
  bool ok = std::fwrite(kNpyMagic, 1, kNpyMagicLen, f) == kNpyMagicLen;
  ok = ok && std::fwrite(version, 1, 2, f) == 2;
  ok = ok && std::fwrite(len_le, 1, 2, f) == 2;
  ok = ok && std::fwrite(dict.data(), 1, dict.size(), f) == dict.size();
  ok = ok && (values.empty() || std::fwrite(values.data(), sizeof(T), values.size(), f) == values.size());
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int write_errno = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    write_errno = errno;
  }
  if (ok && via_temp && !(replace ? std::rename(tmp.c_str(), path.c_str()) == 0 : rename_no_replace(tmp, path))) {
    const int rename_errno = errno;
    std::remove(tmp.c_str());
    MOE_CHECK(rename_errno != EEXIST, path, " exists (it appeared while this command ran, or is a symbolic link); ",
              "choose a new file name (nothing is overwritten)");
    MOE_FAIL("writing ", path, " failed: cannot rename ", tmp, " to it: ", std::strerror(rename_errno));
  }
  if (!ok) std::remove(tmp.c_str());
  MOE_CHECK(ok, "writing ", path, " failed: ", write_errno ? std::strerror(write_errno) : "short write");
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "cannot open token file ", path, ": ", std::strerror(errno));
  struct stat st {};
  MOE_CHECK(::stat(path.c_str(), &st) == 0, "cannot stat ", path, ": ", std::strerror(errno));
  const int64_t file_size = st.st_size;

  char pre[12] = {};
  in.read(pre, 10);
  MOE_CHECK(in.gcount() == 10 && std::memcmp(pre, kNpyMagic, kNpyMagicLen) == 0, path,
            ": not a .npy file (bad magic; expected \\x93NUMPY)");
  const int major = static_cast<unsigned char>(pre[6]);
  const int minor = static_cast<unsigned char>(pre[7]);
  MOE_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, path, ": unsupported .npy version ",
            major, ".", minor, " (expected 1.0, 2.0 or 3.0)");
  int64_t header_len = 0;
  int64_t prefix = 10;
  if (major == 1) {
    header_len = static_cast<unsigned char>(pre[8]) | (static_cast<unsigned char>(pre[9]) << 8);
  } else {
    in.read(pre + 10, 2);
    MOE_CHECK(in.gcount() == 2, path, ": truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(pre[8 + i]);
    prefix = 12;
  }
  MOE_CHECK(prefix + header_len <= file_size, path, ": truncated .npy header (header says ",
            prefix + header_len, " bytes, file has ", file_size, ")");
  std::string text(static_cast<size_t>(header_len), '\0');
  in.read(text.data(), header_len);
  MOE_CHECK(in.gcount() == header_len, path, ": truncated .npy header");

  std::string descr;
  bool fortran = false, has_descr = false, has_fortran = false, has_shape = false;
  std::vector<int64_t> shape;
  HeaderDict(text, path).parse(descr, fortran, shape, has_descr, has_fortran, has_shape);
  MOE_CHECK(has_descr && has_fortran && has_shape, path,
            ": .npy header lacks one of 'descr', 'fortran_order', 'shape'");

  NpyHeader h;
  if (descr == "<u2") {
    h.dtype = TokenDType::U16;
  } else if (descr == "<u4") {
    h.dtype = TokenDType::U32;
  } else {
    MOE_FAIL(path, ": dtype '", printable(descr), "' is not supported; token files must be uint16 ('<u2') or uint32 ('<u4')");
  }
  MOE_CHECK(!fortran, path, ": fortran_order True is not supported");
  MOE_CHECK(shape.size() == 1, path, ": token files must be 1-D, got shape ", shape_str(shape));
  h.length = shape[0];
  h.data_offset = prefix + header_len;
  const int64_t expected = h.data_offset + h.length * static_cast<int64_t>(token_dtype_size(h.dtype));
  MOE_CHECK(file_size >= expected, path, ": truncated: expected ", expected, " bytes (header ", h.data_offset,
            " + ", h.length, " x ", token_dtype_size(h.dtype), "), file has ", file_size);
  MOE_CHECK(file_size == expected, path, ": ", file_size - expected, " unexpected trailing bytes (expected ",
            expected, " bytes, file has ", file_size, ")");
  return h;
}

void write_npy(const std::string& path, std::span<const uint16_t> values) {
  write_npy_impl<uint16_t>(path, "<u2", values);
}
void write_npy(const std::string& path, std::span<const uint32_t> values) {
  write_npy_impl<uint32_t>(path, "<u4", values);
}
void write_new_npy(const std::string& path, std::span<const uint16_t> values) {
  write_npy_impl<uint16_t>(path, "<u2", values, {}, /*via_temp=*/false);
}
void write_npy_f32(const std::string& path, std::span<const float> values, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  MOE_CHECK(n == static_cast<int64_t>(values.size()), path, ": shape does not match ", values.size(), " values");
  write_npy_impl<float>(path, "<f4", values, shape, /*via_temp=*/true, /*replace=*/false);
}

}  // namespace moe
