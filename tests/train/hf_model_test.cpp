// HfModel reads any flat range of moetrain's logical tensors from a Hugging Face folder: the
// fused expert tensors assembled from the per-expert Hub layout (gate rows, then up rows, per
// expert) or read from the fused layout, F32 or BF16, one file or shards. Ranges that start and
// end inside an expert or across the gate/up boundary (what FSDP shards ask for) give exactly the
// elements of the whole tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../cli/hf_folder.h"
#include "moe/model/weights.h"
#include "moe/train/hf_model.h"
#include "train_test_util.h"

namespace moe {
namespace {

// The expected logical tensor `name` (fused experts) from the tensors the folder was written with.
std::vector<float> expected(const HfSpec& s, const std::vector<HfTensorData>& tensors, const std::string& name) {
  const bool gate_up = name.find("mlp.experts.gate_up_proj") != std::string::npos;
  const bool down = name.find("mlp.experts.down_proj") != std::string::npos;
  if (s.fused || !(gate_up || down)) return find_tensor(tensors, name).values;
  const std::string base = name.substr(0, name.rfind('.') + 1);
  std::vector<float> out;
  for (int64_t x = 0; x < s.experts; ++x)
    for (const char* part : gate_up ? std::vector<const char*>{"gate_proj", "up_proj"} : std::vector<const char*>{"down_proj"}) {
      const std::vector<float>& v = find_tensor(tensors, base + std::to_string(x) + "." + part + ".weight").values;
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}

void expect_ranges_read_exactly(const HfSpec& s, int shards, DType dtype) {
  testing::TempDir dir;
  const std::vector<HfTensorData> tensors = olmoe_tensors(s);
  write_hf_folder(dir.path + "/hf", olmoe_config(s), tensors, shards, dtype);
  const HfModel model(dir.path + "/hf", "test");
  EXPECT_EQ(model.fused_experts(), s.fused);
  const ParamRegistry reg = build_registry(model.model(), 0, model.model().num_experts, ParamLayout::ByBlock);
  const int64_t per_expert_gate_up = 2 * s.intermediate * s.hidden;
  for (const ParamEntry& e : reg.entries()) {
    const int64_t n = e.global_shape.numel();
    const std::vector<float> want = expected(s, tensors, e.name);  // exact in BF16 (hf_folder.h: pattern)
    ASSERT_EQ(static_cast<int64_t>(want.size()), n) << e.name;
    std::vector<float> whole(static_cast<size_t>(n));
    model.read(e.name, 0, n, whole.data());
    ASSERT_EQ(whole, want) << e.name;
    // Ranges inside one element run, across the gate/up boundary, across experts, and empty.
    const int64_t h = s.intermediate * s.hidden;
    for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{
             {1, n - 1}, {h - 3, h + 5}, {per_expert_gate_up - 2, per_expert_gate_up + 3}, {n / 3, n / 3}, {n - 1, n}}) {
      if (begin < 0 || end > n || begin > end) continue;
      std::vector<float> part(static_cast<size_t>(end - begin));
      model.read(e.name, begin, end, part.data());
      ASSERT_EQ(part, std::vector<float>(want.begin() + begin, want.begin() + end))
          << e.name << " [" << begin << ", " << end << ")";
    }
  }
}

TEST(HfModel, RangesOfPerExpertF32TensorsAreTheFusedTensorsElements) { expect_ranges_read_exactly({}, 0, DType::F32); }

TEST(HfModel, RangesOfShardedPerExpertBf16TensorsAreTheFusedTensorsElements) {
  expect_ranges_read_exactly({}, 3, DType::BF16);
}

TEST(HfModel, RangesOfFusedBf16TensorsAreTheTensorsElements) {
  HfSpec s;
  s.fused = true;
  expect_ranges_read_exactly(s, 0, DType::BF16);
}

// A weight file rewritten in place (a save_pretrained into the folder) while it is imported: the
// read through its mapping raised SIGBUS, which killed import-hf with no word and left its staging
// folder behind. Now the read is an error naming the file and the tensor.
TEST(HfModel, WeightFileCutShortAfterOpeningIsAnErrorNamingIt) {
  testing::TempDir dir;
  const HfSpec s;
  write_hf_folder(dir.path + "/hf", olmoe_config(s), olmoe_tensors(s));
  const HfModel model(dir.path + "/hf", "test");
  const std::string file = dir.path + "/hf/model.safetensors";
  ASSERT_EQ(::truncate(file.c_str(), 4096), 0);  // lm_head.weight lies pages past this
  std::vector<float> lm_head(static_cast<size_t>(s.vocab * s.hidden));
  try {
    model.read("lm_head.weight", 0, s.vocab * s.hidden, lm_head.data());
    ADD_FAILURE() << "read a tensor past the end of the file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file + " ends inside tensor 'lm_head.weight'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moe
