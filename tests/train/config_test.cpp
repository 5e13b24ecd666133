// The config key table (train/config_keys.h) drives reading, writing, the listing and the
// comparisons: what is written reads back to the same values for every key, a value outside a
// key's range or a size product that would overflow is refused naming the keys (never showing a
// wrapped number), and the README's key table is the listing the binary prints. The integer array
// parallel.pp_layers is read from a file and from --set, refused as a string (its former form) or any
// other non-array with an array to write that splits the configured model, and resolves to exactly
// the given pipeline chunk sizes. A --set value that opens an array, table or string but does not
// parse is refused as such, never taken as a bare string. A width of 0 is accepted exactly where
// the key table says (no layer uses it), and refused elsewhere naming the layers that need it.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "moe/core/error.h"
#include "moe/train/config.h"
#include "moe/train/pipeline_layout.h"
#include "../error_of.h"

namespace moe {
namespace {

using moe::testing::error_of;

TEST(Config, WrittenConfigReadsBackToTheSameValueForEveryKey) {
  // Strings that a hand-written writer got wrong: quotes, backslashes, newlines, TOML syntax.
  const Config c = load_config("tiny", {"name=\"plain-name_1.0\"", "run.dir=\"dir \\\"quoted\\\" \\\\with\\nnewline = [x]\"",
                                        "train.lr=0.1", "model.rope_theta=3.0000000000000004", "data.seed=0",
                                        "train.seed=9223372036854775807", "run.resume=\"auto\"",
                                        "model.qk_norm=\"per_head\"", "parallel.mode=\"ddp\"",
                                        "optim.moment_dtype=\"bf16\"", "model.num_hidden_layers=8", "parallel.pp=2",
                                        "parallel.pp_layers=[3, 5]"});
  EXPECT_EQ(c.name, "plain-name_1.0");
  EXPECT_EQ(c.run.dir, "dir \"quoted\" \\with\nnewline = [x]");
  const std::string text = config_to_toml(c);
  const Config back = parse_config(text, "written config");
  EXPECT_EQ(config_values(back), config_values(c)) << text;
  EXPECT_EQ(back.run.dir, c.run.dir);
  EXPECT_EQ(back.model.rope_theta, 3.0000000000000004);
  EXPECT_EQ(back.train.seed, 9223372036854775807ull);
  EXPECT_EQ(back.optim.moment_dtype, DType::BF16);
  EXPECT_EQ(back.parallel.pp_layers, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(parse_config(config_to_toml(load_config("tiny")), "written default").parallel.pp_layers,
            std::vector<int64_t>{})
      << "the default (balanced) is written as an empty array and reads back as one";
  EXPECT_EQ(load_config("tiny").optim.moment_dtype, DType::F32) << "moments default to FP32";
  EXPECT_EQ(config_differences(back, c, "", "a", "b"), "");
}

TEST(Config, WrittenFloatsAreTheShortestTextThatReadsBackAsTheSameValue) {
  // toml++'s compiled library wrote max_digits10 digits: lr = 0.0030000000000000001.
  const Config c = load_config("tiny", {"train.lr=0.003", "train.weight_decay=1e-06", "model.rope_theta=500000.0",
                                        "train.beta2=0.95"});
  const std::string text = config_to_toml(c);
  for (const char* line : {"lr = 0.003\n", "weight_decay = 1e-06\n", "rope_theta = 5e+05\n", "beta2 = 0.95\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in:\n" << text;
  }
  const Config back = parse_config(text, "written config");
  EXPECT_EQ(back.train.lr, 0.003);
  EXPECT_EQ(back.train.weight_decay, 1e-6);
  EXPECT_EQ(back.model.rope_theta, 500000.0);
}

TEST(Config, DifferencesNameEachDifferingKeyWithBothValues) {
  const Config a = load_config("tiny", {"model.num_experts=4", "train.lr=0.5"});
  const Config b = load_config("tiny");
  const std::string model_only = config_differences(a, b, "model", "this run", "checkpoint");
  EXPECT_NE(model_only.find("model.num_experts = 4 in this run, 8 in checkpoint"), std::string::npos) << model_only;
  EXPECT_EQ(model_only.find('\n'), std::string::npos) << "one line: " << model_only;
  EXPECT_EQ(model_only.find("train.lr"), std::string::npos) << model_only;
  EXPECT_NE(config_differences(a, b, "", "x", "y").find("train.lr = 0.5 in x, 0.003 in y"), std::string::npos);
  // Numbers in the shortest text that reads back as the value, plain where that reads best.
  const std::string eps = config_differences(load_config("tiny", {"model.rms_norm_eps=1e-6", "model.rope_theta=5e5"}),
                                             load_config("tiny", {"model.rope_theta=1e4"}), "model", "x", "y");
  EXPECT_NE(eps.find("model.rms_norm_eps = 1e-06 in x, 1e-05 in y"), std::string::npos) << eps;
  EXPECT_NE(eps.find("model.rope_theta = 500000 in x, 10000 in y"), std::string::npos) << eps;
  // What the rank-agreement and resume messages show for an array key: both arrays as written.
  const std::vector<std::string> eight = {"model.num_hidden_layers=8", "parallel.pp=2"};
  std::vector<std::string> given = eight;
  given.push_back("parallel.pp_layers=[3,5]");
  const std::string layers = config_differences(load_config("tiny", given), load_config("tiny", eight), "parallel",
                                                "rank 0", "rank 1");
  EXPECT_NE(layers.find("parallel.pp_layers = [3, 5] in rank 0, [] in rank 1"), std::string::npos) << layers;
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
      // Integers a double cannot hold exactly were read from an empty optional (garbage, e.g. 9.37e-312).
      {"train.lr=9007199254740993", "must be a finite number in [0, 10], got 9007199254740993"},
      {"train.lr=-9223372036854775807", "got -9223372036854775807"},
      {"model.capacity_factor=9007199254740993", "got 9007199254740993"},
      {"run.peak_tflops=1e-320", "run.peak_tflops = "},  // an MFU of inf%
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_config("tiny", {c.set}); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.set << " -> " << e;
  }
  EXPECT_EQ(load_config("tiny", {"train.lr=1"}).train.lr, 1.0);  // an integer for a number key is its value
}

// tiny with 8 layers on `pp` pipeline stages (1F1B) and the given extra overrides.
Config pipelined(int64_t pp, std::vector<std::string> extra) {
  std::vector<std::string> o = {"model.num_hidden_layers=8", "parallel.pp=" + std::to_string(pp)};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config("tiny", o);
}

// The written tiny config with 8 layers, its [parallel] table replaced by `lines`.
std::string tiny_toml_with_parallel(const std::string& lines) {
  std::string text = config_to_toml(load_config("tiny", {"model.num_hidden_layers=8"}));
  const size_t begin = text.find("[parallel]"), end = text.find("\n[", begin + 1);
  if (begin == std::string::npos || end == std::string::npos) return "no [parallel] table followed by another in:\n" + text;
  return text.replace(begin, end - begin, "[parallel]\n" + lines + "\n");
}

TEST(Config, PpLayersArrayIsReadFromAFileAndFromSet) {
  const std::string text = tiny_toml_with_parallel("pp = 2\npp_layers = [ 3, 5 ]");
  EXPECT_EQ(parse_config(text, "file.toml").parallel.pp_layers, (std::vector<int64_t>{3, 5})) << text;
  EXPECT_EQ(pipelined(2, {"parallel.pp_layers=[3,5]"}).parallel.pp_layers, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(pipelined(2, {"parallel.pp_layers=[ 3, 5 ]"}).parallel.pp_layers, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(pipelined(2, {"parallel.pp_layers=[3,5]", "parallel.pp_layers=[]"}).parallel.pp_layers,
            std::vector<int64_t>{})
      << "a later --set replaces the array; [] asks for the balanced split";
}

// Each schedule combination that would not run what it names is refused, naming the keys; the
// ones that would run are accepted.
TEST(Config, PipelineScheduleCombinationsThatWouldNotRunAsNamedAreRefused) {
  const struct {
    int64_t pp;
    std::vector<std::string> extra;
    const char* needle;  // "" = accepted
  } cases[] = {
      {2, {"parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"}, ""},
      {2, {"parallel.pp_schedule=\"1f1b\""}, ""},
      {2, {"parallel.pp_schedule=\"interleaved\""}, "needs parallel.pp_virtual >= 2 chunks per rank"},
      {2, {"parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=1"}, "(with 1 it is the 1F1B schedule)"},
      {1, {"parallel.pp_schedule=\"interleaved\""}, "one stage has nothing to interleave"},
      {1, {"parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2"}, "needs parallel.pp_schedule"},
      {2, {"parallel.pp_virtual=2"}, "parallel.pp_virtual = 2 needs parallel.pp_schedule = \"interleaved\""},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { pipelined(c.pp, c.extra); });
    if (std::string(c.needle).empty())
      EXPECT_EQ(e, "") << c.extra.front();
    else
      EXPECT_NE(e.find(c.needle), std::string::npos) << c.extra.front() << " (pp " << c.pp << ") -> " << e;
  }
}

TEST(Config, PpLayersAsAStringIsRefusedShowingTheArrayToWrite) {
  // Quoted, bare (taken as a string) and the empty default of the old form.
  const struct {
    const char* set;
    const char* array;
    const char* flag;
  } cases[] = {
      {"parallel.pp_layers=\"3,5\"", "parallel.pp_layers = [3, 5]", "--set 'parallel.pp_layers=[3,5]'"},
      {"parallel.pp_layers=3,5", "parallel.pp_layers = [3, 5]", "--set 'parallel.pp_layers=[3,5]'"},
      {"parallel.pp_layers=\" 3, 5 \"", "parallel.pp_layers = [3, 5]", "--set 'parallel.pp_layers=[3,5]'"},
      {"parallel.pp_layers=\"\"", "parallel.pp_layers = []", "--set 'parallel.pp_layers=[]'"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { pipelined(2, {c.set}); });
    EXPECT_NE(e.find("config key 'parallel.pp_layers'"), std::string::npos) << c.set << " -> " << e;
    EXPECT_NE(e.find("must be an array of integers, not the string"), std::string::npos) << c.set << " -> " << e;
    EXPECT_NE(e.find(c.array), std::string::npos) << c.set << " -> " << e;
    EXPECT_NE(e.find(c.flag), std::string::npos) << c.set << " -> " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
  }
  const std::string file =
      error_of([] { parse_config(tiny_toml_with_parallel("pp = 2\npp_layers = \"3,5\""), "old.toml"); });
  EXPECT_NE(file.find("config key 'parallel.pp_layers' in old.toml must be an array of integers, not the string "
                      "\"3,5\"; it takes one layer count per pipeline chunk"),
            std::string::npos)
      << file;
  EXPECT_NE(file.find("write parallel.pp_layers = [3, 5]"), std::string::npos) << file;
}

TEST(Config, PpLayersElementsThatAreNotPositiveIntegersAreRefusedNamingTheKey) {
  const struct {
    const char* set;
    const char* needle;
  } cases[] = {
      {"parallel.pp_layers=[3,1.5]", "must be an integer, got 1.5"},
      {"parallel.pp_layers=[3,\"5\"]", "must be an integer"},
      {"parallel.pp_layers=[[3],5]", "must be an integer"},
      {"parallel.pp_layers=[8,0]", "must be in [1, 2048], got 0"},
      {"parallel.pp_layers=[9,-1]", "must be in [1, 2048], got -1"},
      {"parallel.pp_layers=8", "must be an array of integers, got 8"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { pipelined(2, {c.set}); });
    EXPECT_NE(e.find("config key 'parallel.pp_layers'"), std::string::npos) << c.set << " -> " << e;
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.set << " -> " << e;
  }
  // A config built in code is held to the same element range.
  Config c = pipelined(2, {});
  c.parallel.pp_layers = {9, -1};
  const std::string built = error_of([&] { c.validate(); });
  EXPECT_NE(built.find("parallel.pp_layers = [9, -1]: element 1 must be in [1, 2048], got -1"), std::string::npos)
      << built;
}

// The "write parallel.pp_layers = [...]" a refusal of a value that is not an array offers, as a --set override.
std::string offered_array(const std::string& error) {
  std::smatch m;
  if (!std::regex_search(error, m, std::regex(R"(write parallel\.pp_layers = (\[[0-9, ]*\]))"))) return "";
  return "parallel.pp_layers=" + m[1].str();
}

// A value that is not an array gets an example that splits the configured model (8 layers here):
// the user's own numbers only when they do, else the balanced split; none where no split exists.
TEST(Config, PpLayersThatIsNotAnArrayIsRefusedWithAnExampleThatSplitsThisModel) {
  const struct {
    int64_t pp;
    std::vector<std::string> extra;  // the last one is the bad pp_layers
  } cases[] = {
      {2, {"parallel.pp_layers=\"three\""}},
      {2, {"parallel.pp_layers=8"}},
      {2, {"parallel.pp_layers=3,1"}},  // two numbers, but not 8 layers
      {1, {"parallel.pp_layers=4,4"}},  // 8 layers, but one stage
      {2, {"parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2", "parallel.pp_layers=\"x\""}},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { pipelined(c.pp, c.extra); });
    EXPECT_NE(e.find("must be an array of integers"), std::string::npos) << c.extra.back() << " -> " << e;
    EXPECT_NE(e.find("adding up to model.num_hidden_layers = 8"), std::string::npos) << e;
    const std::string example = offered_array(e);
    ASSERT_NE(example, "") << "no example offered: " << e;
    std::vector<std::string> fixed = c.extra;
    fixed.back() = example;
    EXPECT_NO_THROW(pipelined(c.pp, fixed)) << example << " offered by: " << e;
  }
  // 16 stages cannot split 8 layers: no example, the keys to lower instead.
  const std::string none = error_of([] { pipelined(16, {"parallel.pp_layers=\"x\""}); });
  EXPECT_NE(none.find("exceed model.num_hidden_layers = 8: lower parallel.pp"), std::string::npos) << none;
  EXPECT_EQ(offered_array(none), "") << none;
}

// A --set value that opens an array, an inline table or a quoted string and does not parse is
// refused as that (naming the key and the text), not taken as a bare string; bare words still are.
TEST(Config, UnparsableSetValuesAreRefusedAsWhatTheyOpenNotTakenAsStrings) {
  const struct {
    const char* set;
    const char* needle;
  } cases[] = {
      {"parallel.pp_layers=[1,1", "the array [1,1 given for parallel.pp_layers could not be parsed"},
      {"parallel.pp_layers= [3,", "the array [3, given for parallel.pp_layers could not be parsed"},
      {"data.sources=[{path=\"a.npy\"}", "the array [{path=\"a.npy\"} given for data.sources could not be parsed"},
      {"eval.sets={name=\"a\"", "the inline table {name=\"a\" given for eval.sets could not be parsed"},
      {"run.dir=\"out", "the quoted string \"out given for run.dir could not be parsed"},
      {"name='tiny", "the quoted string 'tiny given for name could not be parsed"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { load_config("tiny", {c.set}); });
    EXPECT_NE(e.find(std::string("--set ") + c.set + ":"), std::string::npos) << c.set << " -> " << e;
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.set << " -> " << e;
    EXPECT_EQ(e.find("not the string"), std::string::npos) << "reported as a string value: " << e;
  }
  EXPECT_EQ(load_config("tiny", {"run.dir=runs/a b"}).run.dir, "runs/a b");
  EXPECT_EQ(load_config("tiny", {"data.path=data/*.npy"}).data.path, "data/*.npy");
}

TEST(Config, SpacesAroundASetKeyItsDotAndItsEqualsSignAreTomlLayoutNotPartOfTheName) {
  EXPECT_EQ(load_config("tiny", {"train.steps = 7"}).train.steps, 7);
  EXPECT_EQ(load_config("tiny", {" train . steps\t=9 "}).train.steps, 9);
  EXPECT_EQ(load_config("tiny", {"run.dir = runs/a b "}).run.dir, "runs/a b");
  EXPECT_EQ(load_config("tiny", {"run.dir = \" x \""}).run.dir, " x ") << "spaces inside quotes are the value's";
  EXPECT_EQ(load_config("tiny", {" name = x"}).name, "x") << "the one key outside a section";
  for (const char* bad : {" =3", "train. =3", " .steps=3", "train={steps=2}", "steps=2"}) {
    const std::string e = error_of([&] { load_config("tiny", {bad}); });
    EXPECT_NE(e.find("--set expects section.key=value"), std::string::npos) << bad << " -> " << e;
  }
}

// The "e.g. parallel.pp_layers = [...]" a refusal offers, as a --set override.
std::string offered_split(const std::string& error) {
  std::smatch m;
  if (!std::regex_search(error, m, std::regex(R"(e\.g\. parallel\.pp_layers = (\[[0-9, ]*\]))"))) return "";
  return "parallel.pp_layers=" + m[1].str();
}

TEST(Config, PpLayersOfTheWrongCountOrSumAreRefusedOfferingASplitThatWorks) {
  const struct {
    int64_t pp;
    std::vector<std::string> extra;
    const char* needle;
  } cases[] = {
      {2, {"parallel.pp_layers=[3,4]"}, "parallel.pp_layers = [3, 4] gives 2 chunk sizes adding up to 7"},
      {2, {"parallel.pp_layers=[3,3,2]"}, "parallel.pp x parallel.pp_virtual = 2 sizes"},
      {1, {"parallel.pp_layers=[3,5]"}, "parallel.pp x parallel.pp_virtual = 1 sizes"},
      {2,
       {"parallel.pp_schedule=\"interleaved\"", "parallel.pp_virtual=2", "parallel.pp_layers=[3,5]"},
       "parallel.pp x parallel.pp_virtual = 4 sizes of at least 1 adding up to model.num_hidden_layers = 8"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { pipelined(c.pp, c.extra); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << e;
    const std::string split = offered_split(e);
    ASSERT_NE(split, "") << "no working split offered: " << e;
    std::vector<std::string> fixed = c.extra;
    fixed.back() = split;
    EXPECT_NO_THROW(pipelined(c.pp, fixed)) << split << " offered by: " << e;
  }
}

TEST(Config, GivenPpLayersAreTheResolvedPipelineChunks) {
  const struct {
    int64_t pp, virtual_stages;
    std::vector<int64_t> sizes;
  } cases[] = {{2, 1, {3, 5}}, {2, 1, {7, 1}}, {4, 1, {1, 1, 1, 5}}, {2, 2, {1, 3, 2, 2}}};
  for (const auto& c : cases) {
    std::string array = "parallel.pp_layers=[";
    for (size_t i = 0; i < c.sizes.size(); ++i) array.append(i ? "," : "").append(std::to_string(c.sizes[i]));
    array += ']';
    std::vector<std::string> extra = {array};
    if (c.virtual_stages > 1)
      extra.insert(extra.end(), {"parallel.pp_schedule=\"interleaved\"",
                                 "parallel.pp_virtual=" + std::to_string(c.virtual_stages)});
    const Config cfg = pipelined(c.pp, extra);
    const PipelineLayout layout =
        plan_pipeline_layout(cfg.model, cfg.train.seq_len, static_cast<int>(cfg.parallel.pp),
                             static_cast<int>(cfg.parallel.pp_virtual), cfg.parallel.pp_layers);
    ASSERT_EQ(layout.chunks(), static_cast<int>(c.sizes.size())) << array;
    std::vector<int64_t> resolved;
    for (int k = 0; k < layout.chunks(); ++k) resolved.push_back(layout.end_layer(k) - layout.first_layer(k));
    EXPECT_EQ(resolved, c.sizes) << array;
    EXPECT_EQ(layout.first_layer(0), 0) << array;
    EXPECT_EQ(layout.end_layer(layout.chunks() - 1), 8) << array;
  }
}

TEST(Config, AStoredConfigOfTheStringFormReadsAsTheArray) {
  // Checkpoints written before pp_layers became an array store it as a string ("" by default).
  const std::string old_default = tiny_toml_with_parallel("pp_layers = \"\"");
  const std::string old_given = tiny_toml_with_parallel("pp = 2\npp_layers = \"3, 5\"");
  EXPECT_EQ(parse_stored_config(old_default, "train_state.json").parallel.pp_layers, std::vector<int64_t>{});
  EXPECT_EQ(parse_stored_config(old_given, "train_state.json").parallel.pp_layers, (std::vector<int64_t>{3, 5}));
  EXPECT_NE(error_of([&] { parse_config(old_given, "run.toml"); }).find("not the string"), std::string::npos)
      << "only stored configs are read in the old form";
  EXPECT_NE(error_of([&] { parse_stored_config(old_default, "train_state.json", {"parallel.pp_layers=\"3,5\""}); })
                .find("not the string"),
            std::string::npos)
      << "overrides are read in today's form only";
  EXPECT_NE(error_of([&] { parse_stored_config(tiny_toml_with_parallel("pp_layers = \"x\""), "s.json"); })
                .find("config key 'parallel.pp_layers' in s.json"),
            std::string::npos);
}

TEST(Config, AConfigWithDataSourcesIsWrittenWithoutDataPathAndReadsBack) {
  const Config c = load_config("tiny", {"data.sources=[{path=\"a.npy\", weight=3.0}, {path=\"b\", weight=1.0}]"});
  const std::string text = config_to_toml(c);
  EXPECT_EQ(text.find("path = 'synthetic'"), std::string::npos) << text;
  EXPECT_EQ(config_values(parse_config(text, "written")), config_values(c));
  for (const auto& [key, value] : config_values(c)) EXPECT_NE(key, "data.path") << value;
  EXPECT_TRUE(written_config_text(text));
  // Written so until 2026-12-07: data.path's default beside the sources. A checkpoint's stored
  // config and a run folder's config.toml of that form read as today's (load_config reads a file
  // with moetrain's first line as stored: data_cli_test); a user's own config is refused.
  std::string old = text;
  old.insert(old.find("\nsampling = ", old.find("\n[data]\n")) + 1, "path = 'synthetic'\n");
  EXPECT_NE(error_of([&] { parse_config(old, "mix.toml"); }).find("gives both data.path and [[data.sources]]"),
            std::string::npos);
  EXPECT_EQ(config_values(parse_stored_config(old, "train_state.json")), config_values(c));
  EXPECT_TRUE(written_config_text(old)) << old;
  // A path of the user's beside the sources is not that form.
  std::string other = text;
  other.insert(other.find("\nsampling = ", other.find("\n[data]\n")) + 1, "path = 'mine.npy'\n");
  EXPECT_FALSE(written_config_text(other));
  EXPECT_NE(error_of([&] { parse_stored_config(other, "train_state.json"); }).find("gives both"), std::string::npos);
  // Hand layout or a comment makes the text the user's.
  EXPECT_FALSE(written_config_text("# mine\n" + text));
  EXPECT_TRUE(written_config_text(config_to_toml(load_config("tiny"))));
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

// The "accepted" cell of a key's row in the key table (`moetrain keys`, README.md).
std::string accepted_in_key_table(const std::string& key) {
  const std::string table = config_keys_markdown();
  const size_t row = table.find("| `" + key + "` |");
  if (row == std::string::npos) return "no row for " + key;
  std::stringstream line(table.substr(row, table.find('\n', row) - row));
  std::string cell;
  for (int i = 0; i <= 4; ++i) std::getline(line, cell, '|');  // "", key, type, default, accepted
  return cell.substr(1, cell.size() - 2);
}

// A width only MoE layers use (or only dense ones) may be 0 when no layer uses it, and the key
// table says when; elsewhere 0 is refused naming the key and the layer setting that needs it.
// Experts per token is never 0: even an all-dense model builds the expert dispatcher, which sizes
// its buffers by top-K (the table once listed 0, which then failed at start-up in rank_capacity).
TEST(Config, ZeroWidthsAreAcceptedExactlyWhereTheKeyTableSays) {
  EXPECT_EQ(accepted_in_key_table("model.num_experts_per_tok"), "in [1, 1048576]");
  EXPECT_EQ(accepted_in_key_table("model.intermediate_size"),
            ">= 1 (at most 2^40), or 0 when every layer is dense (model.first_k_dense_replace = "
            "model.num_hidden_layers)");
  EXPECT_EQ(accepted_in_key_table("model.dense_intermediate_size"),
            ">= 1 (at most 2^40), or 0 when no layer is dense (model.first_k_dense_replace = 0)");

  const std::vector<std::string> all_dense = {"model.first_k_dense_replace=2", "model.dense_intermediate_size=64"};
  const auto with = [](std::vector<std::string> o, const std::string& more) {
    o.push_back(more);
    return o;
  };
  EXPECT_EQ(load_config("tiny", with(all_dense, "model.intermediate_size=0")).model.intermediate_size, 0);
  for (const auto& overrides :
       {std::vector<std::string>{"model.num_experts_per_tok=0"}, with(all_dense, "model.num_experts_per_tok=0")}) {
    const std::string e = error_of([&] { load_config("tiny", overrides); });
    EXPECT_NE(e.find("'model.num_experts_per_tok' in built-in config 'tiny' (with --set overrides) must be in "
                     "[1, 1048576], got 0"),
              std::string::npos)
        << e;
  }
  const std::string moe_width = error_of([] { load_config("tiny", {"model.intermediate_size=0"}); });
  EXPECT_NE(moe_width.find("model.intermediate_size = 0 needs every layer dense (model.first_k_dense_replace = "
                           "model.num_hidden_layers = 2), but model.first_k_dense_replace = 0"),
            std::string::npos)
      << moe_width;
  const std::string dense_width = error_of([] { load_config("tiny", {"model.first_k_dense_replace=1"}); });
  EXPECT_NE(dense_width.find("model.dense_intermediate_size = 0 needs no layer dense (model.first_k_dense_replace = "
                             "0), but model.first_k_dense_replace = 1"),
            std::string::npos)
      << dense_width;
  const std::string negative = error_of([] { load_config("tiny", {"model.intermediate_size=-1"}); });
  EXPECT_NE(negative.find("must be >= 1 (at most 2^40), or 0 when every layer is dense"), std::string::npos)
      << negative;
}

// FP8 on the GPU reads 16-byte rows of codes: each feature width and the tokens of a microbatch
// must be multiples of 16, refused up front naming the key (the kernels' own check names none).
TEST(Config, Fp8OnTheGpuRefusesWidthsAndMicrobatchesThatAreNotMultiplesOf16) {
  const std::vector<std::string> fp8 = {"train.precision=\"fp8\"", "model.hidden_size=128",
                                        "model.intermediate_size=64", "train.seq_len=64", "train.micro_batch_size=1"};
  EXPECT_NO_THROW(check_fp8_gpu_shapes(load_config("tiny", fp8)));
  const auto refused = [&](const std::vector<std::string>& more, const std::string& key) {
    std::vector<std::string> o = fp8;
    o.insert(o.end(), more.begin(), more.end());
    const Config c = load_config("tiny", o);  // valid as a config: the CPU emulation runs it
    try {
      check_fp8_gpu_shapes(c);
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(key), std::string::npos) << msg;
      EXPECT_NE(msg.find("multiple of 16"), std::string::npos) << msg;
      EXPECT_NE(msg.find("run.device = \"cpu\""), std::string::npos) << msg;
    }
  };
  refused({"model.hidden_size=120", "model.num_attention_heads=4", "model.num_key_value_heads=4"}, "model.hidden_size");
  refused({"model.intermediate_size=100"}, "model.intermediate_size");
  refused({"model.shared_expert_intermediate_size=24"}, "model.shared_expert_intermediate_size");
  refused({"model.first_k_dense_replace=1", "model.dense_intermediate_size=40"}, "model.dense_intermediate_size");
  refused({"train.seq_len=63", "train.micro_batch_size=1"}, "train.micro_batch_size x train.seq_len");
  // 16 heads of 8 keep the query 128 wide, but one key/value head is 8 wide.
  refused({"model.num_attention_heads=16", "model.num_key_value_heads=1"}, "model.num_key_value_heads");
}

// train.max_duration: plain decimal numbers, each with a unit from the largest down (the last may
// go without one: seconds). std::stod used to take signs, exponents and hex ("0x10s" ran 16 s).
TEST(Config, DurationsAreDecimalNumbersWithUnitsFromTheLargestDown) {
  EXPECT_DOUBLE_EQ(parse_duration("90s", "k"), 90);
  EXPECT_DOUBLE_EQ(parse_duration("1h30m", "k"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("1d2h3m4s", "k"), 86400 + 7200 + 180 + 4);
  EXPECT_DOUBLE_EQ(parse_duration("1.5h", "k"), 5400);
  EXPECT_DOUBLE_EQ(parse_duration("45", "k"), 45);
  EXPECT_DOUBLE_EQ(parse_duration("", "k"), 0);  // no limit
  // Refused, each naming the key and the text (as "not a duration", or the unit at fault).
  for (const char* text : {"0x10s", "0x1p4s", "+5m", "-5m", "1e3s", "1e9h", ".s", "inf", "nan", "h", "1..5h", " 5m",
                           "1h30", "1h1h", "30m1h"}) {
    const std::string e = error_of([&] { parse_duration(text, "train.max_duration"); });
    EXPECT_NE(e.find(std::string("train.max_duration = \"") + text + "\""), std::string::npos) << text << ": " << e;
  }
  const std::string huge = "1" + std::string(400, '0') + "s", tiny = "0." + std::string(400, '0') + "1s";
  for (const std::string& text : {std::string("+5m"), std::string("-5m"), std::string(".s"), std::string("inf"),
                                  std::string(" 5m"), huge, tiny})
    EXPECT_NE(error_of([&] { parse_duration(text, "k"); }).find("is not a duration"), std::string::npos) << text;
  for (const char* text : {"1h1h", "30m1h", "1m2m"})
    EXPECT_NE(error_of([&] { parse_duration(text, "k"); }).find("each unit once, from the largest down"),
              std::string::npos)
        << text;
  EXPECT_NE(error_of([&] { parse_duration("5x", "k"); }).find("unknown unit 'x'"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_duration("0s", "k"); }).find("must be longer than zero"), std::string::npos);
}

}  // namespace
}  // namespace moe
