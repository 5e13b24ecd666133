// Expert buffers, leases and capacity: the part of token dispatch that every backend shares.
// A backend only decides where the memory comes from (an Arena
// for local and alltoall, a SymmetricHeap for rowwise) and implements the routing: place_routes,
// dispatch, combine and their backwards.
//
// - rank_capacity: the rows of one rank's expert buffer, fixed at start-up.
// - BufferMemory: where buffers come from; ArenaMemory and HeapLayout are the two strategies.
// - ExpertBufferPools: per MoE layer a pool of `slots_per_layer` (expert_in, expert_out) pairs
//   and one pair of backward scratch; forward acquires a lease, backward releases it. When every
//   MoE layer recomputes its expert rows in backward (train.recompute = block), one pair shared by
//   all layers replaces the pools.
// - PooledDispatcher: the TokenDispatcher base that answers capacity, expert ownership, leases
//   and byte counts from the above, so backends do not repeat them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/arena.h"
#include "moe/core/tensor.h"
#include "moe/model/dispatch.h"

namespace moe {

// Rows of one destination rank's expert buffer: dropless -> tokens * top_k * ranks (every route of
// every rank may land here); otherwise ceil(capacity_factor * tokens * top_k), never more than the
// dropless worst case. tokens: per microbatch on one rank; ranks: the EP group's size (1 for local).
int64_t rank_capacity(int64_t tokens, int64_t top_k, int ranks, double capacity_factor, bool dropless);

// Bytes one kept route moves through dispatch and combine: its token row into expert_in (payload
// fp8: `hidden` E4M3 codes and ceil(hidden / 128) F32 scales; bf16: `hidden` elements of `dtype`) and
// its expert output back (`hidden` elements of `dtype`, the activation dtype, in either payload).
int64_t route_payload_bytes(int64_t hidden, DType dtype, Payload payload);

// Where a backend's buffers live. reserve() at start-up, get() once the memory exists.
class BufferMemory {
 public:
  virtual ~BufferMemory() = default;
  // Sets aside one buffer; `name` labels it in memory reports. Returns its id for get().
  virtual int reserve(const std::string& name, DType dtype, Shape shape) = 0;
  virtual Tensor get(int id) const = 0;
};

// Named buffers of an Arena (local, alltoall): valid once the arena is committed.
class ArenaMemory final : public BufferMemory {
 public:
  explicit ArenaMemory(Arena& arena) : arena_(arena) {}
  int reserve(const std::string& name, DType dtype, Shape shape) override;
  Tensor get(int id) const override { return arena_.get(slots_.at(static_cast<size_t>(id))); }
  Arena& arena() const { return arena_; }

 private:
  Arena& arena_;
  std::vector<Arena::Slot> slots_;
};

// Buffers at fixed offsets of one symmetric-heap segment (rowwise). Every rank reserves the same
// buffers in the same order, so an offset names the same buffer on every rank. The backend
// allocates the heap with bytes() once everything is reserved, then bind()s its local segment.
class HeapLayout final : public BufferMemory {
 public:
  static constexpr size_t kAlign = 256;

  explicit HeapLayout(Device device) : device_(device) {}
  int reserve(const std::string& name, DType dtype, Shape shape) override;
  Tensor get(int id) const override;
  size_t offset(int id) const { return entries_.at(static_cast<size_t>(id)).offset; }
  // Bytes every rank's segment needs (at least one alignment unit, so a heap is never empty).
  size_t bytes() const { return end_ > 0 ? end_ : kAlign; }
  void bind(void* local_segment) { base_ = static_cast<char*>(local_segment); }

 private:
  struct Entry {
    size_t offset;
    DType dtype;
    Shape shape;
  };
  Device device_;
  std::vector<Entry> entries_;
  size_t end_ = 0;
  char* base_ = nullptr;
};

// How many expert buffers to set aside and how large; fixed at start-up.
struct ExpertPoolSizes {
  int first_layer = 0;  // MoE layers [first_layer, num_layers) get a pool; dense layers none
  int num_layers = 0;
  // Buffer pairs per layer = microbatches whose forward has run and whose backward has not, at
  // once: 1 when microbatches run one after the other; a pipeline schedule's microbatches in flight.
  int slots_per_layer = 1;
  int64_t rows = 0;  // rank_capacity
  int64_t hidden = 0;
  DType dtype = DType::F32;
  // Every MoE layer recomputes its expert rows in backward: no per-layer pools, one shared pair.
  bool recompute = false;
  // FP8: every expert_in (leases, recompute pair) is E4M3 codes [rows, hidden] plus F32 scales
  // [rows, ceil(hidden / 128)]; expert_out and the backward pair (if it has an expert_out) stay `dtype`.
  Payload payload = Payload::BF16;
  // false: the backward pair has no expert_out (DispatchShape::grad_expert_out).
  bool grad_expert_out = true;
};

class ExpertBufferPools {
 public:
  // Reserves in `memory` (which must outlive the pools), for each MoE layer, slots_per_layer pairs
  // (expert_in, expert_out) of [rows, hidden] (with sizes.recompute: one pair for all layers
  // instead), then the backward pair. Arena buffer names: dispatch.layer.<l>.slot.<s>.expert_in|
  // expert_out (dispatch.recompute.expert_in|expert_out) and dispatch.grad.expert_in|expert_out; with
  // payload fp8 each forward pair also has expert_in_scales.
  void reserve(BufferMemory& memory, const ExpertPoolSizes& sizes);
  bool reserved() const { return memory_ != nullptr; }
  const ExpertPoolSizes& sizes() const { return sizes_; }

  // A free slot of `layer`'s pool; throws naming the pool and parallel.lease_slots when none is free.
  // Every rank of an EP group makes the same calls in the same order and so gets the same slot,
  // which is what lets rowwise address a peer's buffer by its own (layer, slot).
  Lease acquire(int layer);
  void release(const Lease& lease);
  // Backward scratch shared by all layers: expert_out holds d(expert output), expert_in d(expert input).
  ExpertBuffers grad_buffers() const;
  // The pair every layer uses when reserved with sizes.recompute; throws otherwise.
  ExpertBuffers recompute_buffers() const;
  // Whether `t` is (a view of) one of the recompute pair's buffers.
  bool is_recompute_buffer(const Tensor& t) const;

 private:
  struct Slot {
    int in = -1, out = -1, in_scales = -1;  // BufferMemory ids (in_scales: payload fp8 only; out: -1 when not reserved)
    bool busy = false;
  };
  ExpertBuffers buffers_of(const Slot& s) const;
  std::vector<Slot>& pool_of(int layer, const char* op);

  BufferMemory* memory_ = nullptr;
  ExpertPoolSizes sizes_;
  std::vector<std::vector<Slot>> pools_;  // [layer - first_layer][slot]; empty with sizes_.recompute
  Slot grad_;
  Slot recompute_;  // with sizes_.recompute only
};

// The TokenDispatcher base of every backend: capacity (rank_capacity), which experts this rank
// holds, leases and the backward scratch (ExpertBufferPools), and the payload byte counters.
// A backend implements reserve_buffers (choosing its memory and calling reserve_pools) and the
// routing: place_routes, dispatch, combine and their backwards.
class PooledDispatcher : public TokenDispatcher {
 public:
  int64_t expert_rows(int64_t tokens, int64_t top_k) const final;
  int64_t first_expert() const final { return static_cast<int64_t>(rank_) * local_experts_; }
  int64_t local_experts() const final { return local_experts_; }
  Lease acquire(int layer) final;
  void release(const Lease& lease) final { pools_.release(lease); }
  ExpertBuffers grad_buffers() final;
  ExpertBuffers recompute_buffers() final;
  int64_t bytes_moved() const final { return bytes_moved_; }
  int64_t remote_bytes_moved() const final { return remote_bytes_moved_; }

 protected:
  // what: names the backend in errors ("rowwise dispatcher"). ranks, rank: the EP group's size and
  // this rank's place in it (1 and 0 for local); rank r holds experts [r*E, (r+1)*E), E = N / ranks.
  PooledDispatcher(std::string what, int ranks, int rank, int64_t num_experts, double capacity_factor,
                   bool dropless);
  // Reserves the pools for `shape` in `memory`: buffers of `dtype` (the rows the backend moves) with
  // rows_ = expert_rows(shape.tokens, shape.top_k). Sets tokens_, top_k_, hidden_ and rows_.
  void reserve_pools(BufferMemory& memory, const DispatchShape& shape, DType dtype);
  // The CPU multi-rank backends move F32 rows in host memory: refuses anything else.
  void require_host_f32_rows(const DispatchShape& shape, const Arena& arena) const;
  // Their call arguments: `t` an F32 [rows_, hidden_] expert buffer, an F32 [tokens_, cols] token-side
  // tensor, top_k the reserved one; errors name the backend, the call (op) and the argument (what).
  void check_f32_expert_rows(const Tensor& t, const char* op, const char* what) const;
  // dispatch_fp8's expert_in: reserved with payload fp8, codes [rows_, hidden_] E4M3 and Rows-tile F32
  // scales [rows_, ceil(hidden_ / 128)].
  void check_fp8_expert_rows(const Fp8Tensor& t, const char* op) const;
  void check_f32_tokens(const Tensor& t, int64_t cols, const char* op, const char* what) const;
  void check_top_k(int top_k, const char* op) const;
  // place_routes' topk_idx: [tokens_, top_k_], the reserved shape.
  void check_reserved_topk(const Tensor& topk_idx) const;
  // Adds to the byte counters (CPU backends count as they move; the GPU one sets totals it read).
  void count_moved(int64_t bytes, int64_t remote_bytes) {
    bytes_moved_ += bytes;
    remote_bytes_moved_ += remote_bytes;
  }
  void set_moved(int64_t bytes, int64_t remote_bytes) { bytes_moved_ = bytes, remote_bytes_moved_ = remote_bytes; }
  // Whether `t` lies in the recompute pair (whose expert_out is rewritten in backward; see combine_backward).
  bool is_recompute_buffer(const Tensor& t) const { return pools_.reserved() && pools_.is_recompute_buffer(t); }

  const std::string what_;
  const int ranks_, rank_;
  const int64_t num_experts_, local_experts_;
  int64_t tokens_ = 0, top_k_ = 0, hidden_ = 0, rows_ = 0;  // of the reserved shape
  Payload payload_ = Payload::BF16;                          // of the reserved shape

 private:
  double capacity_factor_;
  bool dropless_;
  ExpertBufferPools pools_;
  int64_t bytes_moved_ = 0, remote_bytes_moved_ = 0;
};

}  // namespace moe
