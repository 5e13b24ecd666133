#include "moe/data/token_array.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "moe/core/error.h"
#include "moe/core/mapped_file_faults.h"
#include "moe/data/megatron_index.h"

namespace moe {

void TokenArray::map(const std::string& path, size_t bytes) {
  path_ = path;
  if (bytes == 0) return;  // an empty file has nothing to map
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MOE_CHECK(fd >= 0, "cannot open token file ", path, ": ", std::strerror(errno));
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int saved_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  MOE_CHECK(p != MAP_FAILED, "cannot mmap token file ", path, ": ", std::strerror(saved_errno));
  map_ = static_cast<const unsigned char*>(p);
  map_bytes_ = bytes;
  watch_mapping(p, bytes, path, "restore it and resume from the last checkpoint");
}

TokenArray TokenArray::open_npy(const std::string& path) {
  TokenArray t;
  const NpyHeader h = read_npy_header(path);
  t.dtype_ = h.dtype;
  t.length_ = h.length;
  t.data_offset_ = h.data_offset;
  t.map(path, static_cast<size_t>(h.data_offset) + static_cast<size_t>(h.length) * token_dtype_size(h.dtype));
  return t;
}

TokenArray TokenArray::open_raw(const std::string& path, TokenDType dtype) {
  struct stat st {};
  MOE_CHECK(::stat(path.c_str(), &st) == 0, "cannot read token file ", path, ": ", std::strerror(errno));
  MOE_CHECK(S_ISREG(st.st_mode), "token file ", path, " is not a regular file");
  // The first bytes: a header that raw mode would read as tokens is refused, naming what it is.
  char head[kMegatronIndexMagicLen] = {};
  const size_t head_len = std::min(sizeof head, static_cast<size_t>(st.st_size));
  if (head_len > 0) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    MOE_CHECK(fd >= 0, "cannot open token file ", path, ": ", std::strerror(errno));
    const ssize_t got = ::pread(fd, head, head_len, 0);
    const int saved_errno = errno;
    ::close(fd);
    MOE_CHECK(got == static_cast<ssize_t>(head_len), "cannot read token file ", path, ": ",
              got < 0 ? std::strerror(saved_errno) : "it shrank while being opened");
  }
  // A .npy file (prepare's output, numpy.save) read as raw would train on its header as tokens.
  MOE_CHECK(head_len < kNpyMagicLen || std::memcmp(head, kNpyMagic, kNpyMagicLen) != 0, "token file ", path,
            " starts with the .npy magic (\\x93NUMPY): it is a .npy file with a header, which data.format = \"raw\" "
            "would read as tokens; use data.format = \"npy\" (--set data.format=npy)");
  MOE_CHECK(!is_megatron_index(head, head_len), "token file ", path, " is a Megatron-LM index (.idx), not tokens: "
            "name the .bin files it indexes (a folder, or a glob such as data/*.bin)");
  // A Megatron .bin's index knows its token type and length: the precise error where it disagrees.
  check_megatron_index(path, dtype, static_cast<uint64_t>(st.st_size));
  const size_t item = token_dtype_size(dtype);
  MOE_CHECK(static_cast<size_t>(st.st_size) % item == 0, "raw token file ", path, " has ", st.st_size,
            " bytes, not a multiple of ", item, " (data.dtype = \"", token_dtype_name(dtype),
            "\"): the file is truncated or data.dtype is wrong");
  TokenArray t;
  t.dtype_ = dtype;
  t.length_ = static_cast<int64_t>(static_cast<size_t>(st.st_size) / item);
  t.map(path, static_cast<size_t>(st.st_size));
  return t;
}

TokenArray TokenArray::open(const std::string& path, const std::string& format, TokenDType dtype) {
  if (format == "raw") return open_raw(path, dtype);
  MOE_CHECK(format == "npy", "data.format = \"", format, "\" is not one of: npy, raw");
  return open_npy(path);
}

void TokenArray::release() {
  if (map_ != nullptr) {
    unwatch_mapping(map_);
    ::munmap(const_cast<unsigned char*>(map_), map_bytes_);
  }
  map_ = nullptr;
  map_bytes_ = 0;
}

void TokenArray::swap(TokenArray& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(dtype_, o.dtype_);
  std::swap(length_, o.length_);
  std::swap(data_offset_, o.data_offset_);
  std::swap(map_, o.map_);
  std::swap(map_bytes_, o.map_bytes_);
}

TokenDType token_dtype_from_name(const std::string& name) {
  if (name == "uint16") return TokenDType::U16;
  MOE_CHECK(name == "uint32", "data.dtype = \"", name, "\" is not one of: uint16, uint32");
  return TokenDType::U32;
}

}  // namespace moe
