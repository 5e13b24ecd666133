#include "moe/ckpt/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "moe/ckpt/checksum.h"
#include "moe/ckpt/durable_file.h"
#include "moe/ckpt/json_field.h"
#include "moe/core/bounded_json.h"
#include "moe/core/device.h"
#include "moe/core/error.h"

namespace moe {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "moetrain-checkpoint";
// Version 2 added a checksum to every chunk record; version 1 (none) still loads, unverified.
constexpr int64_t kVersion = 2;
constexpr int64_t kOldestVersion = 1;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Element count of a logical shape, or -1 when a dim is negative or the product overflows.
int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

std::string tmp_dir_path(const std::string& run_dir, int64_t step) {
  return run_dir + "/.tmp-" + checkpoint_dir_name(step);
}

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  MOE_CHECK(!std::filesystem::is_directory(path, ec), "cannot read ", path, ": it is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in, "cannot read ", path, ": ", errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  MOE_CHECK(!in.bad(), "cannot read ", path, ": ", errno_text());
  return ss.str();
}

json parse_json_file(const std::string& path) {
  std::string text = read_text_file(path);
  try {
    return parse_bounded_json(text, path);
  } catch (const json::parse_error& e) {
    MOE_FAIL(path, " is not valid JSON: ", e.what());
  }
}

// A chunk file must be a plain name inside the checkpoint directory.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos;
}

// Checks one logical tensor's chunks (all ranks) agree, do not overlap and store every element once;
// sorts them by begin.
void check_and_sort_chunks(const std::string& where, const std::string& key, std::vector<CheckpointChunk>& chunks) {
  const CheckpointChunk& first = chunks.front();
  int64_t numel = shape_numel(first.global_shape);
  MOE_CHECK(numel >= 0, where, ": tensor '", key, "' has invalid shape ", shape_str(first.global_shape));
  for (const auto& c : chunks) {
    MOE_CHECK(c.dtype == first.dtype && c.global_shape == first.global_shape, where, ": tensor '", key, "' stored as ",
              dtype_name(first.dtype), " ", shape_str(first.global_shape), " in ", first.file, " but as ",
              dtype_name(c.dtype), " ", shape_str(c.global_shape), " in ", c.file);
    MOE_CHECK(0 <= c.begin && c.begin <= c.end && c.end <= numel, where, ": chunk [", c.begin, ", ", c.end,
              ") of tensor '", key, "' in ", c.file, " lies outside its ", numel, " elements");
  }
  std::sort(chunks.begin(), chunks.end(), [](const CheckpointChunk& a, const CheckpointChunk& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Every element in exactly one chunk: a gap found here, not when a rank reads that range (after
  // the other tensors, or never if no rank of the resuming layout reads it).
  const CheckpointChunk* prev = nullptr;
  int64_t covered = 0;  // [0, covered) is stored
  for (const auto& c : chunks) {
    if (c.begin == c.end) continue;
    MOE_CHECK(c.begin >= covered, where, ": chunks of tensor '", key, "' overlap: [", prev->begin, ", ", prev->end,
              ") in ", prev->file, " and [", c.begin, ", ", c.end, ") in ", c.file);
    MOE_CHECK(c.begin == covered, where, ": elements [", covered, ", ", c.begin, ") of tensor '", key,
              "' are not stored in any chunk");
    covered = c.end;
    prev = &c;
  }
  MOE_CHECK(covered == numel, where, ": elements [", covered, ", ", numel, ") of tensor '", key,
            "' are not stored in any chunk");
}

// The dtypes read_into converts between.
bool is_f32_or_bf16(DType t) { return t == DType::F32 || t == DType::BF16; }

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  MOE_CHECK(!ec, "cannot remove ", path, ": ", ec.message());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Chunk records

json chunks_to_json(const std::vector<CheckpointChunk>& chunks) {
  json j = json::array();
  for (const auto& c : chunks) {
    json r = {{"key", c.key},
              {"dtype", std::string(dtype_name(c.dtype))},
              {"shape", c.global_shape},
              {"begin", c.begin},
              {"end", c.end},
              {"file", c.file},
              {"file_key", c.file_key}};
    if (c.checksum) r["checksum"] = checksum_hex(*c.checksum);
    j.push_back(std::move(r));
  }
  return j;
}

std::vector<CheckpointChunk> chunks_from_json(const json& j, const std::string& source) {
  std::vector<CheckpointChunk> chunks;
  for (const JsonField& r : JsonField(j, source).elements()) {
    CheckpointChunk c;
    c.key = r["key"].as_string();
    c.dtype = dtype_from_safetensors(r["dtype"].as_string(), r["dtype"].name());
    c.global_shape = r["shape"].as_int_array(0);
    c.begin = r["begin"].as_int(0);
    c.end = r["end"].as_int(c.begin);
    c.file = r["file"].as_string();
    c.file_key = r["file_key"].as_string();
    if (r.has("checksum")) {
      c.checksum = checksum_from_hex(r["checksum"].as_string());
      if (!c.checksum) r["checksum"].fail("16 hexadecimal digits");
    }
    chunks.push_back(std::move(c));
  }
  return chunks;
}

// ---------------------------------------------------------------------------------------------
// Save

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::string rank_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.safetensors", rank);
  return buf;
}

std::string begin_checkpoint(const std::string& run_dir, int64_t step) {
  MOE_CHECK(step >= 0, "checkpoint step must be >= 0, got ", step);
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  MOE_CHECK(!ec, "cannot create checkpoint directory ", run_dir, ": ", ec.message());
  std::string tmp = tmp_dir_path(run_dir, step);
  // A temp dir left by a crashed save is garbage by definition: it was never committed.
  if (fs::exists(tmp, ec)) remove_tree(tmp);
  MOE_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "cannot create checkpoint directory ", tmp, ": ", errno_text());
  return tmp;
}

std::vector<CheckpointChunk> write_rank_file(const std::string& tmp_dir, int rank,
                                             const std::vector<CheckpointSlice>& slices) {
  return write_rank_file(tmp_dir, rank, slices, nullptr);
}

std::vector<CheckpointChunk> write_rank_file(const std::string& tmp_dir, int rank,
                                             const std::vector<CheckpointSlice>& slices, const SliceProducer& produce) {
  MOE_CHECK(rank >= 0, "write_rank_file: rank must be >= 0, got ", rank);
  const std::string file = rank_file_name(rank);
  const std::string path = tmp_dir + "/" + file;
  std::vector<CheckpointChunk> chunks;
  SafetensorsWriter writer;
  writer.set_metadata("format", kFormat);
  writer.set_metadata("rank", std::to_string(rank));
  for (const auto& s : slices) {
    int64_t numel = shape_numel(s.global_shape);
    MOE_CHECK(!s.key.empty(), "checkpoint rank ", rank, ": slice with an empty key");
    MOE_CHECK(numel >= 0, "checkpoint rank ", rank, ": tensor '", s.key, "' has invalid shape ",
              shape_str(s.global_shape));
    MOE_CHECK(0 <= s.begin && s.begin <= s.end && s.end <= numel, "checkpoint rank ", rank, ": slice [", s.begin, ", ",
              s.end, ") of tensor '", s.key, "' lies outside its ", numel, " elements");
    MOE_CHECK(s.begin == s.end || s.data || produce, "checkpoint rank ", rank, ": slice [", s.begin, ", ", s.end,
              ") of tensor '", s.key, "' has no data");
    // The checksum is filled in as the bytes are written.
    CheckpointChunk c{s.key, s.dtype, s.global_shape, s.begin, s.end, file, s.key + "@" + std::to_string(s.begin), {}};
    for (const auto& other : chunks)
      MOE_CHECK(other.file_key != c.file_key, "checkpoint rank ", rank, ": two slices of tensor '", s.key,
                "' begin at element ", s.begin);
    writer.add(c.file_key, s.dtype, {s.end - s.begin});
    chunks.push_back(std::move(c));
  }
  writer.open(path);
  std::vector<unsigned char> staging;  // one slice at a time when slices are produced on demand
  for (size_t i = 0; i < slices.size(); ++i) {
    const CheckpointSlice& s = slices[i];
    const size_t bytes = static_cast<size_t>(s.end - s.begin) * dtype_size(s.dtype);
    const void* src = s.data;
    if (!s.data && bytes != 0) {
      staging.resize(bytes);
      produce(i, staging.data());
      src = staging.data();
    }
    // Hashed from the very bytes handed to the writer, so the checksum covers everything after.
    chunks[i].checksum = checksum_bytes(src, bytes);
    writer.write(src, bytes);
  }
  writer.finish();
  return chunks;
}

void write_checkpoint_index(const std::string& tmp_dir, int64_t step, const std::vector<CheckpointChunk>& chunks,
                            const json& train_state) {
  const std::string where = "checkpoint " + tmp_dir;
  std::map<std::string, std::vector<CheckpointChunk>> by_key;
  for (const auto& c : chunks) {
    MOE_CHECK(plain_file_name(c.file), where, ": chunk file name '", c.file, "' is not a plain file name");
    MOE_CHECK(c.checksum, where, ": chunk '", c.file_key, "' of ", c.file,
              " has no checksum (chunk records come from write_rank_file)");
    by_key[c.key].push_back(c);
  }
  json tensors = json::object();
  for (auto& [key, list] : by_key) {
    check_and_sort_chunks(where, key, list);
    json records = json::array();
    for (const auto& c : list)
      records.push_back({{"file", c.file},
                         {"key", c.file_key},
                         {"begin", c.begin},
                         {"end", c.end},
                         {"checksum", {{"algorithm", kChecksumAlgorithm}, {"value", checksum_hex(*c.checksum)}}}});
    tensors[key] = {{"dtype", std::string(dtype_name(list.front().dtype))},
                    {"shape", list.front().global_shape},
                    {"chunks", std::move(records)}};
  }
  json index = {{"format", kFormat}, {"version", kVersion}, {"step", step}, {"tensors", std::move(tensors)}};
  std::string state_text, index_text;
  try {
    state_text = train_state.dump(2) + "\n";
    index_text = index.dump(1) + "\n";
  } catch (const json::exception& e) {
    MOE_FAIL(where, ": cannot encode JSON: ", e.what());
  }
  // train_state.json first: index.json is what marks the directory as loadable.
  write_file_atomic(tmp_dir + "/train_state.json", state_text);
  write_file_atomic(tmp_dir + "/index.json", index_text);
}

std::string commit_checkpoint(const std::string& run_dir, int64_t step) {
  const std::string tmp = tmp_dir_path(run_dir, step);
  const std::string final_dir = run_dir + "/" + checkpoint_dir_name(step);
  std::error_code ec;
  MOE_CHECK(fs::exists(tmp + "/index.json", ec), "cannot commit checkpoint ", tmp, ": index.json was not written");
  fsync_dir(tmp);  // files were fsynced one by one; this makes their names durable
  if (std::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST) MOE_FAIL("cannot rename ", tmp, " to ", final_dir, ": ", errno_text());
    // Saving a step again: swap atomically so step-N is always one complete checkpoint, then
    // drop the old one (now under the temp name, which a later save would clear anyway).
    MOE_CHECK(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0, "cannot replace ",
              final_dir, " with ", tmp, ": ", errno_text());
    remove_tree(tmp);
  }
  fsync_dir(run_dir);
  return final_dir;
}

void abandon_checkpoint(const std::string& run_dir, int64_t step) {
  std::error_code ignored;
  fs::remove_all(tmp_dir_path(run_dir, step), ignored);
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<CheckpointSlice>& slices,
                            const json& train_state) {
  std::string tmp = begin_checkpoint(run_dir, step);
  try {
    std::vector<CheckpointChunk> chunks = write_rank_file(tmp, 0, slices);
    if (std::getenv("MOE_TEST_CRASH_DURING_SAVE")) std::_Exit(3);  // test hook: die mid-save
    write_checkpoint_index(tmp, step, chunks, train_state);
    return commit_checkpoint(run_dir, step);
  } catch (...) {
    abandon_checkpoint(run_dir, step);
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Load

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  MOE_CHECK(fs::is_directory(dir, ec), "checkpoint directory ", dir, " does not exist");
  const std::string index_path = dir + "/index.json", state_path = dir + "/train_state.json";
  std::string reading = index_path;  // the file being read, for errors no check foresaw
  try {
    read_index(index_path, reading);
    reading = state_path;
    train_state_ = parse_json_file(state_path);
    JsonField(train_state_, state_path).expect_object();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. std::bad_alloc: still say which file was being read
    MOE_FAIL("checkpoint ", dir, ": cannot read ", reading, ": ", e.what());
  }
}

void CheckpointReader::read_index(const std::string& index_path, std::string& reading) {
  const json index = parse_json_file(index_path);
  const JsonField root(index, index_path);
  MOE_CHECK(index.is_object() && index.value("format", json()) == kFormat, index_path,
            ": not a moetrain checkpoint index (missing \"format\": \"", kFormat, "\")");
  version_ = root["version"].as_int(kOldestVersion);
  MOE_CHECK(version_ <= kVersion, index_path, ": checkpoint format version ", version_,
            " is newer than this build reads (", kOldestVersion, " to ", kVersion,
            "); load it with the moetrain that wrote it");
  step_ = root["step"].as_int(0);
  for (const auto& [key, t] : root["tensors"].members()) {
    StoredTensor st;
    st.dtype = dtype_from_safetensors(t["dtype"].as_string(), t["dtype"].name());
    st.shape = t["shape"].as_int_array(0);
    st.numel = shape_numel(st.shape);
    if (st.numel < 0) t["shape"].fail("a shape whose element count fits in 64 bits");
    for (const JsonField& r : t["chunks"].elements()) {
      CheckpointChunk c;
      c.key = key;
      c.dtype = st.dtype;
      c.global_shape = st.shape;
      c.file = r["file"].as_string();
      if (!plain_file_name(c.file)) r["file"].fail("a plain file name inside the checkpoint directory");
      c.file_key = r["key"].as_string();
      c.begin = r["begin"].as_int(0, st.numel);
      c.end = r["end"].as_int(c.begin, st.numel);
      // Version 1 predates checksums: its chunks are read unverified. A chunk that carries one
      // under version 1 is an edited index (turning verification off), not an old checkpoint.
      if (version_ < 2 && r.has("checksum"))
        r["checksum"].fail("absent in a version-1 index (this index carries checksums: its version was changed)");
      if (version_ >= 2) {
        const JsonField sum = r["checksum"];
        const std::string algorithm = sum["algorithm"].as_string();
        MOE_CHECK(algorithm == kChecksumAlgorithm, sum["algorithm"].name(), ": unsupported checksum algorithm '",
                  algorithm, "' (this build verifies ", kChecksumAlgorithm, ")");
        c.checksum = checksum_from_hex(sum["value"].as_string());
        if (!c.checksum) sum["value"].fail("16 hexadecimal digits");
      }
      auto it = files_.find(c.file);
      if (it == files_.end()) {
        reading = dir_ + "/" + c.file;
        std::error_code ec;
        MOE_CHECK(fs::exists(reading, ec), r["file"].name(), ": rank file ", reading, " does not exist");
        it = files_.emplace(c.file, SafetensorsReader(reading)).first;
        reading = index_path;
      }
      const SafetensorsReader& f = it->second;
      MOE_CHECK(f.has(c.file_key), r["key"].name(), ": chunk tensor '", c.file_key, "' not found in ", f.path());
      const SafetensorsEntry& e = f.entry(c.file_key);
      MOE_CHECK(e.dtype == st.dtype && e.shape == std::vector<int64_t>{c.end - c.begin}, index_path, ", tensor '", key,
                "': chunk '", c.file_key, "' in ", f.path(), " is ", dtype_name(e.dtype), " ", shape_str(e.shape),
                ", index says ", dtype_name(st.dtype), " [", c.end - c.begin, "]");
      st.chunks.push_back(std::move(c));
    }
    MOE_CHECK(!st.chunks.empty() || st.numel == 0, index_path, ": elements [0, ", st.numel, ") of tensor '", key,
              "' are not stored in any chunk (the tensor lists none)");
    if (!st.chunks.empty()) check_and_sort_chunks(index_path, key, st.chunks);
    st.verified = std::make_unique<std::atomic<bool>[]>(st.chunks.size());
    tensors_.emplace(key, std::move(st));
  }
}

int64_t CheckpointReader::train_state_int(const std::string& key) const {
  return JsonField(train_state_, dir_ + "/train_state.json")[key].as_int(0);
}

int64_t CheckpointReader::train_state_int(const std::string& key, int64_t fallback) const {
  return train_state_.contains(key) ? train_state_int(key) : fallback;
}

std::string CheckpointReader::train_state_string(const std::string& key) const {
  return JsonField(train_state_, dir_ + "/train_state.json")[key].as_string();
}

std::vector<std::string> CheckpointReader::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, t] : tensors_) out.push_back(k);
  return out;
}

const CheckpointReader::StoredTensor& CheckpointReader::tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  MOE_CHECK(it != tensors_.end(), "tensor '", key, "' not found in checkpoint ", dir_);
  return it->second;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& key) const { return tensor(key).shape; }

DType CheckpointReader::dtype(const std::string& key) const { return tensor(key).dtype; }

void CheckpointReader::read(const std::string& key, DType expected, int64_t begin, int64_t end, void* out) const {
  DType stored = tensor(key).dtype;
  MOE_CHECK(stored == expected, "checkpoint ", dir_, ": tensor '", key, "' is stored as ", dtype_name(stored),
            ", caller expects ", dtype_name(expected));
  read(key, begin, end, out);
}

void CheckpointReader::read_into(const std::string& key, int64_t begin, int64_t end, const Tensor& dst) const {
  const DType stored = dtype(key);
  const bool converts = stored != dst.dtype && is_f32_or_bf16(stored) && is_f32_or_bf16(dst.dtype);
  MOE_CHECK((stored == dst.dtype || converts) && dst.numel() == end - begin, "checkpoint ", dir_, ": read of '", key,
            "' (stored as ", dtype_name(stored), ") into a ", dtype_name(dst.dtype), " tensor of ", dst.numel(),
            " elements, expected ", end - begin, " elements of ", dtype_name(stored),
            is_f32_or_bf16(stored) ? " (or of F32/BF16, converted)" : "");
  if (!converts && dst.device == Device::CPU) return read(key, begin, end, dst.data);
  // Host bytes in dst's dtype: dst itself on the CPU, else a staging buffer copied over at the end.
  std::vector<unsigned char> staging(dst.device == Device::CPU ? 0 : dst.nbytes());
  auto* host = dst.device == Device::CPU ? static_cast<unsigned char*>(dst.data) : staging.data();
  if (!converts) {
    read(key, begin, end, host);
  } else {
    // Converted a bounded run of elements at a time, so the stored dtype needs no second full buffer.
    constexpr int64_t kRun = int64_t{1} << 20;
    std::vector<unsigned char> raw(static_cast<size_t>(std::min(kRun, end - begin)) * dtype_size(stored));
    for (int64_t at = begin; at < end; at += kRun) {
      const int64_t n = std::min(kRun, end - at);
      read(key, at, at + n, raw.data());
      const size_t offset = static_cast<size_t>(at - begin);
      if (stored == DType::F32) {
        auto* out = reinterpret_cast<uint16_t*>(host) + offset;
        for (int64_t i = 0; i < n; ++i) {
          float f;
          std::memcpy(&f, raw.data() + i * 4, 4);
          out[i] = f32_to_bf16(f);
        }
      } else {
        auto* out = reinterpret_cast<float*>(host) + offset;
        for (int64_t i = 0; i < n; ++i) {
          uint16_t h;
          std::memcpy(&h, raw.data() + i * 2, 2);
          out[i] = bf16_to_f32(h);
        }
      }
    }
  }
  if (dst.device != Device::CPU) copy_to_tensor(dst, staging.data());
}

void CheckpointReader::verify_chunk(const StoredTensor& t, size_t i) const {
  const CheckpointChunk& c = t.chunks[i];
  // No checksum: a version-1 chunk, read unverified. Two threads may both hash a chunk the first
  // time; that only repeats work.
  if (!c.checksum || t.verified[i].load(std::memory_order_acquire)) return;
  const SafetensorsReader& f = files_.at(c.file);
  const SafetensorsEntry& e = f.entry(c.file_key);
  const uint64_t found = checksum_bytes(f.data(c.file_key), e.end - e.begin);
  MOE_CHECK(found == *c.checksum, "checkpoint ", dir_, ": rank file ", c.file, ", tensor '", c.key, "' (in-file key '",
            c.file_key, "', elements [", c.begin, ", ", c.end, ")): ", kChecksumAlgorithm,
            " checksum mismatch: index.json has ", checksum_hex(*c.checksum), ", the stored bytes hash to ",
            checksum_hex(found),
            " (the file changed after it was written; restore it or resume from another checkpoint)");
  bytes_verified_->fetch_add(static_cast<int64_t>(e.end - e.begin), std::memory_order_relaxed);
  t.verified[i].store(true, std::memory_order_release);
}

void CheckpointReader::read(const std::string& key, int64_t begin, int64_t end, void* out) const {
  const StoredTensor& t = tensor(key);
  MOE_CHECK(0 <= begin && begin <= end && end <= t.numel, "checkpoint ", dir_, ": read [", begin, ", ", end,
            ") of tensor '", key, "' lies outside its ", t.numel, " elements");
  const size_t esize = dtype_size(t.dtype);
  auto* dst = static_cast<unsigned char*>(out);
  int64_t cursor = begin;  // everything before it has been copied
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const CheckpointChunk& c = t.chunks[i];
    if (cursor >= end) break;
    if (c.end <= cursor) continue;
    MOE_CHECK(c.begin <= cursor, "checkpoint ", dir_, ": elements [", cursor, ", ", std::min(c.begin, end),
              ") of tensor '", key, "' are not stored in any chunk");
    verify_chunk(t, i);
    int64_t stop = std::min(end, c.end);
    const auto* src = static_cast<const unsigned char*>(files_.at(c.file).data(c.file_key));
    std::memcpy(dst + (cursor - begin) * esize, src + (cursor - c.begin) * esize, (stop - cursor) * esize);
    cursor = stop;
  }
  MOE_CHECK(cursor >= end, "checkpoint ", dir_, ": elements [", cursor, ", ", end, ") of tensor '", key,
            "' are not stored in any chunk");
}

// ---------------------------------------------------------------------------------------------
// Finding and pruning

}  // namespace moe
