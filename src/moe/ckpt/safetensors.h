// Safetensors files: a memory-mapped reader that validates the whole header at open, and a
// streaming writer that needs only one tensor's bytes in memory at a time.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N,
// N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
// then the data section; offsets are relative to the start of the data section.
//
// NOTES: the writer packs tensors back to back in declaration order (the reference library
// rejects gaps), so only the start of the data section is 8-byte aligned; a tensor after an
// odd-sized one may be misaligned. Read through memcpy, not by casting data() to float*.
// The reader accepts gaps and trailing bytes but never overlaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "moe/core/dtype.h"

namespace moe {

// The largest header either side accepts (the reference library uses the same limit).
constexpr uint64_t kSafetensorsMaxHeader = 100u * 1000u * 1000u;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets in the data section
};

// Parses a safetensors dtype string ("F32", "BF16", ...); throws moe::Error naming `context`
// for strings that are unknown or that DType cannot hold (F16, F64, ...).
DType dtype_from_safetensors(std::string_view name, const std::string& context);

class SafetensorsReader {  // memory-mapped, fully validated at open
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&& other) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&& other) noexcept;
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // sorted by name
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;                     // "tensor 'X' not found in F"
  const void* data(const std::string& name) const;                                  // possibly unaligned
  // Bytes [byte_begin, byte_end) of tensor `name`, read from the file rather than the mapping: a
  // file cut short since it was opened (rewritten in place by another program) is then an error
  // naming it, where a read of the mapping past its new end raises SIGBUS and kills the process.
  void read(const std::string& name, uint64_t byte_begin, uint64_t byte_end, void* dst) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // "__metadata__"
  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  uint64_t data_offset() const { return data_offset_; }  // 8 + header length

 private:
  void release();

  std::string path_;
  const unsigned char* map_ = nullptr;
  int fd_ = -1;  // kept open for read()
  uint64_t file_size_ = 0;
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Streaming writer: declare all tensors (so the header can be written first), then write each
// tensor's bytes in declaration order (possibly in several pieces), then finish() (flush +
// fsync). Bytes go to "<path>.tmp-<pid>", renamed to `path` by finish(); a writer destroyed
// before finish() removes its temp file, so `path` never holds a partial file.
class SafetensorsWriter {
 public:
  SafetensorsWriter() = default;
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void add(const std::string& name, DType dtype, std::vector<int64_t> shape);
  void set_metadata(const std::string& key, const std::string& value);
  void open(const std::string& path);       // writes the header; no add() after this
  void write(const void* bytes, size_t n);  // appends to the current tensor(s) in declaration order
  void finish();                            // checks every declared byte was written

  uint64_t data_bytes() const { return data_bytes_; }  // sum of all declared tensor sizes

 private:
  void abandon();

  std::vector<SafetensorsEntry> entries_;  // declaration order
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  bool finished_ = false;
};

void write_safetensors(const std::string& path,
                       const std::vector<std::tuple<std::string, DType, std::vector<int64_t>, const void*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace moe
