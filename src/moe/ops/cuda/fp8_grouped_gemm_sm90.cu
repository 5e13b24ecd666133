// fp8_grouped_gemm_sm90.h: the FP8 expert product c = a * b[e]^T -> BF16 as a persistent,
// warp-specialized SM90 kernel of our own (forty-second session), on CuTe's WGMMA and TMA
// primitives and CUTLASS's mbarrier wrappers.
//
// Layout of the work. Output tiles are 128 rows x 128 columns of one expert; the experts' rows are
// one array, so a tile is (expert e, its m-th 128-row block, the n-th 128-column block) and the
// tiles are numbered expert by expert, m-block by m-block, n fastest. A grid of one CTA per SM walks
// them with a stride of the grid (TileWalk); each CTA first reads the device offsets and prefix-sums
// the experts' m-blocks into shared memory, so nothing about the routing reaches the host.
//
// Roles (384 threads): warp 0 is the producer. Per 128-deep K block it waits for a free stage,
// then one lane issues the two TMA loads (A: 128 rows x 128 codes of the activations; B: 128 rows
// of b[e] x 128 codes, from one tensor map over [E * n_out, k_in]) and every lane copies four of
// the tile's 128 row scales with cp.async (plus lane 0 the weight block's scale); the stage's full
// barrier completes when the TMA bytes have landed and all 32 lanes' copies have (33 arrivals: one
// arrive_and_expect_tx, 32 cp.async.mbarrier.arrive.noinc). Warps 4-11 are two math warp groups of
// 64 rows each: per stage four m64n128k32 WGMMAs into a temporary accumulator, wait, release the
// stage, then promote (acc += tmp * row scale * block scale: the DeepSeek-V3 recipe's FP32
// promotion once per 128-deep slice). The two groups' MMAs interleave on the tensor cores, so one
// group's promotion hides under the other's products.
//
// Epilogue. A tile whose 128 rows all belong to its expert is converted to BF16 into a 128-byte
// swizzled shared buffer (conflict-free writes from the accumulator layout) and leaves by two TMA
// stores per group (64 x 64 boxes), which run while the group starts the next tile; the buffer is
// reused only after the previous stores have read it (cp.async.bulk.wait_group.read). A tile that
// ends inside its expert is stored from the registers, masked to the expert's rows (a TMA box would
// write the next expert's rows). Columns at or past n_out are never stored (TMA clips them; the
// masked path checks them). Rows past an expert are loaded and computed, not stored; boxes past
// the arrays read TMA's zeros.
#if defined(MOE_HAVE_CUTLASS)
#include "moe/ops/cuda/fp8_grouped_gemm_sm90.h"

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "cute/arch/cluster_sm90.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "moe/core/cuda_check.h"
#include "moe/core/error.h"

namespace moe::cuda::sm90_fp8 {
namespace {

constexpr int kTile = 128;      // BM = BN = BK = the scale block
constexpr int kMathGroups = 2;  // 64 rows each
constexpr int kThreads = 128 * (1 + kMathGroups);
constexpr int kOperandBytes = kTile * kTile;  // one 128 x 128 tile of E4M3 codes
constexpr int kStoreBoxBytes = 64 * 128;      // 64 rows x 64 BF16: one 128-byte-swizzled TMA box

// Shared memory, from a 1024-byte aligned base (128-byte swizzle atoms are 1024 bytes). Two
// pipeline depths: 5 stages beside a store buffer of both of a group's 64-column boxes (32 KB), or
// 6 stages beside one box per group (16 KB), the second box written once the first has been read.
template <int kStages>
struct Smem {
  static constexpr int kStoreBoxes = kStages >= 6 ? 1 : 2;  // boxes per math group's store buffer
  static constexpr int kStoreGroupBytes = kStoreBoxes * kStoreBoxBytes;
  static constexpr int kOffA = 0;
  static constexpr int kOffB = kOffA + kStages * kOperandBytes;
  static constexpr int kOffStore = kOffB + kStages * kOperandBytes;
  static constexpr int kOffRowScales = kOffStore + kMathGroups * kStoreGroupBytes;
  static constexpr int kOffBlockScales = kOffRowScales + kStages * kTile * 4;
  static constexpr int kOffBarriers = kOffBlockScales + ((kStages * 4 + 15) / 16) * 16;
  static constexpr int kOffTables = kOffBarriers + 2 * kStages * 8;
  static size_t bytes(int groups) {
    // The tables: the clamped offsets and the m-block prefix, groups + 1 ints each.
    return static_cast<size_t>(kOffTables) + 2 * 4 * static_cast<size_t>(groups + 1);
  }
};
static_assert(Smem<6>::kOffTables + 2 * 4 * 1025 <= 227 * 1024, "6 stages fit with 1024 groups");

struct Params {
  const float* a_scales;  // [rows, k_blocks]
  const float* b_scales;  // [groups, n_blocks, k_blocks]
  __nv_bfloat16* c;       // [rows, n_out]
  const int32_t* offsets;
  int groups, rows, n_out, k_blocks, n_blocks;
};

// One tile of the walk. n_block may be n_blocks (past the output) for the second CTA of a cluster
// when n_blocks is odd: that tile is computed on the last real block's operands and not stored.
struct Tile {
  int e, m0, valid_rows, n_block;
};

// The tiles a CTA takes. Work units are (m-block, group of kCluster adjacent n-blocks), numbered
// expert by expert; a cluster takes units u = cluster index, + clusters, ..., and its CTA of rank r
// the unit's r-th n-block, so the CTAs of a cluster always share the m-block (the A tile they
// multicast). The expert cursor only moves forward, as u does.
struct TileWalk {
  const int* lo;                            // clamped offsets [groups + 1]
  const int* prefix;                        // m-blocks before expert e [groups + 1]
  int groups, slots, cluster, rank, e = 0;  // slots: units per m-block
  __device__ __forceinline__ bool at(int u, Tile& tile) {
    const int mb = u / slots;
    if (mb >= prefix[groups]) return false;
    while (prefix[e + 1] <= mb) ++e;
    tile.e = e;
    tile.m0 = lo[e] + (mb - prefix[e]) * kTile;
    tile.valid_rows = min(kTile, max(lo[e + 1], lo[e]) - tile.m0);
    tile.n_block = (u - mb * slots) * cluster + rank;
    return true;
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// A 128-byte-swizzled, K-major WGMMA operand descriptor: rows of 128 bytes, 8-row groups 1024 bytes
// apart (the leading-byte offset is unused for swizzled K-major layouts).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1024 >> 4) << 32) |
         (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, uint64_t* bar, void* dst, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(x), "r"(y)
      : "memory");
}

// 4 bytes global -> shared, zero-filled when src_bytes is 0.
// The A tile's rows [64 rank, 64 rank + 64) into the same offset of both CTAs of a 2-CTA cluster,
// completing bytes on each CTA's barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(const CUtensorMap* map, uint64_t* bar, void* dst, int x, int y) {
  const uint16_t both = 0x3;
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%4, "
      "%5}], [%2], %3;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(both), "r"(x), "r"(y)
      : "memory");
}

__device__ __forceinline__ void cp_async_4(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}

// The barrier counts one arrival when all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Named barrier 1 + group over the group's 128 threads (immediate ids: a register id makes ptxas
// reserve all 16).
__device__ __forceinline__ void group_sync(int group) {
  if (group == 0)
    asm volatile("bar.sync 1, 128;" ::: "memory");
  else
    asm volatile("bar.sync 2, 128;" ::: "memory");
}

// mbarrier waits and arrivals with "memory" clobbers (CUTLASS's wrappers have none), so the compiler
// cannot move the shared-memory reads of a stage across them.
__device__ __forceinline__ void wait_barrier(uint64_t* bar, int phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
}

__device__ __forceinline__ void arrive_barrier(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// An arrival on the other CTA's barrier at the same shared-memory offset.
__device__ __forceinline__ void arrive_peer_barrier(uint64_t* bar, uint32_t peer) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(peer)
      : "memory");
}

__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}

template <size_t... I>
__device__ __forceinline__ void wgmma_64x128x32(uint64_t da, uint64_t db, float (&d)[64], cute::SM90::GMMA::ScaleOut s,
                                                std::index_sequence<I...>) {
  cute::SM90::GMMA::MMA_64x128x32_F32E4M3E4M3_SS_TN<>::fma(da, db, d[I]..., s);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// kCluster 1: one CTA per tile; 2: clusters of two CTAs on adjacent n-blocks of one m-block, each
// loading half of the A tile for both (TMA multicast), so A crosses L2 once per pair.
template <int kCluster, int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_nt_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                  const __grid_constant__ CUtensorMap map_c, const Params p) {
  using L = Smem<kStages>;
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* const a_tiles = smem + L::kOffA;
  uint8_t* const b_tiles = smem + L::kOffB;
  float* const row_scales = reinterpret_cast<float*>(smem + L::kOffRowScales);
  float* const block_scales = reinterpret_cast<float*>(smem + L::kOffBlockScales);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + L::kOffBarriers);
  uint64_t* const empty = full + kStages;
  int* const lo = reinterpret_cast<int*>(smem + L::kOffTables);
  int* const prefix = lo + p.groups + 1;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    if (smem_addr(smem) % 1024 != 0) __trap();  // the swizzle atoms (and so the descriptors) need it
    for (int s = 0; s < kStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 1 + 32);
      // One arrival per math warp of each CTA that writes the stage (multicast: both).
      cutlass::arch::ClusterBarrier::init(&empty[s], kMathGroups * 4 * kCluster);
    }
    cutlass::arch::fence_barrier_init();
  }
  // The tables: clamped offsets, then warp 0 scans the experts' m-block counts 32 at a time.
  for (int e = threadIdx.x; e <= p.groups; e += kThreads) lo[e] = min(max(p.offsets[e], 0), p.rows);
  __syncthreads();
  if (warp == 0) {
    int carry = 0;
    for (int base = 0; base < p.groups; base += 32) {
      const int e = base + lane;
      const int count = e < p.groups ? (max(lo[e + 1] - lo[e], 0) + kTile - 1) / kTile : 0;
      int inclusive = count;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= d) inclusive += v;
      }
      if (e < p.groups) prefix[e] = carry + inclusive - count;
      carry += __shfl_sync(0xffffffffu, inclusive, 31);
    }
    if (lane == 0) prefix[p.groups] = carry;
  }
  __syncthreads();
  // The peer's barriers are initialized before any multicast or remote arrival reaches them.
  if constexpr (kCluster > 1) cute::cluster_sync();

  const int rank = kCluster > 1 ? static_cast<int>(cute::block_rank_in_cluster()) : 0;
  const int unit0 = blockIdx.x / kCluster, units = gridDim.x / kCluster;
  TileWalk walk{lo, prefix, p.groups, (p.n_blocks + kCluster - 1) / kCluster, kCluster, rank};
  Tile tile;
  if (warp == 0) {
    // Producer.
    int stage = 0, phase = 0;
    for (int u = unit0; walk.at(u, tile); u += units) {
      const int n_block = min(tile.n_block, p.n_blocks - 1);  // a tile past the output computes on the last
      const int b_row = tile.e * p.n_out + n_block * kTile;
      const float* block_scale = p.b_scales + (static_cast<int64_t>(tile.e) * p.n_blocks + n_block) * p.k_blocks;
      for (int kb = 0; kb < p.k_blocks; ++kb) {
        wait_barrier(&empty[stage], phase ^ 1);
        if (lane == 0) {
          arrive_expect_tx(&full[stage], 2 * kOperandBytes);
          if constexpr (kCluster > 1)
            tma_load_2d_multicast(&map_a, &full[stage], a_tiles + stage * kOperandBytes + rank * 64 * kTile, kb * kTile,
                                  tile.m0 + 64 * rank);
          else
            tma_load_2d(&map_a, &full[stage], a_tiles + stage * kOperandBytes, kb * kTile, tile.m0);
          tma_load_2d(&map_b, &full[stage], b_tiles + stage * kOperandBytes, kb * kTile, b_row);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = tile.m0 + lane + 32 * i;
          const int src_row = min(r, p.rows - 1);
          cp_async_4(&row_scales[stage * kTile + lane + 32 * i],
                     p.a_scales + static_cast<int64_t>(src_row) * p.k_blocks + kb, r < p.rows ? 4 : 0);
        }
        if (lane == 0) cp_async_4(&block_scales[stage], block_scale + kb, 4);
        cp_async_arrive_noinc(&full[stage]);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // the last scale copies land before the warp exits
    return;
  }
  if (warp < 4) return;  // the rest of the producer warp group

  // Math warp groups.
  const int group = warp / 4 - 1, warp_in_group = warp % 4;
  const int r0 = warp_in_group * 16 + lane / 4;  // this thread's rows r0 and r0 + 8 of the group's 64
  const int quad = lane % 4;
  uint8_t* const store_buf = smem + L::kOffStore + group * L::kStoreGroupBytes;
  const bool store_thread = threadIdx.x % 128 == 0;
  int stage = 0, phase = 0;
  for (int u = unit0; walk.at(u, tile); u += units) {
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
    for (int kb = 0; kb < p.k_blocks; ++kb) {
      wait_barrier(&full[stage], phase);
      float tmp[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(tmp[i]);
      cute::warpgroup_arrive();
      const uint32_t a_addr = smem_addr(a_tiles + stage * kOperandBytes + group * 64 * kTile);
      const uint32_t b_addr = smem_addr(b_tiles + stage * kOperandBytes);
#pragma unroll
      for (int k = 0; k < kTile / 32; ++k) {
        wgmma_64x128x32(sw128_desc(a_addr + 32 * k), sw128_desc(b_addr + 32 * k), tmp,
                        k == 0 ? cute::SM90::GMMA::ScaleOut::Zero : cute::SM90::GMMA::ScaleOut::One,
                        std::make_index_sequence<64>{});
      }
      cute::warpgroup_commit_batch();
      const float bs = block_scales[stage];
      const float s0 = row_scales[stage * kTile + group * 64 + r0] * bs;
      const float s1 = row_scales[stage * kTile + group * 64 + r0 + 8] * bs;
      cute::warpgroup_wait<0>();
#pragma unroll
      for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(tmp[i]);
      __syncwarp();
      if (lane == 0) {
        arrive_barrier(&empty[stage]);
        if constexpr (kCluster > 1) arrive_peer_barrier(&empty[stage], rank ^ 1);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        acc[4 * j + 0] = fmaf(tmp[4 * j + 0], s0, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(tmp[4 * j + 1], s0, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(tmp[4 * j + 2], s1, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(tmp[4 * j + 3], s1, acc[4 * j + 3]);
      }
      if (++stage == kStages) stage = 0, phase ^= 1;
    }

    const int n0 = tile.n_block * kTile;
    const int row0 = tile.m0 + group * 64;
    if (n0 >= p.n_out) continue;  // the second CTA's tile past the output: computed, not stored
    if (tile.valid_rows == kTile) {
      // Each pass writes kStoreBoxes 64-column boxes into the group's buffer and stores them by TMA;
      // the buffer is free once the previous pass's (or tile's) stores have read it.
#pragma unroll
      for (int pass = 0; pass < 2 / L::kStoreBoxes; ++pass) {
        if (pass > 0 && n0 + 64 * pass >= p.n_out) break;  // the second box lies past the output
        if (store_thread) cute::tma_store_wait<0>();
        group_sync(group);
#pragma unroll
        for (int jj = 0; jj < 8 * L::kStoreBoxes; ++jj) {
          const int j = pass * 8 + jj, chunk = j % 8;
          uint8_t* box = store_buf + (jj / 8) * kStoreBoxBytes;
          // Row r's 16-byte chunk c sits at chunk c ^ (r % 8) (TMA's 128-byte swizzle); r0 % 8 = lane / 4.
          *reinterpret_cast<uint32_t*>(box + r0 * 128 + ((chunk ^ (r0 % 8)) * 16) + quad * 4) =
              pack_bf16(acc[4 * j + 0], acc[4 * j + 1]);
          *reinterpret_cast<uint32_t*>(box + (r0 + 8) * 128 + ((chunk ^ ((r0 + 8) % 8)) * 16) + quad * 4) =
              pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
        }
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the writes, visible to the TMA store
        group_sync(group);
        if (store_thread) {
#pragma unroll
          for (int b = 0; b < L::kStoreBoxes; ++b) {
            const int col = n0 + 64 * (pass + b);
            if (b == 0 || col < p.n_out) cute::SM90_TMA_STORE_2D::copy(&map_c, store_buf + b * kStoreBoxBytes, col, row0);
          }
          cute::tma_store_arrive();
        }
      }
    } else {
      const int row_end = tile.m0 + tile.valid_rows;
      const int ra = row0 + r0, rb = row0 + r0 + 8;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int col = n0 + 8 * j + 2 * quad;
        if (col >= p.n_out) continue;
        if (ra < row_end)
          *reinterpret_cast<uint32_t*>(p.c + static_cast<int64_t>(ra) * p.n_out + col) =
              pack_bf16(acc[4 * j + 0], acc[4 * j + 1]);
        if (rb < row_end)
          *reinterpret_cast<uint32_t*>(p.c + static_cast<int64_t>(rb) * p.n_out + col) =
              pack_bf16(acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }
  if (store_thread) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  // Neither CTA leaves while the other may still arrive on its empty barriers (the producer and idle
  // warps have exited; the cluster barrier waits for the threads that have not).
  if constexpr (kCluster > 1) cute::cluster_sync();
}

// A 2D tensor map over a row-major [height, width] array of `elem_bytes` elements with 128-byte
// swizzled boxes of box_h rows x box_w elements.
CUtensorMap tensor_map(const void* base, CUtensorMapDataType type, int elem_bytes, uint64_t width, uint64_t height,
                       uint32_t box_w, uint32_t box_h, const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {width, height};
  const cuuint64_t strides[1] = {width * static_cast<uint64_t>(elem_bytes)};
  const cuuint32_t box[2] = {box_w, box_h};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = cutlass::call_cuTensorMapEncodeTiled(
      &map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MOE_CHECK(r == CUDA_SUCCESS, "fp8_grouped_matmul (SM90): cuTensorMapEncodeTiled failed for ", what, " (CUresult ",
            static_cast<int>(r), ")");
  return map;
}

int sm_count() {
  int device = 0, count = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

// MOE_SM90_CLUSTER=2 runs 2-CTA clusters that multicast A (the faster form at K = 2048, forty-third
// session); otherwise one CTA per tile, launched without cluster attributes. Read at every call, as
// MOE_FP8_NT_KERNEL is.
int cluster_size() { return env_switch("MOE_SM90_CLUSTER", "1", "2") ? 2 : 1; }

// MOE_SM90_STAGES=6 runs 6 pipeline stages beside a 16 KB store buffer (the tile's two 64-column
// boxes written one after the other); otherwise 5 stages beside a 32 KB one. Read at every call.
int stage_count() { return env_switch("MOE_SM90_STAGES", "5", "6") ? 6 : 5; }

// What prepare_fp8_nt_bf16 found: an error that keeps the kernel from running (empty if none), and
// how many 2-CTA clusters fit on the GPU at once for 5 and 6 stages (0: the 2-CTA form falls back to
// one CTA per tile).
std::string prepare_error;
int max_active_pairs[2] = {0, 0};

cudaLaunchConfig_t pair_launch_config(int grid, size_t smem, cudaStream_t stream, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(grid));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = 2;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return config;
}

template <int kStages>
void launch(int cluster, const CUtensorMap& map_a, const CUtensorMap& map_b, const CUtensorMap& map_c, const Params& p,
            int64_t max_m_blocks, cudaStream_t stream) {
  const size_t smem = Smem<kStages>::bytes(p.groups);
  if (cluster == 2) {
    cudaLaunchAttribute attr;
    const int64_t max_units = max_m_blocks * ((p.n_blocks + 1) / 2);
    const int grid = 2 * static_cast<int>(std::min<int64_t>(max_active_pairs[kStages - 5], max_units));
    const cudaLaunchConfig_t config = pair_launch_config(grid, smem, stream, &attr);
    CUDA_CHECK(cudaLaunchKernelEx(&config, fp8_nt_kernel<2, kStages>, map_a, map_b, map_c, p));
  } else {
    static const int sms = sm_count();
    const int grid = static_cast<int>(std::min<int64_t>(sms, max_m_blocks * p.n_blocks));
    fp8_nt_kernel<1, kStages><<<grid, kThreads, smem, stream>>>(map_a, map_b, map_c, p);
    CUDA_CHECK_LAUNCH();
  }
}

// Reserves the shared memory of both launch forms at kStages and counts the 2-CTA clusters that fit.
template <int kStages>
void prepare_stages() {
  const int smem = static_cast<int>(Smem<kStages>::bytes(cutlass_grouped::kMaxGroups));
  for (const void* kernel : {reinterpret_cast<const void*>(fp8_nt_kernel<1, kStages>),
                             reinterpret_cast<const void*>(fp8_nt_kernel<2, kStages>)}) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: the default (CUTLASS) path must not see it
      prepare_error = std::string("cannot reserve its shared memory: ") + cudaGetErrorString(e);
      return;
    }
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t config = pair_launch_config(2 * sm_count(), smem, nullptr, &attr);
  if (cudaOccupancyMaxActiveClusters(&max_active_pairs[kStages - 5], fp8_nt_kernel<2, kStages>, &config) !=
      cudaSuccess) {
    cudaGetLastError();
    max_active_pairs[kStages - 5] = 0;  // the 2-CTA form runs as one CTA per tile
  }
}

}  // namespace

bool env_switch(const char* name, const char* default_value, const char* other_value) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0' || std::strcmp(v, default_value) == 0) return false;
  MOE_CHECK(std::strcmp(v, other_value) == 0, name, " = '", v, "' is not accepted: use ", default_value,
            " (the default) or ", other_value);
  return true;
}

void fp8_matmul_nt_bf16(void* c, cutlass_grouped::Fp8Operand a, cutlass_grouped::Fp8Operand b, const int32_t* offsets,
                        int groups, int64_t rows, int n_out, int k_in, cudaStream_t stream) {
  const char* op = "fp8_grouped_matmul (SM90)";
  MOE_CHECK(prepare_error.empty(), op, ": ", prepare_error);
  MOE_CHECK(groups >= 1 && groups <= cutlass_grouped::kMaxGroups, op, ": ", groups, " groups, expected 1..",
            cutlass_grouped::kMaxGroups);
  MOE_CHECK(static_cast<int64_t>(groups) * n_out <= INT32_MAX, op, ": ", groups, " x ", n_out,
            " weight rows exceed 2^31 - 1 (TMA coordinates are int)");
  const int k_blocks = (k_in + kTile - 1) / kTile, n_blocks = (n_out + kTile - 1) / kTile;
  // Pairs only where a unit has two real n-blocks to share A between, and where clusters fit.
  const int stages = stage_count();
  const int cluster = cluster_size() == 2 && n_blocks >= 2 && max_active_pairs[stages - 5] > 0 ? 2 : 1;
  const CUtensorMap map_a = tensor_map(a.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, static_cast<uint64_t>(k_in),
                                       static_cast<uint64_t>(rows), kTile, kTile / cluster, "a");
  const CUtensorMap map_b = tensor_map(b.codes, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, static_cast<uint64_t>(k_in),
                                       static_cast<uint64_t>(groups) * n_out, kTile, kTile, "b");
  const CUtensorMap map_c = tensor_map(c, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, static_cast<uint64_t>(n_out),
                                       static_cast<uint64_t>(rows), 64, 64, "c");
  const Params p{a.scales, b.scales, static_cast<__nv_bfloat16*>(c), offsets, groups, static_cast<int>(rows), n_out,
                 k_blocks, n_blocks};
  // At most rows / 128 + groups m-blocks (each expert adds at most one partial block).
  const int64_t max_m_blocks = rows / kTile + groups;
  if (stages == 6)
    launch<6>(cluster, map_a, map_b, map_c, p, max_m_blocks, stream);
  else
    launch<5>(cluster, map_a, map_b, map_c, p, max_m_blocks, stream);
}

// Runs with the CUTLASS kernels' preparation on every FP8 start, whichever kernel is chosen, so it
// never throws: a failure is kept and reported only if this kernel is asked to run.
void prepare_fp8_nt_bf16() {
  prepare_stages<5>();
  if (prepare_error.empty()) prepare_stages<6>();
}

}  // namespace moe::cuda::sm90_fp8
#endif
