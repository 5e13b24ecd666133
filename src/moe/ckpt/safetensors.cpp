#include "moe/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "moe/ckpt/durable_file.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"
#include "moe/core/mapped_file_faults.h"

namespace moe {

namespace {

using nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Bytes of a tensor, or false when numel * dtype_size does not fit in 64 bits.
bool tensor_nbytes(const std::vector<int64_t>& shape, DType dtype, uint64_t* nbytes) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *nbytes = n;
  return true;
}

// A JSON integer that is >= 0 and fits in int64 (shape dims) or uint64 (offsets).
bool json_nonneg(const json& v, uint64_t limit, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
  } else {
    return false;
  }
  return *out <= limit;
}

}  // namespace

DType dtype_from_safetensors(std::string_view name, const std::string& context) {
  static constexpr DType kAll[] = {DType::F32, DType::BF16, DType::FP8_E4M3, DType::E8M0,
                                   DType::I32, DType::I64,  DType::U8};
  for (DType t : kAll)
    if (dtype_name(t) == name) return t;
  static constexpr std::string_view kKnownUnsupported[] = {"F64", "F16", "F8_E5M2", "F6_E2M3", "F6_E3M2", "F4", "I8",
                                                           "I16", "U16", "U32",     "U64",     "BOOL",    "C64"};
  for (std::string_view s : kKnownUnsupported)
    if (s == name)
      MOE_FAIL(context, ": unsupported dtype '", name,
               "' (moetrain handles F32, BF16, F8_E4M3, F8_E8M0, I32, I64, U8)");
  MOE_FAIL(context, ": unknown dtype '", name, "'");
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  const std::string where = "safetensors file " + path;
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (a hang, not an
  // error); it is refused below as not a regular file. Reads of a regular file ignore the flag.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  MOE_CHECK(fd >= 0, "cannot open ", where, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    MOE_FAIL(where, " is not a regular file");
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ < 8) {
    ::close(fd);
    MOE_FAIL(where, " is truncated: ", file_size_, " bytes, shorter than the 8-byte header length");
  }
  void* m = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  std::string map_error = m == MAP_FAILED ? errno_text() : "";
  if (m == MAP_FAILED) ::close(fd);
  MOE_CHECK(m != MAP_FAILED, "cannot memory-map ", where, ": ", map_error);
  map_ = static_cast<const unsigned char*>(m);
  fd_ = fd;
  watch_mapping(map_, file_size_, path, "restore it (or resume from another checkpoint) and run again");

  try {
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | map_[i];  // little-endian
    MOE_CHECK(header_len <= kSafetensorsMaxHeader, where, ": header length ", header_len, " exceeds the limit of ",
              kSafetensorsMaxHeader, " bytes (corrupt file?)");
    MOE_CHECK(header_len <= file_size_ - 8, where, ": header length ", header_len, " runs past the end of the file (",
              file_size_, " bytes; truncated?)");
    data_offset_ = 8 + header_len;
    const uint64_t data_size = file_size_ - data_offset_;

    json header;
    try {
      // A tensor named twice would silently be the last of its entries.
      header = parse_bounded_json_range(map_ + 8, map_ + data_offset_, where + ": header", /*unique_keys=*/true);
    } catch (const json::parse_error& e) {
      MOE_FAIL(where, ": header is not valid JSON: ", e.what());
    }
    MOE_CHECK(header.is_object(), where, ": header is not a JSON object");

    for (const auto& [name, value] : header.items()) {
      if (name == "__metadata__") {
        MOE_CHECK(value.is_object(), where, ": __metadata__ is not a JSON object");
        for (const auto& [k, v] : value.items()) {
          MOE_CHECK(v.is_string(), where, ": __metadata__ value for '", k, "' is not a string");
          metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      const std::string what = where + ", tensor '" + name + "'";
      MOE_CHECK(value.is_object(), what, ": entry is not a JSON object");
      auto dt = value.find("dtype");
      auto sh = value.find("shape");
      auto off = value.find("data_offsets");
      MOE_CHECK(dt != value.end() && dt->is_string(), what, ": missing or non-string 'dtype'");
      MOE_CHECK(sh != value.end() && sh->is_array(), what, ": missing or non-array 'shape'");
      MOE_CHECK(off != value.end() && off->is_array(), what, ": missing or non-array 'data_offsets'");

      SafetensorsEntry e;
      e.name = name;
      e.dtype = dtype_from_safetensors(dt->get_ref<const std::string&>(), what);
      for (const json& d : *sh) {
        uint64_t v = 0;
        MOE_CHECK(json_nonneg(d, std::numeric_limits<int64_t>::max(), &v), what, ": shape ", sh->dump(),
                  " has an entry that is not a non-negative 64-bit integer");
        e.shape.push_back(static_cast<int64_t>(v));
      }
      MOE_CHECK(off->size() == 2 && json_nonneg((*off)[0], UINT64_MAX, &e.begin) &&
                    json_nonneg((*off)[1], UINT64_MAX, &e.end),
                what, ": data_offsets ", off->dump(), " is not [begin, end] of non-negative integers");
      MOE_CHECK(e.begin <= e.end, what, ": data_offsets [", e.begin, ", ", e.end, "] has begin > end");
      MOE_CHECK(e.end <= data_size, what, ": data_offsets [", e.begin, ", ", e.end, "] run past the data section (",
                data_size, " bytes; truncated file?)");
      uint64_t nbytes = 0;
      MOE_CHECK(tensor_nbytes(e.shape, e.dtype, &nbytes), what, ": shape ", shape_str(e.shape),
                " overflows 64-bit byte count");
      MOE_CHECK(e.end - e.begin == nbytes, what, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                " bytes but dtype ", dtype_name(e.dtype), " and shape ", shape_str(e.shape), " need ", nbytes);
      index_[e.name] = entries_.size();
      entries_.push_back(std::move(e));
    }

    // The format packs the tensors: sorted by range, each starts where the one before ends, the
    // first at 0 and the last at the end of the file (the reference reader refuses anything else, so
    // a gap or trailing bytes mean a damaged or concatenated file, not another writer's layout).
    std::vector<const SafetensorsEntry*> by_offset;
    for (const auto& e : entries_) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t covered = 0;
    const SafetensorsEntry* previous = nullptr;
    for (const SafetensorsEntry* b : by_offset) {
      if (b->begin < covered) {
        MOE_FAIL(where, ": tensors '", previous->name, "' [", previous->begin, ", ", previous->end, ") and '", b->name,
                 "' [", b->begin, ", ", b->end, ") overlap");
      }
      MOE_CHECK(b->begin == covered, where, ": bytes [", covered, ", ", b->begin, ") of the data section belong to no "
                "tensor (before '", b->name, "'); the format packs tensors without gaps (damaged file?)");
      covered = b->end;
      previous = b;
    }
    MOE_CHECK(covered == data_size, where, ": the tensors end at byte ", covered, " of the ", data_size,
              "-byte data section; the ", data_size - covered,
              " bytes after them belong to no tensor (damaged or concatenated file?)");
  } catch (const json::exception& e) {  // defensive: any JSON access surprise is a bad file
    release();
    MOE_FAIL(where, ": malformed header: ", e.what());
  } catch (...) {
    release();
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { release(); }

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      fd_(o.fd_),
      file_size_(o.file_size_),
      data_offset_(o.data_offset_),
      entries_(std::move(o.entries_)),
      index_(std::move(o.index_)),
      metadata_(std::move(o.metadata_)) {
  o.map_ = nullptr;
  o.fd_ = -1;
  o.file_size_ = 0;
}

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = o.map_;
    fd_ = o.fd_;
    file_size_ = o.file_size_;
    data_offset_ = o.data_offset_;
    entries_ = std::move(o.entries_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
    o.map_ = nullptr;
    o.fd_ = -1;
    o.file_size_ = 0;
  }
  return *this;
}

void SafetensorsReader::release() {
  if (map_) {
    unwatch_mapping(map_);
    ::munmap(const_cast<unsigned char*>(map_), file_size_);
  }
  map_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

const SafetensorsEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  MOE_CHECK(it != index_.end(), "tensor '", name, "' not found in ", path_);
  return entries_[it->second];
}

const void* SafetensorsReader::data(const std::string& name) const { return map_ + data_offset_ + entry(name).begin; }

void SafetensorsReader::read(const std::string& name, uint64_t byte_begin, uint64_t byte_end, void* dst) const {
  const SafetensorsEntry& e = entry(name);
  MOE_CHECK(byte_begin <= byte_end && byte_end <= e.end - e.begin, path_, ": tensor '", name, "' does not hold bytes [",
            byte_begin, ", ", byte_end, ")");
  auto* out = static_cast<unsigned char*>(dst);
  uint64_t at = data_offset_ + e.begin + byte_begin, left = byte_end - byte_begin;
  while (left > 0) {
    const ssize_t n = ::pread(fd_, out, std::min<uint64_t>(left, uint64_t{1} << 30), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    MOE_CHECK(n >= 0, "cannot read tensor '", name, "' of ", path_, ": ", errno_text());
    MOE_CHECK(n > 0, path_, " ends inside tensor '", name, "' (at byte ", at, " of the ", file_size_,
              " it had when opened): it was cut short while being read; restore it and run again");
    out += n, at += static_cast<uint64_t>(n), left -= static_cast<uint64_t>(n);
  }
}

// ---------------------------------------------------------------------------------------------
// Writer

SafetensorsWriter::~SafetensorsWriter() { abandon(); }

void SafetensorsWriter::abandon() {
  if (file_) {
    std::fclose(file_);
    file_ = nullptr;
    ::unlink(tmp_path_.c_str());
  }
}

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
  MOE_CHECK(!file_ && !finished_, "safetensors writer: add('", name, "') after open()");
  MOE_CHECK(!name.empty() && name != "__metadata__", "safetensors writer: invalid tensor name '", name, "'");
  for (const auto& e : entries_) MOE_CHECK(e.name != name, "safetensors writer: tensor '", name, "' added twice");
  uint64_t nbytes = 0;
  MOE_CHECK(tensor_nbytes(shape, dtype, &nbytes), "safetensors writer: tensor '", name, "' has invalid shape ",
            shape_str(shape));
  MOE_CHECK(nbytes <= UINT64_MAX - data_bytes_, "safetensors writer: total size overflows at '", name, "'");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = dtype;
  e.shape = std::move(shape);
  e.begin = data_bytes_;
  e.end = data_bytes_ + nbytes;
  data_bytes_ = e.end;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  MOE_CHECK(!file_ && !finished_, "safetensors writer: set_metadata('", key, "') after open()");
  metadata_[key] = value;
}

void SafetensorsWriter::open(const std::string& path) {
  MOE_CHECK(!file_ && !finished_, "safetensors writer: open(", path, ") called twice");
  // nlohmann::json objects keep keys sorted, which is the order we promise.
  json header = json::object();
  for (const auto& e : entries_)
    header[e.name] = {
        {"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // e.g. a name that is not valid UTF-8
    MOE_FAIL("safetensors writer for ", path, ": cannot encode header: ", e.what());
  }
  // Pad with spaces (allowed by the format) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  MOE_CHECK(text.size() <= kSafetensorsMaxHeader, "safetensors writer for ", path, ": header of ", text.size(),
            " bytes exceeds the limit");

  path_ = path;
  tmp_path_ = path + ".tmp-" + std::to_string(::getpid());
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  MOE_CHECK(file_, "cannot create ", tmp_path_, ": ", errno_text());
  unsigned char len_bytes[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len_bytes, 1, 8, file_) != 8 || std::fwrite(text.data(), 1, text.size(), file_) != text.size()) {
    std::string why = errno_text();
    abandon();
    MOE_FAIL("cannot write header of ", tmp_path_, ": ", why);
  }
}

void SafetensorsWriter::write(const void* bytes, size_t n) {
  MOE_CHECK(file_, "safetensors writer: write() before open() or after finish()");
  if (n > data_bytes_ - written_) {
    std::string p = path_;
    uint64_t w = written_;
    abandon();
    MOE_FAIL("safetensors writer for ", p, ": write of ", n, " bytes at offset ", w, " exceeds the ", data_bytes_,
             " declared bytes");
  }
  if (n && std::fwrite(bytes, 1, n, file_) != n) {
    std::string why = errno_text();
    abandon();
    MOE_FAIL("cannot write ", tmp_path_, ": ", why);
  }
  written_ += n;
}

void SafetensorsWriter::finish() {
  MOE_CHECK(file_, "safetensors writer: finish() before open() or called twice");
  if (written_ != data_bytes_) {
    // Name the first tensor that is not complete.
    std::string short_name;
    for (const auto& e : entries_)
      if (e.end > written_) {
        short_name = e.name;
        break;
      }
    uint64_t w = written_;
    abandon();
    MOE_FAIL("safetensors writer for ", path_, ": only ", w, " of ", data_bytes_, " declared bytes written (tensor '",
             short_name, "' incomplete)");
  }
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  std::string why = ok ? "" : errno_text();
  if (!ok) {
    abandon();
    MOE_FAIL("cannot flush ", tmp_path_, ": ", why);
  }
  std::fclose(file_);
  file_ = nullptr;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    why = errno_text();
    ::unlink(tmp_path_.c_str());
    MOE_FAIL("cannot rename ", tmp_path_, " to ", path_, ": ", why);
  }
  fsync_dir(parent_dir(path_));
  finished_ = true;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::tuple<std::string, DType, std::vector<int64_t>, const void*>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter writer;
  for (const auto& [name, dtype, shape, bytes] : tensors) writer.add(name, dtype, shape);
  for (const auto& [k, v] : metadata) writer.set_metadata(k, v);
  writer.open(path);
  for (const auto& [name, dtype, shape, bytes] : tensors) {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    n *= dtype_size(dtype);
    MOE_CHECK(n == 0 || bytes, "write_safetensors(", path, "): tensor '", name, "' has no data pointer");
    writer.write(bytes, n);
  }
  writer.finish();
}

}  // namespace moe
