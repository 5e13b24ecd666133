// End-to-end tests that a checkpoint is taken only for what it is: tensors of another shape, a
// missing router bias or nesting that would overflow the stack are refused with one error line; a
// run directory named `latest` is that directory; a user's `step-notes/` is not a checkpoint; and
// a file-size limit is an error that leaves no temporary folder (SIGXFSZ would kill silently).
#include <sys/resource.h>

#include <csignal>

#include "cli_test_util.h"

namespace {

// Edits a checkpoint's train_state.json: the stored model config's line `from` becomes `to`.
// train_state.json carries no checksum, so this is what a hand edit or a copied file can do.
void edit_stored_model_config(const std::string& ckpt, const std::string& from, const std::string& to) {
  const std::string path = ckpt + "/train_state.json";
  nlohmann::json st = nlohmann::json::parse(read_file(path));
  std::string text = st["model_config"].get<std::string>();
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << "the stored model config lacks '" << from << "':\n" << text;
  text.replace(at, from.size(), to);
  st["model_config"] = text;
  write_file(path, st.dump(2));
}

// `sets` with `key=value` replaced (or added).
std::vector<std::string> sets_with(std::vector<std::string> sets, const std::string& key, const std::string& value) {
  sets.erase(std::remove_if(sets.begin(), sets.end(), [&](const std::string& s) { return s.rfind(key + "=", 0) == 0; }),
             sets.end());
  sets.push_back(key + "=" + value);
  return sets;
}

TEST_F(CliTest, a_checkpoint_whose_tensors_have_another_shape_is_refused_naming_the_tensor) {
  // Saved with hidden_size 32; its stored model config then loses the line that says so, so the
  // config comparison sees the default-free text of a 16-wide model: only the shapes tell.
  ASSERT_EQ(moetrain(tiny_train({}, sets_with(tiny_sets(), "model.hidden_size", "32"))).exit_code, 0);
  const std::string ckpt = run_dir() + "/step-000001";
  edit_stored_model_config(ckpt, "hidden_size = 32", "hidden_size = 16");
  const std::string other = path("other");
  std::vector<std::string> resume = {"train", "--set", "run.dir=" + other, "--resume", ckpt, "--steps", "2"};
  for (const std::string& s : tiny_sets()) resume.insert(resume.end(), {"--set", s});
  const CliRun r = moetrain(resume);
  expect_error(r, {ckpt, "is stored as [", "this run's model needs ["});
  EXPECT_FALSE(fs::exists(other + "/step-000002"));

  std::vector<std::string> init = {"train", "--set", "run.dir=" + other, "--init-from", ckpt};
  for (const std::string& s : tiny_sets()) init.insert(init.end(), {"--set", s});
  expect_error(moetrain(init), {ckpt, "is stored as [", "this run's model needs ["});
}

TEST_F(CliTest, a_checkpoint_without_the_router_bias_a_run_updates_is_refused) {
  const std::vector<std::string> sets = sets_with(tiny_sets(), "model.bias_update_rate", "0.01");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"}, sets)).exit_code, 0);
  const std::string index_path = run_dir() + "/step-000002/index.json";
  nlohmann::json index = nlohmann::json::parse(read_file(index_path));
  ASSERT_TRUE(index["tensors"].contains("router_bias")) << index.dump().substr(0, 400);
  index["tensors"].erase("router_bias");
  write_file(index_path, index.dump(2));
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}, sets));
  expect_error(r, {"holds no 'router_bias'", "model.bias_update_rate"});
  EXPECT_FALSE(fs::exists(run_dir() + "/step-000003"));
}

TEST_F(CliTest, a_run_directory_named_latest_is_that_directory) {
  const std::string dir = path("exp/latest");
  std::vector<std::string> sets = tiny_sets();
  std::vector<std::string> first = {"train", "--set", "run.dir=" + dir, "--steps", "1"};
  for (const std::string& s : sets) first.insert(first.end(), {"--set", s});
  ASSERT_EQ(moetrain(first).exit_code, 0);
  std::vector<std::string> again = {"train", "--set", "run.dir=" + dir, "--steps", "2", "--resume", "latest"};
  for (const std::string& s : sets) again.insert(again.end(), {"--set", s});
  const CliRun r = moetrain(again);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir + "/step-000002/index.json"));
  // A checkpoint beside it in the parent is not what `exp/latest` means once `exp/latest` exists.
  ASSERT_EQ(moetrain({"export-hf", dir, path("hf")}).exit_code, 0);
  EXPECT_TRUE(fs::exists(path("hf/config.json")));
}

TEST_F(CliTest, entries_named_like_checkpoints_are_not_taken_for_a_run) {
  fs::create_directories(run_dir() + "/step-by-step-notes");
  write_file(run_dir() + "/step-by-step-notes/a.txt", "mine");
  write_file(run_dir() + "/step-plan.txt", "also mine");
  const CliRun r = moetrain(tiny_train({"--steps", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(run_dir() + "/step-by-step-notes/a.txt"), "mine");
  EXPECT_EQ(read_file(run_dir() + "/step-plan.txt"), "also mine");
  // --overwrite moves only the run's own files.
  const CliRun o = moetrain(tiny_train({"--steps", "1", "--overwrite"}));
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("--overwrite: moved the previous run"), std::string::npos) << o.out;
  EXPECT_EQ(read_file(run_dir() + "/step-by-step-notes/a.txt"), "mine");
  EXPECT_EQ(read_file(run_dir() + "/step-plan.txt"), "also mine");
}

TEST_F(CliTest, deeply_nested_json_in_a_checkpoint_is_one_error_line_not_a_crash) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  const std::string ckpt = run_dir() + "/step-000001";
  write_file(ckpt + "/train_state.json", std::string(100000, '[') + std::string(100000, ']'));
  expect_error(moetrain({"eval", "--checkpoint", ckpt, "--data", "synthetic"}), {"train_state.json", "nests JSON"});
  expect_error(moetrain(tiny_train({"--steps", "2", "--resume", "latest"})), {"train_state.json", "nests JSON"});
}

TEST_F(CliTest, malformed_run_records_are_named_as_what_they_are) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  // A step past int64 was read as a wrapped negative number.
  write_file(run_dir() + "/.set-aside.json", R"({"after_step": 99999999999999999999, "dir": "x"})");
  expect_error(moetrain(tiny_train({"--steps", "2", "--resume", "latest"})),
               {".set-aside.json", "\"after_step\" must be a step >= 0, got 1e+20"});
  fs::remove(run_dir() + "/.set-aside.json");
  // A record that is a directory was reported as JSON that ends too early.
  const std::string state = run_dir() + "/step-000001/train_state.json";
  fs::remove(state);
  fs::create_directory(state);
  expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic"}),
               {"train_state.json", "is a directory"});
}

TEST_F(CliTest, a_file_size_limit_is_an_error_that_leaves_no_temporary_folder) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  // SIGXFSZ at its default action (kill), as in a user's shell: moetrain must ignore it itself.
  auto* previous = std::signal(SIGXFSZ, SIG_DFL);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const CliRun r = moetrain({"export-hf", run_dir(), path("hf")});
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  expect_error(r, {"hf"});
  for (const auto& e : fs::directory_iterator(tmp_))
    EXPECT_EQ(e.path().filename().string().find("hf"), std::string::npos) << "left behind: " << e.path();
}

// eval reads the checkpoint's stored config with fixed overrides of its own (the data, the
// layout); an error in that config named it "(with --set overrides)" though the user gave none.
TEST_F(CliTest, an_error_in_the_config_eval_reads_from_a_checkpoint_blames_a_set_only_when_one_was_given) {
  ASSERT_EQ(moetrain(tiny_train({})).exit_code, 0);
  const std::string ckpt = run_dir() + "/step-000001";
  const std::string path = ckpt + "/train_state.json";
  nlohmann::json st = nlohmann::json::parse(read_file(path));
  std::string text = st["config"].get<std::string>();
  const size_t at = text.find("num_experts_per_tok = 2");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, std::string("num_experts_per_tok = 2").size(), "num_experts_per_tok = -1");
  st["config"] = text;
  write_file(path, st.dump(2));

  const CliRun plain = moetrain({"eval", "--checkpoint", ckpt, "--data", "synthetic"});
  expect_error(plain, {"'model.num_experts_per_tok' in " + path + " must be"});
  EXPECT_EQ(plain.err.find("with --set overrides"), std::string::npos) << plain.err;
  const CliRun with_set =
      moetrain({"eval", "--checkpoint", ckpt, "--data", "synthetic", "--set", "train.micro_batch_size=1"});
  expect_error(with_set, {"'model.num_experts_per_tok' in " + path + " (with --set overrides) must be"});
}

}  // namespace
