#include "moe/ops/attention.h"

#include <cstdint>

#include "moe/ops/cpu/attention.h"
#include "moe/ops/dispatch.h"
#include "moe/ops/op_checks.h"

#if defined(MOE_HAVE_CUDA) && __has_include("moe/ops/cuda/attention.h")
#include "moe/ops/cuda/attention.h"
#define MOE_FAMILY_HAS_CUDA 1
#define MOE_CUDA_NAMESPACE cuda
#else
#define MOE_FAMILY_HAS_CUDA 0
#define MOE_CUDA_NAMESPACE cpu
#endif

namespace moe {

namespace {

void check_shape(const char* op, const AttentionShape& s) {
  MOE_CHECK(s.batch >= 0 && s.seq_len >= 0, op, ": batch ", s.batch, " and seq_len ", s.seq_len,
            " must be non-negative");
  MOE_CHECK(s.n_heads > 0 && s.n_kv_heads > 0 && s.n_heads % s.n_kv_heads == 0, op, ": n_heads ", s.n_heads,
            " must be a positive multiple of n_kv_heads ", s.n_kv_heads);
  MOE_CHECK(s.head_dim > 0, op, ": head_dim must be positive, got ", s.head_dim);
}

// The dtype of q, k, v, out and their gradients: F32 on the CPU; BF16 on the GPU, where cuDNN's
// fused attention takes half-precision inputs and outputs (and reads and writes every tensor with
// 16-byte vectors). lse is F32 everywhere.
struct AttentionCheck {
  OpCheck check;
  const AttentionShape& s;
  DType io;

  AttentionCheck(const char* op, Device device, const AttentionShape& shape)
      : check(op, device), s(shape), io(device == Device::CUDA ? DType::BF16 : DType::F32) {
    check_shape(op, s);
  }

  // A token-major [B*T, heads * hd] tensor of the io dtype.
  void rows(const char* name, const Tensor& t, int64_t heads) const {
    check.tensor(name, t, io, io == DType::BF16 ? "cuDNN attention takes BF16 inputs and outputs" : nullptr);
    expect_elems(name, t, s.batch * s.seq_len, heads * s.head_dim);
  }

  // lse [B, Hq, T] F32.
  void lse(const Tensor& t) const {
    check.tensor("lse", t, DType::F32);
    expect_elems("lse", t, s.batch * s.n_heads, s.seq_len);
  }

  void expect_elems(const char* name, const Tensor& t, int64_t rows, int64_t width) const {
    MOE_CHECK(t.numel() == rows * width, check.op(), ": ", name, " has shape ", t.shape.str(), ", expected [", rows,
              ", ", width, "] elements");
    MOE_CHECK(check.host_data() || reinterpret_cast<uintptr_t>(t.data) % 16 == 0, check.op(), ": tensor ", name,
              " must be 16-byte aligned for cuDNN");
  }

  // The CPU op's per-thread scratch; cuDNN keeps its own (see ops/cuda/attention.h).
  void workspace(const Tensor& t) const {
    if (!check.host_data()) return;
    check.workspace("workspace", t, cpu::attention_workspace_elems(s),
                    "attention_workspace_elems after setting the thread count");
  }
};

}  // namespace

// NOTES: the workspace size has no tensor to dispatch on; it is the CPU size. The CUDA op (cuDNN)
// ignores the caller's workspace and keeps its own per-stream buffer (moe/ops/cuda/attention.h),
// so no device argument is needed here.
int64_t attention_workspace_elems(const AttentionShape& s) {
  check_shape("attention_workspace_elems", s);
  return cpu::attention_workspace_elems(s);
}

int64_t attention_deterministic_workspace_bytes(const AttentionShape& s) {
  check_shape("attention_deterministic_workspace_bytes", s);
  const int64_t t = (s.seq_len + 63) / 64 * 64;
  return s.batch * s.n_heads * t * t * 2;
}

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream) {
  const AttentionCheck check("attention_forward", q.device, s);
  check.rows("q", q, s.n_heads);
  check.rows("k", k, s.n_kv_heads);
  check.rows("v", v, s.n_kv_heads);
  check.rows("out", out, s.n_heads);
  check.lse(lse);
  check.workspace(workspace);
  MOE_OP_DISPATCH(q.device, attention_forward, out, lse, q, k, v, s, workspace, stream);
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream) {
  const AttentionCheck check("attention_backward", q.device, s);
  check.rows("q", q, s.n_heads);
  check.rows("k", k, s.n_kv_heads);
  check.rows("v", v, s.n_kv_heads);
  check.rows("out", out, s.n_heads);
  check.rows("dout", dout, s.n_heads);
  check.lse(lse);
  check.rows("dq", dq, s.n_heads);
  check.rows("dk", dk, s.n_kv_heads);
  check.rows("dv", dv, s.n_kv_heads);
  check.workspace(workspace);
  MOE_OP_DISPATCH(q.device, attention_backward, dq, dk, dv, dout, q, k, v, out, lse, s, workspace, stream);
}

}  // namespace moe
