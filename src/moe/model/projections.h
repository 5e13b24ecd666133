// The model's quantizable matrix products (model/precision.h) in the run's precision: with an
// empty Fp8Weight they are the BF16 products (matmul, grouped_matmul); with the weight's FP8 cache
// they quantize the activation operands into scratch reserved here (1 x 128 tiles along the
// features for the forward and the data gradient; along the tokens, transposed, for the weight
// gradient) and run the FP8 products (moe/ops/fp8.h).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "moe/core/arena.h"
#include "moe/model/config.h"
#include "moe/model/fp8_weights.h"
#include "moe/model/precision.h"
#include "moe/ops/fp8_gather.h"

namespace moe {

// One of several linear layers that read the same input (q, k and v read the attention norm's
// output): in FP8 the input is quantized once for all of them.
struct SharedInputLinear {
  Tensor y, w;           // forward: y = x w^T
  const Fp8Weight* f;    // the weight's FP8 cache (empty in BF16)
};
struct SharedInputLinearGrad {
  Tensor dw, dy, w;      // backward: dx (+)= dy w, dw += dy^T x
  const Fp8Weight* f;
};

// An expert output gradient as the weight gradient reads it: dy, and in FP8 its columns operand,
// quantized in the same pass as the data gradient's rows (so dy is read once; dy is empty where it
// was never stored). The operand lives in scratch that the next experts_data_grad or
// experts_swiglu_data_grad overwrites: use it before then.
struct ExpertOutputGrad {
  Tensor dy;
  Fp8Tensor columns;
};

class Projections {
 public:
  // FP8: reserves the operand scratch in `arena` (activations.fp8.*) for `rows` token rows and
  // `expert_rows` rows over `experts` local experts. BF16: reserves nothing.
  Projections(const ModelConfig& cfg, Precision precision, int64_t rows, int64_t expert_rows, int64_t experts,
              Arena& arena);

  // y (= or +=) x W^T.
  void linear(Tensor y, Tensor x, Tensor w, const Fp8Weight& f, bool accumulate = false);
  // dx (= or +=) dy W, and dW += dy^T x.
  void linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, const Fp8Weight& f, bool accumulate_dx);
  // linear() for each layer, all reading x.
  void linear_shared_input(Tensor x, std::initializer_list<SharedInputLinear> layers);
  // The same from x's FP8 rows operand (FP8 weights only), e.g. what rmsnorm_rows returned.
  void linear_shared_input(const Fp8Tensor& xq, std::initializer_list<SharedInputLinear> layers);
  // rmsnorm_forward(out, rstd, x, weight, eps) that also quantizes out as the rows operand of the FP8
  // products reading it next, in the same pass (fp8_rmsnorm_forward); the operand lives in this
  // object's scratch until the next quantization. FP8 only.
  Fp8Tensor rmsnorm_rows(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps);
  // The SwiGLU of a dense MLP or the shared expert with its down product: act = swiglu(gu) (kept for
  // the backward), then y (= or +=) act W^T. In FP8 the SwiGLU kernel writes act's Rows operand as
  // it computes act (moe/ops/fp8_swiglu.h), as experts_swiglu_forward does for the routed experts.
  void swiglu_linear(Tensor y, Tensor act, Tensor gu, Tensor w, const Fp8Weight& f, bool accumulate);
  // The same when the backward keeps act in FP8 (FP8 weights only): one kernel writes act's Rows
  // operand and act_columns (codes [act width, round_up(rows, 128)]), the down weight gradient's
  // operand, and no act (moe/ops/fp8_swiglu.h); swiglu_columns writes only what the backward keeps
  // (recompute: no product follows).
  void swiglu_linear(Tensor y, Fp8Tensor act_columns, Tensor gu, const Fp8Weight& f, bool accumulate);
  void swiglu_columns(Fp8Tensor act_columns, Tensor gu);
  // linear_backward() with x kept as its FP8 columns operand (swiglu_linear's act_columns).
  void linear_backward(Tensor dx, Tensor dw, Tensor dy, const Fp8Tensor& x_columns, const Fp8Weight& f,
                       bool accumulate_dx);
  // The SwiGLU backward of a dense MLP or the shared expert with the gate/up product's backward:
  // dgu = swiglu_backward(dact, gu), then linear_backward(dx, dw, dgu, x, w, f, accumulate_dx). In
  // FP8 one kernel quantizes dgu into both operands as it computes it (fp8_swiglu_backward) and
  // `dgu` is not written (it may be empty).
  void swiglu_linear_backward(Tensor dx, Tensor dw, Tensor dgu, Tensor dact, Tensor gu, Tensor x, Tensor w,
                              const Fp8Weight& f, bool accumulate_dx);
  // linear_backward() for each layer, all reading x: dx (= or +=, per accumulate_dx) sum_i dy_i W_i.
  void linear_backward_shared_input(Tensor dx, Tensor x, std::initializer_list<SharedInputLinearGrad> layers,
                                    bool accumulate_dx);

  // Per expert e over its rows [o_e, o_{e+1}) (moe/ops/grouped_gemm.h):
  // c = a w[e]^T (forward: w [E, out, in]).
  void experts_forward(Tensor c, Tensor a, Tensor w, const Fp8Weight& f, Tensor offsets);
  // The same with `a` already FP8 rows (ep.payload = "fp8": the dispatched expert input, quantized at
  // its source into the tiles quantize_rows would make of its values). FP8 weights only.
  void experts_forward(Tensor c, Fp8Tensor a, const Fp8Weight& f, Tensor offsets);
  // dx = dy w[e] (data gradient); returns dy for the weight gradient.
  ExpertOutputGrad experts_data_grad(Tensor dx, Tensor dy, Tensor w, const Fp8Weight& f, Tensor offsets);
  // The same with dy the weighted token rows of `dy` (every route on this rank: moe/ops/fp8_gather.h),
  // quantized into both layouts from the token rows; dy itself is never stored (the result's dy is
  // empty). FP8 weights only.
  ExpertOutputGrad experts_data_grad(Tensor dx, const GatheredRows& dy, const Fp8Weight& f, Tensor offsets);
  // The SwiGLU between the experts' gate/up and down products, with the down product:
  // act = swiglu(gu) (kept for the backward), then c = act w_down[e]^T. In FP8 the SwiGLU kernel
  // writes act's Rows operand as it computes act (moe/ops/fp8_swiglu.h).
  void experts_swiglu_forward(Tensor c, Tensor act, Tensor gu, Tensor w_down, const Fp8Weight& f_down,
                              Tensor offsets);
  // The same when the backward keeps the SwiGLU output in FP8: one kernel quantizes swiglu(gu) into
  // the down product's rows operand (scratch) and into act_columns (codes [H, columns]), the down
  // weight gradient's operand, and stores no act (moe/ops/fp8_swiglu.h). FP8 weights only.
  void experts_swiglu_forward(Tensor c, Fp8Tensor act_columns, Tensor gu, const Fp8Weight& f_down, Tensor offsets);
  // The experts' SwiGLU backward with the gate/up data gradient: dgu = swiglu_backward(dact, gu),
  // then experts_data_grad(dx, dgu, ...). In FP8 one kernel quantizes dgu into both operands as it
  // computes it (fp8_swiglu_backward): `dgu` is not written (it may be empty), the result's dy is
  // empty, and the operand scratch of the last experts_data_grad is overwritten (finish that
  // product's weight gradient first).
  ExpertOutputGrad experts_swiglu_data_grad(Tensor dx, Tensor dgu, Tensor dact, Tensor gu, Tensor w,
                                            const Fp8Weight& f, Tensor offsets);
  // dw[e] (+= or =, per accumulate) dy^T x (weight gradient; = zeroes experts without rows).
  void experts_weight_grad(Tensor dw, const ExpertOutputGrad& dy, Tensor x, const Fp8Weight& f, Tensor offsets,
                           bool accumulate);
  // With x moved as FP8 rows (ep.payload = "fp8") the weight gradient runs in two calls, so the
  // caller can read x before the rows may be overwritten: expert_input_columns re-quantizes x along
  // the tokens (moe/ops/fp8_requantize.h: its values as the activation dtype `values` holds them)
  // into the x^T operand scratch, which it returns (valid until the next weight gradient);
  // experts_weight_grad then takes that operand. The operand is the
  // column tiles of the dequantized rows, not of the BF16 rows: the same values except for elements
  // in E4M3's subnormal range of a tile (docs/architecture.md, FP8 dispatch payload). FP8 weights only.
  // The down weight gradient takes the SwiGLU output's kept columns operand the same way.
  Fp8Tensor expert_input_columns(Fp8Tensor x, DType values, Tensor offsets);
  // The same operand when every route is on this rank: x's columns quantized from the token rows
  // (moe/ops/fp8_gather.h), the bits of quantizing the expert input rows a BF16 dispatch stores.
  Fp8Tensor expert_input_columns(const GatheredRows& x, Tensor offsets);
  void experts_weight_grad(Tensor dw, const ExpertOutputGrad& dy, Fp8Tensor x_columns, const Fp8Weight& f,
                           Tensor offsets, bool accumulate);

 private:
  struct Buffer {
    Arena::Slot codes, scales;
  };
  // Views of a buffer as an operand of `rows` x `cols` codes with `tiles` scales.
  Fp8Tensor operand(const Buffer& b, int64_t rows, int64_t cols, Fp8Tiles tiles = Fp8Tiles::Rows);
  // The columns operand (Columns tiles, codes [features, fp8_columns_capacity(rows, segments)]).
  Fp8Tensor columns_operand(const Buffer& b, int64_t features, int64_t rows, int64_t segments);
  Fp8Tensor quantize_rows(const Buffer& b, Tensor x);
  Fp8Tensor quantize_columns(const Buffer& b, Tensor x, Tensor offsets, int64_t segments);
  // dy as the data gradient's rows (in rows_) and the weight gradient's columns (in grad_columns_), one pass.
  std::pair<Fp8Tensor, Fp8Tensor> quantize_output_grad(Tensor dy, Tensor offsets, int64_t segments);
  // act = swiglu(gu) as its rows operand (in rows_, returned) and act_columns, over the segments of
  // offsets (empty: one), in one kernel; act itself is not stored.
  Fp8Tensor swiglu_rows_and_columns(Fp8Tensor act_columns, Tensor gu, Tensor offsets);
  // The FP8 products of linear_backward with x's columns operand given.
  void fp8_linear_backward(Tensor dx, Tensor dw, Tensor dy, const Fp8Tensor& x_columns, const Fp8Weight& f,
                           bool accumulate_dx);
  // The same with dy's operands given (rows for the data gradient, columns for the weight gradient).
  void fp8_linear_backward(Tensor dx, Tensor dw, const Fp8Tensor& dy_rows, const Fp8Tensor& dy_columns,
                           const Fp8Tensor& x_columns, const Fp8Weight& f, bool accumulate_dx);
  // dgu = swiglu_backward(dact, gu) as its rows operand (in rows_) and columns operand (in
  // grad_columns_), over the segments of offsets (empty: one), in one kernel; dgu is not stored.
  std::pair<Fp8Tensor, Fp8Tensor> swiglu_backward_operands(Tensor dact, Tensor gu, Tensor offsets);

  Arena& arena_;
  Buffer rows_;              // the forward's or data gradient's activation operand
  Buffer grad_columns_;      // the weight gradient's dy^T
  Buffer input_columns_;     // the weight gradient's x^T
};

}  // namespace moe
