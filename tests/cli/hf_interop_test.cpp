// Checkpoint interop on the command line: export-hf writes the Hugging Face layout, import-hf
// reads it back, and `moetrain eval` of the imported checkpoint gives bit-identical logits and the
// same loss as the original; bad inputs are refused with the file or tensor named.
// (The comparison against stock transformers is python/hf_check.py; its output is in bench/RESULTS.md.)
#include "cli_test_util.h"
#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/safetensors.h"
#include "moe/core/dtype.h"

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
  // The F32 values of a tensor in a safetensors file.
  static std::vector<float> f32_values(const moe::SafetensorsReader& f, const std::string& name) {
    const moe::SafetensorsEntry& e = f.entry(name);
    EXPECT_EQ(e.dtype, moe::DType::F32) << name;
    std::vector<float> v((e.end - e.begin) / 4);
    std::memcpy(v.data(), f.data(name), v.size() * 4);
    return v;
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
  EXPECT_NE(ex.out.find("note: trained with model.capacity_factor"), std::string::npos) << ex.out;
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
  // The imported step-0 checkpoint was never trained: its export has no note about dropped routes.
  const CliRun again = moetrain({"export-hf", path("imported"), path("hf-again")});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out.find("note:"), std::string::npos) << again.out;
  // The imported run continues training from its own config.
  const CliRun cont = moetrain({"train", "--config", path("imported/config.toml"), "--resume",
                                path("imported/step-000000"), "--steps", "1", "--set", "train.seq_len=16",
                                "--set", "train.global_batch_size=2", "--set", "train.micro_batch_size=2",
                                "--set", "data.synthetic_tokens=20000", "--set", "data.synthetic_eval_tokens=2000",
                                "--set", "run.device=cpu"});
  EXPECT_EQ(cont.exit_code, 0) << cont.err;
}

TEST_F(HfInterop, bf16_export_holds_the_rounded_weights_and_imports_as_them) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf32")}).exit_code, 0);
  const CliRun ex = moetrain({"export-hf", run_dir(), path("hf16"), "--dtype", "bf16"});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;
  EXPECT_NE(ex.out.find("bfloat16"), std::string::npos) << ex.out;
  EXPECT_EQ(nlohmann::json::parse(read_file(path("hf16/config.json")))["torch_dtype"], "bfloat16");
  EXPECT_EQ(nlohmann::json::parse(read_file(path("hf32/config.json")))["torch_dtype"], "float32");
  const moe::SafetensorsReader f32(path("hf32/model-00001-of-00001.safetensors"));
  const moe::SafetensorsReader bf16(path("hf16/model-00001-of-00001.safetensors"));
  ASSERT_EQ(f32.entries().size(), bf16.entries().size());
  EXPECT_EQ(bf16.file_size() - bf16.data_offset(), (f32.file_size() - f32.data_offset()) / 2);
  int64_t changed = 0;  // values that rounding moved: the export did round
  for (const moe::SafetensorsEntry& e : f32.entries()) {
    ASSERT_TRUE(bf16.has(e.name)) << e.name;
    const moe::SafetensorsEntry& h = bf16.entry(e.name);
    EXPECT_EQ(h.dtype, moe::DType::BF16) << e.name;
    EXPECT_EQ(h.shape, e.shape) << e.name;
    const std::vector<float> values = f32_values(f32, e.name);
    std::vector<uint16_t> stored(values.size());
    std::memcpy(stored.data(), bf16.data(e.name), stored.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      ASSERT_EQ(stored[i], moe::f32_to_bf16(values[i])) << e.name << "[" << i << "]";
      changed += moe::bf16_to_f32(stored[i]) != values[i];
    }
  }
  EXPECT_GT(changed, 1000);
  // import-hf reads the BF16 export back as exactly the rounded FP32 main weights.
  ASSERT_EQ(moetrain({"import-hf", path("hf16"), path("imported")}).exit_code, 0);
  const moe::CheckpointReader original(run_dir() + "/step-000002");
  const moe::CheckpointReader imported(path("imported/step-000000"));
  int64_t weights = 0;
  for (const std::string& key : original.keys()) {
    // The weights: Hugging Face names, not their AdamW moments or router_bias (training state).
    const bool hf_name = key.rfind("model.", 0) == 0 || key.rfind("lm_head.", 0) == 0;
    if (!hf_name || key.find(".exp_avg") != std::string::npos) continue;
    ASSERT_TRUE(imported.has(key)) << key;
    const std::vector<int64_t> shape = original.global_shape(key);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    original.read(key, moe::DType::F32, 0, n, a.data());
    imported.read(key, moe::DType::F32, 0, n, b.data());
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(moe::bf16_to_f32(moe::f32_to_bf16(a[i])), b[i]) << key << "[" << i << "]";
    ++weights;
  }
  EXPECT_EQ(weights, 2 + 2 * 11 + 1);  // embedding, LM head; 11 per layer (attention, norms, router, experts); norm
}

// NaN passed CLI11's range check and became a shard size through an undefined conversion.
TEST_F(HfInterop, export_refuses_a_shard_size_that_is_not_a_number_as_a_usage_error) {
  const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--max-shard-gb", "nan"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--max-shard-gb"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("hf")));
}

TEST_F(HfInterop, export_copies_tokenizer_files_byte_for_byte) {
  // Ids up to 511 of the tiny model's 512, its own layout and UTF-8 kept as they are.
  const std::string bytes =
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,   \"\xc3\xa9\": 1}},\n"
      " \"added_tokens\": [{\"id\": 511, \"content\": \"<|endoftext|>\"}]}\n";
  constexpr char kMerges[] = "#version: 0.2\n\0\xff\n";
  const std::string merges(kMerges, sizeof kMerges - 1);  // with its NUL and non-UTF-8 byte
  write_file(path("tokenizer.json"), bytes);
  write_file(path("merges.txt"), merges);
  const CliRun r = moetrain(
      {"export-hf", run_dir(), path("hf"), "--tokenizer", path("tokenizer.json"), "--tokenizer", path("merges.txt")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(path("hf/tokenizer.json")), bytes);
  EXPECT_EQ(read_file(path("hf/merges.txt")), merges);
  EXPECT_EQ(r.out.find("note: copied"), std::string::npos) << "names Hugging Face finds are not noted:\n" << r.out;
}

// Before, --tokenizer copied any file: another model's model.safetensors went in beside the
// export's shards, and transformers would load it instead of them (import-hf refused the folder).
TEST_F(HfInterop, export_refuses_a_weight_file_as_a_tokenizer_file_before_writing) {
  for (const char* name : {"model.safetensors", "pytorch_model.bin", "consolidated.pth", "x.safetensors.index.json"}) {
    write_file(path(name), "weights");
    const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--tokenizer", path(name)});
    expect_error(r, {path(name), "is named like a weight file", "tokenizer.json"});
    EXPECT_FALSE(fs::exists(path("hf"))) << name;
  }
}

// Another model's tokenizer (ids past the model's vocab_size, in its vocabulary or its added
// tokens) was copied without a word: the exported model would index past its embedding.
TEST_F(HfInterop, export_refuses_a_tokenizer_with_ids_past_the_models_vocabulary) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1999}}}"},
      {"tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": " + [] {
         std::string list = "[[\"p\", -1.0]";
         for (int i = 1; i < 600; ++i) list += ", [\"p\", -1.0]";
         return list + "]";
       }() + "}}"},
      {"vocab.json", "{\"a\": 0, \"b\": 700}"}};
  for (const auto& [name, text] : cases) {
    const std::string dir = path("tok-" + std::to_string(&name - &cases[0].first));
    fs::create_directories(dir);
    write_file(dir + "/" + name, text);
    const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--tokenizer", dir + "/" + name});
    expect_error(r, {dir + "/" + name, "has token ids up to", "vocabulary has 512 (model.vocab_size)"});
    EXPECT_FALSE(fs::exists(path("hf"))) << text;
  }
  write_file(path("tokenizer.json"), "{\"model\": ");
  expect_error(moetrain({"export-hf", run_dir(), path("hf"), "--tokenizer", path("tokenizer.json")}),
               {path("tokenizer.json"), "cannot be read as JSON"});
  EXPECT_FALSE(fs::exists(path("hf")));
  // A token added past the vocabulary (a pad token, embeddings not resized) loads: it is noted.
  write_file(path("tokenizer.json"),
             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 512}]}");
  const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--tokenizer", path("tokenizer.json")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("note: tokenizer.json adds tokens with ids up to 512, past the model's 512"), std::string::npos)
      << r.out;
}

// A tokenizer file under a name Hugging Face does not look for is copied as given, and said.
TEST_F(HfInterop, export_notes_a_tokenizer_file_hugging_face_will_not_find_by_its_name) {
  write_file(path("tok300.json"), "{}");
  const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--tokenizer", path("tok300.json")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(path("hf/tok300.json")), "{}");
  EXPECT_NE(r.out.find("note: copied tok300.json under the name given"), std::string::npos) << r.out;
}

// An empty path (a script's unset variable) ended in "filesystem error: cannot make absolute path:
// Invalid argument []", exit 1.
TEST_F(HfInterop, empty_paths_are_usage_errors_naming_the_argument) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"export-hf", run_dir(), ""}, "out"},
      {{"export-hf", "", path("hf2")}, "checkpoint"},
      {{"export-hf", run_dir(), path("hf2"), "--tokenizer", ""}, "--tokenizer"},
      {{"import-hf", path("hf"), ""}, "out"},
      {{"import-hf", "", path("imported")}, "hf_dir"}};
  for (const auto& [args, name] : cases) {
    const CliRun r = moetrain(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err, "error: " + name + ": must not be empty (see moetrain --help)\n");
  }
  EXPECT_FALSE(fs::exists(path("hf2")));
  EXPECT_FALSE(fs::exists(path("imported")));
}

TEST_F(HfInterop, export_refuses_an_unknown_dtype_before_writing) {
  const CliRun r = moetrain({"export-hf", run_dir(), path("hf"), "--dtype", "fp16"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--dtype"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(path("hf")));
}

// Before, `export-hf CKPT CKPT/hf` put a folder inside the user's checkpoint.
TEST_F(HfInterop, export_into_a_checkpoint_is_refused_and_writes_nothing_there) {
  const std::string ckpt = run_dir() + "/step-000002";
  const CliRun r = moetrain({"export-hf", ckpt, ckpt + "/hf/out"});
  expect_error(r, {ckpt + "/hf/out", "is inside the checkpoint " + ckpt});
  EXPECT_FALSE(fs::exists(ckpt + "/hf"));
  ASSERT_EQ(moetrain({"export-hf", ckpt, path("hf")}).exit_code, 0);
  expect_error(moetrain({"import-hf", path("hf"), ckpt + "/imported"}), {"is inside the checkpoint " + ckpt});
  EXPECT_FALSE(fs::exists(ckpt + "/imported"));
  // Through a link to the checkpoint, and into a copy of it under another name.
  fs::create_directory_symlink(ckpt, path("best"));
  expect_error(moetrain({"export-hf", path("best"), path("best/hf")}), {"is inside the checkpoint " + ckpt});
  expect_error(moetrain({"import-hf", path("hf"), path("best/imported")}), {"is inside the checkpoint " + ckpt});
  fs::copy(ckpt, path("step-000002-best"), fs::copy_options::recursive);
  expect_error(moetrain({"export-hf", path("step-000002-best"), path("step-000002-best/hf")}),
               {"is inside the checkpoint " + path("step-000002-best")});
  EXPECT_FALSE(fs::exists(ckpt + "/hf") || fs::exists(ckpt + "/imported") || fs::exists(path("step-000002-best/hf")));
  // A copy under another name exports like the original (before, a checkpoint named otherwise than
  // step-<digits> was refused for its note).
  EXPECT_EQ(moetrain({"export-hf", path("step-000002-best"), path("hf-of-copy")}).exit_code, 0);
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

// train_state.json's config is text beside the weights, which export reads by element ranges: a
// config giving fewer experts exported each expert tensor's first part, one giving fewer layers
// dropped the last layer, both without a word.
TEST_F(HfInterop, export_of_a_checkpoint_whose_config_disagrees_with_its_tensors_is_refused_naming_the_tensor) {
  const std::string state = run_dir() + "/step-000002/train_state.json";
  const std::string original = read_file(state);
  // Both records of the model edited alike (export_refuses_a_train_state_whose_two_model_records_differ
  // has them disagree): they agree with each other, not with the tensors.
  const auto with_config = [&](const std::string& from, const std::string& to) {
    nlohmann::json j = nlohmann::json::parse(original);
    for (const char* record : {"config", "model_config"}) {
      std::string config = j[record];
      const size_t at = config.find(from);
      ASSERT_NE(at, std::string::npos) << record << ": " << from;
      j[record] = config.replace(at, from.size(), to);
    }
    write_file(state, j.dump());
  };
  with_config("num_experts = 8", "num_experts = 4");
  expect_error(moetrain({"export-hf", run_dir(), path("hf")}),
               {"model.layers.0.mlp.gate.weight", "[8,16]", "[4,16]", "train_state.json"});
  EXPECT_FALSE(fs::exists(path("hf")));
  with_config("num_hidden_layers = 2", "num_hidden_layers = 1");
  expect_error(moetrain({"export-hf", run_dir(), path("hf")}),
               {"model.layers.1.", "model.num_hidden_layers = 1", "train_state.json"});
  EXPECT_FALSE(fs::exists(path("hf")));
  write_file(state, original);  // the control
  EXPECT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
}

// A symbolic link as the output, even one to nothing: the export ran to the end, then failed to
// rename its result over the link ("Not a directory").
TEST_F(HfInterop, export_to_a_symbolic_link_is_refused_naming_it_before_anything_is_written) {
  fs::create_symlink(path("nowhere"), path("hf"));
  expect_error(moetrain({"export-hf", run_dir(), path("hf")}), {path("hf"), "is a symbolic link"});
  EXPECT_TRUE(fs::is_symlink(path("hf")));
  EXPECT_FALSE(fs::exists(path("nowhere")));
  for (const auto& e : fs::directory_iterator(tmp_))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// The parent folders export created for its output were left behind when it failed.
TEST_F(HfInterop, export_failing_midway_leaves_no_temporary_folder_and_no_new_parents) {
  const std::string nested_out = path("new/parent/hf");
  std::vector<std::string> before;
  for (const auto& e : fs::recursive_directory_iterator(tmp_)) before.push_back(e.path().string());
  // A file-size limit below a shard's size makes its write fail (EFBIG; SIGXFSZ ignored).
  const CliRun r = run({"/bin/sh", "-c", "ulimit -f 16 && trap '' XFSZ && exec \"$0\" \"$@\"",
                        MOE_BINARY_DIR "/moetrain", "export-hf", run_dir(), nested_out});
  expect_error(r, {"model-00001-of-00001.safetensors", "File too large"});
  std::vector<std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(tmp_)) after.push_back(e.path().string());
  std::sort(before.begin(), before.end());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before);
  ASSERT_EQ(moetrain({"export-hf", run_dir(), nested_out}).exit_code, 0);  // the control
  EXPECT_TRUE(fs::exists(nested_out + "/config.json"));
}

// Ctrl-C, SIGTERM or SIGHUP in the middle of an export or import: the temporary folder with its
// partial shards (export) or the staging folder with its partial checkpoint (import) was left
// behind. Now each is removed, the command says so in one error line and dies of the signal (128 +
// the signal number, so a calling script stops). A test hook makes it wait for the signal once
// its first tensor is written.
TEST_F(HfInterop, an_interrupted_export_or_import_removes_its_temporary_folder_and_dies_of_the_signal) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
  const auto entries = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(tmp_)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  // The job runs under job control (set -m): a background job of a plain script ignores SIGINT.
  const auto interrupted = [&](const std::vector<std::string>& args, const std::string& temporary,
                               const char* signal) {
    std::string cmd = "set -m; MOE_TEST_HF_PAUSE=1 '" MOE_BINARY_DIR "/moetrain'";
    for (const std::string& arg : args) cmd += " '" + arg + "'";
    cmd += " & pid=$!; for i in $(seq 500); do ls -A '" + tmp_ + "' '" + path("new") + "' 2>/dev/null | grep -q '" +
           temporary + "' && break; sleep 0.02; done; kill -" + signal + " $pid; wait $pid";
    return run({"/bin/bash", "-c", cmd});
  };
  const struct {
    const char* name;
    int number;
  } signals[] = {{"INT", 2}, {"TERM", 15}, {"HUP", 1}};
  const std::vector<std::string> before = entries();
  for (const auto& sig : signals) {
    SCOPED_TRACE(sig.name);
    CliRun r = interrupted({"export-hf", run_dir(), path("new/hf2")}, "hf2.tmp-", sig.name);
    EXPECT_EQ(r.exit_code, 128 + sig.number) << r.err;
    EXPECT_EQ(r.err.rfind(std::string("error: export-hf was interrupted (SIG") + sig.name + ")", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find("error", 1), std::string::npos) << "one error line (and bash's job report):\n" << r.err;
    EXPECT_EQ(entries(), before) << "the temporary folder and the parent it created are removed";
    r = interrupted({"import-hf", path("hf"), path("new/imported")}, ".imported.import-", sig.name);
    EXPECT_EQ(r.exit_code, 128 + sig.number) << r.err;
    EXPECT_EQ(r.err.rfind(std::string("error: import-hf was interrupted (SIG") + sig.name + ")", 0), 0u) << r.err;
    EXPECT_EQ(r.err.find("error", 1), std::string::npos) << "one error line (and bash's job report):\n" << r.err;
    EXPECT_EQ(entries(), before) << "the staging folder and the parent it created are removed";
  }
  // A signal ignored when the command starts (nohup) stays ignored.
  const std::string cmd = "trap '' HUP; MOE_TEST_HF_PAUSE=1 '" MOE_BINARY_DIR "/moetrain' export-hf '" + run_dir() +
                          "' '" + path("hf3") + "' & pid=$!; for i in $(seq 500); do ls -A '" + tmp_ +
                          "' | grep -q hf3.tmp- && break; sleep 0.02; done; kill -HUP $pid; sleep 0.3; "
                          "kill -0 $pid || exit 3; kill -TERM $pid; wait $pid";
  EXPECT_EQ(run({"/bin/bash", "-c", cmd}).exit_code, 128 + 15);
  EXPECT_EQ(entries(), before);
}

TEST_F(HfInterop, export_refuses_a_model_with_a_selection_bias) {
  std::vector<std::string> sets = tiny_sets();
  sets.push_back("model.bias_update_rate=0.01");
  sets.push_back("run.dir=" + path("biased"));
  sets.push_back("run.device=cpu");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"}, sets)).exit_code, 0);
  expect_error(moetrain({"export-hf", path("biased"), path("hf")}), {"bias_update_rate"});
  EXPECT_FALSE(fs::exists(path("hf")));
  // A run started from it with --init-from keeps the bias but no longer updates it: its export
  // loaded and routed differently, without a word. Refused by the bias's values.
  std::vector<std::string> ft = tiny_sets();
  ft.push_back("run.dir=" + path("ft"));
  ft.push_back("run.device=cpu");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1", "--init-from", path("biased")}, ft)).exit_code, 0);
  expect_error(moetrain({"export-hf", path("ft"), path("hf")}), {"router_bias that is not zero", "--init-from"});
  EXPECT_FALSE(fs::exists(path("hf")));
}

// Outputs spelled "hf/" or "hf/." are the folder "hf" (export built its temporary folder inside the
// output and failed at the final rename, after all the work); "." is refused before any work (the
// import failed at its rename); a folder named with characters a run's name cannot hold gets a
// name it can (config.toml said name = "my run", which every later start refused), and the
// printed command quotes the path; paths that are not UTF-8, which the checkpoints record as
// text, are refused before anything is written (the import failed after its rank file, a run
// --init-from one after its steps, at the first save).
TEST_F(HfInterop, output_and_source_paths_are_checked_before_the_work) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("ex/slash/")}).exit_code, 0);
  EXPECT_TRUE(fs::exists(path("ex/slash/config.json")));
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("ex/dot/.")}).exit_code, 0);
  EXPECT_TRUE(fs::exists(path("ex/dot/config.json")));
  fs::create_directories(path("empty"));
  const std::string in_empty = "cd '" + path("empty") + "' && '" MOE_BINARY_DIR "/moetrain' import-hf ../ex/slash .";
  const CliRun dot = run({"/bin/bash", "-c", in_empty});
  expect_error(dot, {"output '.' names the current folder"});
  EXPECT_TRUE(fs::is_empty(path("empty")));

  const CliRun spaced = moetrain({"import-hf", path("ex/slash"), path("my run")});
  ASSERT_EQ(spaced.exit_code, 0) << spaced.err;
  EXPECT_NE(spaced.out.find("--config '" + path("my run") + "/config.toml'"), std::string::npos) << spaced.out;
  const CliRun evaluated = moetrain({"eval", "--checkpoint", path("my run/step-000000"), "--data", "synthetic",
                                     "--tokens", "2048", "--set", "run.device=\"cpu\""});
  EXPECT_EQ(evaluated.exit_code, 0) << evaluated.err;

  const std::string odd = path("bad\xffname");
  fs::copy(path("ex/slash"), odd);
  expect_error(moetrain({"import-hf", odd, path("io")}), {"is not valid UTF-8", "bad\\xffname"});
  EXPECT_FALSE(fs::exists(path("io")));
  expect_error(moetrain({"import-hf", path("ex/slash"), path("out\xff")}), {"is not valid UTF-8"});
  std::vector<std::string> sets = tiny_sets();
  sets.push_back("run.dir=" + path("ft"));
  const CliRun init = moetrain(tiny_train({"--steps", "1", "--init-from", odd}, sets));
  expect_error(init, {"--init-from", "is not valid UTF-8"});
  EXPECT_FALSE(fs::exists(path("ft")));
}

// train_state.json records the model twice: a start that loads the checkpoint compares its
// "model_config", the export read only "config", so an edited config exported another model (a
// rope_theta here) where eval refused the checkpoint. Now the export compares the two.
TEST_F(HfInterop, export_refuses_a_train_state_whose_two_model_records_differ) {
  const std::string step = run_dir() + "/step-000002", edited = path("edited");
  fs::copy(step, edited);
  nlohmann::json st = nlohmann::json::parse(read_file(edited + "/train_state.json"));
  std::string config = st["config"].get<std::string>();
  const size_t at = config.find("rope_theta = ");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, config.find('\n', at) - at, "rope_theta = 123456.0");
  st["config"] = config;
  write_file(edited + "/train_state.json", st.dump());
  expect_error(moetrain({"export-hf", edited, path("hf")}),
               {"records two different models", "model.rope_theta = 123456 in its config"});
  EXPECT_FALSE(fs::exists(path("hf")));
}

TEST_F(HfInterop, import_refuses_a_non_empty_output_and_leaves_it_alone) {
  ASSERT_EQ(moetrain({"export-hf", run_dir(), path("hf")}).exit_code, 0);
  expect_error(moetrain({"import-hf", path("hf"), run_dir()}), {run_dir(), "not empty"});
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
}

// An output file that is a symbolic link, even to nothing, passed the exists() check and was
// replaced by the written file (bench --json and plan --json alike; their writers are tested in
// tests/ckpt/durable_file_test.cpp, eval's in tests/data/npy_test.cpp).
TEST_F(HfInterop, eval_logits_at_a_symbolic_link_is_refused_before_evaluating_and_the_link_kept) {
  fs::create_symlink(path("nowhere.npy"), path("logits.npy"));
  expect_error(eval(run_dir(), path("logits.npy")), {"eval --logits", path("logits.npy"), "exists"});
  EXPECT_TRUE(fs::is_symlink(path("logits.npy")));
  EXPECT_FALSE(fs::exists(path("nowhere.npy")));
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
  // The prepared folder says so in its dataset.json (as train refuses it); a copy of its token
  // file elsewhere is refused at its first token past the vocabulary.
  expect_error(moetrain({"eval", "--checkpoint", path("small"), "--data", path("bytes"), "--set", "run.device=cpu"}),
               {path("bytes/dataset.json"), "vocab_size 257", "model.vocab_size = 200"});
  fs::copy_file(path("bytes/big.npy"), path("big.npy"));
  expect_error(moetrain({"eval", "--checkpoint", path("small"), "--data", path("big.npy"), "--set", "run.device=cpu"}),
               {"big.npy", "token 256", "vocab_size"});
}

}  // namespace
