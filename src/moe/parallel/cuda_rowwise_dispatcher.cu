// Kernels and host side of CudaRowwiseDispatcher (cuda_rowwise_dispatcher.h).
//   exchange_counts: one thread per (peer, expert) stores this rank's count into the peer's area;
//   ep_route_index: one block per expert n, as route_index_local in ops/cuda/route.cu but with the
//     placement of placement.cpp: the block sums the gathered counts ahead of (n, me) at n's owner,
//     then numbers the routes to n in (t, k) order with a block-wide scan per chunk of routes; it
//     also checks the counts and adds the bytes its kept routes move to the status record;
//   dispatch: one block per token reads its row once and stores it into the owners' expert_in rows
//     of its K routes (PUT), route_rows.cuh's scatter kernel; dispatch_fp8 the same with the row
//     quantized once into FP8 codes and scales (route_rows.cuh's FP8 scatter kernel);
//   combine, dispatch backward, combine backward: one block per token over its K routed rows, the
//     kernels of ops/cuda/route_rows.cuh (shared with the local ops of ops/cuda/permute.cu) with
//     rows located in their owners' heap segments (PeerRow): the combine and the dispatch backward
//     read rows there (GET) and sum over k in ascending order in FP32, rounding once on store; the
//     combine backward stores w * dout into the owner's d_expert_out (PUT) and reduces
//     dot(dout, expert_out) in a fixed order for dweights.
// Rows move in chunks of 16 bytes (8 BF16) when the row size and every buffer allow it, else one element at a time; the
// arithmetic per element is the same either way, and the same as the local dispatcher's. No atomics on rows: results are
// deterministic (the byte counters add integers, in any order to the same total).
#include "moe/parallel/cuda_rowwise_dispatcher.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <type_traits>

#include "moe/core/cuda_check.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/ops/cuda/element.cuh"
#include "moe/ops/cuda/route_rows.cuh"
#include "moe/ops/cuda/route_scan.cuh"

#if defined(MOE_HAVE_NCCL)
#include "moe/comm/nccl_communicator.h"
#include "moe/comm/timed_communicator.h"
#endif

namespace moe {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kRouteThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops beyond this many rows

// Every rank's heap segment, passed by value to each kernel (no device table to keep filled).
struct PeerBases {
  char* base[CudaRowwiseDispatcher::kMaxRanks];
};

// The kernels' by-value table of the ranks' heap segments.
PeerBases peer_table(const std::vector<char*>& bases) {
  PeerBases peers{};
  for (size_t r = 0; r < bases.size(); ++r) peers.base[r] = bases[r];
  return peers;
}

unsigned grid_for(int64_t items) { return static_cast<unsigned>(std::min(items, kMaxBlocks)); }

using cuda::Pack;
using cuda::with_vec_width;

// The device status record in this rank's heap segment (cuda_rowwise_dispatcher.h): byte counters that only grow,
// and the first wrong count found (error = 0: none). Read by check_after_step() after the step.
enum CountError : unsigned long long {
  kCountsNotTopkHistogram = 1,  // subject = expert: expert_counts[subject] = reported, topk_idx routes expected
  kAgreedRowInconsistent = 2,   // subject = source rank: its counts add up to reported (or one is < 0), not expected
  kOwnRowNotIntact = 3,         // subject = expert: the agreed area holds reported for this rank, it stored expected
};
struct DeviceStatus {
  unsigned long long bytes, remote_bytes;
  unsigned long long error;
  long long layer, subject, reported, expected;
};

__device__ void report_count_error(DeviceStatus* status, CountError code, int layer, long long subject,
                                   long long reported, long long expected) {
  if (atomicCAS(&status->error, 0ull, static_cast<unsigned long long>(code)) != 0ull) return;  // keep the first
  status->layer = layer;
  status->subject = subject;
  status->reported = reported;
  status->expected = expected;
}

// area(r)[me * N + n] = counts[n] for every rank r: this rank's row of everyone's [P][N] counts.
__global__ void exchange_counts_kernel(PeerBases peers, int ranks, size_t area_offset,
                                       const int32_t* __restrict__ counts, int me, int64_t N) {
  const int64_t total = static_cast<int64_t>(ranks) * N;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / N);
    const int64_t n = i % N;
    reinterpret_cast<int32_t*>(peers.base[r] + area_offset)[me * N + n] = counts[n];
  }
}

// Block n (an expert, owner d = n / E, local expert e = n % E), from gathered [P][N] counts:
//   before  = routes ahead of (e, me) at d: all sources of local experts < e, sources < me of e; through = routes of
//   local experts <= e at d, all sources; start = min(before, rows), kept = min(before + counts[me][n], rows) - start
//   (placement.cpp);
// the j-th route of this rank to n (in (t, k) order) gets d * rows + start + j if j < kept, else -1. When d == me the
// block also writes expert_offsets[e + 1] = min(through, rows) (and block e == 0 offsets[0] = 0). Block 0 writes -1 for
// routes whose expert is not in [0, N).
// Checks (into `status`, with `layer`): block n, that expert_counts[n] is the number of routes to n in topk_idx and that
// the agreed area holds it for this rank; block s < P, that source s's agreed counts are >= 0 and add up to `routes`
// (every rank routes T*K). Block n adds kept * route_bytes (route_payload_bytes: dispatch, then combine) to the byte
// counters.
__global__ void ep_route_index_kernel(int32_t* __restrict__ route_index, int32_t* __restrict__ expert_offsets,
                                      const int32_t* __restrict__ topk_idx, const int32_t* __restrict__ expert_counts,
                                      const int32_t* __restrict__ gathered, int64_t routes, int N, int ranks, int E,
                                      int me, int64_t rows, long long route_bytes, int layer, DeviceStatus* status) {
  const int n = blockIdx.x, d = n / E, e = n % E;
  long long before_part = 0, through_part = 0;
  const int ahead = e * ranks + me,
            through_items = (e + 1) * ranks;  // (e', s) pairs, e'-major
  for (int j = threadIdx.x; j < through_items; j += blockDim.x) {
    const int ep = j / ranks, s = j % ranks;
    const long long c = __ldcg(gathered + static_cast<int64_t>(s) * N + static_cast<int64_t>(d) * E + ep);
    through_part += c;
    if (j < ahead) before_part += c;
  }
  const long long before = cuda::route_scan::block_sum<kRouteThreads>(before_part),
                  through = cuda::route_scan::block_sum<kRouteThreads>(through_part);
  const long long mine = __ldcg(gathered + static_cast<int64_t>(me) * N + n);  // peers' stores: read at L2
  const long long start = before < rows ? before : rows;
  const long long end = before + mine < rows ? before + mine : rows;
  const long long kept = end - start;
  if (d == me && threadIdx.x == 0) {
    expert_offsets[e + 1] = static_cast<int32_t>(through < rows ? through : rows);
    if (e == 0) expert_offsets[0] = 0;
  }
  const long long first_row = static_cast<long long>(d) * rows + start;
  // routed: this rank's routes to n, what expert_counts[n] must be.
  const long long routed = cuda::route_scan::assign_expert_rows<kRouteThreads>(
      route_index, topk_idx, routes, N, n, first_row, kept, /*mark_invalid=*/n == 0);
  if (n < ranks) {  // source n's agreed row
    long long sum_part = 0, negative_part = 0;
    for (int j = threadIdx.x; j < N; j += blockDim.x) {
      const long long c = __ldcg(gathered + static_cast<int64_t>(n) * N + j);
      sum_part += c;
      negative_part += c < 0;
    }
    const long long sum = cuda::route_scan::block_sum<kRouteThreads>(sum_part),
                    negative = cuda::route_scan::block_sum<kRouteThreads>(negative_part);
    if (threadIdx.x == 0 && (negative > 0 || sum != routes))
      report_count_error(status, kAgreedRowInconsistent, layer, n, negative > 0 ? -1 : sum, routes);
  }
  if (threadIdx.x == 0) {
    const long long stored = expert_counts[n];
    if (stored != routed)
      report_count_error(status, kCountsNotTopkHistogram, layer, n, stored, routed);
    else if (mine != stored)
      report_count_error(status, kOwnRowNotIntact, layer, n, mine, stored);
    if (kept > 0) {
      const auto bytes = static_cast<unsigned long long>(kept * route_bytes);
      atomicAdd(&status->bytes, bytes);
      if (d != me) atomicAdd(&status->remote_bytes, bytes);
    }
  }
}

// A route's row in some rank's [rows, D] heap buffer at buffer_offset, or nullptr when dropped.
template <typename Elem>
__device__ __forceinline__ Elem* routed_row(const PeerBases& peers, size_t buffer_offset, int32_t v, int64_t rows,
                                            int64_t limit, int64_t D) {
  if (v < 0 || v >= limit) return nullptr;
  const int d = static_cast<int>(v / rows);
  return reinterpret_cast<Elem*>(peers.base[d] + buffer_offset) + (v % rows) * D;
}

// A route's row in its owner's heap buffer at `offset` (route_rows.cuh's Row functor): the dispatch
// stores rows there (PUT), the combine and the dispatch backward read them (GET), the combine
// backward does both.
template <typename Elem>
struct PeerRow {
  PeerBases peers;
  size_t offset;
  int64_t rows, limit, D;
  __device__ __forceinline__ Elem* operator()(int32_t v) const {
    return routed_row<std::remove_const_t<Elem>>(peers, offset, v, rows, limit, D);
  }
};

}  // namespace

CudaRowwiseDispatcher::CudaRowwiseDispatcher(Communicator& ep_group, int64_t num_experts, double capacity_factor,
                                             bool dropless)
    : PooledDispatcher("rowwise dispatcher on the GPU", ep_group.size(), ep_group.rank(), num_experts,
                       capacity_factor, dropless),
      ep_group_(ep_group) {
#if defined(MOE_HAVE_NCCL)
  MOE_CHECK(ep_group.plans_only() || dynamic_cast<NcclCommunicator*>(&untimed(ep_group)) != nullptr,
            "rowwise dispatcher on the GPU: the EP group must "
            "be an NCCL communicator (its symmetric heap is made of NCCL "
            "registered windows); got another "
            "communicator (MPI or local). Make the EP group with "
            "make_nccl_communicator");
#else
  MOE_FAIL(
      "rowwise dispatcher on the GPU: this binary was built without NCCL "
      "(ep.backend = rowwise needs it)");
#endif
  MOE_CHECK(ranks_ <= kMaxRanks, "rowwise dispatcher on the GPU: an EP group of ", ranks_, " ranks exceeds the ",
            kMaxRanks, " ranks of one NVLink domain that the kernels address (parallel.ep)");
  MOE_CHECK(num_experts <= std::numeric_limits<int32_t>::max(), "rowwise dispatcher on the GPU: ", num_experts,
            " experts do not fit I32 expert ids");
}

void CudaRowwiseDispatcher::reserve_buffers(const DispatchShape& shape, Arena& arena) {
  MOE_CHECK(arena.device() == Device::CUDA, "rowwise dispatcher on the GPU: reserve_buffers needs a CUDA arena, got a ",
            device_name(arena.device()), " one");
  MOE_CHECK(shape.dtype == DType::BF16 || shape.dtype == DType::F32,
            "rowwise dispatcher on the GPU: moves BF16 or "
            "F32 rows, got ",
            dtype_name(shape.dtype));
  dtype_ = shape.dtype;
  static_assert(sizeof(DeviceStatus) % sizeof(int64_t) == 0);
  for (int& area : count_areas_) area = layout_.reserve("counts", DType::I32, {ranks_, num_experts_});
  status_ = layout_.reserve("status", DType::I64, {static_cast<int64_t>(sizeof(DeviceStatus) / sizeof(int64_t))});
  first_buffer_offset_ = layout_.bytes();
  reserve_pools(layout_, shape, dtype_);  // dense layers get no buffers
  MOE_CHECK(static_cast<int64_t>(ranks_) * rows_ <= std::numeric_limits<int32_t>::max(), "rowwise dispatcher: ",
            ranks_, " ranks x ", rows_,
            " rows do not fit an I32 route index (lower model.capacity_factor or the tokens per microbatch)");
  // NOTES: the heap is zero-filled and every rank has registered it before make_nccl_symmetric_heap returns (a group
  // barrier), so no peer's first store can land before the owner's zero-fill: the CPU version's opening sync is done
  // inside the heap here. The zero fill also starts the status record at no bytes and no error.
  if (ep_group_.plans_only()) {  // memory planning: the heap's size, nothing allocated
    planned_heap_bytes_ = layout_.bytes();
    return;
  }
  heap_ = make_nccl_symmetric_heap(ep_group_, layout_.bytes());
  layout_.bind(heap_->local());
  peer_bases_.resize(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r)
    peer_bases_[static_cast<size_t>(r)] = static_cast<char*>(heap_->peer(heap_->local(), r));
}

size_t CudaRowwiseDispatcher::heap_offset(const Tensor& t, const char* op, const char* what) const {
  return heap_offset(t, dtype_, hidden_, op, what);
}

size_t CudaRowwiseDispatcher::heap_offset(const Tensor& t, DType dtype, int64_t cols, const char* op,
                                          const char* what) const {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher ", op, ": called before reserve_buffers");
  const char* base = static_cast<const char*>(heap_->local());
  const char* p = static_cast<const char*>(t.data);
  MOE_CHECK(t.device == Device::CUDA && p >= base + first_buffer_offset_ &&
                p + t.nbytes() <= base + heap_->bytes_per_rank(),
            "rowwise dispatcher ", op, " (rank ", ep_group_.rank(), "): ", what,
            " is not a buffer of the dispatcher's symmetric heap; pass a "
            "lease's buffers or grad_buffers()");
  MOE_CHECK(t.dtype == dtype && t.ndim() == 2 && t.dim(0) == rows_ && t.dim(1) == cols, "rowwise dispatcher ", op,
            ": ", what, " must be [", rows_, ", ", cols, "] ", dtype_name(dtype), ", got ", t.shape.str(), " ",
            dtype_name(t.dtype));
  return static_cast<size_t>(p - base);
}

void CudaRowwiseDispatcher::check_tokens(const Tensor& t, int64_t cols, DType dtype, const char* op,
                                         const char* what) const {
  MOE_CHECK(t.device == Device::CUDA && t.dtype == dtype && t.ndim() == 2 && t.dim(0) == tokens_ && t.dim(1) == cols &&
                (t.data != nullptr || t.numel() == 0),
            "rowwise dispatcher ", op, ": ", what, " must be [", tokens_, ", ", cols, "] ", dtype_name(dtype),
            " on cuda, got ", t.shape.str(), " ", dtype_name(t.dtype), " on ", device_name(t.device));
}

void CudaRowwiseDispatcher::check_call(const RoutePlan& plan, int top_k, Stream stream, const char* op) const {
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher ", op, ": called before reserve_buffers");
  MOE_CHECK(top_k == top_k_, "rowwise dispatcher ", op, ": top_k ", top_k, " does not match the planned ", top_k_);
  MOE_CHECK(plan.route_index.device == Device::CUDA && plan.route_index.dtype == DType::I32 &&
                plan.route_index.numel() == tokens_ * top_k_,
            "rowwise dispatcher ", op, ": route_index must be [", tokens_ * top_k_, "] I32 on cuda, got ",
            plan.route_index.shape.str(), " ", dtype_name(plan.route_index.dtype));
  // NOTES: heap_->sync() is queued on the compute stream; a kernel on another stream would not be ordered with it, so
  // every call runs there.
  MOE_CHECK(cuda_stream(stream) == compute_stream(), "rowwise dispatcher ", op,
            ": runs on the compute stream only "
            "(the heap's syncs are queued there); pass a null Stream");
}

void CudaRowwiseDispatcher::place_routes(int layer, const RoutePlan& plan, Tensor topk_idx, Tensor expert_counts,
                                         Stream stream) {
  constexpr const char* op = "place_routes";
  MOE_CHECK(heap_ != nullptr, "rowwise dispatcher: place_routes before reserve_buffers");
  const int P = ranks_, me = rank_;
  const int64_t N = num_experts_, E = local_experts_;
  MOE_CHECK(topk_idx.device == Device::CUDA && topk_idx.dtype == DType::I32 && topk_idx.ndim() == 2 &&
                topk_idx.dim(0) == tokens_ && topk_idx.dim(1) == top_k_,
            "rowwise dispatcher (rank ", me, "): topk_idx must be [", tokens_, ", ", top_k_, "] I32 on cuda, got ",
            topk_idx.shape.str(), " ", dtype_name(topk_idx.dtype));
  MOE_CHECK(expert_counts.device == Device::CUDA && expert_counts.dtype == DType::I32 && expert_counts.numel() == N,
            "rowwise dispatcher (rank ", me, "): expert_counts must be [", N, "] I32 on cuda, got ",
            expert_counts.shape.str(), " ", dtype_name(expert_counts.dtype));
  MOE_CHECK(plan.expert_offsets.device == Device::CUDA && plan.expert_offsets.dtype == DType::I32 &&
                plan.expert_offsets.numel() == E + 1,
            "rowwise dispatcher (rank ", me, "): expert_offsets must be [", E + 1,
            "] I32 on cuda (local experts + 1), got ", plan.expert_offsets.shape.str());
  check_call(plan, static_cast<int>(top_k_), stream, op);
  const cudaStream_t s = compute_stream();
  const PeerBases peers = peer_table(peer_bases_);
  // NOTES: two count areas used in turn. A rank stores into area a while a peer may still be reading area a of an
  // earlier placement; with alternation the last reads of area a came before the previous placement's sync, which we
  // have passed, so they are finished. (In a captured step replayed back to back, a step with an odd number of
  // placements meets the same area twice in a row across the replay boundary; any dispatch in between, whose sync
  // follows the placement, keeps it safe, and every MoE layer dispatches after placing its routes.)
  const size_t area = layout_.offset(count_areas_[placements_++ % 2]);
  const int64_t pairs = static_cast<int64_t>(P) * N;
  exchange_counts_kernel<<<grid_for((pairs + kMaxThreads - 1) / kMaxThreads), kMaxThreads, 0, s>>>(
      peers, P, area, expert_counts.i32(), me, N);
  CUDA_CHECK_LAUNCH();
  // NOTES: every rank's count row must have landed in our area before we place routes from it.
  heap_->sync();
  const auto* gathered = reinterpret_cast<const int32_t*>(static_cast<const char*>(heap_->local()) + area);
  auto* status = static_cast<DeviceStatus*>(layout_.get(status_).data);
  ep_route_index_kernel<<<static_cast<unsigned>(N), kRouteThreads, 0, s>>>(
      plan.route_index.i32(), plan.expert_offsets.i32(), topk_idx.i32(), expert_counts.i32(), gathered,
      tokens_ * top_k_, static_cast<int>(N), P, static_cast<int>(E), me, rows_,
      static_cast<long long>(route_payload_bytes(hidden_, dtype_, payload_)), layer, status);
  CUDA_CHECK_LAUNCH();
}

void CudaRowwiseDispatcher::check_after_step() {
  if (heap_ == nullptr) return;  // nothing reserved, nothing ran
  const Tensor record = layout_.get(status_);
  DeviceStatus st{};
  copy_from_tensor(&st, record);
  set_moved(static_cast<int64_t>(st.bytes), static_cast<int64_t>(st.remote_bytes));
  if (st.error == 0) return;
  // Cleared first, so that a caller who handles the error sees later checks afresh.
  DeviceStatus cleared{};
  cleared.bytes = st.bytes, cleared.remote_bytes = st.remote_bytes;
  copy_to_tensor(record, &cleared);
  const char* fix = "; the counts handed to place_routes must be route_counts of the same topk_idx. Found on the "
                    "device during the step, so that step's results are not valid";
  switch (st.error) {
    case kCountsNotTopkHistogram:
      MOE_FAIL("rowwise dispatcher on the GPU (rank ", rank_, "), MoE layer ", st.layer, ": expert_counts[", st.subject,
               "] = ", st.reported, " but topk_idx routes ", st.expected, " tokens to expert ", st.subject, fix);
    case kAgreedRowInconsistent:
      MOE_FAIL("rowwise dispatcher on the GPU (rank ", rank_, "), MoE layer ", st.layer, ": the agreed counts of rank ",
               st.subject, st.reported < 0 ? " include a negative count" : " add up to ",
               st.reported < 0 ? std::string() : std::to_string(st.reported), " routes where every rank routes T*K = ",
               st.expected, fix);
    case kOwnRowNotIntact:
      MOE_FAIL("rowwise dispatcher on the GPU (rank ", rank_, "), MoE layer ", st.layer,
               ": the agreed count area holds ", st.reported, " routes of this rank to expert ", st.subject,
               " where it stored ", st.expected, " (the count exchange or its sync went wrong)");
    default:
      MOE_FAIL("rowwise dispatcher on the GPU (rank ", rank_, "): unknown device error code ", st.error,
               " in the status record");
  }
}

void CudaRowwiseDispatcher::sum_peer_routes(Tensor out, const Tensor& expert_rows, size_t rows_offset,
                                            const float* weights, bool accumulate, const RoutePlan& plan, int top_k) {
  if (tokens_ == 0 || hidden_ == 0) return;
  const int64_t P = ep_group_.size();
  const PeerBases peers = peer_table(peer_bases_);
  const cudaStream_t s = compute_stream();
  with_vec_width(dtype_, hidden_, {out.data, peer_bases_[0], expert_rows.data}, [&](auto row_type) {
    using Elem = typename decltype(row_type)::elem;
    constexpr int V = decltype(row_type)::width;
    cuda::route_rows::launch_sum_routes<Elem, V>(
        static_cast<Elem*>(out.data), PeerRow<const Elem>{peers, rows_offset, rows_, P * rows_, hidden_}, weights,
        accumulate, plan.route_index.i32(), top_k, tokens_, hidden_, s);
  });
  CUDA_CHECK_LAUNCH();
}

void CudaRowwiseDispatcher::dispatch(Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k, Stream stream) {
  constexpr const char* op = "dispatch";
  check_call(plan, top_k, stream, op);
  const size_t in_offset = heap_offset(expert_in, op, "expert_in");
  check_tokens(x, hidden_, dtype_, op, "x");
  // NOTES: no sync before the PUTs. The rows we overwrite in a peer's expert_in were last read by that peer's expert
  // GEMMs (forward, the weight gradient or a recompute in backward) of the lease's previous holder (of the recompute
  // pair: the layer that used it last); the peer finished those reads (stream order) before its barrier kernel of a
  // later sync (the opening sync of combine or of dispatch_backward) that we have passed too.
  const int64_t routes = tokens_ * top_k_, P = ep_group_.size();
  if (routes > 0 && hidden_ > 0) {
    const PeerBases peers = peer_table(peer_bases_);
    const cudaStream_t s = compute_stream();
    with_vec_width(dtype_, hidden_, {x.data, peer_bases_[0], expert_in.data}, [&](auto row_type) {
      using Elem = typename decltype(row_type)::elem;
      constexpr int V = decltype(row_type)::width;
      cuda::route_rows::launch_scatter_routes<Elem, V>(static_cast<const Elem*>(x.data),
                                                       PeerRow<Elem>{peers, in_offset, rows_, P * rows_, hidden_},
                                                       plan.route_index.i32(), top_k, tokens_, hidden_, s);
    });
    CUDA_CHECK_LAUNCH();
  }
  // NOTES: the owners' expert GEMMs read expert_in next; this sync completes every rank's PUTs (each kept row has
  // exactly one writer) before any owner reads.
  heap_->sync();
}

void CudaRowwiseDispatcher::dispatch_fp8(Fp8Tensor expert_in, Tensor x, const RoutePlan& plan, int top_k,
                                         Stream stream) {
  constexpr const char* op = "dispatch_fp8";
  check_call(plan, top_k, stream, op);
  check_fp8_expert_rows(expert_in, op);
  const int64_t tiles = expert_in.scales.dim(1);
  const size_t codes_offset = heap_offset(expert_in.codes, DType::FP8_E4M3, hidden_, op, "expert_in codes");
  const size_t scales_offset = heap_offset(expert_in.scales, DType::F32, tiles, op, "expert_in scales");
  check_tokens(x, hidden_, dtype_, op, "x");
  // NOTES: no sync before the PUTs, for the reason dispatch gives: the rows' last readers (the owners' expert GEMMs and
  // their weight gradient's dequantize) finished before a sync we have passed.
  const int64_t routes = tokens_ * top_k_, P = ep_group_.size();
  if (routes > 0 && hidden_ > 0) {
    const PeerBases peers = peer_table(peer_bases_);
    // Heap buffers start on 256-byte boundaries, so a codes row starts 4-byte aligned when D is a multiple of 4.
    const bool word_stores = hidden_ % 4 == 0 && codes_offset % 4 == 0;
    auto launch = [&](auto elem) {
      using Elem = decltype(elem);
      cuda::route_rows::launch_scatter_routes_fp8<Elem>(
          static_cast<const Elem*>(x.data), PeerRow<uint8_t>{peers, codes_offset, rows_, P * rows_, hidden_},
          PeerRow<float>{peers, scales_offset, rows_, P * rows_, tiles}, plan.route_index.i32(), top_k, tokens_,
          hidden_, word_stores, compute_stream());
    };
    if (dtype_ == DType::BF16)
      launch(__nv_bfloat16{});
    else
      launch(float{});
    CUDA_CHECK_LAUNCH();
  }
  // NOTES: the owners' expert GEMMs read expert_in next; this sync completes every rank's PUTs first.
  heap_->sync();
}

void CudaRowwiseDispatcher::combine(Tensor out, Tensor expert_out, Tensor weights, const RoutePlan& plan, int top_k,
                                    Stream stream) {
  constexpr const char* op = "combine";
  check_call(plan, top_k, stream, op);
  const size_t out_offset = heap_offset(expert_out, op, "expert_out");
  check_tokens(out, hidden_, dtype_, op, "out");
  check_tokens(weights, top_k_, DType::F32, op, "weights");
  // NOTES: every owner must have finished writing expert_out (its down-projection GEMM) before we load from it. No
  // closing sync: an owner writes this slot's expert_out again only after the dispatch sync of a later use of the slot,
  // which we enter only after these loads (stream order).
  heap_->sync();
  sum_peer_routes(out, expert_out, out_offset, weights.f32(), /*accumulate=*/true, plan, top_k);
}

void CudaRowwiseDispatcher::combine_backward(Tensor d_expert_out, Tensor dweights, Tensor dout, Tensor expert_out,
                                             Tensor weights, const RoutePlan& plan, int top_k, Stream stream) {
  constexpr const char* op = "combine_backward";
  check_call(plan, top_k, stream, op);
  const size_t dy_offset = heap_offset(d_expert_out, op, "d_expert_out");
  const size_t y_offset = heap_offset(expert_out, op, "expert_out");
  check_tokens(dout, hidden_, dtype_, op, "dout");
  check_tokens(weights, top_k_, DType::F32, op, "weights");
  check_tokens(dweights, top_k_, DType::F32, op, "dweights");
  // NOTES: no opening sync for a lease. (1) The d_expert_out rows we store into were last read by the owner's expert
  // GEMMs of the previous MoE backward, which precede that backward's dispatch_backward syncs, which we have passed.
  // (2) expert_out (GET, for dweights) was completed before the combine sync of this lease's forward; the lease keeps
  // it from being overwritten. The recompute pair's expert_out is different: the owner has just rewritten it (the
  // recomputed down projection, after the re-dispatch sync), so every owner must finish that before we load.
  if (is_recompute_buffer(expert_out)) heap_->sync();
  if (tokens_ > 0) {
    const int64_t P = ep_group_.size();
    const PeerBases peers = peer_table(peer_bases_);
    const cudaStream_t s = compute_stream();
    // D == 0 still runs: dweights are written (all zeros).
    with_vec_width(dtype_, hidden_, {dout.data, peer_bases_[0], d_expert_out.data, expert_out.data}, [&](auto row_type) {
      using Elem = typename decltype(row_type)::elem;
      constexpr int V = decltype(row_type)::width;
      cuda::route_rows::launch_combine_backward<Elem, V>(
          dweights.f32(), static_cast<const Elem*>(dout.data), weights.f32(),
          PeerRow<const Elem>{peers, y_offset, rows_, P * rows_, hidden_},
          PeerRow<Elem>{peers, dy_offset, rows_, P * rows_, hidden_}, plan.route_index.i32(), top_k, tokens_, hidden_,
          s);
    });
    CUDA_CHECK_LAUNCH();
  }
  // NOTES: the owners' GEMMs read d_expert_out next; complete every rank's PUTs first.
  heap_->sync();
}

void CudaRowwiseDispatcher::dispatch_backward(Tensor dx, Tensor d_expert_in, const RoutePlan& plan, int top_k,
                                              Stream stream) {
  constexpr const char* op = "dispatch_backward";
  check_call(plan, top_k, stream, op);
  const size_t in_offset = heap_offset(d_expert_in, op, "d_expert_in");
  check_tokens(dx, hidden_, dtype_, op, "dx");
  // NOTES: every owner must have finished writing d_expert_in (its data-gradient GEMM) before we load from it.
  heap_->sync();
  sum_peer_routes(dx, d_expert_in, in_offset, /*weights=*/nullptr, /*accumulate=*/false, plan, top_k);
  // NOTES: once we return, the owner may write d_expert_in again (the next MoE layer's backward, or any caller's use of
  // grad_buffers()); this sync keeps that write behind every rank's loads.
  heap_->sync();
}

}  // namespace moe
