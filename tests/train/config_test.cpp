// The config key table (train/config_keys.h) drives reading, writing, the listing and the
// comparisons: what is written reads back to the same values for every key, a value outside a
// key's range or a size product that would overflow is refused naming the keys (never showing a
// wrapped number), and the README's key table is the listing the binary prints.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "moe/core/error.h"
#include "moe/train/config.h"

namespace moe {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, WrittenConfigReadsBackToTheSameValueForEveryKey) {
  // Strings that a hand-written writer got wrong: quotes, backslashes, newlines, TOML syntax.
  const Config c = load_config("tiny", {"name=\"plain-name_1.0\"", "run.dir=\"dir \\\"quoted\\\" \\\\with\\nnewline = [x]\"",
                                        "train.lr=0.1", "model.rope_theta=3.0000000000000004", "data.seed=0",
                                        "train.seed=9223372036854775807", "run.resume=\"auto\"",
                                        "model.qk_norm=\"per_head\"", "parallel.mode=\"ddp\"",
                                        "optim.moment_dtype=\"bf16\""});
  EXPECT_EQ(c.name, "plain-name_1.0");
  EXPECT_EQ(c.run.dir, "dir \"quoted\" \\with\nnewline = [x]");
  const std::string text = config_to_toml(c);
  const Config back = parse_config(text, "written config");
  EXPECT_EQ(config_values(back), config_values(c)) << text;
  EXPECT_EQ(back.run.dir, c.run.dir);
  EXPECT_EQ(back.model.rope_theta, 3.0000000000000004);
  EXPECT_EQ(back.train.seed, 9223372036854775807ull);
  EXPECT_EQ(back.optim.moment_dtype, DType::BF16);
  EXPECT_EQ(load_config("tiny").optim.moment_dtype, DType::F32) << "moments default to FP32";
  EXPECT_EQ(config_differences(back, c, "", "a", "b"), "");
}

TEST(Config, DifferencesNameEachDifferingKeyWithBothValues) {
  const Config a = load_config("tiny", {"model.num_experts=4", "train.lr=0.5"});
  const Config b = load_config("tiny");
  const std::string model_only = config_differences(a, b, "model", "this run", "checkpoint");
  EXPECT_NE(model_only.find("this run: model.num_experts = 4"), std::string::npos) << model_only;
  EXPECT_NE(model_only.find("checkpoint: model.num_experts = 8"), std::string::npos) << model_only;
  EXPECT_EQ(model_only.find("train.lr"), std::string::npos) << model_only;
  EXPECT_NE(config_differences(a, b, "", "x", "y").find("x: train.lr = 0.5"), std::string::npos);
  // A layout change of the same values is no difference: values are compared, not text.
  const Config reordered = parse_config("[train]\nlr = 5e-1\n[model]\nnum_experts = 4\n" +
                                            std::string("vocab_size = 512\nhidden_size = 64\n"),
                                        "reordered");
  Config a_model_only = b;
  a_model_only.model = a.model;
  EXPECT_EQ(config_differences(reordered, a_model_only, "model", "x", "y"), "");
}

TEST(Config, ValuesOutsideAKeysRangeAreRefusedNamingTheKeyAndTheRange) {
  const struct {
    const char* set;
    const char* needle;
  } cases[] = {
      {"train.steps=-3", "train.steps' in"},
      {"train.save_every=-5", "train.save_every"},
      {"train.keep_last=-2", "train.keep_last"},
      {"train.lr=nan", "train.lr"},
      {"train.lr=1e39", "train.lr"},
      {"model.init_std=1e-300", "model.init_std"},
      {"model.num_hidden_layers=1000000", "model.num_hidden_layers"},
      {"name=\"../escape\"", "plain folder name"},
      {"run.dir=\"~/runs\"", "not expanded"},
      {"train.beta2=1.0", "train.beta2"},
      {"data.eval_fraction=1", "data.eval_fraction"},
      {"model.hidden_size=0", "model.hidden_size"},
      {"train.micro_batch_size=144115188075855872", "train.micro_batch_size"},  // 2^57
      {"parallel.ep=0", "parallel.ep"},
      {"train.max_skipped_steps=-1", "train.max_skipped_steps"},
      {"run.resume=\"always\"", "run.resume = \"always\" is not one of: no, auto"},
      {"optim.moment_dtype=\"fp16\"", "optim.moment_dtype = \"fp16\" is not one of: fp32, bf16"},
      {"model.hidden_size=2.5", "must be an integer"},
      {"train.lr=\"fast\"", "must be a number"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_config("tiny", {c.set}); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.set << " -> " << e;
  }
}

TEST(Config, SizeProductsThatWouldOverflowAreRefusedWithoutWrappedNumbers) {
  // Each factor is within its key's range; their product is not usable.
  const std::string tokens =
      error_of([] { load_config("tiny", {"train.micro_batch_size=1048576", "train.seq_len=1048576",
                                         "train.global_batch_size=1048576"}); });
  EXPECT_NE(tokens.find("tokens per microbatch"), std::string::npos) << tokens;
  EXPECT_NE(tokens.find("train.micro_batch_size (1048576) x train.seq_len (1048576)"), std::string::npos) << tokens;
  const std::string rows = error_of([] {
    load_config("tiny", {"train.micro_batch_size=32768", "train.global_batch_size=32768", "train.seq_len=32768"});
  });
  EXPECT_NE(rows.find("train.micro_batch_size"), std::string::npos) << rows;
  const std::string experts = error_of([] {
    load_config("tiny", {"model.vocab_size=2147483648", "model.hidden_size=1099511627776",
                         "model.num_attention_heads=1", "model.num_key_value_heads=1"});
  });
  EXPECT_NE(experts.find("embedding elements"), std::string::npos) << experts;
  EXPECT_NE(experts.find("does not fit in 64 bits"), std::string::npos) << experts;
  for (const std::string& e : {tokens, rows, experts})
    EXPECT_FALSE(std::regex_search(e, std::regex("= -[0-9]"))) << "a wrapped negative number: " << e;
}

TEST(Config, ADirectoryAsConfigFileIsRefused) {
  const std::string e = error_of([] { load_config(MOE_SOURCE_DIR "/configs"); });
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
}

TEST(Config, ReadmeKeyTableIsTheListingTheBinaryPrints) {
  std::ifstream in(MOE_SOURCE_DIR "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  EXPECT_NE(readme.find(config_keys_markdown()), std::string::npos)
      << "README.md's config key table differs from `moetrain keys`; paste its output into README.md:\n"
      << config_keys_markdown();
}

}  // namespace
}  // namespace moe
