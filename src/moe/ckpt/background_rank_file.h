// One rank's file of a checkpoint written on a thread of its own (train.async_save), so that
// training goes on while the bytes reach the disk. start() first copies the slices into host memory
// this object owns (the snapshot: the steps after the save change the weights and moments, and what
// is written must be the saved step's), then one thread runs write_rank_file on the copy. The
// caller asks done() at step boundaries and collects the chunk records with finish(), which
// rethrows the thread's error. No collective runs on the thread: the multi-rank commit (index.json,
// the rename) stays with the caller, on its own thread (train/trainer_checkpoint.cpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "moe/ckpt/checkpoint.h"

namespace moe {

class BackgroundRankFile {
 public:
  BackgroundRankFile() = default;
  // Waits for a write still running (its result is dropped), except while an exception unwinds:
  // then the thread is left to end on its own (it owns what it uses), so an error on one rank of a
  // job reaches MPI_Abort without waiting for the disk (minutes for a large checkpoint).
  ~BackgroundRankFile();
  BackgroundRankFile(const BackgroundRankFile&) = delete;
  BackgroundRankFile& operator=(const BackgroundRankFile&) = delete;

  // Host bytes start() would copy for these slices.
  static size_t snapshot_bytes(const std::vector<CheckpointSlice>& slices);

  // Copies every slice (those with null data through produce, as write_rank_file would ask) and
  // starts writing <tmp_dir>/rank-RRRRR.safetensors from the copy. Refused while a write is held.
  void start(const std::string& tmp_dir, int rank, std::vector<CheckpointSlice> slices, const SliceProducer& produce);
  bool held() const { return thread_.joinable(); }  // started and not yet collected by finish()
  bool done() const;                                // a write is held and has ended, well or not
  // Waits for the write, frees the snapshot and returns its chunk records, or rethrows its error.
  std::vector<CheckpointChunk> finish();

 private:
  // What the thread uses and produces, shared with it so that it may outlive this object.
  struct Write {
    std::vector<std::unique_ptr<unsigned char[]>> storage;  // the host copy, one buffer per slice
    std::atomic<bool> done{false};
    std::vector<CheckpointChunk> chunks;  // read after join
    std::exception_ptr error;             // read after join
  };
  std::shared_ptr<Write> write_;
  std::thread thread_;
};

}  // namespace moe
