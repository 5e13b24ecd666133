// The data a team already has, end to end: raw OLMo-core / Dolma token arrays, several sources
// mixed by weight in a config file, named validation sets reported under their names, and
// `moetrain eval --data synthetic`; a bad source is one error naming its key, nothing written.
#include <algorithm>

#include "cli_test_util.h"

namespace {

// A headerless uint16 array of valid tokens.
std::string raw_u16(const std::vector<uint16_t>& tokens) {
  return std::string(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
}

class DataCliTest : public CliTest {
 protected:
  std::string config_with(const std::string& extra) const {
    return read_file(MOE_SOURCE_DIR "/configs/tiny.toml") + "\n" + extra;
  }
  std::vector<std::string> train_with_config(const std::string& config_path, int steps) const {
    std::vector<std::string> sets = tiny_sets();
    return tiny_train({"--config", config_path, "--steps", std::to_string(steps), "--set", "train.eval_every=2",
                       "--set", "train.log_every=1"},
                      sets);
  }
};

TEST_F(DataCliTest, raw_sources_mixed_by_weight_and_named_eval_sets_train_and_are_reported) {
  fs::create_directories(path("dolma"));
  write_file(path("dolma/part-00000.npy"), raw_u16(valid_tokens(4000)));  // raw despite the name, as Dolma writes
  write_file(path("dolma/part-00001.npy"), raw_u16(valid_tokens(3000)));
  write_file(path("code.bin"), raw_u16(valid_tokens(2000)));
  write_file(path("val-a.bin"), raw_u16(valid_tokens(600)));
  const std::vector<uint16_t> longer = valid_tokens(2000);
  write_file(path("val-b.bin"), raw_u16(std::vector<uint16_t>(longer.begin() + 1111, longer.end())));
  // The tiny config's [data] table gets the sources (data.path stays at its default).
  std::string text = read_file(MOE_SOURCE_DIR "/configs/tiny.toml");
  text.replace(text.find("[data]\n"), std::string("[data]\n").size(),
               "[data]\nformat = \"raw\"\ndtype = \"uint16\"\n\n[[data.sources]]\npath = \"" + path("dolma") +
                   "\"\nweight = 3.0\n\n[[data.sources]]\npath = \"" + path("*.bin") +
                   "\"\nweight = 1.0\n\n[[eval.sets]]\nname = \"val-a\"\npath = \"" + path("val-a.bin") +
                   "\"\n\n[[eval.sets]]\nname = \"val-b\"\npath = \"" + path("val-b.bin") + "\"\n");
  write_file(path("mix.toml"), text);
  const CliRun r = moetrain(train_with_config(path("mix.toml"), 4));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("from 2 sources"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval loss on val-a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("eval loss on val-b"), std::string::npos) << r.out;
  const auto records = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  ASSERT_TRUE(records[1].contains("eval_sets")) << records[1].dump();
  EXPECT_TRUE(records[1]["eval_sets"]["val-a"].is_number());
  EXPECT_TRUE(records[1]["eval_sets"]["val-b"].is_number());
  EXPECT_NE(records[1]["eval_sets"]["val-a"], records[1]["eval_sets"]["val-b"]);
  // The glob *.bin also matches the validation files: mixing them in is what the user asked for;
  // config.toml records the resolved sources.
  EXPECT_NE(read_file(run_dir() + "/config.toml").find("[[data.sources]]"), std::string::npos);
}

// A config with [[data.sources]] is written without data.path (which the reader refuses beside
// sources). Until 2026-12-07 it carried data.path = "synthetic": such a run's config.toml and
// checkpoints could not be read back, so export-hf failed, a second resume was refused (both
// config files taken for the user's) and a changed source weight went unreported. A run directory
// of that older form is still moetrain's own.
TEST_F(DataCliTest, a_run_on_several_sources_resumes_again_and_again_and_exports) {
  write_file(path("a.bin"), raw_u16(valid_tokens(3000)));
  write_file(path("b.bin"), raw_u16(valid_tokens(2000)));
  const auto sources = [&](double weight) {
    return "data.sources=[{path=\"" + path("a.bin") + "\", weight=" + std::to_string(weight) + "}, {path=\"" +
           path("b.bin") + "\", weight=1.0}]";
  };
  const auto train = [&](double weight, int steps, bool resume) {
    std::vector<std::string> sets = tiny_sets();
    sets.insert(sets.end(), {sources(weight), "data.format=raw"});
    std::vector<std::string> extra = {"--steps", std::to_string(steps), "--save-every", "2"};
    if (resume) extra.insert(extra.end(), {"--resume", "latest"});
    return moetrain(tiny_train(extra, sets));
  };
  ASSERT_EQ(train(3.0, 2, false).exit_code, 0);
  const std::string config = run_dir() + "/config.toml";
  EXPECT_EQ(read_file(config).find("path = 'synthetic'"), std::string::npos) << read_file(config);
  const CliRun changed = train(1.0, 4, true);
  ASSERT_EQ(changed.exit_code, 0) << changed.err;
  EXPECT_NE(changed.out.find("data.sources[0].weight = 1 (was 3)"), std::string::npos) << changed.out;
  const CliRun again = train(1.0, 6, true);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_FALSE(fs::exists(run_dir() + "/config.resolved.toml")) << "config.toml is moetrain's: rewritten";
  EXPECT_NE(read_file(config).find("steps = 6"), std::string::npos);
  const CliRun ex = moetrain({"export-hf", run_dir(), path("hf")});
  ASSERT_EQ(ex.exit_code, 0) << ex.err;

  // The older form: data.path = "synthetic" beside the sources, where toml++ orders it in [data].
  std::string text = read_file(config);
  const size_t data = text.find("\n[data]\n"), sampling = text.find("\nsampling = ", data);
  ASSERT_TRUE(data != std::string::npos && sampling != std::string::npos) << text;
  text.insert(sampling + 1, "path = 'synthetic'\n");
  write_file(config, text);
  const std::string older = read_file(config);
  const CliRun old = train(1.0, 8, true);
  ASSERT_EQ(old.exit_code, 0) << old.err;
  EXPECT_FALSE(fs::exists(run_dir() + "/config.resolved.toml")) << "the older form is moetrain's too";
  EXPECT_NE(read_file(config).find("steps = 8"), std::string::npos);
  EXPECT_EQ(read_file(config).find("path = 'synthetic'"), std::string::npos);
  // Given back as --config, a config.toml of the older form reads as well (as a stored config).
  write_file(path("older.toml"), older);
  const CliRun plan = moetrain({"plan", "--config", path("older.toml")});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  std::string hand = older.substr(older.find('\n') + 1);  // without moetrain's first line: the user's file
  write_file(path("hand.toml"), hand);
  expect_error(moetrain({"plan", "--config", path("hand.toml")}), {"gives both data.path and [[data.sources]]"});
}

// A checkpoint records each token file's length and checksum: a resume over files that changed
// since (same name, other tokens), appeared or went away names them in a note; one over the same
// files says nothing.
TEST_F(DataCliTest, a_resume_names_the_token_files_that_changed_since_the_checkpoint) {
  fs::create_directories(path("corpus"));
  write_file(path("corpus/a.bin"), raw_u16(valid_tokens(3000)));
  write_file(path("corpus/b.bin"), raw_u16(valid_tokens(2000)));
  write_file(path("corpus/c.bin"), raw_u16(valid_tokens(2000)));
  std::vector<std::string> sets = tiny_sets();
  sets.insert(sets.end(), {"data.path=" + path("corpus"), "data.format=raw"});
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "2"}, sets)).exit_code, 0);
  const std::string state = read_file(run_dir() + "/step-000002/train_state.json");
  EXPECT_NE(state.find("\"data_files\""), std::string::npos) << state;
  const CliRun same = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}, sets));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out.find("token files differ"), std::string::npos) << same.out;
  // The same files by another spelling of the path, or copied elsewhere: the same windows, no note.
  fs::copy(path("corpus"), path("moved"));
  for (const std::string& spelling : {path("corpus") + "/./", path("moved")}) {
    std::vector<std::string> moved = sets;
    moved.push_back("data.path=" + spelling);
    const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", run_dir() + "/step-000002"}, moved));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out.find("token files differ"), std::string::npos) << spelling << "\n" << r.out;
  }
  std::vector<uint16_t> other = valid_tokens(2000);
  std::reverse(other.begin(), other.end());  // same length, other tokens
  write_file(path("corpus/b.bin"), raw_u16(other));
  fs::remove(path("corpus/c.bin"));
  write_file(path("corpus/d.bin"), raw_u16(valid_tokens(1000)));
  const CliRun changed = moetrain(tiny_train({"--steps", "4", "--resume", run_dir() + "/step-000002"}, sets));
  ASSERT_EQ(changed.exit_code, 0) << changed.err;
  EXPECT_NE(changed.out.find("token files differ from the ones the checkpoint's run read (" + path("corpus/b.bin") +
                             " changed, " + path("corpus/c.bin") + " is gone, " + path("corpus/d.bin") + " is new)"),
            std::string::npos)
      << changed.out;
}

TEST_F(DataCliTest, a_bad_source_is_named_before_anything_is_written) {
  const struct {
    std::vector<std::string> sets;
    std::vector<std::string> needles;
  } cases[] = {
      {{"data.sources=[{path=\"" + path("nope") + "\", weight=1.0}]"}, {"data.sources[0].path", "does not exist"}},
      {{"data.sources=[{path=\"" + path("nope") + "\", weight=0.0}]"}, {"data.sources[0].weight"}},
      {{"data.sources=[{path=\"x\", wieght=2.0}]"}, {"unknown key 'wieght'", "data.sources[0]"}},
      {{"data.sources=[{path=\"x\"}]", "data.path=\"y\""}, {"data.path", "data.sources", "not both"}},
      {{"data.sources=[{path=\"synthetic\"}]"}, {"data.sources[0].path", "use data.path = \"synthetic\" instead"}},
      {{"eval.sets=[{name=\"a\", path=\"" + path("nope.bin") + "\"}]"}, {"eval.sets[0].path"}},
      {{"eval.sets=[{name=\"a\", path=\"x\"}, {name=\"a\", path=\"y\"}]"}, {"eval.sets", "'a'", "twice"}},
      {{"data.format=\"raw\"", "data.path=\"" + path("odd.bin") + "\""}, {"odd.bin", "not a multiple of 2"}},
  };
  write_file(path("odd.bin"), "abc");
  for (const auto& c : cases) {
    std::vector<std::string> args = tiny_train();
    for (const std::string& s : c.sets) args.insert(args.end(), {"--set", s});
    const CliRun r = moetrain(args);
    expect_error(r, c.needles);
    EXPECT_FALSE(fs::exists(run_dir())) << c.sets[0];
  }
}

TEST_F(DataCliTest, eval_of_the_synthetic_corpus_uses_the_checkpoints_own_corpus) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const CliRun r = moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mean loss"), std::string::npos) << r.out;
  // The same number as the run's own final held-out loss over the same windows is not required
  // (the run evaluates eval_batches microbatches); it must be a finite loss near log(vocab).
  const size_t at = r.out.find("mean loss ");
  ASSERT_NE(at, std::string::npos);
  const double loss = std::stod(r.out.substr(at + 10));
  EXPECT_GT(loss, 1.0);
  EXPECT_LT(loss, 7.0);
}

// data.format = "raw" reads headerless arrays: a folder prepare wrote (its dataset.json) and a
// file with a .npy header are refused, in train and in eval of a raw-data checkpoint, instead of
// reading each header as 64 tokens.
TEST_F(DataCliTest, raw_format_refuses_prepared_folders_and_npy_files_in_train_and_eval) {
  std::string text;
  for (int i = 0; i < 3000; ++i) text += static_cast<char>('a' + i % 26);
  write_file(path("h.txt"), text);
  ASSERT_EQ(moetrain({"prepare", path("h.txt"), "--out", path("bytes")}).exit_code, 0);
  // A vocabulary of 65536 takes every uint16 the header's bytes make: only the format can refuse them.
  const std::vector<std::string> raw_sets = {"--set", "data.format=raw", "--set", "model.vocab_size=65536", "--set",
                                             "model.eos_token_id=256"};
  for (const std::string& data : {path("bytes"), path("bytes/h.npy"), path("bytes/*.npy")}) {
    std::vector<std::string> args = tiny_train({"--set", "data.path=" + data});
    args.insert(args.end(), raw_sets.begin(), raw_sets.end());
    expect_error(moetrain(args), {path("bytes"), "data.format = \"npy\""});
    EXPECT_FALSE(fs::exists(run_dir())) << data;
  }
  // A checkpoint trained on raw arrays, evaluated on a .npy file: refused naming the file.
  write_file(path("train.bin"), raw_u16(valid_tokens(4000)));
  std::vector<std::string> args = tiny_train({"--steps", "1", "--set", "data.path=" + path("train.bin")});
  args.insert(args.end(), raw_sets.begin(), raw_sets.end());
  ASSERT_EQ(moetrain(args).exit_code, 0);
  expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", path("bytes/h.npy")}),
               {path("bytes/h.npy"), ".npy magic", "--set data.format=npy"});
  // What the message advises works.
  const CliRun r = moetrain({"eval", "--checkpoint", run_dir(), "--data", path("bytes/h.npy"), "--set", "data.format=npy"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// eval reads only --data: the stand-in for the training corpus it never reads holds a window of
// whatever train.seq_len a --set gives (a seq_len longer than the stand-in was refused, naming
// data.path, which the user never set).
TEST_F(DataCliTest, eval_with_a_seq_len_longer_than_its_stand_in_corpus_reads_only_the_data_given) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  write_file(path("val.npy"), npy_u16(valid_tokens(3000)));
  const CliRun r =
      moetrain({"eval", "--checkpoint", run_dir(), "--data", path("val.npy"), "--set", "data.synthetic_tokens=8",
                "--set", "train.seq_len=32", "--set", "train.micro_batch_size=1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("mean loss"), std::string::npos) << r.out;
  // --data synthetic evaluates the held-out stream only, whatever the training stream's length.
  const CliRun held_out = moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic", "--set",
                                    "data.synthetic_tokens=8", "--set", "train.seq_len=32", "--set",
                                    "train.micro_batch_size=1"});
  EXPECT_EQ(held_out.exit_code, 0) << held_out.err;
  EXPECT_NE(held_out.out.find("mean loss"), std::string::npos) << held_out.out;
}

// eval reads a folder as train does: its dataset.json is checked, not only for train.
TEST_F(DataCliTest, eval_applies_the_dataset_json_checks_that_train_applies) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  fs::create_directories(path("data"));
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  const auto dataset_json = [&](int64_t vocab_size, int64_t tokens) {
    write_file(path("data/dataset.json"), nlohmann::json{{"tokenizer", "test"},
                                                         {"vocab_size", vocab_size},
                                                         {"files", {{{"name", "a.npy"}, {"tokens", tokens}}}}}
                                              .dump());
  };
  const std::vector<std::string> train_args = tiny_train({"--set", "data.path=" + path("data"), "--set",
                                                          "run.dir=" + path("run2")});
  dataset_json(100000, 3000);
  for (const std::string& data : {path("data"), path("data/*.npy")}) {
    expect_error(moetrain(train_args), {path("data/dataset.json"), "vocab_size 100000"});
    expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", data}),
                 {path("data/dataset.json"), "vocab_size 100000"});
  }
  dataset_json(512, 2999);
  expect_error(moetrain(train_args), {path("data/a.npy"), "holds 3000 tokens", "lists it with 2999"});
  expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", path("data")}),
               {path("data/a.npy"), "holds 3000 tokens", "lists it with 2999"});
  dataset_json(512, 3000);  // the control
  EXPECT_EQ(moetrain({"eval", "--checkpoint", run_dir(), "--data", path("data")}).exit_code, 0);
  // A glob that matches nothing says why, naming the pattern.
  expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", path("nope/*.npy")}),
               {"--data = \"" + path("nope/*.npy") + "\"", "the folder " + path("nope") + " does not exist"});
}

// An empty folder is named under the flag or key that gave it, not as data.path.
TEST_F(DataCliTest, an_empty_folder_is_named_under_its_own_flag_or_key) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  fs::create_directories(path("empty"));
  CliRun r = moetrain({"eval", "--checkpoint", run_dir(), "--data", path("empty")});
  expect_error(r, {"--data: folder '" + path("empty") + "' contains no .npy token files"});
  EXPECT_EQ(r.err.find("data.path"), std::string::npos) << r.err;
  r = moetrain(tiny_train({"--set", "eval.sets=[{name=\"v\", path=\"" + path("empty") + "\"}]", "--set",
                           "run.dir=" + path("run2")}));
  expect_error(r, {"eval.sets[0].path: folder '" + path("empty") + "'"});
  EXPECT_EQ(r.err.find("data.path"), std::string::npos) << r.err;
}

// --tokens N is a ceiling (whole windows in whole microbatches, at most N predicted tokens), and
// a number past int64 is a usage error, not "all" (the command line's kDecimal).
TEST_F(DataCliTest, eval_tokens_is_a_ceiling_and_a_number_out_of_range_is_a_usage_error) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);  // seq_len 16, micro_batch_size 2
  write_file(path("val.npy"), npy_u16(valid_tokens(4000)));
  const auto evaluated = [&](const std::vector<std::string>& extra) -> int64_t {
    std::vector<std::string> args = {"eval", "--checkpoint", run_dir(), "--data", path("val.npy")};
    args.insert(args.end(), extra.begin(), extra.end());
    const CliRun r = moetrain(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const size_t at = r.out.find(" over ");
    return at == std::string::npos ? -1 : std::stoll(r.out.substr(at + 6));
  };
  EXPECT_EQ(evaluated({"--tokens", "1000", "--set", "train.micro_batch_size=1"}), 992);  // 62 windows of 16, not 63
  EXPECT_EQ(evaluated({"--tokens", "1000"}), 992);
  EXPECT_EQ(evaluated({"--tokens", "32"}), 32);
  // Below one microbatch (2 windows of 16 tokens): nothing could be evaluated.
  CliRun r = moetrain({"eval", "--checkpoint", run_dir(), "--data", path("val.npy"), "--tokens", "20"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--tokens 20 is fewer than the 32 predicted tokens of one microbatch"), std::string::npos)
      << r.err;
  for (const char* n : {"99999999999999999999", "-99999999999999999999", "9223372036854775808"}) {
    r = moetrain({"eval", "--checkpoint", run_dir(), "--data", path("val.npy"), "--tokens", n});
    EXPECT_EQ(r.exit_code, 2) << n << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("--tokens"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("out of range"), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
  EXPECT_EQ(evaluated({"--tokens", "9223372036854775807"}), evaluated({}));  // the largest int64: all
}

// eval holds the checkpoint's weights only (no gradients, no optimizer state): a checkpoint that
// could not be trained further in some memory is evaluated there. MOE_TEST_MEMORY_MIB stands in
// for a smaller machine. Training needs ~111 MiB here (27 MiB of weights, 81 MiB of gradients
// and moments); the evaluation ~29 MiB, which `plan --eval` states.
TEST_F(DataCliTest, eval_holds_the_weights_only_and_runs_where_training_the_checkpoint_does_not_fit) {
  std::vector<std::string> sets = tiny_sets();
  sets.insert(sets.end(), {"model.hidden_size=256", "model.intermediate_size=512"});
  ASSERT_EQ(moetrain(tiny_train({}, sets)).exit_code, 0);
  const auto with_memory = [&](const std::string& mib, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/env", "MOE_TEST_MEMORY_MIB=" + mib, MOE_BINARY_DIR "/moetrain"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  };
  std::vector<std::string> resume = tiny_train({"--resume", "latest", "--steps", "2"}, sets);
  expect_error(with_memory("100", resume), {"the run needs", "optim.moment_dtype"}, /*one_line=*/false);
  const CliRun eval = with_memory("100", {"eval", "--checkpoint", run_dir(), "--data", "synthetic"});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  const size_t loss_at = eval.out.find("mean loss");
  ASSERT_NE(loss_at, std::string::npos) << eval.out;
  // eval keeps nothing for a backward (block recompute) unless asked: the same loss as keeping all.
  const CliRun keeping = moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic", "--set",
                                   "train.recompute=none"});
  ASSERT_EQ(keeping.exit_code, 0) << keeping.err;
  const auto loss_line = [](const std::string& out) {
    const size_t at = out.find("mean loss");
    return at == std::string::npos ? out : out.substr(at, out.find(" tokens", at) - at);
  };
  EXPECT_EQ(loss_line(keeping.out), loss_line(eval.out));

  // Below the evaluation's own need: refused with the weights' figures, no optimizer lever offered.
  const CliRun small = with_memory("20", {"eval", "--checkpoint", run_dir(), "--data", "synthetic"});
  expect_error(small, {"the evaluation needs", "no gradients or optimizer state", "plan --eval"}, false);
  EXPECT_EQ(small.err.find("moment_dtype"), std::string::npos) << small.err;
  // `plan --eval` of the same model plans the figure the evaluation was refused with.
  const std::string needs = "the evaluation needs ";
  const size_t at = small.err.find(needs);
  ASSERT_NE(at, std::string::npos);
  const std::string figure = small.err.substr(at + needs.size(), small.err.find(" per rank", at) - at - needs.size());
  // The evaluation that ran states the same plan.
  EXPECT_NE(eval.out.find("memory: " + figure + " planned per rank"), std::string::npos) << figure << "\n" << eval.out;
  std::vector<std::string> plan = {"plan", "--eval", "--gpu-memory", "0.02"};
  for (const std::string& s : sets) plan.insert(plan.end(), {"--set", s});
  const CliRun planned = moetrain(plan);
  ASSERT_EQ(planned.exit_code, 0) << planned.err;
  EXPECT_NE(planned.out.find("evaluation plan of"), std::string::npos) << planned.out;
  EXPECT_NE(planned.out.find(" " + figure + "  NO"), std::string::npos) << figure << "\n" << planned.out;
  // A config file that trains under FSDP is planned as eval runs it (whole-model DDP ranks), unless
  // --set asks for FSDP.
  write_file(path("fsdp.toml"), config_with("[parallel]\nmode = \"fsdp\"\n"));
  plan.insert(plan.begin() + 1, {"--config", path("fsdp.toml")});
  const CliRun from_file = moetrain(plan);
  ASSERT_EQ(from_file.exit_code, 0) << from_file.err;
  EXPECT_NE(from_file.out.find("(ddp, pp 1"), std::string::npos) << from_file.out;
  EXPECT_NE(from_file.out.find(" " + figure + "  NO"), std::string::npos) << figure << "\n" << from_file.out;
  plan.insert(plan.end(), {"--set", "parallel.mode=fsdp"});
  const CliRun asked = moetrain(plan);
  ASSERT_EQ(asked.exit_code, 0) << asked.err;
  EXPECT_NE(asked.out.find("(fsdp, pp 1"), std::string::npos) << asked.out;
}

}  // namespace
