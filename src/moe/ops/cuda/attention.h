// CUDA causal attention through cuDNN's fused SDPA (flash attention), driven by the cuDNN
// frontend graph API. Semantics: moe/ops/attention.h; ops/attention.cpp checks the arguments, the
// 16-byte alignment cuDNN needs included.
//
// Dtypes on the GPU: q, k, v, out (and dout, dq, dk, dv) are BF16 (cuDNN's fused attention takes
// half-precision inputs and outputs; the GPU model runs BF16), F32 tensors are refused; lse is F32
// [B, Hq, T], cuDNN's softmax stats (natural-log log-sum-exp of the scaled scores per query row)
// written straight into it. Matmuls and softmax run in FP32 inside cuDNN. Grouped-query heads go
// to cuDNN as they are (K/V with Hkv heads); dk/dv come back as the group sums.
//
// The token-major layout [B*T, H*hd] is handed to cuDNN as [b, h, s, d] with strides
// {T*H*hd, hd, H*hd, 1}: no transposes.
//
// NOTES: built only where CMake found cuDNN and the frontend headers (MOE_HAVE_CUDNN); otherwise
// every entry point fails with a clear error and attention_supported() says why.
// One cuDNN handle per device and one graph per (device, B, T, Hq, Hkv, hd, dtype, fwd/bwd), both
// built on first use and kept for the life of the process. The cuDNN workspace is not the
// caller's `workspace` tensor (that stays sized for the CPU op, see moe/ops/attention.cpp): each
// stream gets a device buffer owned by this file, allocated on first use and grown (after a
// synchronize of that stream) when a newly built graph needs more (the backward's can be large: an
// FP32 dQ accumulator is B*Hq*T*hd*4 bytes, 268 MB at B=8, T=4096, Hq=16, hd=128; the size was not
// measured). This memory lives outside the caller's planned allocation. Creating the handle, building a
// graph and allocating the workspace must not happen during CUDA graph capture: the first eager
// call of each shape does them, a first call under capture fails with a clear error; later calls
// only enqueue work and may be captured. The backward is cuDNN's default (non-deterministic: dQ
// accumulates with atomics) unless s.deterministic asks for cuDNN's deterministic algorithm, which
// on Hopper stores the score gradients dP in the workspace and computes dQ from them as a product
// (attention_deterministic_workspace_bytes: 4.3 GB at B=8, T=4096, Hq=16); the forward is always
// deterministic.
#pragma once

#include <string>

#include "moe/core/stream.h"
#include "moe/core/tensor.h"
#include "moe/ops/attention.h"

namespace moe::cuda {

// True when this binary was built with cuDNN attention; otherwise false with the reason in *why.
bool attention_supported(std::string* why = nullptr);

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream);
// The cuDNN workspace of the forward or backward graph for s (built now if it was not; not during
// capture on `stream`): what the memory plan's reserve must cover.
int64_t attention_workspace_bytes(const AttentionShape& s, bool backward, Stream stream);
void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream);

}  // namespace moe::cuda
