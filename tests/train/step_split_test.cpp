// The step-time split of `moetrain bench`: kernels sorted into kinds by name, each kind's time per
// step, share, and achieved rate computed from the model's FLOP count (or the optimizer's bytes),
// against the ceilings given. The ceilings themselves are measured on the GPU (bench only).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moe/core/device.h"
#include "moe/train/step_split.h"

namespace moe {
namespace {

TEST(StepSplit, kernels_are_grouped_by_name) {
  EXPECT_EQ(kernel_group("_ZN4moe4cuda12_GLOBAL__N_112adamw_kernelILb1EEEvPfPKfS3_S3_"), KernelGroup::AdamW);
  // The update that writes the FP8 caches in its pass is AdamW's; the caches' own pass is not.
  EXPECT_EQ(kernel_group("_ZN4moe4cuda12_GLOBAL__N_128adamw_quantize_blocks_kernelIfEEvPfPKf"), KernelGroup::AdamW);
  EXPECT_EQ(kernel_group("_ZN4moe4cuda12_GLOBAL__N_122quantize_blocks_kernelEPKfPhPfS3_S4_"), KernelGroup::Fp8Cache);
  EXPECT_EQ(kernel_group("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...>>(...)"),
            KernelGroup::ExpertGemm);
  EXPECT_EQ(kernel_group("_ZN4moe4cuda15cutlass_grouped18zero_empty_expertsEPfPKill"), KernelGroup::Other);
  EXPECT_EQ(kernel_group("void moe::cuda::sm90_fp8::(anonymous namespace)::fp8_nt_kernel<2>(CUtensorMap_st, ...)"),
            KernelGroup::ExpertGemm);
  EXPECT_EQ(kernel_group("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NTN"), KernelGroup::DenseGemm);
  EXPECT_EQ(kernel_group("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"), KernelGroup::DenseGemm);
  EXPECT_EQ(kernel_group("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3"),
            KernelGroup::Attention);
  EXPECT_EQ(kernel_group("_ZN4moe4cuda12_GLOBAL__N_126sum_squares_partial_kernelEPKfl"), KernelGroup::GradNorm);
  EXPECT_EQ(kernel_group("_ZN4moe4cuda12_GLOBAL__N_121rmsnorm_forward_kernelEv"), KernelGroup::Other);
  EXPECT_EQ(kernel_group("[memcpy DtoD]"), KernelGroup::Other);
  // FP8: the quantizers, the SwiGLU forward that quantizes among them (its bytes are counted there,
  // train/step_work.h); the RMSNorm and dispatch scatter that quantize stay element-wise.
  EXPECT_EQ(kernel_group("moe::cuda::fp8_tiles::quantize_columns_staged_kernel<"
                         "moe::cuda::(anonymous namespace)::StagedGatheredRows<true>, true>(...)"),
            KernelGroup::Fp8Quantize);
  EXPECT_EQ(kernel_group("moe::cuda::fp8_tiles::quantize_columns_kernel<__nv_bfloat16, true>"),
            KernelGroup::Fp8Quantize);
  EXPECT_EQ(kernel_group("moe::cuda::fp8_tiles::quantize_rows_kernel<__nv_bfloat16, moe::cuda::SwigluForwardRows<>>"),
            KernelGroup::Fp8Quantize);
  EXPECT_EQ(kernel_group("moe::cuda::route_rows::scatter_routes_fp8_kernel<__nv_bfloat16>"), KernelGroup::Other);
}

TEST(StepSplit, rates_come_from_the_step_work_and_the_time_per_step) {
  StepWork work;
  const double tokens = 32768;
  work.expert_flops = 6 * 2e8 * tokens;
  work.dense_flops = 6 * 1e8 * tokens;
  work.attention_flops = 5e8 * tokens;
  work.adamw_bytes = 30e9;
  work.elementwise_bytes = 20e9;
  work.optimizer_other_bytes = 4e9;
  Ceilings c;
  c.gemm_tflops = 800;
  c.copy_tb_s = 4;
  const std::vector<KernelProfiler::Entry> entries = {
      {"void cutlass::device_kernel<GemmUniversal>", 30, 40.0},  // 3 steps: 13.33 ms per step
      {"nvjet_tst_128x256", 90, 12.0},
      {"adamw_kernel", 6, 30.0},
      {"rope_kernel", 30, 6.0},
      {"another_elementwise", 30, 3.0},
  };
  const auto rows = split_step(entries, 3, work, c);
  ASSERT_EQ(rows.size(), 4u);  // no attention and no gradient-norm time: no rows for them
  EXPECT_EQ(rows[0].group, KernelGroup::ExpertGemm);
  EXPECT_EQ(rows[1].group, KernelGroup::DenseGemm);
  EXPECT_EQ(rows[2].group, KernelGroup::AdamW);
  EXPECT_EQ(rows[3].group, KernelGroup::Other);
  EXPECT_NEAR(rows[0].ms_per_step, 40.0 / 3, 1e-9);
  EXPECT_NEAR(rows[3].ms_per_step, 3.0, 1e-9);
  double share = 0;
  for (const auto& r : rows) share += r.share;
  EXPECT_NEAR(share, 1.0, 1e-12);
  EXPECT_NEAR(rows[0].share, 40.0 / 91.0, 1e-12);
  // 6 x 2e8 x 32768 FLOPs in 13.33 ms; the dense products: 6 x 1e8 x 32768 in 4 ms.
  EXPECT_NEAR(rows[0].rate, 6 * 2e8 * tokens / (40.0 / 3 * 1e-3) / 1e12, 1e-9);
  EXPECT_NEAR(rows[1].rate, 6 * 1e8 * tokens / 4e-3 / 1e12, 1e-9);
  EXPECT_STREQ(rows[0].unit, "TFLOP/s");
  EXPECT_EQ(rows[0].ceiling, 800);
  // AdamW: 30 GB in 10 ms per step = 3 TB/s against the 4 TB/s copy.
  EXPECT_NEAR(rows[2].rate, 3.0, 1e-12);
  EXPECT_STREQ(rows[2].unit, "TB/s");
  EXPECT_EQ(rows[2].ceiling, 4);
  // Element-wise bytes and the optimizer's other passes: 24 GB in 3 ms = 8 TB/s.
  EXPECT_NEAR(rows[3].rate, 8.0, 1e-12);

  const std::string text = format_step_split(rows, c);
  EXPECT_NE(text.find("expert GEMMs"), std::string::npos) << text;
  EXPECT_NE(text.find("75% of the ceiling"), std::string::npos) << text;  // AdamW 3 of 4 TB/s
  EXPECT_THROW(split_step(entries, 0, work, c), Error);
}

// In FP8 the expert and dense GEMMs are measured against the FP8 GEMM ceiling; attention, BF16 in
// both precisions, against the BF16 one.
TEST(StepSplit, fp8_runs_measure_the_gemm_rows_against_the_fp8_ceiling_and_attention_against_bf16) {
  StepWork work;
  work.expert_flops = 1e15;
  work.dense_flops = 1e15;
  work.attention_flops = 1e15;
  Ceilings c;
  c.gemm_tflops = 800;
  c.fp8_gemm_tflops = 1450;
  c.copy_tb_s = 4;
  const std::vector<KernelProfiler::Entry> entries = {
      {"void cutlass::device_kernel<GemmUniversal>", 1, 1.0},
      {"nvjet_sm90_qqtst_128x128", 1, 1.0},
      {"cudnn_generated_fort_native_sdpa_sm90_flash_fprop", 1, 1.0},
  };
  const auto rows = split_step(entries, 1, work, c);
  ASSERT_EQ(rows.size(), 3u);
  for (const SplitRow& r : rows) {
    SCOPED_TRACE(kernel_group_name(r.group));
    EXPECT_EQ(r.ceiling, r.group == KernelGroup::Attention ? 800 : 1450);
  }
}

// With one rank per stage in FP8 the AdamW pass writes the caches: the row says what share of its
// time that is, by the caches' share of its bytes.
TEST(StepSplit, the_adamw_row_gives_the_fp8_caches_share_of_its_time) {
  StepWork work;
  work.adamw_bytes = 30e9;
  work.fp8_cache_in_adamw_bytes = 3e9;
  Ceilings c;
  c.gemm_tflops = 800;
  c.copy_tb_s = 4;
  const auto rows = split_step({{"moe::cuda::adamw_quantize_blocks_kernel<float>", 2, 20.0}}, 2, work, c);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].group, KernelGroup::AdamW);
  EXPECT_NEAR(rows[0].fp8_cache_ms, 1.0, 1e-12);  // 10 ms per step, a tenth of the bytes
  const std::string text = format_step_split(rows, c);
  EXPECT_NE(text.find("of which writing the FP8 caches ~1.00 ms"), std::string::npos) << text;
  work.fp8_cache_in_adamw_bytes = 0;  // BF16, or a separate cache pass
  const std::string plain = format_step_split(split_step({{"adamw_kernel", 2, 20.0}}, 2, work, c), c);
  EXPECT_EQ(plain.find("FP8 caches"), std::string::npos) << plain;
}

TEST(StepSplit, ceilings_say_why_they_were_not_measured_without_a_gpu) {
  std::string why;
  if (cuda_available(&why)) GTEST_SKIP() << "a GPU is present: measured by moetrain bench";
  const Ceilings c = measure_ceilings();
  EXPECT_EQ(c.gemm_tflops, 0);
  EXPECT_FALSE(c.why_not.empty());
  EXPECT_NE(format_step_split({}, c).find("not measured"), std::string::npos);
}

}  // namespace
}  // namespace moe
