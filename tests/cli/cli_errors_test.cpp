// End-to-end tests of the moetrain command line: every bad input (config, data, checkpoint,
// output folder, prepare input) must end the real binary with exit status 1, one "error: ..."
// message on stderr that names the problem, and no partial output. Positive controls run the
// same tiny commands without the fault, so a test cannot pass just because the command fails.
//
// Every case runs `moetrain` in a fresh temp dir with a model small enough (hidden 16, seq 16,
// 2 sequences per step, a 20K-token synthetic corpus) that a run takes well under 2 s.
#include <regex>

#include "cli_test_util.h"

namespace {

// ---- positive controls ----------------------------------------------------------------------

TEST_F(CliTest, tiny_run_exits_zero_and_writes_metrics_with_every_key_and_a_checkpoint) {
  const CliRun r = moetrain(tiny_train());
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_EQ(r.err, "");
  const auto records = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 1u);
  for (const char* key : {"step", "loss", "lm_loss", "lb_loss", "z_loss", "grad_norm", "lr", "tokens_per_s", "mfu"}) {
    ASSERT_TRUE(records[0].contains(key)) << "metrics.jsonl lacks '" << key << "': " << records[0].dump();
    EXPECT_TRUE(records[0][key].is_number()) << key << " is not a number: " << records[0].dump();
  }
  EXPECT_EQ(records[0]["step"].get<int64_t>(), 1);
  EXPECT_GT(records[0]["lm_loss"].get<double>(), 0.0);
  EXPECT_GT(records[0]["tokens_per_s"].get<double>(), 0.0);
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000001"});
}

TEST_F(CliTest, resume_latest_with_more_steps_continues_at_the_next_step_only) {
  const CliRun first = moetrain(tiny_train({"--steps", "2"}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
  const CliRun resumed = moetrain(tiny_train({"--resume", "latest", "--steps", "3"}));
  ASSERT_EQ(resumed.exit_code, 0) << "stdout:\n" << resumed.out << "\nstderr:\n" << resumed.err;
  EXPECT_NE(resumed.out.find("at step 2"), std::string::npos) << resumed.out;
  std::vector<int64_t> steps;
  for (const auto& rec : read_metrics(run_dir() + "/metrics.jsonl")) steps.push_back(rec["step"].get<int64_t>());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));  // the first run logged 1 and 2; the resumed run only 3
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000002", "step-000003"}));
}

TEST_F(CliTest, npy_folder_written_by_this_test_trains) {
  // Proves npy_u16 writes files the reader accepts, so the data cases below fail for their fault.
  fs::create_directory(path("data"));
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("data")}));
  EXPECT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_EQ(read_metrics(run_dir() + "/metrics.jsonl").size(), 1u);
}

TEST_F(CliTest, prepare_of_an_existing_file_writes_the_out_dir) {
  write_file(path("doc.txt"), "hello world\n");
  const CliRun r = moetrain({"prepare", path("doc.txt"), "--out", path("out")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(path("out/doc.npy")));
  EXPECT_TRUE(fs::exists(path("out/dataset.json")));
}

// ---- config errors: all fail before the run dir is created -----------------------------------

TEST_F(CliTest, malformed_toml_names_the_file_and_line) {
  // "[data" (unterminated table header) replaces "[data]"; find its line in the file.
  const std::string text = tiny_toml_with("[data]", "[data");
  const int line = 1 + static_cast<int>(std::count(text.begin(), text.begin() + static_cast<long>(text.find("[data")), '\n'));
  write_file(path("bad.toml"), text);
  const CliRun r = moetrain(tiny_train({"--config", path("bad.toml")}));
  expect_error(r, {path("bad.toml"), "line " + std::to_string(line)});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, unknown_key_in_config_file_is_named) {
  write_file(path("typo.toml"), tiny_toml_with("[model]\n", "[model]\nhidden_sise = 16\n"));
  const CliRun r = moetrain(tiny_train({"--config", path("typo.toml")}));
  expect_error(r, {"model.hidden_sise", path("typo.toml")});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, unknown_key_via_set_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "train.stepz=3"}));
  expect_error(r, {"train.stepz", "--set"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, wrong_type_in_file_and_via_set_names_the_key) {
  // The hidden_size override is left out here: it would replace the bad value.
  std::vector<std::string> sets = tiny_sets();
  sets.erase(std::find(sets.begin(), sets.end(), "model.hidden_size=16"));
  write_file(path("type.toml"), tiny_toml_with("hidden_size = 64", "hidden_size = \"big\""));
  const CliRun from_file = moetrain(tiny_train({"--config", path("type.toml")}, sets));
  expect_error(from_file, {"model.hidden_size", "integer", path("type.toml")});
  const CliRun from_set = moetrain(tiny_train({"--set", "model.hidden_size=big"}, sets));
  expect_error(from_set, {"model.hidden_size", "integer"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, pp_layers_as_a_string_in_file_and_via_set_shows_the_array_to_write) {
  write_file(path("old.toml"), tiny_toml_with("[run]", "[parallel]\npp_layers = \"1,1\"\n\n[run]"));
  const CliRun from_file = moetrain(tiny_train({"--config", path("old.toml")}));
  // tiny has 2 layers on one stage: the array that works is [2], not the string's [1, 1].
  expect_error(from_file, {"config key 'parallel.pp_layers' in " + path("old.toml"), "not the string \"1,1\"",
                           "write parallel.pp_layers = [2]"});
  const CliRun from_set = moetrain(tiny_train({"--set", "parallel.pp_layers=\"1,1\""}));
  expect_error(from_set, {"parallel.pp_layers", "--set 'parallel.pp_layers=[2]'"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, an_unclosed_array_via_set_is_named_as_an_array_that_does_not_parse) {
  const CliRun r = moetrain(tiny_train({"--set", "parallel.pp_layers=[1,1"}));
  expect_error(r,
               {"--set parallel.pp_layers=[1,1:", "the array [1,1 given for parallel.pp_layers could not be parsed"});
  EXPECT_EQ(r.err.find("string"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, pp_layers_array_via_set_trains_and_the_written_config_reads_back) {
  // The positive control of the case above: the array form runs, and the run directory's config
  // dump (the resolved config, array included) is a config the binary reads again.
  const CliRun r = moetrain(tiny_train({"--set", "parallel.pp_layers=[2]"}));
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  const std::string written = read_file(run_dir() + "/config.toml");
  EXPECT_TRUE(std::regex_search(written, std::regex(R"(\npp_layers = \[ ?2 ?\]\n)"))) << written;
  const CliRun again = moetrain({"plan", "--device", "cpu", "--config", run_dir() + "/config.toml"});
  EXPECT_EQ(again.exit_code, 0) << "stdout:\n" << again.out << "\nstderr:\n" << again.err;
  const CliRun wrong = moetrain({"plan", "--device", "cpu", "--config", run_dir() + "/config.toml", "--set",
                                 "parallel.pp_layers=[1,1,1]"});
  expect_error(wrong, {"parallel.pp_layers = [1, 1, 1] gives 3 chunk sizes", "e.g. parallel.pp_layers = [2]"});
}

TEST_F(CliTest, heads_not_dividing_hidden_size_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "model.num_attention_heads=3", "--set", "model.num_key_value_heads=3"}));
  expect_error(r, {"model.num_attention_heads", "model.hidden_size"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, top_k_above_num_experts_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "model.num_experts_per_tok=9"}));
  expect_error(r, {"model.num_experts_per_tok", "9"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, global_batch_not_a_multiple_of_micro_batch_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "train.global_batch_size=3"}));
  expect_error(r, {"train.global_batch_size", "train.micro_batch_size"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, missing_config_file_is_named) {
  const CliRun r = moetrain(tiny_train({"--config", path("nope.toml")}));
  expect_error(r, {path("nope.toml")});
  EXPECT_FALSE(fs::exists(run_dir()));
}

// --steps, --save-every and --keep-last stand for config keys. They were appended to the user's
// --set overrides, so an error in the file was reported "in FILE (with --set overrides)", and a
// file whose `train` is not a table was blamed on "--set train.steps", a --set nobody typed.
TEST_F(CliTest, an_error_in_the_config_file_names_the_file_and_no_set_under_flags_for_keys) {
  write_file(path("typo.toml"), tiny_toml_with("[model]\n", "[model]\nhidden_sise = 16\n"));
  write_file(path("flat.toml"), "train = 5\n");
  for (const std::vector<std::string>& args : {
           std::vector<std::string>{"train", "--config", path("typo.toml"), "--steps", "3"},
           std::vector<std::string>{"train", "--config", path("flat.toml"), "--steps", "3", "--keep-last", "2"},
           std::vector<std::string>{"bench", "--config", path("typo.toml")},  // its --steps has a default
       }) {
    const CliRun r = moetrain(args);
    expect_error(r, {args[2]});
    EXPECT_EQ(r.err.find("--set"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(path("runs")));
}

// A new run of no steps is refused before run.dir is claimed: it used to exit 0 ("nothing to do")
// leaving a run.dir with only config.toml, which no --resume could continue.
TEST_F(CliTest, a_new_run_of_zero_steps_is_refused_and_writes_nothing) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--steps", "0"}, std::vector<std::string>{"--set", "train.steps=0"}}) {
    expect_error(moetrain(tiny_train(extra)), {"train.steps = 0: a new run trains at least one step"});
    EXPECT_FALSE(fs::exists(run_dir()));
  }
  // A run already at its last step still has nothing to do, and says so.
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const CliRun again = moetrain(tiny_train({"--steps", "2", "--resume", "latest"}));
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find("nothing to do: already at step 2"), std::string::npos) << again.out;
}

// A flag's value that its config key does not take is a usage error (exit 2) naming the flag and
// the key's own range, not a --set (it was exit 1, and the flag's message gave int64's range).
TEST_F(CliTest, a_flag_value_its_config_key_refuses_names_the_flag) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"train", "--steps", "9223372036854775807", "0 to 1099511627776"},
        {"train", "--steps", "1099511627777", "0 to 1099511627776"},
        {"train", "--save-every", "1099511627777", "0 to 1099511627776"},
        {"train", "--keep-last", "2000000000", "0 to 1073741824"},
        {"bench", "--steps", "1099511627777", "1 to 1099511627776"}}) {
    const CliRun r = moetrain({extra[0], extra[1], extra[2]});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("error: " + extra[1] + ": Value " + extra[2] + " not in range " + extra[3]), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("--set"), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(path("runs")));
}

// ---- data errors ---------------------------------------------------------------------------

TEST_F(CliTest, data_path_to_a_missing_folder_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("no-such-data")}));
  expect_error(r, {"data.path", path("no-such-data")});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, truncated_npy_is_named) {
  fs::create_directory(path("data"));
  std::string bytes = npy_u16(valid_tokens(3000));
  bytes.resize(bytes.size() - 1000);  // the header still says 3000 tokens
  write_file(path("data/cut.npy"), bytes);
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("data")}));
  expect_error(r, {path("data/cut.npy"), "truncated"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, token_outside_vocab_names_the_file_and_value) {
  fs::create_directory(path("data"));
  std::vector<uint16_t> tokens = valid_tokens(3000);
  tokens[1234] = 600;  // vocab_size is 512
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  write_file(path("data/b.npy"), npy_u16(tokens));
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("data")}));
  expect_error(r, {path("data/b.npy"), "600", "1234", "512"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

// A file shorter than one window is skipped with a warning naming it; when every file is that
// short, the check runs before the run dir is created (Trainer's constructor calls
// TokenDataset::check_window), so a failed start leaves nothing behind.
TEST_F(CliTest, file_shorter_than_seq_len_is_skipped_with_a_warning_naming_it) {
  fs::create_directory(path("data"));
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  write_file(path("data/short.npy"), npy_u16(valid_tokens(10)));  // a window needs seq_len + 1 = 17
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("data")}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: " + path("data/short.npy")), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("17"), std::string::npos) << r.err;
}

TEST_F(CliTest, data_where_no_file_holds_a_window_is_named_and_leaves_no_run_dir) {
  fs::create_directory(path("data"));
  write_file(path("data/short.npy"), npy_u16(valid_tokens(10)));
  const CliRun r = moetrain(tiny_train({"--set", "data.path=" + path("data")}));
  expect_error(r, {"data.path", path("data/short.npy"), "17"});
  EXPECT_FALSE(fs::exists(run_dir())) << "a failed run left its run dir behind";
}

// ---- checkpoint errors ---------------------------------------------------------------------

TEST_F(CliTest, resume_from_a_missing_dir_is_named) {
  const CliRun r = moetrain(tiny_train({"--resume", path("no-such-ckpt")}));
  expect_error(r, {path("no-such-ckpt")});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, resume_from_a_truncated_rank_file_names_the_file_and_writes_nothing) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "1"})).exit_code, 0);
  ASSERT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000001", "step-000002"}));
  const std::string rank_file = run_dir() + "/step-000002/rank-00000.safetensors";
  ASSERT_TRUE(fs::exists(rank_file));
  fs::resize_file(rank_file, fs::file_size(rank_file) / 2);
  const std::string metrics_before = read_file(run_dir() + "/metrics.jsonl");

  const CliRun r = moetrain(tiny_train({"--resume", "latest", "--steps", "3"}));
  expect_error(r, {"step-000002/rank-00000.safetensors"});
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000001", "step-000002"}));
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl"), metrics_before);
}

TEST_F(CliTest, resume_with_another_model_config_names_the_differing_key) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const std::string metrics_before = read_file(run_dir() + "/metrics.jsonl");
  const CliRun r = moetrain(tiny_train({"--resume", "latest", "--steps", "3", "--set", "model.num_experts=4"}));
  // The message names each differing key with both values, on the one error line.
  expect_error(r, {"model.num_experts = 4 in this run, 8 in the checkpoint", "step-000002"});
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl"), metrics_before);
}

// ---- command-line errors: one line, exit status 2, nothing written ---------------------------

TEST_F(CliTest, negative_counts_on_the_command_line_are_usage_errors) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--steps", "-3"}, {"--save-every", "-5"}, {"--keep-last", "-2"}}) {
    const CliRun r = moetrain(tiny_train(extra));
    EXPECT_EQ(r.exit_code, 2) << extra[0] << ": " << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(extra[0]), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_FALSE(fs::exists(run_dir()));
  }
  const CliRun eval = moetrain({"eval", "--checkpoint", path("x"), "--data", path("y"), "--tokens", "-5"});
  EXPECT_EQ(eval.exit_code, 2) << eval.err;
  EXPECT_NE(eval.err.find("--tokens"), std::string::npos) << eval.err;
}

// Counts are decimal: CLI11's base detection read `--steps 010` as 8 and `0x10` as 16, and took a
// number past int64 as its saturated value. An empty path flag (an unset shell variable) was
// silently "not given": --resume "" started afresh.
TEST_F(CliTest, counts_are_decimal_and_empty_path_flags_are_usage_errors) {
  const CliRun ten = moetrain(tiny_train({"--steps", "010", "--set", "train.eval_every=0"}));
  ASSERT_EQ(ten.exit_code, 0) << ten.err;
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000010"});
  fs::remove_all(run_dir());
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--steps", "0x10"}, {"--save-every", "1e3"}, {"--resume", ""}, {"--init-from", ""},
        {"--keep-last", "99999999999999999999"}}) {
    const CliRun r = moetrain(tiny_train(extra));
    EXPECT_EQ(r.exit_code, 2) << extra[0] << " " << extra[1] << ": " << r.err;
    EXPECT_NE(r.err.find("error: " + extra[0]), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_FALSE(fs::exists(run_dir()));
  }
  const CliRun tokens =
      moetrain({"eval", "--checkpoint", path("x"), "--data", path("y"), "--tokens", "99999999999999999999"});
  EXPECT_EQ(tokens.exit_code, 2) << tokens.err;
  EXPECT_NE(tokens.err.find("out of range"), std::string::npos) << tokens.err;
  const CliRun json = moetrain({"plan", "--json", ""});
  EXPECT_EQ(json.exit_code, 2) << json.err;
}

// A --set that is not section.key=value cannot be read as an override at all: a usage error (2),
// for every command that takes --set; a well-formed one naming an unknown key is a config error (1).
TEST_F(CliTest, a_set_without_key_and_equals_sign_is_a_usage_error) {
  for (const std::vector<std::string>& args :
       {tiny_train({"--set", "train.steps"}), tiny_train({"--set", "=3"}), tiny_train({"--set", "a.b.c=1"}),
        tiny_train({"--set", " =3"}), tiny_train({"--set", "train. =3"}), tiny_train({"--set", " .steps=3"}),
        tiny_train({"--set", "train.lr=1\nx=2"}),  // the second line was dropped
        tiny_train({"--set", "train={steps=2}"}),   // a whole section, replacing the file's keys there
        tiny_train({"--set", "steps=2"}),
        std::vector<std::string>{"bench", "--set", "run.device"}, std::vector<std::string>{"plan", "--set", "x"},
        std::vector<std::string>{"eval", "--checkpoint", path("x"), "--data", "synthetic", "--set", "train.seq_len"}}) {
    const CliRun r = moetrain(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find("expects section.key=value, got '"), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
  EXPECT_FALSE(fs::exists(run_dir()));
  const CliRun unknown = moetrain(tiny_train({"--set", "train.no_such_key=3"}));
  EXPECT_EQ(unknown.exit_code, 1) << unknown.err;
}

TEST_F(CliTest, no_subcommand_and_unknown_flags_are_usage_errors_and_help_is_not) {
  const CliRun bare = moetrain({});
  EXPECT_EQ(bare.exit_code, 2) << bare.err;
  EXPECT_EQ(bare.err.rfind("error: ", 0), 0u) << bare.err;
  const CliRun unknown = moetrain({"train", "--stepz", "3"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("--stepz"), std::string::npos) << unknown.err;
  const CliRun help = moetrain({"train", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("--resume"), std::string::npos) << help.out;
}

TEST_F(CliTest, a_directory_as_config_file_is_named) {
  fs::create_directory(path("configs"));
  const CliRun r = moetrain(tiny_train({"--config", path("configs")}));
  expect_error(r, {path("configs"), "not a regular file"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, tokens_per_microbatch_that_overflow_are_named_without_wrapped_numbers) {
  const CliRun r = moetrain(tiny_train({"--set", "train.micro_batch_size=144115188075855872", "--set",
                                        "train.global_batch_size=144115188075855872"}));
  expect_error(r, {"144115188075855872", "at most 2^40"});
  EXPECT_FALSE(std::regex_search(r.err, std::regex("[^a-z]-[0-9]"))) << "a negative number in: " << r.err;
  const CliRun product = moetrain(tiny_train({"--set", "train.micro_batch_size=1048576", "--set",
                                              "train.global_batch_size=1048576", "--set", "train.seq_len=1048576"}));
  expect_error(product, {"tokens per microbatch", "train.micro_batch_size (1048576) x train.seq_len (1048576)"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, a_synthetic_corpus_larger_than_memory_is_named) {
  const CliRun r = moetrain(tiny_train({"--set", "data.synthetic_tokens=1000000000000"}));
  expect_error(r, {"data.synthetic_tokens"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

// ---- output and prepare errors -------------------------------------------------------------

TEST_F(CliTest, run_dir_under_a_regular_file_is_named) {
  write_file(path("file"), "not a folder");
  std::vector<std::string> args = tiny_train();
  args.insert(args.end(), {"--set", "run.dir=" + path("file/run")});  // the later --set wins
  const CliRun r = moetrain(args);
  expect_error(r, {path("file/run"), "run.dir"});
  EXPECT_EQ(read_file(path("file")), "not a folder");
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(CliTest, prepare_of_a_missing_input_is_named_and_creates_no_out_dir) {
  write_file(path("doc.txt"), "hello world\n");
  const CliRun r = moetrain({"prepare", path("doc.txt"), path("missing.txt"), "--out", path("out")});
  expect_error(r, {path("missing.txt")});
  EXPECT_FALSE(fs::exists(path("out")));
}

// An output file in a folder that does not exist is refused before the work (a bench or an eval
// could run for minutes first), naming the file and the folder.
TEST_F(CliTest, output_files_in_missing_folders_are_refused_before_the_work) {
  const std::string missing = path("no-such-folder");
  const CliRun bench = moetrain({"bench", "--steps", "50", "--set", "run.device=cpu", "--json", missing + "/b.json"});
  expect_error(bench, {"bench --json", missing + "/b.json", "does not exist"});
  EXPECT_EQ(bench.out.find("step "), std::string::npos) << "no step should run:\n" << bench.out;
#if defined(MOE_HAVE_CUDA)  // plan --json predicts a GPU run: a build without CUDA refuses it before this check
  const CliRun plan = moetrain({"plan", "--json", missing + "/p.json"});
  EXPECT_EQ(plan.exit_code, 1);  // the folder is at fault, not the command line: as for bench and eval
  EXPECT_NE(plan.err.find("plan --json " + missing + "/p.json cannot be written"), std::string::npos) << plan.err;
#endif
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const CliRun eval =
      moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic", "--logits", missing + "/l.npy"});
  expect_error(eval, {"eval --logits", "does not exist"});
  EXPECT_FALSE(fs::exists(missing));
}

TEST_F(CliTest, a_misspelled_command_is_named_with_the_commands_that_exist) {
  const CliRun r = moetrain({"trian", "--steps", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'trian'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train, bench"), std::string::npos) << r.err;
  // A known command with a bad flag keeps CLI11's own message.
  const CliRun flag = moetrain({"train", "--no-such-flag"});
  EXPECT_EQ(flag.exit_code, 2);
  EXPECT_NE(flag.err.find("--no-such-flag"), std::string::npos) << flag.err;
  EXPECT_EQ(flag.err.find("unknown command"), std::string::npos) << flag.err;
}

// Precision may change across a resume (the FP32 weights are the truth), but not silently.
TEST_F(CliTest, a_resume_in_another_precision_says_so) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "train.precision=fp8"})).exit_code, 0);
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("note: the checkpoint was trained with train.precision = \"fp8\""), std::string::npos) << r.out;
  const CliRun same = moetrain(tiny_train({"--steps", "4", "--resume", "latest"}));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out.find("note: the checkpoint was trained with"), std::string::npos) << same.out;
}

}  // namespace
