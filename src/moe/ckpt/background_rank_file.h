// One rank's file of a checkpoint written on a thread of its own (train.async_save), so that
// training goes on while the bytes reach the disk. start() first copies the slices into host memory
// this object owns (the snapshot: the steps after the save change the weights and moments, and what
// is written must be the saved step's), then one thread runs write_rank_file on the copy. The copy
// is the pause training sees, and most of it, into fresh memory, is the kernel mapping its pages
// (bench/RESULTS.md, twenty-fourth session): the copy is kept after a write and reused by the next
// start() with the same slice sizes (every periodic save of a run), which copies into mapped pages. The
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
  // Host bytes start() would add for these slices: none when the kept copy fits them one for one,
  // else snapshot_bytes less the kept copy's (freed before the new one is made).
  size_t bytes_to_allocate(const std::vector<CheckpointSlice>& slices) const;
  size_t kept_bytes() const;                        // held between writes (the last snapshot)
  int copies_made() const { return copies_made_; }  // host copies made so far (a reuse makes none)

  // Copies every slice (those with null data through produce, as write_rank_file would ask) and
  // starts writing <tmp_dir>/rank-RRRRR.safetensors from the copy. Refused while a write is held.
  void start(const std::string& tmp_dir, int rank, std::vector<CheckpointSlice> slices, const SliceProducer& produce);
  // With a GPU's slices: each snapshot is page-locked once for the GPU when it is made
  // (core/pinned_host.h), so the copies of every later save into it run by DMA.
  void pin_for_gpu(bool pin) { pin_ = pin; }
  bool held() const { return thread_.joinable(); }  // started and not yet collected by finish()
  bool done() const;                                // a write is held and has ended, well or not
  // Waits for the write, keeps the snapshot's buffers for the next start() and returns its chunk
  // records, or rethrows its error.
  std::vector<CheckpointChunk> finish();

 private:
  // Every slice's copy in one anonymous mapping whose pages are mapped when it is made
  // (MAP_POPULATE: one call, not a fault per 4 KiB page in the copy), page-locked with pin.
  struct Snapshot {
    unsigned char* base = nullptr;
    size_t mapped = 0;
    bool pinned = false;
    std::vector<size_t> offsets, sizes;  // one per slice
    Snapshot(const std::vector<CheckpointSlice>& slices, bool pin);
    ~Snapshot();
    Snapshot(const Snapshot&) = delete;
    Snapshot& operator=(const Snapshot&) = delete;
    bool fits(const std::vector<CheckpointSlice>& slices) const;
    size_t bytes() const;
  };
  // What the thread uses and produces, shared with it so that it may outlive this object.
  struct Write {
    std::unique_ptr<Snapshot> snapshot;  // the host copy
    std::atomic<bool> done{false};
    std::vector<CheckpointChunk> chunks;  // read after join
    std::exception_ptr error;             // read after join
  };
  std::shared_ptr<Write> write_;
  std::thread thread_;
  std::unique_ptr<Snapshot> kept_;  // the last write's snapshot, once collected
  bool pin_ = false;
  int copies_made_ = 0;
};

}  // namespace moe
