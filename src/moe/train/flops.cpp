#include "moe/train/flops.h"

#include "moe/core/device.h"
#include "moe/core/error.h"

namespace moe {

FlopCount count_flops(const ModelConfig& c, int64_t seq_len) {
  const double D = static_cast<double>(c.hidden_size), V = static_cast<double>(c.vocab_size);
  const double hd = static_cast<double>(c.head_dim());
  const double q_out = static_cast<double>(c.num_attention_heads) * hd;
  const double kv_out = static_cast<double>(c.num_key_value_heads) * hd;
  const double N = static_cast<double>(c.num_experts), K = static_cast<double>(c.num_experts_per_tok);
  const double H = static_cast<double>(c.intermediate_size);
  const double S = static_cast<double>(c.shared_expert_intermediate_size);
  const double Hd = static_cast<double>(c.dense_intermediate_size);

  double matmul = D * V;  // LM head
  double expert_matmul = 0;
  double total = 2 * D * V + D;  // embedding, LM head, final norm
  double active = total;
  double qk_norm = c.qk_norm == QkNorm::Full ? q_out + kv_out : c.qk_norm == QkNorm::PerHead ? 2 * hd : 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const double attn = D * (q_out + 2 * kv_out) + q_out * D;
    const double norms = 2 * D + qk_norm;
    matmul += attn;
    total += attn + norms;
    active += attn + norms;
    if (c.is_moe_layer(l)) {
      const double expert = 3 * D * H;
      matmul += D * N + K * expert + 3 * D * S;
      expert_matmul += K * expert;
      total += D * N + N * expert + 3 * D * S;
      active += D * N + K * expert + 3 * D * S;
    } else {
      matmul += 3 * D * Hd;
      total += 3 * D * Hd;
      active += 3 * D * Hd;
    }
  }
  FlopCount f;
  f.matmul_params_per_token = matmul;
  f.expert_params_per_token = expert_matmul;
  f.attention_flops_per_token = 12.0 * static_cast<double>(c.num_hidden_layers) * static_cast<double>(seq_len) * q_out;
  f.flops_per_token = 6 * matmul + f.attention_flops_per_token;
  f.total_params = total;
  f.active_params = active;
  return f;
}

MfuPeak mfu_peak(double configured_tflops, Device device) {
  if (configured_tflops > 0) return {configured_tflops, "run.peak_tflops"};
  if (device == Device::CPU) return {0.2, "the CPU default; set run.peak_tflops for your machine"};
  const GpuInfo g = current_gpu();
  MOE_CHECK(g.major == 9 && g.minor == 0, "no default MFU denominator for ", g.name, " (compute capability ", g.major,
            ".", g.minor, "); set run.peak_tflops to its dense BF16 peak in TFLOP/s");
  return {989.0, "dense BF16 peak of an SXM Hopper GPU (" + g.name + "); set run.peak_tflops for other parts"};
}

}  // namespace moe
