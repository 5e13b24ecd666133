// CPU FP8 quantize and dequantize: OpenMP over rows (Rows tiles), over token tiles (Columns) and
// over block rows (Blocks); each tile's amax, then tile_scale and quantize_with_scale from
// moe/core/fp8.h, so every code and scale is the GPU's bit for bit.
#include "moe/ops/cpu/fp8.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "moe/core/dtype.h"
#include "moe/core/fp8.h"

namespace moe::cpu {
namespace {

constexpr int64_t kTile = kFp8Tile;
// Parallelize loops over at least this many elements (smaller ones cost more in thread start-up).
constexpr int64_t kParallelElements = int64_t{1} << 15;

int64_t tiles_along(int64_t n) { return (n + kTile - 1) / kTile; }

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = f32_to_bf16(v); }

// A tile's amax is kept as the bits of |x|: for non-negative floats the bits order as the values,
// and NaNs lie above infinity, so the largest bits are the amax, or a NaN or an infinity that
// tile_scale turns into a NaN scale (a float max would drop the NaN). The integer max vectorizes.
inline uint32_t magnitude_bits(float v) { return fp8::float_bits(v) & 0x7fffffffu; }
inline float tile_scale_of(uint32_t amax_bits) { return fp8::tile_scale(fp8::bits_float(amax_bits)); }

// The 256 E4M3 values: dequantizing is a table lookup and one multiply by a power of two.
const float* e4m3_values() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int c = 0; c < 256; ++c) t[c] = fp8::e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

// One row of K elements: its ceil(K / 128) tiles' scales and codes.
template <typename In>
void quantize_row_typed(const In* xr, int64_t K, uint8_t* cr, float* sr) {
  for (int64_t j = 0; j < tiles_along(K); ++j) {
    const int64_t k0 = j * kTile, k1 = std::min(K, k0 + kTile);
    uint32_t amax = 0;
    for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, magnitude_bits(to_f32(xr[k])));
    const float scale = tile_scale_of(amax);
    sr[j] = scale;
    for (int64_t k = k0; k < k1; ++k) cr[k] = fp8::quantize_with_scale(to_f32(xr[k]), scale);
  }
}

template <typename In>
void quantize_rows_typed(const In* x, int64_t M, int64_t K, uint8_t* codes, float* scales) {
  const int64_t T = tiles_along(K);
#pragma omp parallel for schedule(static) if (M * K > kParallelElements)
  for (int64_t m = 0; m < M; ++m) quantize_row_typed(x + m * K, K, codes + m * K, scales + m * T);
}

// One Rows tile of the columns layout: rows [row, row + count) of x (count <= 128) become columns
// [column, column + 128) of every codes row k, the columns past count holding code 0.
struct ColumnTile {
  int64_t row, count, column;
};

// Keeps the transposed writes of one tile within a few KiB (kColumnChunk codes rows of 128 bytes).
constexpr int64_t kColumnChunk = 64;

template <typename In>
void quantize_columns_typed(const In* x, int64_t K, const std::vector<ColumnTile>& tiles, int64_t end, int64_t Mp,
                            uint8_t* codes, float* scales) {
  const int64_t T = tiles_along(Mp), n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel if (n_tiles * kTile * K > kParallelElements)
  {
    std::vector<uint32_t> amax(K);
    std::vector<float> scale(K);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tiles; ++t) {
      const ColumnTile& tile = tiles[t];
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t r = 0; r < tile.count; ++r) {
        const In* xr = x + (tile.row + r) * K;
        for (int64_t k = 0; k < K; ++k) amax[k] = std::max(amax[k], magnitude_bits(to_f32(xr[k])));
      }
      float* tile_scales = scales + tile.column / kTile * K;  // tile-major: [T, K]
      for (int64_t k = 0; k < K; ++k) {
        scale[k] = tile_scale_of(amax[k]);
        tile_scales[k] = scale[k];
      }
      for (int64_t k0 = 0; k0 < K; k0 += kColumnChunk) {
        const int64_t k1 = std::min(K, k0 + kColumnChunk);
        for (int64_t r = 0; r < tile.count; ++r) {
          const In* xr = x + (tile.row + r) * K;
          for (int64_t k = k0; k < k1; ++k)
            codes[k * Mp + tile.column + r] = fp8::quantize_with_scale(to_f32(xr[k]), scale[k]);
        }
        if (tile.count < kTile)
          for (int64_t k = k0; k < k1; ++k)
            std::memset(codes + k * Mp + tile.column + tile.count, 0, static_cast<size_t>(kTile - tile.count));
      }
    }
  }
  // The columns past the last segment: code 0, and scale 1 for their tiles (end is a tile boundary).
#pragma omp parallel for schedule(static) if ((Mp - end) * K > kParallelElements)
  for (int64_t k = 0; k < K; ++k) std::memset(codes + k * Mp + end, 0, static_cast<size_t>(Mp - end));
  std::fill(scales + end / kTile * K, scales + T * K, 1.0f);
}

template <typename Out>
void dequantize_rows_typed(const Fp8Tensor& in, int64_t row_begin, int64_t row_end, Out* out) {
  const float* values = e4m3_values();
  const int64_t K = in.codes.dim(-1), T = tiles_along(K);
  // Blocks tiles: codes [.., N, K] (leading dims folded into rows), a scales row per 128 rows of N.
  // Columns tiles: codes [N, K], row r's tile j scale at scales[j N + r] (tile-major).
  const bool blocks = in.tiles == Fp8Tiles::Blocks, columns = in.tiles == Fp8Tiles::Columns;
  const int64_t N = in.codes.dim(-2), TN = tiles_along(N);
  const uint8_t* codes = in.codes.ptr<const uint8_t>();
  const float* scales = in.scales.ptr<const float>();
#pragma omp parallel for schedule(static) if ((row_end - row_begin) * K > kParallelElements)
  for (int64_t r = row_begin; r < row_end; ++r) {
    // Columns: row r's tiles are N apart from scales[r]; Rows and Blocks: a row of T scales.
    const float* sr = columns ? scales + r : scales + (blocks ? (r / N) * TN + (r % N) / kTile : r) * T;
    const int64_t tile_stride = columns ? N : 1;
    const uint8_t* cr = codes + r * K;
    Out* orow = out + (r - row_begin) * K;
    for (int64_t k = 0; k < K; ++k) store(orow + k, values[cr[k]] * sr[k / kTile * tile_stride]);
  }
}

}  // namespace

void fp8_dequantize_rows_f32(const Fp8Tensor& in, int64_t row_begin, int64_t row_end, float* out) {
  dequantize_rows_typed(in, row_begin, row_end, out);
}

void fp8_quantize_rows(Fp8Tensor out, Tensor x, Stream /*stream*/) {
  uint8_t* codes = out.codes.ptr<uint8_t>();
  float* scales = out.scales.f32();
  if (x.dtype == DType::BF16)
    quantize_rows_typed(x.ptr<const uint16_t>(), x.dim(0), x.dim(1), codes, scales);
  else
    quantize_rows_typed(x.ptr<const float>(), x.dim(0), x.dim(1), codes, scales);
}

void fp8_quantize_row(const float* x, int64_t K, uint8_t* codes, float* scales) {
  quantize_row_typed(x, K, codes, scales);
}

void fp8_quantize_columns(Fp8Tensor out, Tensor x, Tensor offsets, Stream /*stream*/) {
  const int64_t M = x.dim(0), K = x.dim(1), Mp = out.codes.dim(1);
  // Segment g (rows [o_g, o_{g+1})) starts at column p_g; its tiles are the work items.
  std::vector<int32_t> one_segment = {0, static_cast<int32_t>(M)};
  const bool segmented = offsets.numel() > 0 && offsets.data != nullptr;
  const int32_t* o = segmented ? offsets.i32() : one_segment.data();
  const int64_t G = segmented ? offsets.numel() - 1 : 1;
  std::vector<ColumnTile> tiles;
  int64_t column = 0;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t row = o[g]; row < o[g + 1]; row += kTile, column += kTile)
      tiles.push_back({row, std::min<int64_t>(kTile, o[g + 1] - row), column});
  uint8_t* codes = out.codes.ptr<uint8_t>();
  float* scales = out.scales.f32();
  if (x.dtype == DType::BF16)
    quantize_columns_typed(x.ptr<const uint16_t>(), K, tiles, column, Mp, codes, scales);
  else
    quantize_columns_typed(x.ptr<const float>(), K, tiles, column, Mp, codes, scales);
}

void fp8_quantize_rows_and_columns(Fp8Tensor rows, Fp8Tensor columns, Tensor x, Tensor offsets, Stream stream) {
  cpu::fp8_quantize_rows(rows, x, stream);
  cpu::fp8_quantize_columns(columns, x, offsets, stream);
}

void fp8_quantize_blocks(Fp8Tensor out, Fp8Tensor out_t, Tensor w, Stream /*stream*/) {
  const int64_t E = w.ndim() == 3 ? w.dim(0) : 1, N = w.dim(-2), K = w.dim(-1);
  const int64_t TN = tiles_along(N), TK = tiles_along(K);
  const float* wv = w.f32();
  uint8_t* codes = out.codes.ptr<uint8_t>();
  float* scales = out.scales.f32();
  const bool transposed = out_t.codes.data != nullptr;
  uint8_t* codes_t = transposed ? out_t.codes.ptr<uint8_t>() : nullptr;
  float* scales_t = transposed ? out_t.scales.f32() : nullptr;
#pragma omp parallel if (E * N * K > kParallelElements)
  {
    std::vector<uint32_t> amax(TK);
    std::vector<float> scale(TK);
#pragma omp for schedule(static)
    for (int64_t block_row = 0; block_row < E * TN; ++block_row) {
      const int64_t e = block_row / TN, i = block_row % TN;
      const int64_t n0 = i * kTile, n1 = std::min(N, n0 + kTile);
      const float* we = wv + e * N * K;
      std::fill(amax.begin(), amax.end(), 0u);
      for (int64_t n = n0; n < n1; ++n) {
        const float* wn = we + n * K;
        for (int64_t j = 0; j < TK; ++j) {
          uint32_t m = amax[j];
          for (int64_t k = j * kTile; k < std::min(K, (j + 1) * kTile); ++k) m = std::max(m, magnitude_bits(wn[k]));
          amax[j] = m;
        }
      }
      for (int64_t j = 0; j < TK; ++j) {
        scale[j] = tile_scale_of(amax[j]);
        scales[block_row * TK + j] = scale[j];
        if (transposed) scales_t[(e * TK + j) * TN + i] = scale[j];  // the same value, at (j, i)
      }
      uint8_t* ce = codes + e * N * K;
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t j = 0; j < TK; ++j)
          for (int64_t k = j * kTile; k < std::min(K, (j + 1) * kTile); ++k)
            ce[n * K + k] = fp8::quantize_with_scale(we[n * K + k], scale[j]);
      if (!transposed) continue;
      // The transposed codes are the same codes (same scale, element-wise rounding), moved.
      uint8_t* cte = codes_t + e * K * N;
      for (int64_t k0 = 0; k0 < K; k0 += kColumnChunk) {
        const int64_t k1 = std::min(K, k0 + kColumnChunk);
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t k = k0; k < k1; ++k) cte[k * N + n] = ce[n * K + k];
      }
    }
  }
}

void fp8_dequantize(Tensor out, Fp8Tensor in, Stream /*stream*/) {
  const int64_t rows = in.codes.numel() == 0 ? 0 : in.codes.numel() / in.codes.dim(-1);
  if (out.dtype == DType::BF16)
    dequantize_rows_typed(in, 0, rows, out.ptr<uint16_t>());
  else
    dequantize_rows_typed(in, 0, rows, out.f32());
}

}  // namespace moe::cpu
