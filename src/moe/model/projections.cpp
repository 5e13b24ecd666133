#include "moe/model/projections.h"

#include <algorithm>
#include <initializer_list>

#include "moe/ops/activation.h"
#include "moe/ops/fp8_norm.h"
#include "moe/ops/fp8_requantize.h"
#include "moe/ops/fp8_swiglu.h"
#include "moe/ops/gemm.h"
#include "moe/ops/grouped_gemm.h"

namespace moe {
namespace {

int64_t tiles(int64_t n) { return (n + kFp8Tile - 1) / kFp8Tile; }

int64_t widest(std::initializer_list<int64_t> widths) { return std::max(widths); }

}  // namespace

Projections::Projections(const ModelConfig& cfg, Precision precision, int64_t rows, int64_t expert_rows,
                         int64_t experts, Arena& arena)
    : arena_(arena) {
  if (precision != Precision::FP8) return;
  const int64_t D = cfg.hidden_size, hd = cfg.head_dim();
  const int64_t Qo = cfg.num_attention_heads * hd, KVo = cfg.num_key_value_heads * hd;
  const int64_t S = cfg.shared_expert_intermediate_size, Hd = cfg.dense_intermediate_size;
  const int64_t H = cfg.intermediate_size;
  const bool has_moe = cfg.first_k_dense_replace < cfg.num_hidden_layers;
  const bool has_dense = cfg.first_k_dense_replace > 0;
  // Widths quantized along the features: forward inputs (in) and data-gradient inputs (out).
  int64_t dense_in = widest({D, Qo}), dense_out = widest({Qo, KVo, D});
  if (has_dense) dense_in = widest({dense_in, Hd}), dense_out = widest({dense_out, 2 * Hd});
  if (has_moe && S > 0) dense_in = widest({dense_in, S}), dense_out = widest({dense_out, 2 * S});
  const int64_t expert_in = has_moe ? widest({D, H}) : 0, expert_out = has_moe ? widest({2 * H, D}) : 0;
  const int64_t dense_cols = fp8_columns_capacity(rows, 1);
  const int64_t expert_cols = has_moe ? fp8_columns_capacity(expert_rows, experts) : 0;
  const int64_t widest_rows = widest({dense_in, dense_out});
  const int64_t row_codes = std::max(rows * widest_rows, expert_rows * widest({expert_in, expert_out}));
  const int64_t row_scales = std::max(rows * tiles(widest_rows), expert_rows * tiles(widest({expert_in, expert_out})));
  auto reserve = [&](Buffer& b, const char* name, int64_t codes, int64_t scales) {
    b.codes = arena.reserve(std::string("activations.fp8.") + name + ".codes", DType::FP8_E4M3, {codes});
    b.scales = arena.reserve(std::string("activations.fp8.") + name + ".scales", DType::F32, {scales});
  };
  reserve(rows_, "rows", row_codes, row_scales);
  reserve(grad_columns_, "grad_columns", std::max(dense_out * dense_cols, expert_out * expert_cols),
          std::max(dense_out * tiles(dense_cols), expert_out * tiles(expert_cols)));
  reserve(input_columns_, "input_columns", std::max(dense_in * dense_cols, expert_in * expert_cols),
          std::max(dense_in * tiles(dense_cols), expert_in * tiles(expert_cols)));
}

Fp8Tensor Projections::operand(const Buffer& b, int64_t rows, int64_t cols, Fp8Tiles tiles) {
  const Tensor codes = arena_.get(b.codes), scales = arena_.get(b.scales);
  const Shape shape{rows, cols}, scale_shape = fp8_scale_shape(shape, tiles);
  MOE_CHECK(shape.numel() <= codes.numel() && scale_shape.numel() <= scales.numel(), "FP8 operand [", rows, ", ",
            cols, "] exceeds its scratch (", codes.numel(), " codes)");
  return Fp8Tensor{codes.view({codes.numel()}).rows(0, shape.numel()).view(shape),
                   scales.view({scales.numel()}).rows(0, scale_shape.numel()).view(scale_shape), tiles};
}

Fp8Tensor Projections::columns_operand(const Buffer& b, int64_t features, int64_t rows, int64_t segments) {
  return operand(b, features, fp8_columns_capacity(rows, segments), Fp8Tiles::Columns);
}

Fp8Tensor Projections::quantize_rows(const Buffer& b, Tensor x) {
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  Fp8Tensor q = operand(b, rows, cols);
  fp8_quantize_rows(q, x.view({rows, cols}));
  return q;
}

Fp8Tensor Projections::quantize_columns(const Buffer& b, Tensor x, Tensor offsets, int64_t segments) {
  const int64_t cols = x.dim(-1), rows = x.numel() / cols;
  Fp8Tensor q = columns_operand(b, cols, rows, segments);
  fp8_quantize_columns(q, x.view({rows, cols}), offsets);
  return q;
}

std::pair<Fp8Tensor, Fp8Tensor> Projections::quantize_output_grad(Tensor dy, Tensor offsets, int64_t segments) {
  const int64_t cols = dy.dim(-1), rows = dy.numel() / cols;
  Fp8Tensor r = operand(rows_, rows, cols), c = columns_operand(grad_columns_, cols, rows, segments);
  fp8_quantize_rows_and_columns(r, c, dy.view({rows, cols}), offsets);
  return {r, c};
}

void Projections::linear(Tensor y, Tensor x, Tensor w, const Fp8Weight& f, bool accumulate) {
  if (f.empty()) return matmul(y, x, w, false, true, 1.0f, accumulate ? 1.0f : 0.0f);
  const int64_t out = y.dim(-1);
  fp8_matmul(y.view({y.numel() / out, out}), quantize_rows(rows_, x), f.w, accumulate);
}

void Projections::linear_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, const Fp8Weight& f,
                                  bool accumulate_dx) {
  if (f.empty()) {
    matmul(dx, dy, w, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
    matmul(dw, dy, x, true, false, 1.0f, 1.0f);
    return;
  }
  fp8_linear_backward(dx, dw, dy, quantize_columns(input_columns_, x, Tensor(), 1), f, accumulate_dx);
}

void Projections::fp8_linear_backward(Tensor dx, Tensor dw, Tensor dy, const Fp8Tensor& x_columns, const Fp8Weight& f,
                                      bool accumulate_dx) {
  const auto [dy_rows, dy_columns] = quantize_output_grad(dy, Tensor(), 1);
  fp8_linear_backward(dx, dw, dy_rows, dy_columns, x_columns, f, accumulate_dx);
}

void Projections::fp8_linear_backward(Tensor dx, Tensor dw, const Fp8Tensor& dy_rows, const Fp8Tensor& dy_columns,
                                      const Fp8Tensor& x_columns, const Fp8Weight& f, bool accumulate_dx) {
  const int64_t in = dx.dim(-1);
  fp8_matmul(dx.view({dx.numel() / in, in}), dy_rows, f.w_t, accumulate_dx);
  fp8_matmul(dw, dy_columns, x_columns, /*accumulate=*/true);
}

std::pair<Fp8Tensor, Fp8Tensor> Projections::swiglu_backward_operands(Tensor dact, Tensor gu, Tensor offsets) {
  const int64_t cols = gu.dim(-1), rows = gu.numel() / cols;
  const int64_t segments = offsets.empty() ? 1 : offsets.numel() - 1;
  const Fp8Tensor r = operand(rows_, rows, cols);
  const Fp8Tensor c = columns_operand(grad_columns_, cols, rows, segments);
  fp8_swiglu_backward(r, c, dact.view({rows, cols / 2}), gu.view({rows, cols}), offsets);
  return {r, c};
}

void Projections::swiglu_linear_backward(Tensor dx, Tensor dw, Tensor dgu, Tensor dact, Tensor gu, Tensor x,
                                         Tensor w, const Fp8Weight& f, bool accumulate_dx) {
  if (f.empty()) {
    swiglu_backward(dgu, dact, gu);
    return linear_backward(dx, dw, dgu, x, w, f, accumulate_dx);
  }
  const Fp8Tensor x_columns = quantize_columns(input_columns_, x, Tensor(), 1);
  const auto [dgu_rows, dgu_columns] = swiglu_backward_operands(dact, gu, Tensor());
  fp8_linear_backward(dx, dw, dgu_rows, dgu_columns, x_columns, f, accumulate_dx);
}

void Projections::linear_shared_input(Tensor x, std::initializer_list<SharedInputLinear> layers) {
  if (layers.size() == 0) return;
  if (layers.begin()->f->empty()) {
    for (const SharedInputLinear& l : layers) linear(l.y, x, l.w, *l.f);
    return;
  }
  linear_shared_input(quantize_rows(rows_, x), layers);
}

void Projections::linear_shared_input(const Fp8Tensor& xq, std::initializer_list<SharedInputLinear> layers) {
  for (const SharedInputLinear& l : layers) {
    MOE_CHECK(!l.f->empty(), "linear_shared_input: an FP8 input operand needs the FP8 weight cache");
    const int64_t out = l.y.dim(-1);
    fp8_matmul(l.y.view({l.y.numel() / out, out}), xq, l.f->w, /*accumulate=*/false);
  }
}

Fp8Tensor Projections::rmsnorm_rows(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  const int64_t cols = out.dim(-1), rows = out.numel() / cols;
  Fp8Tensor q = operand(rows_, rows, cols);
  fp8_rmsnorm_forward(out, rstd, q, x, weight, eps);
  return q;
}

void Projections::swiglu_linear(Tensor y, Tensor act, Tensor gu, Tensor w, const Fp8Weight& f, bool accumulate) {
  if (f.empty()) {
    swiglu_forward(act, gu);
    return linear(y, act, w, f, accumulate);
  }
  const int64_t cols = act.dim(-1), rows = act.numel() / cols, out = y.dim(-1);
  const Fp8Tensor act_rows = operand(rows_, rows, cols);
  fp8_swiglu_forward(act.view({rows, cols}), act_rows, gu.view({rows, 2 * cols}));
  fp8_matmul(y.view({y.numel() / out, out}), act_rows, f.w, accumulate);
}

Fp8Tensor Projections::swiglu_rows_and_columns(Fp8Tensor act_columns, Tensor gu, Tensor offsets) {
  const int64_t rows = gu.numel() / gu.dim(-1), cols = gu.dim(-1) / 2;
  const Fp8Tensor act_rows = operand(rows_, rows, cols);
  fp8_swiglu_forward_rows_and_columns(act_rows, act_columns, gu.view({rows, 2 * cols}), offsets);
  return act_rows;
}

void Projections::swiglu_linear(Tensor y, Fp8Tensor act_columns, Tensor gu, const Fp8Weight& f, bool accumulate) {
  MOE_CHECK(!f.empty(), "swiglu_linear: an FP8 SwiGLU output needs the FP8 weight cache (train.precision = \"fp8\")");
  const int64_t out = y.dim(-1);
  fp8_matmul(y.view({y.numel() / out, out}), swiglu_rows_and_columns(act_columns, gu, Tensor()), f.w, accumulate);
}

void Projections::swiglu_columns(Fp8Tensor act_columns, Tensor gu) {
  swiglu_rows_and_columns(act_columns, gu, Tensor());
}

void Projections::linear_backward(Tensor dx, Tensor dw, Tensor dy, const Fp8Tensor& x_columns, const Fp8Weight& f,
                                  bool accumulate_dx) {
  MOE_CHECK(!f.empty(), "linear_backward: an FP8 columns input needs the FP8 weight cache");
  fp8_linear_backward(dx, dw, dy, x_columns, f, accumulate_dx);
}

void Projections::linear_backward_shared_input(Tensor dx, Tensor x,
                                               std::initializer_list<SharedInputLinearGrad> layers,
                                               bool accumulate_dx) {
  if (layers.size() == 0) return;
  const bool fp8 = !layers.begin()->f->empty();
  const Fp8Tensor x_columns = fp8 ? quantize_columns(input_columns_, x, Tensor(), 1) : Fp8Tensor{};
  bool accumulate = accumulate_dx;
  for (const SharedInputLinearGrad& l : layers) {
    if (fp8)
      fp8_linear_backward(dx, l.dw, l.dy, x_columns, *l.f, accumulate);
    else
      linear_backward(dx, l.dw, l.dy, x, l.w, *l.f, accumulate);
    accumulate = true;
  }
}

void Projections::experts_forward(Tensor c, Tensor a, Tensor w, const Fp8Weight& f, Tensor offsets) {
  if (f.empty()) return grouped_matmul(c, a, w, offsets, /*trans_b=*/true, /*accumulate=*/false);
  fp8_grouped_matmul(c, quantize_rows(rows_, a), f.w, offsets);
}

void Projections::experts_forward(Tensor c, Fp8Tensor a, const Fp8Weight& f, Tensor offsets) {
  MOE_CHECK(!f.empty(), "experts_forward: FP8 expert input rows (ep.payload = \"fp8\", or FP8 with every route on the "
            "rank) need the FP8 weight cache "
            "(train.precision = \"fp8\")");
  fp8_grouped_matmul(c, a, f.w, offsets);
}

ExpertOutputGrad Projections::experts_data_grad(Tensor dx, Tensor dy, Tensor w, const Fp8Weight& f, Tensor offsets) {
  if (f.empty()) {
    grouped_matmul(dx, dy, w, offsets, /*trans_b=*/false, /*accumulate=*/false);
    return {dy, {}};
  }
  const auto [dy_rows, dy_columns] = quantize_output_grad(dy, offsets, offsets.numel() - 1);
  fp8_grouped_matmul(dx, dy_rows, f.w_t, offsets);
  return {dy, dy_columns};
}

ExpertOutputGrad Projections::experts_data_grad(Tensor dx, const GatheredRows& dy, const Fp8Weight& f,
                                                Tensor offsets) {
  MOE_CHECK(!f.empty(), "experts_data_grad: gathered output gradients need the FP8 weight cache");
  const int64_t rows = dy.route_of_row.dim(0), cols = dy.x.dim(1);
  const Fp8Tensor r = operand(rows_, rows, cols);
  const Fp8Tensor c = columns_operand(grad_columns_, cols, rows, offsets.numel() - 1);
  fp8_quantize_gathered_rows_and_columns(r, c, dy, offsets);
  fp8_grouped_matmul(dx, r, f.w_t, offsets);
  return {Tensor(), c};
}

ExpertOutputGrad Projections::experts_swiglu_data_grad(Tensor dx, Tensor dgu, Tensor dact, Tensor gu, Tensor w,
                                                       const Fp8Weight& f, Tensor offsets) {
  if (f.empty()) {
    swiglu_backward(dgu, dact, gu);
    return experts_data_grad(dx, dgu, w, f, offsets);
  }
  const auto [dgu_rows, dgu_columns] = swiglu_backward_operands(dact, gu, offsets);
  fp8_grouped_matmul(dx, dgu_rows, f.w_t, offsets);
  return {Tensor(), dgu_columns};
}

void Projections::experts_swiglu_forward(Tensor c, Tensor act, Tensor gu, Tensor w_down, const Fp8Weight& f_down,
                                         Tensor offsets) {
  if (f_down.empty()) {
    swiglu_forward(act, gu);
    return experts_forward(c, act, w_down, f_down, offsets);
  }
  const Fp8Tensor act_rows = operand(rows_, act.dim(0), act.dim(1));
  fp8_swiglu_forward(act, act_rows, gu);
  fp8_grouped_matmul(c, act_rows, f_down.w, offsets);
}

void Projections::experts_swiglu_forward(Tensor c, Fp8Tensor act_columns, Tensor gu, const Fp8Weight& f_down,
                                         Tensor offsets) {
  MOE_CHECK(!f_down.empty(), "experts_swiglu_forward: an FP8 SwiGLU output needs the FP8 weight cache "
            "(train.precision = \"fp8\")");
  fp8_grouped_matmul(c, swiglu_rows_and_columns(act_columns, gu, offsets), f_down.w, offsets);
}

void Projections::experts_weight_grad(Tensor dw, const ExpertOutputGrad& dy, Tensor x, const Fp8Weight& f,
                                      Tensor offsets, bool accumulate) {
  if (f.empty()) return grouped_matmul_wgrad(dw, dy.dy, x, offsets, {}, accumulate);
  const int64_t experts = offsets.numel() - 1;
  fp8_grouped_matmul_wgrad(dw, dy.columns, quantize_columns(input_columns_, x, offsets, experts), offsets,
                           accumulate);
}

Fp8Tensor Projections::expert_input_columns(Fp8Tensor x, DType values, Tensor offsets) {
  const int64_t rows = x.codes.dim(0), cols = x.codes.dim(1);
  Fp8Tensor q = columns_operand(input_columns_, cols, rows, offsets.numel() - 1);
  fp8_requantize_columns(q, x, values, offsets);
  return q;
}

Fp8Tensor Projections::expert_input_columns(const GatheredRows& x, Tensor offsets) {
  const int64_t rows = x.route_of_row.dim(0), cols = x.x.dim(1);
  Fp8Tensor q = columns_operand(input_columns_, cols, rows, offsets.numel() - 1);
  fp8_quantize_gathered_columns(q, x, offsets);
  return q;
}

void Projections::experts_weight_grad(Tensor dw, const ExpertOutputGrad& dy, Fp8Tensor x_columns, const Fp8Weight& f,
                                      Tensor offsets, bool accumulate) {
  MOE_CHECK(!f.empty(), "experts_weight_grad: FP8 expert input rows (ep.payload = \"fp8\", or FP8 with every route on the "
            "rank) need the FP8 weight cache "
            "(train.precision = \"fp8\")");
  fp8_grouped_matmul_wgrad(dw, dy.columns, x_columns, offsets, accumulate);
}

}  // namespace moe
