// Checkpoint interop on the command line: export-hf writes the Hugging Face layout, import-hf
// reads it back, and `moetrain eval` of the imported checkpoint gives bit-identical logits and the
// same loss as the original; bad inputs are refused with the file or tensor named.
// (The comparison against stock transformers is python/hf_check.py; its output is in bench/RESULTS.md.)
#include "cli_test_util.h"
#include "moe/ckpt/safetensors.h"

namespace {

class HfInterop : public CliTest {
 protected:
  // A 2-step tiny run (checkpoint at step 2) and a byte-level token file to evaluate on.
  void SetUp() override {
    CliTest::SetUp();
    ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "run.device=cpu"})).exit_code, 0);
    std::string text;
    for (int i = 0; i < 40; ++i) text += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog\n";
    write_file(path("doc.txt"), text);
    ASSERT_EQ(moetrain({"prepare", path("doc.txt"), "--out", path("data")}).exit_code, 0);
  }
  // Same windows for both checkpoints: an imported checkpoint carries the default train section.
  CliRun eval(const std::string& ckpt, const std::string& logits) {
    return moetrain({"eval", "--checkpoint", ckpt, "--data", path("data"), "--logits", logits, "--set",
                     "train.seq_len=16", "--set", "train.micro_batch_size=2", "--set", "run.device=cpu"});
  }
  static double mean_loss(const CliRun& r) {
    const size_t at = r.out.find("mean loss ");
    EXPECT_NE(at, std::string::npos) << r.out << r.err;
    return at == std::string::npos ? -1 : std::stod(r.out.substr(at + 10));
  }
};

TEST_F(HfInterop, export_then_import_reproduces_logits_and_loss_exactly) {
  const CliRun a = eval(run_dir(), path("a.npy"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const CliRun ex = moetrain({"export-hf", run_dir(), path("hf")});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  for (const char* f : {"config.json", "model.safetensors.index.json", "model-00001-of-00001.safetensors"})
    EXPECT_TRUE(fs::exists(path("hf/") + f)) << f;
  // The Hub layout: one gate/up/down projection per expert, no fused tensors.
  moe::SafetensorsReader shard(path("hf/model-00001-of-00001.safetensors"));
  EXPECT_TRUE(shard.has("model.layers.0.mlp.experts.7.gate_proj.weight"));
  EXPECT_TRUE(shard.has("model.layers.1.mlp.experts.0.down_proj.weight"));
  EXPECT_FALSE(shard.has("model.layers.0.mlp.experts.gate_up_proj"));
  const auto cfg = nlohmann::json::parse(read_file(path("hf/config.json")));
  EXPECT_EQ(cfg["model_type"], "olmoe");
  EXPECT_EQ(cfg["hidden_size"], 16);

  const CliRun im = moetrain({"import-hf", path("hf"), path("imported")});
  ASSERT_EQ(im.exit_code, 0) << im.err;
  EXPECT_NE(im.out.find("moments start at zero"), std::string::npos) << im.out;
  const CliRun b = eval(path("imported"), path("b.npy"));
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_TRUE(read_file(path("a.npy")) == read_file(path("b.npy"))) << "logits differ after export + import";
  EXPECT_EQ(mean_loss(a), mean_loss(b));
  // The imported run continues training from its own config.
  const CliRun cont = moetrain({"train", "--config", path("imported/config.toml"), "--resume",
                                path("imported/step-000000"), "--steps", "1", "--set", "train.seq_len=16",
                                "--set", "train.global_batch_size=2", "--set", "train.micro_batch_size=2",
                                "--set", "data.synthetic_tokens=20000", "--set", "data.synthetic_eval_tokens=2000",
                                "--set", "run.device=cpu"});
  EXPECT_EQ(cont.exit_code, 0) << cont.err;
}

TEST_F(HfInterop, export_refuses_an_existing_output_and_leaves_it_alone) {
  fs::create_directory(path("hf"));
  write_file(path("hf/keep.txt"), "mine");
  expect_error(moetrain({"export-hf", run_dir(), path("hf")}), {path("hf"), "exists"});
  EXPECT_EQ(read_file(path("hf/keep.txt")), "mine");
}

TEST_F(HfInterop, import_with_a_missing_tensor_names_it_and_writes_no_checkpoint) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
  // Drop one expert's down projection from the index.
  auto index = nlohmann::json::parse(read_file(path("hf/model.safetensors.index.json")));
  index["weight_map"].erase("model.layers.1.mlp.experts.3.down_proj.weight");
  write_file(path("hf/model.safetensors.index.json"), index.dump());
  expect_error(moetrain({"import-hf", path("hf"), path("imported")}),
               {"model.layers.1.mlp.experts.3.down_proj.weight", "missing"});
  EXPECT_TRUE(step_dirs(path("imported")).empty());
}

TEST_F(HfInterop, export_refuses_a_model_with_a_selection_bias) {
  std::vector<std::string> sets = tiny_sets();
  sets.push_back("model.bias_update_rate=0.01");
  sets.push_back("run.dir=" + path("biased"));
  sets.push_back("run.device=cpu");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"}, sets)).exit_code, 0);
  expect_error(moetrain({"export-hf", path("biased"), path("hf")}), {"bias_update_rate"});
  EXPECT_FALSE(fs::exists(path("hf")));
}

TEST_F(HfInterop, import_refuses_a_non_empty_output_and_leaves_it_alone) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
  expect_error(moetrain({"import-hf", path("hf"), run_dir()}), {run_dir(), "not empty"});
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
}

TEST_F(HfInterop, eval_refuses_tokens_outside_the_vocabulary) {
  write_file(path("big.txt"), std::string(3000, 'x'));
  ASSERT_EQ(moetrain({"prepare", path("big.txt"), "--out", path("bytes")}).exit_code, 0);
  // The tiny model has 512 tokens; byte-level data is fine. A model with 200 tokens is not.
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"}, {"train.steps=1", "model.hidden_size=16", "model.vocab_size=200",
                                                   "model.eos_token_id=199", "model.intermediate_size=32",
                                                   "train.seq_len=16", "train.micro_batch_size=2",
                                                   "train.global_batch_size=2", "data.synthetic_tokens=20000",
                                                   "data.synthetic_eval_tokens=2000", "run.dir=" + path("small"),
                                                   "run.device=cpu"}))
                .exit_code,
            0);
  expect_error(moetrain({"eval", "--checkpoint", path("small"), "--data", path("bytes"), "--set", "run.device=cpu"}),
               {"big.npy", "vocab_size"});
}

}  // namespace
