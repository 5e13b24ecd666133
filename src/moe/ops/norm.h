// RMSNorm over the last dimension.
#pragma once

#include "moe/core/stream.h"
#include "moe/core/tensor.h"

namespace moe {

// x [R, C], weight [C], out [R, C], rstd [R] (saved for backward):
// rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps); out[r,c] = x[r,c] * rstd[r] * weight[c].
// Per-head QK-norm views x as [R*H, hd] with weight [hd]; full-projection QK-norm uses [R, H*hd].
void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Stream stream = {});

// dx = d out / d x applied to dout (written, or added when accumulate_dx, for residual paths);
// dweight[c] += sum_r dout[r,c] * x[r,c] * rstd[r] (always accumulated: gradient accumulation).
void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight, Tensor rstd,
                      bool accumulate_dx, Stream stream = {});

}  // namespace moe
