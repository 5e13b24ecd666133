// CUDA causal attention: one cuDNN SDPA graph per shape for the forward (out + softmax stats)
// and one for the backward (dq, dk, dv from q, k, v, out, dout, stats), built with the cuDNN
// frontend on first use and cached. Host code only: cuDNN's engines are the kernels.
//
// Masking: top-left diagonal alignment with right bound 0, i.e. query t sees keys 0..t (the
// frontend's causal mask, spelled without its deprecated setter). Stats: cuDNN writes
// max + log(sum exp) of the scaled scores per query row, F32 [b, h, s, 1] with strides
// {h*s, s, 1, 1}, which is exactly our lse [B, Hq, T].
#include "moe/ops/cuda/attention.h"

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "moe/core/cuda_check.h"

#if defined(MOE_HAVE_CUDNN)
#include <cudnn.h>
#include <cudnn_frontend.h>
#endif

namespace moe::cuda {

#if defined(MOE_HAVE_CUDNN)

namespace fe = cudnn_frontend;

namespace {

#define CUDNN_CHECK(call)                                                                               \
  do {                                                                                                  \
    const cudnnStatus_t moe_cudnn_rc_ = (call);                                                         \
    if (moe_cudnn_rc_ != CUDNN_STATUS_SUCCESS) MOE_FAIL(#call, " failed: ", cudnnGetErrorString(moe_cudnn_rc_)); \
  } while (0)

// Tensor uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kOut, kStats, kDout, kDq, kDk, kDv };

std::string shape_str(const AttentionShape& s) {
  return "(B=" + std::to_string(s.batch) + ", T=" + std::to_string(s.seq_len) + ", Hq=" + std::to_string(s.n_heads) +
         ", Hkv=" + std::to_string(s.n_kv_heads) + ", hd=" + std::to_string(s.head_dim) +
         (s.deterministic ? ", deterministic" : "") + ")";
}

void check_not_capturing(cudaStream_t stream, const char* what, const AttentionShape& s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  MOE_CHECK(status == cudaStreamCaptureStatusNone, "attention: the ", what, " for shape ", shape_str(s),
            " would be created during CUDA graph capture (it allocates device memory or builds cuDNN plans); run "
            "one eager call of this shape on this stream before capturing");
}

void fe_check(fe::error_t e, const char* stage, const char* op, const AttentionShape& s) {
  MOE_CHECK(e.is_good(), op, ": cuDNN frontend ", stage, " failed for shape ", shape_str(s), " (BF16): ",
            e.get_message());
}

// [b, h, s, d] view of a token-major [B*T, H*hd] matrix.
std::vector<int64_t> bhsd_dims(const AttentionShape& s, int64_t heads) {
  return {s.batch, heads, s.seq_len, s.head_dim};
}
std::vector<int64_t> token_major_strides(const AttentionShape& s, int64_t heads) {
  return {s.seq_len * heads * s.head_dim, s.head_dim, heads * s.head_dim, 1};
}

std::shared_ptr<fe::graph::Tensor_attributes> bhsd_tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                          const AttentionShape& s, int64_t heads) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim(bhsd_dims(s, heads))
                      .set_stride(token_major_strides(s, heads)));
}
void set_bhsd_output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, const char* name, Uid uid,
                     const AttentionShape& s, int64_t heads) {
  t->set_output(true).set_name(name).set_uid(uid).set_dim(bhsd_dims(s, heads)).set_stride(
      token_major_strides(s, heads));
}
std::vector<int64_t> stats_dims(const AttentionShape& s) { return {s.batch, s.n_heads, s.seq_len, 1}; }
std::vector<int64_t> stats_strides(const AttentionShape& s) { return {s.n_heads * s.seq_len, s.seq_len, 1, 1}; }

std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float attention_scale(const AttentionShape& s) { return 1.0f / std::sqrt(static_cast<float>(s.head_dim)); }

std::shared_ptr<fe::graph::Graph> forward_graph(const AttentionShape& s) {
  auto g = new_graph();
  auto q = bhsd_tensor(*g, "q", kQ, s, s.n_heads);
  auto k = bhsd_tensor(*g, "k", kK, s, s.n_kv_heads);
  auto v = bhsd_tensor(*g, "v", kV, s, s.n_kv_heads);
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("attention_forward")
                   .set_generate_stats(true)
                   .set_attn_scale(attention_scale(s))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);
  auto [out, stats] = g->sdpa(q, k, v, attrs);
  set_bhsd_output(out, "out", kOut, s, s.n_heads);
  stats->set_output(true)
      .set_name("lse")
      .set_uid(kStats)
      .set_data_type(fe::DataType_t::FLOAT)
      .set_dim(stats_dims(s))
      .set_stride(stats_strides(s));
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const AttentionShape& s) {
  auto g = new_graph();
  auto q = bhsd_tensor(*g, "q", kQ, s, s.n_heads);
  auto k = bhsd_tensor(*g, "k", kK, s, s.n_kv_heads);
  auto v = bhsd_tensor(*g, "v", kV, s, s.n_kv_heads);
  auto out = bhsd_tensor(*g, "out", kOut, s, s.n_heads);
  auto dout = bhsd_tensor(*g, "dout", kDout, s, s.n_heads);
  auto stats = g->tensor(fe::graph::Tensor_attributes()
                             .set_name("lse")
                             .set_uid(kStats)
                             .set_data_type(fe::DataType_t::FLOAT)
                             .set_dim(stats_dims(s))
                             .set_stride(stats_strides(s)));
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("attention_backward")
                   .set_attn_scale(attention_scale(s))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(s.deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, out, dout, stats, attrs);
  set_bhsd_output(dq, "dq", kDq, s, s.n_heads);
  set_bhsd_output(dk, "dk", kDk, s, s.n_kv_heads);
  set_bhsd_output(dv, "dv", kDv, s, s.n_kv_heads);
  return g;
}

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

struct StreamBuffer {
  void* ptr = nullptr;
  int64_t bytes = 0;
};

// device, B, T, Hq, Hkv, hd, dtype, backward, deterministic
using GraphKey = std::array<int64_t, 9>;

// The process-wide cuDNN state: handles, graphs, per-stream workspaces. Never destroyed (it would
// run after the CUDA context is gone at exit); the driver frees it with the process.
class CudnnAttentionContext {
 public:
  static CudnnAttentionContext& get() {
    static CudnnAttentionContext* context = new CudnnAttentionContext();
    return *context;
  }

  // Runs the (cached) graph for s on stream with the given device pointers.
  void run(bool backward, const AttentionShape& s, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
    const char* op = backward ? "attention_backward" : "attention_forward";
    int device = -1;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    cudnnHandle_t h = handle(device, stream, s);
    const CachedGraph& g = graph(device, backward, s, h, stream, op);
    void* ws = workspace(stream, g.workspace_bytes, s);
    CUDNN_CHECK(cudnnSetStream(h, stream));
    fe_check(g.graph->execute(h, pack, ws), "execute", op, s);
  }

  int64_t workspace_bytes(bool backward, const AttentionShape& s, cudaStream_t stream) {
    int device = -1;
    CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    cudnnHandle_t h = handle(device, stream, s);
    return graph(device, backward, s, h, stream, backward ? "attention_backward" : "attention_forward")
        .workspace_bytes;
  }

 private:
  CudnnAttentionContext() = default;

  cudnnHandle_t handle(int device, cudaStream_t stream, const AttentionShape& s) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    check_not_capturing(stream, "cuDNN handle", s);
    cudnnHandle_t h = nullptr;
    CUDNN_CHECK(cudnnCreate(&h));
    handles_.emplace(device, h);
    return h;
  }

  const CachedGraph& graph(int device, bool backward, const AttentionShape& s, cudnnHandle_t h, cudaStream_t stream,
                           const char* op) {
    const GraphKey key{device, s.batch, s.seq_len, s.n_heads, s.n_kv_heads, s.head_dim,
                       static_cast<int64_t>(DType::BF16), backward ? 1 : 0, s.deterministic ? 1 : 0};
    auto it = graphs_.find(key);
    if (it != graphs_.end()) return it->second;
    check_not_capturing(stream, backward ? "cuDNN backward plan" : "cuDNN forward plan", s);
    CachedGraph c;
    c.graph = backward ? backward_graph(s) : forward_graph(s);
    fe_check(c.graph->validate(), "validate", op, s);
    fe_check(c.graph->build_operation_graph(h), "build_operation_graph", op, s);
    fe_check(c.graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", op, s);
    fe_check(c.graph->check_support(), "check_support", op, s);
    fe_check(c.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", op, s);
    fe_check(c.graph->get_workspace_size(c.workspace_bytes), "get_workspace_size", op, s);
    return graphs_.emplace(key, std::move(c)).first->second;
  }

  // This stream's cuDNN workspace, grown to at least `bytes`. Growth happens only right after a new
  // graph was built (an eager call): the old buffer may still be read by queued work on this
  // stream, so the stream is drained before it is freed.
  void* workspace(cudaStream_t stream, int64_t bytes, const AttentionShape& s) {
    StreamBuffer& b = workspaces_[stream];
    if (bytes <= b.bytes && b.ptr != nullptr) return b.ptr;
    if (bytes == 0) return nullptr;
    check_not_capturing(stream, "cuDNN workspace", s);
    if (b.ptr != nullptr) {
      CUDA_CHECK(cudaStreamSynchronize(stream));
      CUDA_CHECK(cudaFree(b.ptr));
      b = StreamBuffer{};
    }
    CUDA_CHECK(cudaMalloc(&b.ptr, static_cast<size_t>(bytes)));
    b.bytes = bytes;
    return b.ptr;
  }

  std::mutex mutex_;
  std::map<int, cudnnHandle_t> handles_;
  std::map<GraphKey, CachedGraph> graphs_;
  std::unordered_map<cudaStream_t, StreamBuffer> workspaces_;
};

}  // namespace

bool attention_supported(std::string* why) {
  (void)why;
  return true;
}

void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v, const AttentionShape& s,
                       Tensor workspace, Stream stream) {
  (void)workspace;  // cuDNN's workspace is per stream, owned by the context (see the header)
  const int64_t rows = s.batch * s.seq_len;
  if (rows == 0) return;
  std::unordered_map<int64_t, void*> pack{
      {kQ, q.data}, {kK, k.data}, {kV, v.data}, {kOut, out.data}, {kStats, lse.data}};
  CudnnAttentionContext::get().run(false, s, pack, cuda_stream(stream));
}

int64_t attention_workspace_bytes(const AttentionShape& s, bool backward, Stream stream) {
  return CudnnAttentionContext::get().workspace_bytes(backward, s, cuda_stream(stream));
}

void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                        Tensor lse, const AttentionShape& s, Tensor workspace, Stream stream) {
  (void)workspace;
  const int64_t rows = s.batch * s.seq_len;
  if (rows == 0) return;
  std::unordered_map<int64_t, void*> pack{{kQ, q.data},       {kK, k.data},   {kV, v.data},   {kOut, out.data},
                                          {kDout, dout.data}, {kStats, lse.data}, {kDq, dq.data}, {kDk, dk.data},
                                          {kDv, dv.data}};
  CudnnAttentionContext::get().run(true, s, pack, cuda_stream(stream));
}

#else  // built without cuDNN: every CUDA call is refused

namespace {
constexpr const char* kNoCudnn =
    "this binary was built without cuDNN attention (CMake found no libcudnn, cudnn.h or cuDNN frontend headers; "
    "scripts/setup.sh installs the frontend into .deps/cudnn-frontend)";
}

bool attention_supported(std::string* why) {
  if (why != nullptr) *why = kNoCudnn;
  return false;
}

void attention_forward(Tensor, Tensor, Tensor, Tensor, Tensor, const AttentionShape&, Tensor, Stream) {
  MOE_FAIL("attention_forward: ", kNoCudnn);
}

int64_t attention_workspace_bytes(const AttentionShape&, bool, Stream) {
  MOE_FAIL("attention_workspace_bytes: ", kNoCudnn);
}

void attention_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                        const AttentionShape&, Tensor, Stream) {
  MOE_FAIL("attention_backward: ", kNoCudnn);
}

#endif

}  // namespace moe::cuda
