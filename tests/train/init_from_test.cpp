// `train --init-from` (TrainOptions::init_from): a new run starts from another run's checkpoint or
// from a Hugging Face folder with exactly those weights (and the router bias), AdamW moments at
// zero, step 0, the data and LR schedule from their start and a run id of its own; the source is
// only read; another architecture is refused naming the key; a resume of the fine-tuning run
// continues from its own checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/train/hf_interop.h"
#include "moe/train/init_source.h"
#include "moe/train/trainer.h"
#include "init_from_checks.h"
#include "train_test_util.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

// A 3-step source run on the small config (with `extra`), saved at the end; returns its
// checkpoint directory.
std::string train_source(const std::string& dir, std::vector<std::string> extra = {}) {
  TrainOptions quiet;
  quiet.quiet = true;
  extra.push_back("train.steps=3");
  Trainer t(testing::small_config(dir, extra), quiet, testing::local_world());
  t.run();
  return dir + "/step-000003";
}

TrainOptions init_options(const std::string& from) {
  TrainOptions o;
  o.quiet = true;
  o.init_from = from;
  return o;
}

nlohmann::json train_state(const std::string& ckpt) {
  std::ifstream in(ckpt + "/train_state.json");
  return nlohmann::json::parse(in);
}

// Every file under dir with its size and bytes, to show a source was left as it was.
std::map<std::string, std::string> contents(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) {
      out[fs::relative(e.path(), dir).string()] = "(dir)";
      continue;
    }
    std::ifstream in(e.path(), std::ios::binary);
    out[fs::relative(e.path(), dir).string()] =
        std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

TEST(InitFrom, TakesTheCheckpointsWeightsAndBiasWithFreshMomentsStepDataAndSchedule) {
  testing::TempDir src_dir, ft_dir;
  // The source routes with an auxiliary-loss-free bias, so its bias is not zero.
  const std::string ckpt = train_source(src_dir.path, {"model.bias_update_rate=0.01"});
  const std::map<std::string, std::string> source_before = contents(src_dir.path);
  const CheckpointReader source(ckpt);
  // Another run: other train settings, one microbatch per step (so a step's loss is the first
  // microbatch's), the bias frozen (bias_update_rate may differ: it is a training setting), and
  // the run directory, not the checkpoint, given as the source.
  const std::vector<std::string> ft = {"train.steps=2", "train.lr=1e-3", "train.warmup_steps=0",
                                       "train.global_batch_size=2", "data.seed=7"};
  Trainer t(testing::small_config(ft_dir.path, ft), init_options(src_dir.path), testing::local_world());
  testing::expect_weights_of(t, source);

  // The checkpoint evaluated on the fine-tuning run's first batch (the eval path: its weights
  // and bias, the fine-tuning data): the first training step's loss must be that loss.
  std::vector<std::string> eval_cfg = ft;
  eval_cfg.push_back("model.bias_update_rate=0.01");  // the checkpoint's own model config, as eval requires
  TrainOptions eval_opts;
  eval_opts.quiet = eval_opts.bench = true;
  eval_opts.checkpoint = std::make_shared<const CheckpointReader>(ckpt);
  Trainer eval(testing::small_config(ft_dir.path + "-unused", eval_cfg), eval_opts, testing::local_world());
  const double checkpoint_loss = eval.microbatch_loss(0);

  const TrainSummary s = t.run();
  EXPECT_EQ(s.first_step, 0);
  ASSERT_EQ(s.steps.size(), 2u);
  EXPECT_EQ(s.steps[0].step, 1);
  // Forward only against forward + backward: the same ops on the same batch give the same sum.
  EXPECT_EQ(s.steps[0].lm_loss, checkpoint_loss) << "the first step did not see the checkpoint's model on batch 0";
  EXPECT_DOUBLE_EQ(s.steps[0].lr, 1e-3) << "the LR schedule did not start at step 0 (no warmup: the peak)";
  EXPECT_EQ(s.skipped_steps, 0);

  const nlohmann::json st = train_state(ft_dir.path + "/step-000002");
  EXPECT_EQ(st["step"], 2);
  ASSERT_TRUE(st.contains("init_from")) << st.dump();
  EXPECT_EQ(st["init_from"]["path"], fs::canonical(ckpt).string());
  EXPECT_EQ(st["init_from"]["format"], "moetrain_checkpoint");
  EXPECT_EQ(st["init_from"]["step"], 3);
  EXPECT_EQ(st["init_from"]["run_id"], source.train_state_string("run_id"));
  EXPECT_NE(st["run_id"], source.train_state_string("run_id")) << "the new run took the source's run id";

  // The bias came with the weights and stayed as it was (bias_update_rate = 0 here).
  const int64_t bias_n = source.global_shape("router_bias")[0] * source.global_shape("router_bias")[1];
  std::vector<float> theirs(bias_n), mine(bias_n);
  source.read("router_bias", DType::F32, 0, bias_n, theirs.data());
  CheckpointReader(ft_dir.path + "/step-000002").read("router_bias", DType::F32, 0, bias_n, mine.data());
  EXPECT_EQ(mine, theirs);
  bool nonzero = false;
  for (float b : theirs) nonzero = nonzero || b != 0;
  EXPECT_TRUE(nonzero) << "the source's bias is zero, so this test cannot tell whether it was taken";

  EXPECT_EQ(contents(src_dir.path), source_before) << "the source run directory changed";
}

TEST(InitFrom, AHuggingFaceExportStartsTheSameRunAsItsCheckpoint) {
  testing::TempDir src_dir, hf_parent, a_dir, b_dir;
  const std::string ckpt = train_source(src_dir.path);
  const std::string hf = hf_parent.path + "/hf";
  // Per-expert tensors (the Hub layout); progress after each tensor, rising to the whole.
  std::vector<std::pair<int64_t, int64_t>> said;
  const ExportResult exported = export_hf(ckpt, hf, int64_t{1} << 30, {}, DType::F32,
                                          [&](int64_t done, int64_t total) { said.emplace_back(done, total); });
  ASSERT_EQ(said.size(), static_cast<size_t>(exported.tensors));
  for (size_t i = 1; i < said.size(); ++i) EXPECT_LT(said[i - 1].first, said[i].first);
  EXPECT_EQ(said.back(), std::make_pair(exported.bytes, exported.bytes));
  // Its import likewise, over the weights it reads (FP32: the export's bytes).
  said.clear();
  const ImportResult imported =
      import_hf(hf, hf_parent.path + "/imported", [&](int64_t done, int64_t total) { said.emplace_back(done, total); });
  ASSERT_EQ(said.size(), static_cast<size_t>(imported.tensors));
  EXPECT_EQ(said.back(), std::make_pair(exported.bytes, exported.bytes));
  const std::vector<std::string> ft = {"train.steps=2", "train.lr=1e-3"};
  Trainer from_ckpt(testing::small_config(a_dir.path, ft), init_options(ckpt), testing::local_world());
  Trainer from_hf(testing::small_config(b_dir.path, ft), init_options(hf), testing::local_world());
  // An FP32 export holds the main weights exactly: bit-equal parameters, so bit-equal runs.
  testing::expect_weights_of(from_hf, CheckpointReader(ckpt));
  const TrainSummary a = from_ckpt.run(), b = from_hf.run();
  ASSERT_EQ(a.steps.size(), 2u);
  ASSERT_EQ(b.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(a.steps[i].loss, b.steps[i].loss) << "step " << i + 1;
  const nlohmann::json st = train_state(b_dir.path + "/step-000002");
  EXPECT_EQ(st["init_from"]["format"], "hugging_face");
  EXPECT_EQ(st["init_from"]["path"], fs::canonical(hf).string());
}

TEST(InitFrom, AnotherArchitectureIsRefusedNamingTheKeyAndBothValuesBeforeAnythingIsWritten) {
  testing::TempDir src_dir, ft_parent;
  const std::string ckpt = train_source(src_dir.path);
  const std::string ft_dir = ft_parent.path + "/run";
  try {
    Trainer t(testing::small_config(ft_dir, {"model.num_experts=4"}), init_options(ckpt), testing::local_world());
    FAIL() << "a run with another number of experts was initialized from the checkpoint";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("model.num_experts is 4 in this run's config but 8 in " + ckpt + "/train_state.json"),
              std::string::npos)
        << what;
  }
  EXPECT_FALSE(fs::exists(ft_dir)) << "run.dir was created by a refused run";
}

TEST(InitFrom, TrainingSettingsOfTheModelSectionMayDiffer) {
  testing::TempDir src_dir;
  const InitSource src(train_source(src_dir.path));
  ModelConfig m = src.model();
  EXPECT_EQ(src.architecture_mismatch(m), "");
  // Each listed key is a real key (a renamed key would silently turn into an architecture key).
  Config c;
  std::map<std::string, std::string> values;
  for (const auto& [key, value] : config_values(c)) values[key] = value;
  for (const std::string& key : fine_tuning_model_keys()) EXPECT_TRUE(values.count(key)) << key;
  m.router_aux_loss_coef = 0.5, m.router_z_loss_coef = 0.5, m.routing = Routing::Uniform, m.bias_update_rate = 0.1;
  m.capacity_factor = 3, m.dropless = true, m.init_std = 0.5, m.eos_token_id = 3;
  EXPECT_EQ(src.architecture_mismatch(m), "");
  m.rope_theta = 500000;
  EXPECT_NE(src.architecture_mismatch(m).find("model.rope_theta is 500000 in this run's config but 10000"),
            std::string::npos)
      << src.architecture_mismatch(m);
}

TEST(InitFrom, IsRefusedWithAResumeAndForAMissingPath) {
  testing::TempDir src_dir, ft_dir;
  const std::string ckpt = train_source(src_dir.path);
  TrainOptions both = init_options(ckpt);
  both.resume = ckpt;
  try {
    Trainer t(testing::small_config(ft_dir.path), both, testing::local_world());
    FAIL() << "--init-from with --resume was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("give one of them"), std::string::npos) << e.what();
  }
  try {
    Trainer t(testing::small_config(ft_dir.path), init_options(src_dir.path + "/nowhere"), testing::local_world());
    FAIL() << "a missing --init-from path was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(src_dir.path + "/nowhere: no such file or directory"), std::string::npos)
        << e.what();
  }
}

TEST(InitFrom, AResumeOfTheFineTuningRunContinuesFromItsOwnCheckpoint) {
  testing::TempDir src_dir, full_dir, split_dir;
  const std::string ckpt = train_source(src_dir.path);
  const std::vector<std::string> ft = {"train.steps=4", "train.save_every=2", "train.lr=1e-3"};
  std::vector<double> uninterrupted;
  {
    Trainer t(testing::small_config(full_dir.path, ft), init_options(ckpt), testing::local_world());
    for (const StepRecord& r : t.run().steps) uninterrupted.push_back(r.loss);
  }
  ASSERT_EQ(uninterrupted.size(), 4u);
  {
    Trainer t(testing::small_config(split_dir.path, ft), init_options(ckpt), testing::local_world());
    t.run();
  }
  // Resuming from its step-2 checkpoint is what the run stopped after step 2 would do (the
  // step-4 checkpoint is set aside as an abandoned line).
  TrainOptions resume;
  resume.quiet = true;
  resume.resume = split_dir.path + "/step-000002";
  Trainer resumed(testing::small_config(split_dir.path, ft), resume, testing::local_world());
  const TrainSummary s = resumed.run();
  EXPECT_EQ(s.first_step, 2);
  ASSERT_EQ(s.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(s.steps[i].loss, uninterrupted[2 + i]) << "step " << 3 + i << " differs after the resume";
  // The record of the source survives the resume.
  EXPECT_EQ(train_state(split_dir.path + "/step-000004")["init_from"]["path"], fs::canonical(ckpt).string());
}

}  // namespace
}  // namespace moe
