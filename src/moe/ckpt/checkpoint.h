// Topology-independent checkpoints.
//
//   <run>/step-000100/
//     rank-00000.safetensors   flat 1-D slices this rank owns, in-file key "<key>@<begin>"
//     rank-00001.safetensors
//     index.json               logical key -> {dtype, shape, chunks: [{file, key, begin, end, checksum}]}
//     train_state.json         step, data position, RNG, config (caller's JSON object)
//
// Every chunk's checksum ({"algorithm": "xxh3-64", "value": 16 hex digits}, checksum.h) is computed
// from the bytes as they are written and verified the first time a reader touches the chunk, so a
// bit flipped on disk is an error naming the file and tensor instead of a NaN in training.
// Index version 1 (before checksums) still loads; its chunks are read unverified.
//
// A save goes to <run>/.tmp-step-000100 and is renamed to step-000100 when complete; the
// rename is the commit point, so a directory named step-* is always complete.
//
// Multi-rank save (single-process callers use save_checkpoint(), which does all of it):
//   rank 0:     tmp = begin_checkpoint(run, step)              then barrier
//   every rank: chunks = write_rank_file(tmp, rank, slices)    then gather chunks_to_json(chunks) to rank 0
//   rank 0:     write_checkpoint_index(tmp, step, all_chunks, train_state);
//               commit_checkpoint(run, step)
// Loading under any topology: each rank computes the ranges it owns and calls
// CheckpointReader::read for each, which assembles them from the overlapping chunks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "moe/ckpt/safetensors.h"
#include "moe/core/dtype.h"
#include "moe/core/tensor.h"

namespace moe {

// A slice this rank owns of one logical tensor: flat element range [begin, end) of the
// row-major logical tensor `key` of `global_shape`. `data` holds end - begin host elements.
struct CheckpointSlice {
  std::string key;
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
  int64_t begin = 0, end = 0;
  const void* data = nullptr;
};

// Where one slice was stored: elements [begin, end) of logical tensor `key` live in tensor
// `file_key` of `file` (a name inside the checkpoint directory), whose bytes hash to `checksum`.
struct CheckpointChunk {
  std::string key;
  DType dtype = DType::F32;
  std::vector<int64_t> global_shape;
  int64_t begin = 0, end = 0;
  std::string file, file_key;
  std::optional<uint64_t> checksum;  // checksum_bytes() of the stored bytes; none in version-1 checkpoints
};

// Chunk records as JSON, so ranks can send theirs to rank 0 as text. `source` (e.g. the file
// they were read from) names them in errors.
nlohmann::json chunks_to_json(const std::vector<CheckpointChunk>& chunks);
std::vector<CheckpointChunk> chunks_from_json(const nlohmann::json& j, const std::string& source = "chunk records");

std::string checkpoint_dir_name(int64_t step);  // "step-000100"
std::string rank_file_name(int rank);           // "rank-00003.safetensors"

// 1. Creates <run_dir>/.tmp-step-XXXXXX (creating run_dir if needed, removing a stale temp dir)
//    and returns its path.
std::string begin_checkpoint(const std::string& run_dir, int64_t step);
// Streaming form: a slice whose data is null is produced by produce(slice index, destination)
// just before it is written, so only one slice at a time needs to be in memory.
using SliceProducer = std::function<void(size_t index, void* destination)>;
std::vector<CheckpointChunk> write_rank_file(const std::string& tmp_dir, int rank,
                                             const std::vector<CheckpointSlice>& slices, const SliceProducer& produce);
// 2a. Writes <tmp_dir>/rank-RRRRR.safetensors holding `slices`; returns their chunk records,
//     each with the checksum of the bytes written.
std::vector<CheckpointChunk> write_rank_file(const std::string& tmp_dir, int rank,
                                             const std::vector<CheckpointSlice>& slices);
// 2b. Rank 0: checks the chunks of all ranks agree (dtype, shape, no overlaps, each has a
//     checksum) and writes index.json and train_state.json.
void write_checkpoint_index(const std::string& tmp_dir, int64_t step, const std::vector<CheckpointChunk>& chunks,
                            const nlohmann::json& train_state);
// 3. Fsyncs and renames .tmp-step-XXXXXX to step-XXXXXX (replacing an existing one atomically);
//    returns the final path.
std::string commit_checkpoint(const std::string& run_dir, int64_t step);

// Removes <run_dir>/.tmp-step-XXXXXX, the temp directory of a save that failed, once no rank writes
// into it any more. Best effort: the error being reported is the save's. Its files can be as large
// as a checkpoint, on a disk that just filled up, so they are not left for the next start to clear.
void abandon_checkpoint(const std::string& run_dir, int64_t step);

// All three steps for one process; a failure abandons the save. Test hook: with
// MOE_TEST_CRASH_DURING_SAVE set in the environment it calls std::_Exit(3) after the rank file and
// before index.json.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const std::vector<CheckpointSlice>& slices,
                            const nlohmann::json& train_state);

// Validates index.json (every field, naming the file and field when one is malformed), the
// headers of every referenced rank file and that train_state.json is a JSON object at open.
// Chunk data is verified lazily: the first read that touches a chunk hashes the whole chunk
// and compares it with index.json; later reads of a verified chunk do not hash again. Reads
// may run on several threads at once.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }  // index.json's step
  // False for version-1 checkpoints, whose chunks carry no checksums and are read unverified.
  bool has_checksums() const { return version_ >= 2; }
  // Bytes of chunk data hashed and found intact so far (each chunk counts once).
  int64_t bytes_verified() const { return bytes_verified_->load(std::memory_order_relaxed); }

  const nlohmann::json& train_state() const { return train_state_; }
  // Typed fields of train_state.json; a missing field or a wrong type is an error naming the
  // file and the field. Integers are steps and counts, so they must be >= 0.
  int64_t train_state_int(const std::string& key) const;
  int64_t train_state_int(const std::string& key, int64_t fallback) const;  // fallback when absent
  std::string train_state_string(const std::string& key) const;

  std::vector<std::string> keys() const;  // sorted
  bool has(const std::string& key) const { return tensors_.count(key) != 0; }
  std::vector<int64_t> global_shape(const std::string& key) const;
  DType dtype(const std::string& key) const;
  // Copies logical elements [begin, end) of `key` into out, assembling from every overlapping
  // chunk; error if the range is not fully covered or a chunk's checksum does not match.
  void read(const std::string& key, int64_t begin, int64_t end, void* out) const;
  // Same, and first checks that the stored dtype is `expected`.
  void read(const std::string& key, DType expected, int64_t begin, int64_t end, void* out) const;
  // Same into a tensor of end - begin elements on any device (a device tensor is filled through a
  // host buffer of that size). The stored dtype must be dst's, except that F32 and BF16 convert
  // into each other on the host (F32 -> BF16 rounds to nearest even, BF16 -> F32 is exact): state
  // whose storage dtype is a run setting (the AdamW moments, optim.moment_dtype) is saved as it is
  // stored and resumes under either setting.
  void read_into(const std::string& key, int64_t begin, int64_t end, const Tensor& dst) const;

 private:
  struct StoredTensor {
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    int64_t numel = 0;
    std::vector<CheckpointChunk> chunks;            // sorted by begin, disjoint
    std::unique_ptr<std::atomic<bool>[]> verified;  // per chunk: its checksum has matched
  };
  const StoredTensor& tensor(const std::string& key) const;
  void read_index(const std::string& index_path, std::string& reading);
  // Hashes chunk i of t unless it has been verified already; error naming it on a mismatch.
  void verify_chunk(const StoredTensor& t, size_t i) const;

  std::string dir_;
  int64_t step_ = 0;
  int64_t version_ = 0;
  nlohmann::json train_state_;
  std::map<std::string, SafetensorsReader> files_;
  std::map<std::string, StoredTensor> tensors_;
  std::unique_ptr<std::atomic<int64_t>> bytes_verified_ = std::make_unique<std::atomic<int64_t>>(0);
};


}  // namespace moe
