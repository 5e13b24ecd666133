// CUDA FP8 ops (moe/ops/fp8.h) against the CPU ops. Quantize: rows, the segmented transposed
// columns layout (empty segments, padding columns, padding tiles) and blocks in both orientations,
// F32 and BF16 inputs, partial tiles, unaligned inputs, zero / NaN / infinity tiles, magnitudes
// from FP32 subnormals to 3e38: codes and scales bit for bit (GPU outputs start poisoned, so every
// element must be written). Dequantize: equal values (NaN where the CPU has NaN).
// fp8_matmul (cuBLASLt block-scaled FP8) for the three products of a linear layer: forward x W^T
// (W Blocks), data gradient dY W (W's transposed Blocks cache), weight gradient dY_t X_t^T (both
// Rows-tiled columns operands, F32 accumulated into an existing gradient), at M = 4096 tokens,
// K = 2048, N = 1024 and smaller shapes with partial blocks and unpadded block-scale rows. The
// reference is the CPU's exact emulation on the GPU's own operands (dequantized exactly, FP32
// sgemm). Tolerance per element, S = sum_k |a_ik| |b_jk| over the dequantized operands:
//   F32 c:   |gpu - cpu| <= 2^-11 S + 2^-9 |cpu|      (Hopper's FP8 tensor cores keep only 13-14 bits
//            of each 128-deep partial sum before cuBLAS promotes it to FP32, as DeepSeek-V3
//            reports; measured on the H200: up to ~1e-3 |cpu| in the data gradient and 3.3e-4 S
//            in a weight gradient over two 128-token slices; a wrong scale or tile is off by O(|cpu|))
//   BF16 c:  the F32 bound + 2^-8 (|cpu| + |cpu - c0|)  (BF16 rounding of the product and of the
//            accumulated result; c0 = c before an accumulating call, else 0).
// Also: a CUDA graph capturing quantize + matmul replayed on new data, K = 0, refused dims.
// MOE_BENCH=1 also runs the timing test (quantize GB/s; FP8 against BF16 GEMM).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "moe/core/fp8.h"
#include "moe/core/rng.h"
#include "moe/ops/fp8.h"
#include "moe/ops/gemm.h"

namespace moe {
namespace {

#if defined(MOE_HAVE_CUDA)
using testing::DeviceBuffer;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kTile = kFp8Tile;

int64_t tiles(int64_t n) { return (n + kTile - 1) / kTile; }

// Values across 40 binades (a random binade per 128-run of the last dim and per row, so scales
// differ), with exact zeros here and there. bf16: rounded to BF16 (what the GPU reads is exact).
std::vector<float> random_values(int64_t rows, int64_t cols, uint64_t seed, bool bf16 = false, int binades = 40) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < tiles(cols); ++j) {
      const int binade = static_cast<int>(rng.below(static_cast<uint64_t>(binades))) - binades / 2;
      for (int64_t c = j * kTile; c < std::min(cols, (j + 1) * kTile); ++c)
        v[r * cols + c] = rng.below(17) == 0 ? 0.0f : static_cast<float>(rng.normal() * std::ldexp(1.0, binade));
    }
  return bf16 ? testing::round_bf16(v) : v;
}

std::vector<uint8_t> download_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  CUDA_CHECK(cudaDeviceSynchronize());
  if (!out.empty()) CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size(), cudaMemcpyDeviceToHost));
  return out;
}

// An FP8 tensor on the host, codes and scales prefilled with garbage (an unwritten element shows).
struct HostFp8 {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  Fp8Tensor t;
  HostFp8(Shape shape, Fp8Tiles kind) {
    const Shape scale_shape = fp8_scale_shape(shape, kind);
    codes.assign(static_cast<size_t>(shape.numel()), 0xa5);
    scales.assign(static_cast<size_t>(scale_shape.numel()), -3.0f);
    t = {Tensor(codes.data(), DType::FP8_E4M3, shape), f32_tensor(scales.data(), scale_shape), kind};
  }
};

// An FP8 tensor on the GPU (DeviceBuffer poisons it with 0xff bytes: codes 0xff, scales NaN).
struct DeviceFp8 {
  DeviceBuffer codes, scales;
  Fp8Tiles kind;
  DeviceFp8(Shape shape, Fp8Tiles k)
      : codes(DType::FP8_E4M3, shape), scales(DType::F32, fp8_scale_shape(shape, k)), kind(k) {}
  Fp8Tensor t() const { return {codes.tensor(), scales.tensor(), kind}; }
  // The same bytes as a host tensor (for the CPU reference of a product).
  HostFp8 to_host() const {
    HostFp8 h(codes.tensor().shape, kind);
    h.codes = download_bytes(codes.tensor());
    h.scales = scales.download();
    h.t.codes.data = h.codes.data();
    h.t.scales.data = h.scales.data();
    return h;
  }
};

void expect_same_codes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      ADD_FAILURE() << what << ": code " << i << " is " << int(got[i]) << ", the CPU's " << int(want[i]);
  EXPECT_EQ(bad, 0) << what << ": codes differing from the CPU's";
}

// Bit-equal scales (tile_scale's NaN has one bit pattern on both sides).
void expect_same_scales(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++bad <= 5)
      ADD_FAILURE() << what << ": scale " << i << " is " << got[i] << ", the CPU's " << want[i];
  EXPECT_EQ(bad, 0) << what << ": scales differing from the CPU's";
}

void expect_same_fp8(const DeviceFp8& gpu, const HostFp8& cpu, const std::string& what) {
  expect_same_codes(download_bytes(gpu.codes.tensor()), cpu.codes, what);
  expect_same_scales(gpu.scales.download(), cpu.scales, what);
}

// A device copy of host values in dtype (F32 or BF16; BF16 values must already be BF16-exact).
struct DeviceInput {
  DeviceBuffer buffer;
  DeviceInput(DType dtype, Shape shape, const std::vector<float>& v) : buffer(dtype, shape) {
    if (!v.empty()) buffer.upload(v);
  }
};

// Rows with a zero tile, a NaN tile, an infinity tile, a tile up to 3e38 and one of FP32 subnormals.
std::vector<float> rows_input(int64_t M, int64_t K, uint64_t seed, bool bf16) {
  std::vector<float> x = random_values(M, K, seed, bf16);
  const auto put = [&](int64_t m, int64_t k, float v) {
    if (m < M && k < K) x[m * K + k] = v;
  };
  for (int64_t k = 128; k < 256; ++k) put(1, k, 0.0f);
  put(2, 5, kNan);
  put(3, K - 1, -kInf);
  for (int64_t k = 0; k < std::min<int64_t>(K, 128); ++k) put(4, k, (k % 2 ? -3e38f : 1e30f) / float(k + 1));
  for (int64_t k = 0; k < std::min<int64_t>(K, 128); ++k) put(5, k, (k % 3 ? 1e-40f : -4e-39f) * float(k % 7));
  put(0, 0, bf16 ? 3.3895e38f : 3.4e38f);  // near FP32's (or BF16's) largest value
  return bf16 ? testing::round_bf16(x) : x;
}

void check_rows(DType dtype, int64_t M, int64_t K, uint64_t seed, int64_t misalign = 0) {
  const bool bf16 = dtype == DType::BF16;
  const std::vector<float> x = rows_input(M, K, seed, bf16);
  HostFp8 cpu({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(cpu.t, f32_tensor(const_cast<float*>(x.data()), {M, K}));
  // misalign > 0: x starts `misalign` elements into its buffer (no 16-byte vector loads).
  const testing::OffsetInput dx(dtype, {M, K}, misalign, x);
  DeviceFp8 gpu({M, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(gpu.t(), dx.tensor());
  expect_same_fp8(gpu, cpu, "rows " + std::string(dtype_name(dtype)) + " M=" + std::to_string(M) +
                                " K=" + std::to_string(K) + " misalign=" + std::to_string(misalign));
}

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> o{0};
  for (int32_t c : counts) o.push_back(o.back() + c);
  return o;
}

// counts empty: the one-segment form (offsets not given). Mp = capacity + extra_columns.
void check_columns(DType dtype, const std::vector<int32_t>& counts, int64_t M, int64_t K, int64_t extra_columns,
                   uint64_t seed) {
  const bool bf16 = dtype == DType::BF16;
  const std::vector<int32_t> offsets = offsets_of(counts);
  const int64_t G = counts.empty() ? 1 : static_cast<int64_t>(counts.size());
  const int64_t Mp = fp8_columns_capacity(M, G) + extra_columns;
  std::vector<float> x = rows_input(M, K, seed, bf16);
  if (M > 7 && K > 3) x[7 * K + 3] = kInf;  // an infinity in a column tile too
  HostFp8 cpu({K, Mp}, Fp8Tiles::Columns);
  std::vector<int32_t> host_offsets = offsets;
  const Tensor cpu_offsets = counts.empty() ? Tensor() : i32_tensor(host_offsets.data(), {G + 1});
  fp8_quantize_columns(cpu.t, f32_tensor(x.data(), {M, K}), cpu_offsets);

  DeviceInput dx(dtype, {M, K}, x);
  DeviceBuffer doff(DType::I32, {G + 1});
  if (!counts.empty()) doff.upload_i32(offsets);
  DeviceFp8 gpu({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(gpu.t(), dx.buffer, counts.empty() ? Tensor() : doff.tensor());
  std::string what = "columns " + std::string(dtype_name(dtype)) + " M=" + std::to_string(M) +
                     " K=" + std::to_string(K) + " Mp=" + std::to_string(Mp) + " counts=";
  for (int32_t c : counts) what += std::to_string(c) + ",";
  expect_same_fp8(gpu, cpu, what);
}

// One pass for both layouts: the columns bit-equal to fp8_quantize_columns on the CPU, and the rows
// of every segment (rows past offsets[G] may be left unwritten) bit-equal to fp8_quantize_rows.
// Mp = capacity + extra_columns, as check_columns.
void check_rows_and_columns(DType dtype, const std::vector<int32_t>& counts, int64_t M, int64_t K,
                            int64_t extra_columns, uint64_t seed) {
  const bool bf16 = dtype == DType::BF16;
  const std::vector<int32_t> offsets = offsets_of(counts);
  const int64_t G = counts.empty() ? 1 : static_cast<int64_t>(counts.size());
  const int64_t covered = counts.empty() ? M : offsets.back();
  const int64_t Mp = fp8_columns_capacity(M, G) + extra_columns;
  std::vector<float> x = rows_input(M, K, seed, bf16);
  HostFp8 cpu_rows({M, K}, Fp8Tiles::Rows), cpu_columns({K, Mp}, Fp8Tiles::Columns);
  std::vector<int32_t> host_offsets = offsets;
  const Tensor cpu_offsets = counts.empty() ? Tensor() : i32_tensor(host_offsets.data(), {G + 1});
  fp8_quantize_rows(cpu_rows.t, f32_tensor(x.data(), {M, K}));
  fp8_quantize_columns(cpu_columns.t, f32_tensor(x.data(), {M, K}), cpu_offsets);

  DeviceInput dx(dtype, {M, K}, x);
  DeviceBuffer doff(DType::I32, {G + 1});
  if (!counts.empty()) doff.upload_i32(offsets);
  DeviceFp8 gpu_rows({M, K}, Fp8Tiles::Rows), gpu_columns({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_rows_and_columns(gpu_rows.t(), gpu_columns.t(), dx.buffer, counts.empty() ? Tensor() : doff.tensor());
  std::string what = "rows and columns " + std::string(dtype_name(dtype)) + " M=" + std::to_string(M) +
                     " K=" + std::to_string(K) + " Mp=" + std::to_string(Mp) + " counts=";
  for (int32_t c : counts) what += std::to_string(c) + ",";
  expect_same_fp8(gpu_columns, cpu_columns, what + " (columns)");
  const int64_t row_tiles = tiles(K);
  std::vector<uint8_t> codes = download_bytes(gpu_rows.codes.tensor());
  std::vector<float> scales = gpu_rows.scales.download();
  codes.resize(static_cast<size_t>(covered * K));
  scales.resize(static_cast<size_t>(covered * row_tiles));
  expect_same_codes(codes, {cpu_rows.codes.begin(), cpu_rows.codes.begin() + covered * K}, what + " (rows)");
  expect_same_scales(scales, {cpu_rows.scales.begin(), cpu_rows.scales.begin() + covered * row_tiles},
                     what + " (row scales)");
}

// w [E, N, K] (E = 0: [N, K]) with a binade per 128 x 128 block, a NaN block and a 3e38 block.
void check_blocks(int64_t E, int64_t N, int64_t K, bool transposed, uint64_t seed) {
  const int64_t experts = E == 0 ? 1 : E;
  std::vector<float> w = random_values(experts * N, K, seed);
  Rng rng(seed + 1);
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t i = 0; i < tiles(N); ++i)
      for (int64_t j = 0; j < tiles(K); ++j) {
        const float f = std::ldexp(1.0f, static_cast<int>(rng.below(30)) - 15);
        for (int64_t n = i * kTile; n < std::min(N, (i + 1) * kTile); ++n)
          for (int64_t k = j * kTile; k < std::min(K, (j + 1) * kTile); ++k) w[(e * N + n) * K + k] *= f;
      }
  w[(0 * N + N - 1) * K + K - 1] = kNan;              // the last block of expert 0
  if (N > 128 && K > 1) w[(0 * N + 129) * K + 0] = 3e38f;  // block (1, 0)
  const Shape shape = E == 0 ? Shape{N, K} : Shape{E, N, K};
  const Shape shape_t = E == 0 ? Shape{K, N} : Shape{E, K, N};
  HostFp8 cpu(shape, Fp8Tiles::Blocks), cpu_t(shape_t, Fp8Tiles::Blocks);
  fp8_quantize_blocks(cpu.t, transposed ? cpu_t.t : Fp8Tensor{}, f32_tensor(w.data(), shape));
  DeviceInput dw(DType::F32, shape, w);
  DeviceFp8 gpu(shape, Fp8Tiles::Blocks), gpu_t(shape_t, Fp8Tiles::Blocks);
  fp8_quantize_blocks(gpu.t(), transposed ? gpu_t.t() : Fp8Tensor{}, dw.buffer);
  const std::string what = "blocks E=" + std::to_string(E) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
  expect_same_fp8(gpu, cpu, what);
  if (transposed) expect_same_fp8(gpu_t, cpu_t, what + " transposed");
}

TEST(CudaFp8Quantize, RowsMatchCpuBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 10;
  for (DType dtype : {DType::F32, DType::BF16}) {
    // Single elements, partial tiles (130, 300, 264: vector loads with a partial run), odd K
    // (scalar loads), a model row width and a long row.
    for (const auto& [M, K] : std::vector<std::pair<int64_t, int64_t>>{
             {1, 1}, {6, 130}, {7, 300}, {9, 264}, {64, 2048}, {3, 4100}, {300, 7}})
      check_rows(dtype, M, K, ++seed);
    check_rows(dtype, 40, 2048, ++seed, /*misalign=*/1);  // not 16-byte aligned: scalar loads
  }
}

TEST(CudaFp8Quantize, ColumnsMatchCpuBitForBitWithSegmentsAndPadding) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 30;
  for (DType dtype : {DType::F32, DType::BF16}) {
    check_columns(dtype, {}, 300, 200, 0, ++seed);              // one segment, partial tiles
    check_columns(dtype, {}, 256, 2048, 256, ++seed);           // two padding tiles past the end
    check_columns(dtype, {0, 130, 0, 1, 250}, 381, 200, 0, ++seed);  // empty segments, a 1-row one
    check_columns(dtype, {0, 130, 0, 1, 250}, 400, 130, 2, ++seed);  // rows past offsets[G]; odd K, Mp
    check_columns(dtype, {257, 0, 0, 3, 128, 127, 0, 1000}, 1515, 512, 0, ++seed);
    check_columns(dtype, {0, 0, 0}, 0, 64, 0, ++seed);          // no rows: every tile is padding
  }
}

TEST(CudaFp8Quantize, RowsAndColumnsInOnePassMatchCpuBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 70;
  for (DType dtype : {DType::F32, DType::BF16}) {
    check_rows_and_columns(dtype, {}, 300, 200, 0, ++seed);   // one segment, partial tiles both ways
    check_rows_and_columns(dtype, {}, 256, 2048, 0, ++seed);  // a model width
    check_rows_and_columns(dtype, {0, 130, 0, 1, 250}, 400, 130, 0, ++seed);  // rows past offsets[G]; odd K
    check_rows_and_columns(dtype, {257, 0, 0, 3, 128, 127, 0, 1000}, 1515, 512, 0, ++seed);
    // Padding column tiles past the capacity: 4 wide with Mp % 8 = 4 (the staged kernel's byte
    // stores everywhere), 72 and 8 wide with Mp % 8 = 0 (its 8-byte stores of a partial tile).
    check_rows_and_columns(dtype, {}, 300, 200, 4, ++seed);
    check_rows_and_columns(dtype, {0, 130, 0, 1, 250}, 381, 136, 72, ++seed);
    check_rows_and_columns(dtype, {}, 300, 256, 8, ++seed);
    // The NaN at (2, 5) in a 3-row segment: its column tile's 125 padding codes must stay 0; odd Mp.
    check_rows_and_columns(dtype, {3, 290}, 300, 200, 3, ++seed);
  }
}

// The staged BF16 rows-and-columns kernel keeps a grid of resident blocks (3 per SM) looping over
// the tiles, two tiles in flight per block: ~1,900 tiles here, so every block takes several,
// crossing segments (uneven, some empty, some under a tile) and both stages. The columns-only
// quantizer (one block per tile) at the same shape too.
TEST(CudaFp8Quantize, ColumnsOfManyTilesPerResidentBlockMatchCpuBitForBit) {
  MOE_SKIP_WITHOUT_GPU();
  std::vector<int32_t> counts;
  Rng rng(91);
  for (int g = 0; g < 24; ++g) counts.push_back(g % 7 == 3 ? 0 : static_cast<int32_t>(rng.below(2400)) + 1);
  int64_t M = 0;
  for (int32_t c : counts) M += c;
  check_columns(DType::BF16, counts, M, 1024, 0, 92);
  check_rows_and_columns(DType::BF16, counts, M, 1024, 0, 93);
}

TEST(CudaFp8Quantize, BlocksMatchCpuBitForBitInBothOrientations) {
  MOE_SKIP_WITHOUT_GPU();
  uint64_t seed = 50;
  check_blocks(0, 256, 384, true, ++seed);
  check_blocks(0, 200, 300, true, ++seed);   // partial blocks on both edges
  check_blocks(0, 130, 129, true, ++seed);   // odd K and N: byte stores
  check_blocks(0, 256, 2048, false, ++seed);  // without the transposed cache
  check_blocks(3, 200, 264, true, ++seed);   // experts
  check_blocks(8, 1024, 256, true, ++seed);
}

TEST(CudaFp8Dequantize, MatchesCpuValues) {
  MOE_SKIP_WITHOUT_GPU();
  struct Case {
    Shape shape;
    Fp8Tiles kind;
  };
  for (const Case& c : {Case{{37, 300}, Fp8Tiles::Rows}, Case{{3, 200, 264}, Fp8Tiles::Blocks},
                        Case{{130, 129}, Fp8Tiles::Blocks}, Case{{200, 384}, Fp8Tiles::Columns}}) {
    const int64_t cols = c.shape[c.shape.ndim - 1], rows = c.shape.numel() / cols;
    // Columns [200, 384] hold the columns of x [300, 200] (one segment: 384 = capacity(300, 1)).
    const Shape x_shape = c.kind == Fp8Tiles::Columns ? Shape{300, rows} : c.shape;
    std::vector<float> x = rows_input(x_shape[0], x_shape.numel() / x_shape[0], 70, false);
    DeviceInput dx(DType::F32, x_shape, x);
    DeviceFp8 q(c.shape, c.kind);
    if (c.kind == Fp8Tiles::Rows)
      fp8_quantize_rows(q.t(), dx.buffer);
    else if (c.kind == Fp8Tiles::Columns)
      fp8_quantize_columns(q.t(), dx.buffer, Tensor());
    else
      fp8_quantize_blocks(q.t(), Fp8Tensor{}, dx.buffer);
    HostFp8 h = q.to_host();
    for (DType out : {DType::F32, DType::BF16}) {
      std::vector<float> ref(static_cast<size_t>(c.shape.numel()));
      std::vector<uint16_t> ref16(ref.size());
      if (out == DType::F32)
        fp8_dequantize(f32_tensor(ref.data(), c.shape), h.t);
      else
        fp8_dequantize(Tensor(ref16.data(), DType::BF16, c.shape), h.t);
      if (out == DType::BF16)
        for (size_t i = 0; i < ref.size(); ++i) ref[i] = bf16_to_f32(ref16[i]);
      DeviceBuffer dout(out, c.shape);
      fp8_dequantize(dout, q.t());
      const std::vector<float> got = dout.download();
      int64_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i)
        if (!(got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]))) && ++bad <= 5)
          ADD_FAILURE() << c.shape.str() << " " << dtype_name(out) << ": element " << i << " is " << got[i]
                        << ", the CPU's " << ref[i];
      EXPECT_EQ(bad, 0);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// fp8_matmul

// sum_k |a_ik| |b_jk| of the dequantized operands (CPU).
std::vector<float> abs_products(const HostFp8& a, const HostFp8& b) {
  const int64_t M = a.t.codes.dim(0), K = a.t.codes.dim(1), N = b.t.codes.dim(0);
  std::vector<float> av(static_cast<size_t>(M * K)), bv(static_cast<size_t>(N * K)), s(static_cast<size_t>(M * N));
  fp8_dequantize(f32_tensor(av.data(), {M, K}), a.t);
  fp8_dequantize(f32_tensor(bv.data(), {N, K}), b.t);
  for (float& v : av) v = std::fabs(v);
  for (float& v : bv) v = std::fabs(v);
  matmul(f32_tensor(s.data(), {M, N}), f32_tensor(av.data(), {M, K}), f32_tensor(bv.data(), {N, K}), false, true,
         1.0f, 0.0f);
  return s;
}

// Runs c (+)= a b^T on the GPU (c of dtype c_dtype, starting at c0 when accumulating, else
// poisoned) and on the CPU from the GPU's own operands; checks the tolerance of the file comment.
void expect_matmul_matches_cpu(const DeviceFp8& a, const DeviceFp8& b, DType c_dtype, bool accumulate,
                               const std::vector<float>& c0_values, const std::string& what) {
  const HostFp8 ha = a.to_host(), hb = b.to_host();
  const int64_t M = ha.t.codes.dim(0), N = hb.t.codes.dim(0);
  std::vector<float> c0 = c0_values;
  if (c_dtype == DType::BF16) c0 = testing::round_bf16(c0);
  std::vector<float> ref = accumulate ? c0 : std::vector<float>(static_cast<size_t>(M * N), 0.0f);
  fp8_matmul(f32_tensor(ref.data(), {M, N}), ha.t, hb.t, accumulate);
  DeviceBuffer dc(c_dtype, {M, N});
  if (accumulate) dc.upload(c0);
  fp8_matmul(dc, a.t(), b.t(), accumulate);
  const std::vector<float> got = dc.download();
  const std::vector<float> bound = abs_products(ha, hb);
  double worst = 0;  // max |gpu - cpu| / allowed
  int64_t bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double allowed = std::ldexp(1.0, -11) * bound[i] + std::ldexp(1.0, -9) * std::fabs(ref[i]);
    if (c_dtype == DType::BF16)
      allowed += std::ldexp(1.0, -8) * (std::fabs(ref[i]) + std::fabs(ref[i] - (accumulate ? c0[i] : 0.0f)));
    const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!std::isfinite(got[i]) || err > allowed) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": c[" << i / N << ", " << i % N << "] = " << got[i] << ", the CPU's " << ref[i]
                      << " (allowed error " << allowed << ", sum |a||b| " << bound[i] << ")";
    } else if (allowed > 0) {
      worst = std::max(worst, err / allowed);
    }
  }
  EXPECT_EQ(bad, 0) << what;
  std::printf("%s: worst error %.3g of the tolerance\n", what.c_str(), worst);
}

// The three products of a linear layer y = x W^T (x [M, K] BF16, W [N, K] F32) as the FP8 path
// runs them, each against the CPU.
void check_linear_layer(int64_t M, int64_t K, int64_t N, uint64_t seed) {
  const std::string shape = "M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N);
  const std::vector<float> x = random_values(M, K, seed, true, 8), w = random_values(N, K, seed + 1, false, 6),
                           dy = random_values(M, N, seed + 2, true, 8);
  DeviceInput dx(DType::BF16, {M, K}, x), dw(DType::F32, {N, K}, w), ddy(DType::BF16, {M, N}, dy);
  DeviceFp8 xq({M, K}, Fp8Tiles::Rows), wq({N, K}, Fp8Tiles::Blocks), wq_t({K, N}, Fp8Tiles::Blocks),
      dyq({M, N}, Fp8Tiles::Rows);
  fp8_quantize_rows(xq.t(), dx.buffer);
  fp8_quantize_blocks(wq.t(), wq_t.t(), dw.buffer);
  fp8_quantize_rows(dyq.t(), ddy.buffer);
  const int64_t Mp = fp8_columns_capacity(M, 1);
  DeviceFp8 dy_t({N, Mp}, Fp8Tiles::Columns), x_t({K, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(dy_t.t(), ddy.buffer, Tensor());
  fp8_quantize_columns(x_t.t(), dx.buffer, Tensor());

  for (DType c_dtype : {DType::BF16, DType::F32}) {
    const std::string c = std::string(" c ") + std::string(dtype_name(c_dtype));
    expect_matmul_matches_cpu(xq, wq, c_dtype, false, {}, "forward x.W^T " + shape + c);
    expect_matmul_matches_cpu(dyq, wq_t, c_dtype, false, {}, "data gradient dY.W " + shape + c);
  }
  const std::vector<float> grad0 = random_values(N, K, seed + 3, false, 4);
  expect_matmul_matches_cpu(dy_t, x_t, DType::F32, true, grad0, "weight gradient dW += dY^T.X " + shape);
}

TEST(CudaFp8Matmul, LinearLayerProductsMatchCpuAtModelDims) {
  MOE_SKIP_WITHOUT_GPU();
  check_linear_layer(4096, 2048, 1024, 100);
}

TEST(CudaFp8Matmul, LinearLayerProductsMatchCpuAtSmallerDims) {
  MOE_SKIP_WITHOUT_GPU();
  check_linear_layer(256, 384, 128, 110);  // 3 K tiles: block-scale rows padded from 3 to 4
  check_linear_layer(136, 768, 208, 120);  // partial token tile, partial weight blocks (208 = 128 + 80)
  check_linear_layer(128, 128, 128, 130);  // one tile
}

TEST(CudaFp8Matmul, AccumulatesIntoBf16AndF32) {
  MOE_SKIP_WITHOUT_GPU();
  const int64_t M = 264, K = 512, N = 384;
  DeviceInput dx(DType::BF16, {M, K}, random_values(M, K, 140, true, 8));
  DeviceInput dw(DType::F32, {N, K}, random_values(N, K, 141, false, 6));
  DeviceFp8 xq({M, K}, Fp8Tiles::Rows), wq({N, K}, Fp8Tiles::Blocks), wr({N, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(xq.t(), dx.buffer);
  fp8_quantize_blocks(wq.t(), Fp8Tensor{}, dw.buffer);
  fp8_quantize_rows(wr.t(), dw.buffer);
  const std::vector<float> c0 = random_values(M, N, 142, false, 4);
  for (DType c_dtype : {DType::BF16, DType::F32}) {
    const std::string c = std::string(" c ") + std::string(dtype_name(c_dtype));
    expect_matmul_matches_cpu(xq, wq, c_dtype, true, c0, "accumulate, b Blocks" + c);
    expect_matmul_matches_cpu(xq, wr, c_dtype, true, c0, "accumulate, b Rows" + c);
  }
}

// The weight gradient's Columns operands go to cuBLASLt as they are when their scales are 16-byte
// aligned, and are copied into the staging buffer when not: both give the same bits.
TEST(CudaFp8Matmul, ColumnsOperandsWithUnalignedScalesAreStagedToTheSameProduct) {
  MOE_SKIP_WITHOUT_GPU();
  const int64_t M = 300, K = 256, N = 136, Mp = fp8_columns_capacity(M, 1);
  DeviceInput dx(DType::BF16, {M, K}, random_values(M, K, 143, true, 8));
  DeviceInput ddy(DType::BF16, {M, N}, random_values(M, N, 144, true, 8));
  DeviceFp8 x_t({K, Mp}, Fp8Tiles::Columns), dy_t({N, Mp}, Fp8Tiles::Columns);
  fp8_quantize_columns(x_t.t(), dx.buffer, Tensor());
  fp8_quantize_columns(dy_t.t(), ddy.buffer, Tensor());
  DeviceBuffer aligned_out(DType::F32, {N, K});
  fp8_matmul(aligned_out, dy_t.t(), x_t.t(), false);
  const std::vector<float> want = aligned_out.download();
  // The same scales one float into a buffer: 4-byte aligned only.
  DeviceBuffer dy_shifted(DType::F32, {dy_t.scales.tensor().numel() + 1});
  DeviceBuffer x_shifted(DType::F32, {x_t.scales.tensor().numel() + 1});
  const auto unaligned = [](const DeviceFp8& q, const DeviceBuffer& shifted) {
    float* at = static_cast<float*>(shifted.tensor().data) + 1;
    CUDA_CHECK(cudaMemcpy(at, q.scales.tensor().data, q.scales.bytes(), cudaMemcpyDeviceToDevice));
    Fp8Tensor t = q.t();
    t.scales = Tensor(at, DType::F32, t.scales.shape, Device::CUDA);
    return t;
  };
  const Fp8Tensor dy_unaligned = unaligned(dy_t, dy_shifted), x_unaligned = unaligned(x_t, x_shifted);
  struct Case {
    Fp8Tensor a, b;
    const char* what;
  };
  for (const Case& c : {Case{dy_unaligned, x_t.t(), "a staged, b as it is"},
                        Case{dy_t.t(), x_unaligned, "a as it is, b staged"},
                        Case{dy_unaligned, x_unaligned, "both staged"}}) {
    DeviceBuffer out(DType::F32, {N, K});
    fp8_matmul(out, c.a, c.b, false);
    EXPECT_EQ(out.download(), want) << c.what << ": staged and unstaged Columns scales give different products";
  }
  expect_matmul_matches_cpu(dy_t, x_t, DType::F32, false, {}, "Columns x Columns");
}

// A K that is not a multiple of 128 (allowed: K % 16 == 0): the last 1 x 128 and 128 x 128 tiles
// are partial along K on both operands.
TEST(CudaFp8Matmul, PartialInnerTileMatchesCpu) {
  MOE_SKIP_WITHOUT_GPU();
  const int64_t M = 128, K = 320, N = 136;
  DeviceInput dx(DType::BF16, {M, K}, random_values(M, K, 150, true, 8));
  DeviceInput dw(DType::F32, {N, K}, random_values(N, K, 151, false, 6));
  DeviceFp8 xq({M, K}, Fp8Tiles::Rows), wq({N, K}, Fp8Tiles::Blocks), wr({N, K}, Fp8Tiles::Rows);
  fp8_quantize_rows(xq.t(), dx.buffer);
  fp8_quantize_blocks(wq.t(), Fp8Tensor{}, dw.buffer);
  fp8_quantize_rows(wr.t(), dw.buffer);
  expect_matmul_matches_cpu(xq, wq, DType::F32, false, {}, "K=320, b Blocks");
  expect_matmul_matches_cpu(xq, wr, DType::F32, false, {}, "K=320, b Rows");
}

TEST(CudaFp8Matmul, EmptyInnerDimensionZeroesOrKeepsC) {
  MOE_SKIP_WITHOUT_GPU();
  DeviceFp8 a({16, 0}, Fp8Tiles::Rows), b({8, 0}, Fp8Tiles::Blocks);
  DeviceBuffer c(DType::F32, {16, 8});
  fp8_matmul(c, a.t(), b.t(), false);
  for (float v : c.download()) ASSERT_EQ(v, 0.0f);
  const std::vector<float> c0 = random_values(16, 8, 160);
  c.upload(c0);
  fp8_matmul(c, a.t(), b.t(), true);
  EXPECT_EQ(c.download(), c0);
}

TEST(CudaFp8Matmul, DimsCuBlasCannotTakeAreRefused) {
  MOE_SKIP_WITHOUT_GPU();
  const auto refused = [](int64_t M, int64_t K, int64_t N) {
    DeviceFp8 a({M, K}, Fp8Tiles::Rows), b({N, K}, Fp8Tiles::Blocks);
    DeviceBuffer c(DType::F32, {M, N});
    try {
      fp8_matmul(c, a.t(), b.t(), false);
    } catch (const Error& e) {
      return std::string(e.what()).find("pad the dims") != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(refused(12, 128, 128)) << "M % 8 != 0";
  EXPECT_TRUE(refused(128, 120, 128)) << "K % 16 != 0";
  EXPECT_TRUE(refused(128, 128, 100)) << "N % 8 != 0";
}

// Quantize (rows, columns with device offsets, blocks) and the products captured into one graph:
// no host synchronization inside; replayed on new inputs, it gives the eager results.
TEST(CudaFp8Matmul, QuantizeAndMatmulReplayInsideACapturedGraph) {
  MOE_SKIP_WITHOUT_GPU();
  const int64_t M = 512, K = 256, N = 384;
  const std::vector<int32_t> offsets = offsets_of({200, 0, 312});
  const int64_t Mp = fp8_columns_capacity(M, 3);
  DeviceBuffer dx(DType::BF16, {M, K}), dw(DType::F32, {N, K}), doff(DType::I32, {4});
  doff.upload_i32(offsets);
  DeviceFp8 xq({M, K}, Fp8Tiles::Rows), wq({N, K}, Fp8Tiles::Blocks), wq_t({K, N}, Fp8Tiles::Blocks),
      x_t({K, Mp}, Fp8Tiles::Columns);
  DeviceBuffer y(DType::BF16, {M, N}), g(DType::F32, {K, K});
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const Stream stream{s};
  const auto step = [&] {
    fp8_quantize_rows(xq.t(), dx, stream);
    fp8_quantize_blocks(wq.t(), wq_t.t(), dw, stream);
    fp8_quantize_columns(x_t.t(), dx, doff, stream);
    fp8_matmul(y, xq.t(), wq.t(), false, stream);
    fp8_matmul(g, x_t.t(), x_t.t(), true, stream);  // a Gram matrix of the columns operand
  };
  const auto run_eager = [&](uint64_t seed) {
    dx.upload(random_values(M, K, seed, true, 8));
    dw.upload(random_values(N, K, seed + 1, false, 6));
    CUDA_CHECK(cudaMemset(g.tensor().data, 0, g.bytes()));
    step();
    CUDA_CHECK(cudaStreamSynchronize(s));
    return std::make_pair(y.download(), g.download());
  };
  run_eager(170);  // eager first call: handles, workspaces, plans, staging buffer
  const auto want = run_eager(180);

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  step();
  CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  dx.upload(random_values(M, K, 180, true, 8));
  dw.upload(random_values(N, K, 181, false, 6));
  CUDA_CHECK(cudaMemset(g.tensor().data, 0, g.bytes()));
  CUDA_CHECK(cudaMemset(y.tensor().data, 0xff, y.bytes()));
  CUDA_CHECK(cudaGraphLaunch(exec, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  EXPECT_EQ(y.download(), want.first) << "the replayed forward differs from the eager one";
  EXPECT_EQ(g.download(), want.second) << "the replayed columns product differs from the eager one";
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(s));
}

// MOE_BENCH=1: quantize bandwidth (bytes read + written per second) and the dense FP8 product
// against cuBLASLt BF16 at one linear layer's shapes.
TEST(CudaFp8Matmul, TimingAgainstBf16) {
  MOE_SKIP_WITHOUT_GPU();
  MOE_SKIP_UNLESS_BENCH("timing");
  const int64_t M = 16384, K = 2048, N = 2048;
  DeviceBuffer x(DType::BF16, {M, K}), w(DType::F32, {N, K}), wb(DType::BF16, {N, K}), y(DType::BF16, {M, N});
  x.upload(random_values(M, K, 190, true, 8));
  w.upload(random_values(N, K, 191, false, 6));
  wb.upload(testing::round_bf16(random_values(N, K, 191, false, 6)));
  DeviceFp8 xq({M, K}, Fp8Tiles::Rows), wq({N, K}, Fp8Tiles::Blocks), wq_t({K, N}, Fp8Tiles::Blocks),
      x_t({K, fp8_columns_capacity(M, 1)}, Fp8Tiles::Columns);
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  const auto time_ms = [&](const std::function<void()>& f) {
    f();  // warm-up (plans, staging)
    CUDA_CHECK(cudaDeviceSynchronize());
    const int reps = 20;
    CUDA_CHECK(cudaEventRecord(start, compute_stream()));
    for (int i = 0; i < reps; ++i) f();
    CUDA_CHECK(cudaEventRecord(stop, compute_stream()));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return ms / reps;
  };
  const double x_bytes = static_cast<double>(M * K);
  const double rows_ms = time_ms([&] { fp8_quantize_rows(xq.t(), x); });
  const double cols_ms = time_ms([&] { fp8_quantize_columns(x_t.t(), x, Tensor()); });
  const double both_ms = time_ms([&] { fp8_quantize_rows_and_columns(xq.t(), x_t.t(), x, Tensor()); });
  const double blocks_ms = time_ms([&] { fp8_quantize_blocks(wq.t(), wq_t.t(), w); });
  std::printf("quantize rows + columns in one pass BF16 [%ld, %ld]: %.3f ms, %.0f GB/s\n", long(M), long(K), both_ms,
              x_bytes * (2 + 2 + 8.0 / 128) / both_ms / 1e6);
  std::printf("quantize rows    BF16 [%ld, %ld]: %.3f ms, %.0f GB/s\n", long(M), long(K), rows_ms,
              x_bytes * (2 + 1 + 4.0 / 128) / rows_ms / 1e6);
  std::printf("quantize columns BF16 [%ld, %ld]: %.3f ms, %.0f GB/s\n", long(M), long(K), cols_ms,
              x_bytes * (2 + 1 + 4.0 / 128) / cols_ms / 1e6);
  std::printf("quantize blocks  F32 [%ld, %ld] + transposed: %.3f ms, %.0f GB/s\n", long(N), long(K), blocks_ms,
              static_cast<double>(N * K) * (4 + 2) / blocks_ms / 1e6);
  fp8_quantize_rows(xq.t(), x);
  fp8_quantize_blocks(wq.t(), wq_t.t(), w);
  const double flop = 2.0 * M * N * K;
  const double fp8_ms = time_ms([&] { fp8_matmul(y, xq.t(), wq.t(), false); });
  const double bf16_ms = time_ms([&] { matmul(y, x, wb, false, true, 1.0f, 0.0f); });
  std::printf("GEMM [%ld x %ld] . [%ld x %ld]^T -> BF16: FP8 %.3f ms (%.0f TFLOP/s), BF16 %.3f ms (%.0f TFLOP/s)\n",
              long(M), long(K), long(N), long(K), fp8_ms, flop / fp8_ms / 1e9, bf16_ms, flop / bf16_ms / 1e9);
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
}
#endif  // MOE_HAVE_CUDA

}  // namespace
}  // namespace moe
