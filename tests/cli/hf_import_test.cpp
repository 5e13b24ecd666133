// `moetrain import-hf` of Hugging Face folders written by the test (hf_folder.h): the unchanged
// folder imports with every value in place (the positive controls); each fault, one per test,
// ends the binary with one error line naming config.json and the key, or the file and the
// tensor, or the index entry, and leaves the temp dir exactly as it was (no output folder, no
// staging folder, no parent folders).
#include <sys/stat.h>

#include "cli_test_util.h"
#include "hf_folder.h"
#include "moe/ckpt/checkpoint.h"

namespace {

class HfImport : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    config_ = olmoe_config(spec_);
    tensors_ = olmoe_tensors(spec_);
  }
  std::string hf() const { return path("hf"); }
  std::string config_path() const { return path("hf/config.json"); }
  std::string out() const { return path("out"); }
  void write(int shards = 0, moe::DType dtype = moe::DType::F32) {
    write_hf_folder(hf(), config_, tensors_, shards, dtype);
  }
  CliRun import() { return moetrain({"import-hf", hf(), out()}); }
  // The import fails with one error line holding every needle and changes nothing on disk.
  void expect_refused(const std::vector<std::string>& needles) {
    const std::vector<std::string> before = tree(tmp_);
    expect_error(import(), needles);
    EXPECT_EQ(tree(tmp_), before) << "a failed import changed the temp dir";
  }
  // Logical elements [begin, begin + n) of `key` in the imported checkpoint.
  std::vector<float> imported(const std::string& key, int64_t begin, int64_t n) const {
    moe::CheckpointReader ckpt(out() + "/step-000000");
    std::vector<float> v(static_cast<size_t>(n));
    ckpt.read(key, moe::DType::F32, begin, begin + n, v.data());
    return v;
  }
  // Every value of the imported checkpoint equals the folder's: dense tensors by name, each
  // expert at its place in the fused tensors; the AdamW moments are zero.
  void expect_values_in_place() {
    const int64_t D = spec_.hidden, H = spec_.intermediate;
    for (const char* name :
         {"model.embed_tokens.weight", "model.layers.1.self_attn.k_proj.weight",
          "model.layers.0.self_attn.q_norm.weight", "model.layers.1.mlp.gate.weight", "lm_head.weight"}) {
      const HfTensorData& t = find_tensor(tensors_, name);
      EXPECT_EQ(imported(name, 0, static_cast<int64_t>(t.values.size())), t.values) << name;
    }
    for (int64_t l = 0; l < spec_.layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
      if (spec_.fused) {
        for (const char* fused : {"gate_up_proj", "down_proj"}) {
          const HfTensorData& t = find_tensor(tensors_, p + fused);
          EXPECT_EQ(imported(p + fused, 0, static_cast<int64_t>(t.values.size())), t.values) << p + fused;
        }
        continue;
      }
      for (int64_t x = 0; x < spec_.experts; ++x) {
        const std::string e = p + std::to_string(x) + ".";
        EXPECT_EQ(imported(p + "gate_up_proj", x * 2 * H * D, H * D),
                  find_tensor(tensors_, e + "gate_proj.weight").values);
        EXPECT_EQ(imported(p + "gate_up_proj", x * 2 * H * D + H * D, H * D),
                  find_tensor(tensors_, e + "up_proj.weight").values);
        EXPECT_EQ(imported(p + "down_proj", x * D * H, D * H), find_tensor(tensors_, e + "down_proj.weight").values);
      }
    }
    const std::vector<float> moment = imported("lm_head.weight.exp_avg_sq", 0, spec_.vocab * D);
    EXPECT_EQ(moment, std::vector<float>(moment.size(), 0.0f));
  }

  HfSpec spec_;
  nlohmann::json config_;
  std::vector<HfTensorData> tensors_;
};

// ---- positive controls: the folders the fault tests start from import -----------------------

TEST_F(HfImport, per_expert_f32_folder_imports_every_value_in_place_and_trains_on_cpu) {
  write();
  const CliRun r = import();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("per-expert expert layout"), std::string::npos) << r.out;
  expect_values_in_place();
  EXPECT_EQ(tree(out()),
            (std::vector<std::string>{"config.toml", "step-000000", "step-000000/index.json",
                                      "step-000000/rank-00000.safetensors", "step-000000/train_state.json"}));
  EXPECT_EQ(tree(tmp_).size(), tree(hf()).size() + 1 + tree(out()).size() + 1) << "something besides hf/ and out/";
  const CliRun train = moetrain({"train", "--config", out() + "/config.toml", "--resume", out() + "/step-000000",
                                 "--steps", "1", "--set", "run.device=cpu", "--set", "train.seq_len=16", "--set",
                                 "train.global_batch_size=2", "--set", "train.micro_batch_size=2", "--set",
                                 "data.synthetic_tokens=20000", "--set", "data.synthetic_eval_tokens=2000"});
  EXPECT_EQ(train.exit_code, 0) << train.err;
}

TEST_F(HfImport, sharded_bf16_folder_imports_every_value_in_place) {
  write(3, moe::DType::BF16);  // the pattern values are exact in BF16
  const CliRun r = import();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_values_in_place();
}

TEST_F(HfImport, fused_expert_folder_imports_every_value_in_place) {
  spec_.fused = true;
  tensors_ = olmoe_tensors(spec_);
  write(2);
  const CliRun r = import();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fused expert layout"), std::string::npos) << r.out;
  expect_values_in_place();
}

TEST_F(HfImport, transformers_5_config_with_rope_parameters_imports) {
  config_.erase("rope_scaling");
  config_.erase("torch_dtype");
  config_["dtype"] = "float32";
  config_["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  write();
  EXPECT_EQ(import().exit_code, 0);
}

TEST_F(HfImport, hugging_face_cache_snapshot_linking_into_its_blobs_imports) {
  // The cache layout: snapshots/<revision>/<file> are symlinks to ../../blobs/<hash>.
  write(2);
  const std::string repo = path("cache/models--allenai--OLMoE"), snapshot = repo + "/snapshots/abc123";
  fs::create_directories(repo + "/blobs");
  fs::create_directories(snapshot);
  for (const auto& e : fs::directory_iterator(hf())) {
    const std::string name = e.path().filename().string();
    fs::rename(e.path(), repo + "/blobs/hash-" + name);
    fs::create_symlink("../../blobs/hash-" + name, snapshot + "/" + name);
  }
  const CliRun r = moetrain({"import-hf", snapshot, out()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_values_in_place();
}

TEST_F(HfImport, symlink_to_a_file_inside_the_folder_imports) {
  write(2);
  fs::create_directory(hf() + "/real");
  fs::rename(hf() + "/model-00002-of-00002.safetensors", hf() + "/real/shard2.safetensors");
  fs::create_symlink("real/shard2.safetensors", hf() + "/model-00002-of-00002.safetensors");
  ASSERT_EQ(import().exit_code, 0);
  expect_values_in_place();
}

TEST_F(HfImport, existing_empty_output_folder_receives_the_import) {
  write();
  fs::create_directory(out());
  const CliRun r = import();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_values_in_place();
}

// ---- config.json against the tensors ---------------------------------------------------------

TEST_F(HfImport, num_hidden_layers_above_the_layers_present_names_the_missing_layer) {
  config_["num_hidden_layers"] = 3;
  write();
  expect_refused({config_path(), "num_hidden_layers = 3", "no layer 2"});
}

TEST_F(HfImport, layers_beyond_num_hidden_layers_are_refused_naming_a_tensor_of_the_extra_layer) {
  config_["num_hidden_layers"] = 1;
  write();
  expect_refused({"model.safetensors", "'model.layers.1.", config_path(), "num_hidden_layers = 1"});
}

TEST_F(HfImport, experts_beyond_num_experts_are_refused_naming_a_tensor_of_the_extra_expert) {
  config_["num_experts"] = 2;
  write();
  expect_refused({"model.safetensors", ".mlp.experts.2.", config_path(), "num_experts = 2"});
}

struct SizeCase {
  const char* key;
  int64_t value;
  std::vector<std::string> needles;  // besides config.json's path and the key
};

void PrintTo(const SizeCase& c, std::ostream* os) { *os << c.key << " = " << c.value; }

class HfImportSizes : public HfImport, public ::testing::WithParamInterface<SizeCase> {};

TEST_P(HfImportSizes, config_size_that_disagrees_with_a_tensor_shape_names_the_key_and_the_tensor) {
  config_[GetParam().key] = GetParam().value;
  write();
  std::vector<std::string> needles = {config_path(), GetParam().key};
  needles.insert(needles.end(), GetParam().needles.begin(), GetParam().needles.end());
  expect_refused(needles);
}

INSTANTIATE_TEST_SUITE_P(
    Keys, HfImportSizes,
    ::testing::Values(
        SizeCase{"vocab_size", 80, {"'model.embed_tokens.weight' has shape [64,16]", "[80,16]"}},
        SizeCase{"hidden_size", 32, {"'model.embed_tokens.weight' has shape [64,16]", "[64,32]"}},
        SizeCase{"intermediate_size", 16, {"'model.layers.0.mlp.experts.0.gate_proj.weight' has shape [8,16]"}},
        SizeCase{"num_experts", 6, {"'model.layers.0.mlp.gate.weight' has shape [4,16]", "[6,16]"}},
        // Heads show in the shapes through head_dim = hidden_size / num_attention_heads.
        SizeCase{"num_attention_heads", 2, {"'model.layers.0.self_attn.k_proj.weight' has shape [8,16]", "head_dim"}},
        SizeCase{"num_key_value_heads", 1, {"'model.layers.0.self_attn.k_proj.weight' has shape [8,16]", "[4,16]"}},
        // Sizes in range (the top of moetrain's model.* ranges) but absurd stop at the first tensor
        // that disagrees, without running away.
        SizeCase{"num_experts", 1 << 20, {"'model.layers.0.mlp.gate.weight' has shape [4,16]"}},
        SizeCase{"num_hidden_layers", 1 << 11, {"no layer 2"}}),
    [](const ::testing::TestParamInfo<SizeCase>& info) {
      return std::string(info.param.key) + "_" + std::to_string(info.param.value);
    });

TEST_F(HfImport, tensor_missing_from_the_folder_is_named) {
  tensors_.pop_back();  // lm_head.weight
  write();
  expect_refused({"model.safetensors", "'lm_head.weight' is missing", config_path()});
}

TEST_F(HfImport, tensor_the_model_does_not_have_is_refused_naming_it) {
  tensors_.push_back({"model.layers.0.mlp.shared_expert.gate_proj.weight", {8, 16}, pattern(1, 128)});
  write();
  expect_refused({"model.safetensors", "'model.layers.0.mlp.shared_expert.gate_proj.weight'", "does not have"});
}

TEST_F(HfImport, folder_with_fused_and_per_expert_tensors_of_one_layer_is_refused) {
  spec_.fused = true;
  tensors_ = olmoe_tensors(spec_);
  tensors_.push_back({"model.layers.1.mlp.experts.0.down_proj.weight", {16, 8}, pattern(2, 128)});
  write();
  expect_refused(
      {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.0.down_proj.weight", "one way"});
}

// ---- config.json values ----------------------------------------------------------------------
// (tests/train/hf_config_test.cpp checks every key and value; these show they reach the CLI.)

TEST_F(HfImport, size_that_is_not_an_integer_names_config_json_and_the_key) {
  for (const nlohmann::json& bad : {nlohmann::json(2.5), nlohmann::json("8"), nlohmann::json(true), nlohmann::json(-4),
                                    nlohmann::json(1e30), nlohmann::json(4294967296LL)}) {
    SCOPED_TRACE(bad.dump());
    config_["num_experts"] = bad;
    fs::remove_all(hf());
    write();
    expect_refused({config_path(), "'num_experts' must be an integer", bad.dump()});
  }
}

TEST_F(HfImport, float_setting_that_is_not_a_number_names_config_json_and_the_key) {
  config_["rms_norm_eps"] = "1e-5";
  write();
  expect_refused({config_path(), "'rms_norm_eps' must be a finite number"});
}

TEST_F(HfImport, settings_moetrain_does_not_implement_are_refused_naming_the_key) {
  const std::vector<std::pair<std::string, nlohmann::json>> cases = {
      {"model_type", "llama"},
      {"tie_word_embeddings", true},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}},
      {"hidden_act", "gelu"},
      {"sliding_window", 4096}};
  for (const auto& [key, value] : cases) {
    SCOPED_TRACE(key);
    config_ = olmoe_config(spec_);
    config_[key] = value;
    fs::remove_all(hf());
    write();
    expect_refused({config_path(), "'" + key + "'"});
  }
}

TEST_F(HfImport, malformed_config_json_names_the_file) {
  write();
  write_file(config_path(), "{\"model_type\": \"olmoe\",");
  expect_refused({config_path(), "not valid JSON"});
}

TEST_F(HfImport, config_json_with_a_key_twice_is_refused_naming_the_key) {
  write();
  std::string text = read_file(config_path());
  text.insert(text.find('{') + 1, "\"num_experts\": 8,");  // the later 4 would win silently
  write_file(config_path(), text);
  expect_refused({config_path(), "'num_experts' appears twice"});
}

// ---- the index and the files it names --------------------------------------------------------

// Moves shard 2 of a two-shard folder to <tmp>/outside/, a valid file that import must not read.
class HfImportIndex : public HfImport {
 protected:
  void SetUp() override {
    HfImport::SetUp();
    write(2);
    fs::create_directory(path("outside"));
    fs::rename(hf() + "/" + kShard2, path("outside/") + kShard2);
  }
  // Every weight_map entry of shard 2 now names `file`.
  void point_shard2_at(const std::string& file) {
    nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
    for (auto& [name, value] : index["weight_map"].items())
      if (value == kShard2) value = file;
    write_json(index_path(), index);
  }
  std::string index_path() const { return hf() + "/model.safetensors.index.json"; }
  static constexpr const char* kShard2 = "model-00002-of-00002.safetensors";
};

TEST_F(HfImportIndex, shard_moved_back_inside_imports) {  // the control: the moved file is valid
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  ASSERT_EQ(import().exit_code, 0);
  expect_values_in_place();
}

TEST_F(HfImportIndex, entry_climbing_out_with_dotdot_is_refused_naming_the_entry) {
  point_shard2_at(std::string("../outside/") + kShard2);
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", "../outside/", "reads only files inside it"});
}

TEST_F(HfImportIndex, entry_with_an_absolute_path_is_refused_naming_the_entry) {
  point_shard2_at(path("outside/") + kShard2);
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", path("outside/"), "reads only files inside it"});
}

TEST_F(HfImportIndex, shard_that_is_a_symlink_out_of_the_folder_is_refused_naming_the_entry) {
  fs::create_symlink(std::string("../outside/") + kShard2, hf() + "/" + kShard2);
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", kShard2, "outside the model folder"});
}

TEST_F(HfImportIndex, config_json_that_is_a_symlink_out_of_the_folder_is_refused) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  fs::rename(config_path(), path("outside/config.json"));
  fs::create_symlink("../outside/config.json", config_path());
  expect_refused({"config.json", "outside the model folder"});
}

// "." or a subfolder is a folder, named as such (it read as "outside the model folder (a symlink)").
TEST_F(HfImportIndex, entry_naming_a_folder_is_refused_as_a_folder) {
  fs::create_directory(hf() + "/sub");
  point_shard2_at(".");
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", "'.' is a folder"});
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  for (auto& [name, value] : index["weight_map"].items())
    if (value == ".") value = "sub";
  write_json(index_path(), index);
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", "'sub' is a folder"});
}

TEST_F(HfImportIndex, entry_naming_a_missing_file_is_refused_naming_the_entry) {
  expect_refused({index_path(), "weight_map entry 'lm_head.weight'", kShard2, "does not exist"});
}

TEST_F(HfImportIndex, entry_whose_file_lacks_the_tensor_is_refused_naming_both) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  index["weight_map"]["lm_head.weight"] = "model-00001-of-00002.safetensors";
  write_json(index_path(), index);
  expect_refused(
      {"weight_map entry 'lm_head.weight'", "model-00001-of-00002.safetensors holds no tensor 'lm_head.weight'"});
}

TEST_F(HfImportIndex, tensor_stored_in_two_shards_is_refused_naming_both_files) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  // Shard 1 gets a second copy of lm_head.weight (which the index maps to shard 2).
  std::vector<HfTensorData> shard1(tensors_.begin(), tensors_.begin() + static_cast<long>((tensors_.size() + 1) / 2));
  shard1.push_back(tensors_.back());
  write_shard(hf() + "/model-00001-of-00002.safetensors", shard1, moe::DType::F32);
  expect_refused({"'lm_head.weight' is stored twice", "model-00001-of-00002.safetensors", kShard2});
}

TEST_F(HfImportIndex, malformed_index_names_the_file) {
  write_file(index_path(), "{\"weight_map\": {\"lm_head.weight\": ");
  expect_refused({index_path(), "not valid JSON"});
}

TEST_F(HfImportIndex, entry_that_is_not_a_file_name_is_refused_naming_the_entry) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  index["weight_map"]["lm_head.weight"] = 2;
  write_json(index_path(), index);
  expect_refused({index_path(), "weight_map entry 'lm_head.weight' maps to 2"});
}

// A shard may hold only what the index maps to it: a tensor the weight_map leaves out was dropped
// silently (a single model.safetensors holding the same tensor is refused).
TEST_F(HfImportIndex, tensor_in_a_shard_that_the_weight_map_leaves_out_is_refused_naming_both) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  std::vector<HfTensorData> shard2(tensors_.begin() + static_cast<long>((tensors_.size() + 1) / 2), tensors_.end());
  shard2.push_back({"model.layers.0.mlp.shared_expert.gate_proj.weight", {8, 16}, pattern(99, 8 * 16)});
  write_shard(hf() + "/" + kShard2, shard2, moe::DType::F32);
  expect_refused({hf() + "/" + kShard2, "'model.layers.0.mlp.shared_expert.gate_proj.weight'", index_path(),
                  "does not list"});
}

// model.safetensors beside an index that names other shards: transformers loads model.safetensors
// and ignores the index; import read the index, so the two could import different weights.
TEST_F(HfImportIndex, model_safetensors_beside_an_index_naming_other_shards_is_refused_naming_both) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  write_shard(hf() + "/model.safetensors", tensors_, moe::DType::F32);
  expect_refused({hf(), "holds both model.safetensors and " + index_path(), "remove whichever is stale"});
  // The control: an index naming model.safetensors alone, as some repositories carry, imports.
  fs::remove(hf() + "/model-00001-of-00002.safetensors");
  fs::remove(hf() + "/" + kShard2);
  nlohmann::json index = nlohmann::json::parse(read_file(index_path()));
  for (auto& [name, value] : index["weight_map"].items()) value = "model.safetensors";
  write_json(index_path(), index);
  ASSERT_EQ(import().exit_code, 0);
  expect_values_in_place();
}

// A FIFO where a JSON file or a shard belongs: opening it waited for a writer forever.
TEST_F(HfImportIndex, fifo_in_place_of_config_json_the_index_or_a_shard_is_refused_without_waiting) {
  fs::rename(path("outside/") + kShard2, hf() + "/" + kShard2);
  for (const std::string name : {"config.json", "model.safetensors.index.json", kShard2}) {
    SCOPED_TRACE(name);
    const std::string file = hf() + "/" + name;
    fs::rename(file, path("saved"));
    ASSERT_EQ(::mkfifo(file.c_str(), 0644), 0);
    expect_refused({name, "not a regular file"});
    fs::remove(file);
    fs::rename(path("saved"), file);
  }
  ASSERT_EQ(import().exit_code, 0);  // the control: the restored folder imports
}

// ---- dtypes ----------------------------------------------------------------------------------

// model.safetensors written by hand, so that lm_head.weight can have a dtype moetrain's writer
// does not produce: `dtype` with `element_bytes` bytes per element.
std::string safetensors_with_lm_head_as(const std::vector<HfTensorData>& tensors, const std::string& dtype,
                                        size_t element_bytes) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const HfTensorData& t : tensors) {
    const size_t begin = data.size();
    if (t.name == "lm_head.weight") {
      data.append(t.values.size() * element_bytes, '\0');
      header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    } else {
      data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * 4);
      header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
    }
  }
  std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return bytes + text + data;
}

TEST_F(HfImport, hand_written_f32_file_imports) {  // the control for the dtype cases below
  write();
  write_file(hf() + "/model.safetensors", safetensors_with_lm_head_as(tensors_, "F32", 4));
  ASSERT_EQ(import().exit_code, 0);
  EXPECT_EQ(imported("lm_head.weight", 0, 4), std::vector<float>(4, 0.0f));
}

TEST_F(HfImport, tensor_of_a_dtype_other_than_f32_and_bf16_is_refused_naming_file_and_tensor) {
  // F16 is refused by the safetensors reader (moetrain has no F16 type); I32 and F8_E4M3 it
  // reads, and import refuses them before writing.
  const std::vector<std::tuple<std::string, size_t, std::string>> cases = {
      {"F16", 2, "unsupported dtype 'F16'"},
      {"I32", 4, "has dtype I32; import-hf reads F32 and BF16"},
      {"F8_E4M3", 1, "has dtype F8_E4M3; import-hf reads F32 and BF16"}};
  for (const auto& [dtype, bytes, needle] : cases) {
    SCOPED_TRACE(dtype);
    fs::remove_all(hf());
    write();
    write_file(hf() + "/model.safetensors", safetensors_with_lm_head_as(tensors_, dtype, bytes));
    expect_refused({"model.safetensors", "'lm_head.weight'", needle});
  }
}

// ---- the output folder -----------------------------------------------------------------------

TEST_F(HfImport, output_that_is_a_file_is_refused_and_left_alone) {
  write();
  write_file(out(), "mine");
  expect_refused({out(), "not a directory"});
  EXPECT_EQ(read_file(out()), "mine");
}

TEST_F(HfImport, output_that_is_a_symbolic_link_is_named_as_one_and_left_alone) {
  write();
  fs::create_directory(path("empty"));
  fs::create_directory_symlink(path("empty"), out());
  expect_refused({out(), "is a symbolic link"});
  EXPECT_TRUE(fs::is_symlink(out()));
  EXPECT_TRUE(fs::is_empty(path("empty")));
}

TEST_F(HfImport, output_that_is_not_empty_is_refused_and_left_alone) {
  write();
  fs::create_directory(out());
  write_file(out() + "/notes.txt", "mine");
  expect_refused({out(), "not empty"});
  EXPECT_EQ(read_file(out() + "/notes.txt"), "mine");
}

TEST_F(HfImport, write_failing_midway_leaves_no_output_no_staging_folder_and_no_new_parents) {
  write();
  // A file-size limit far below the checkpoint's size makes the rank file's write fail (EFBIG;
  // SIGXFSZ ignored) after the staging folder and the output's parents were created.
  const std::string nested_out = path("new/parent/out");
  const std::vector<std::string> before = tree(tmp_);
  const CliRun r = run({"/bin/sh", "-c", "ulimit -f 16 && trap '' XFSZ && exec \"$0\" \"$@\"",
                        MOE_BINARY_DIR "/moetrain", "import-hf", hf(), nested_out});
  expect_error(r, {"rank-00000.safetensors"});
  EXPECT_EQ(tree(tmp_), before);
  // The control: without the limit the same command writes the output.
  ASSERT_EQ(moetrain({"import-hf", hf(), nested_out}).exit_code, 0);
  EXPECT_TRUE(fs::exists(nested_out + "/step-000000/index.json"));
}

}  // namespace
