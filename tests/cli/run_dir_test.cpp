// End-to-end tests of what a training run does to its run directory: resuming from an older
// step sets the abandoned line aside (never deletes it, never lets --keep-last or --resume latest
// see it again), a second run cannot clobber the first, a lock keeps two jobs apart, and the
// metrics file stays one whole record per line with steps that never go backwards.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <csignal>
#include <map>

#include "cli_test_util.h"

namespace {

std::vector<int64_t> metric_steps(const std::string& path) {
  std::vector<int64_t> steps;
  for (const auto& rec : read_metrics(path)) steps.push_back(rec["step"].get<int64_t>());
  return steps;
}

// The one folder under <run>/<kind>/ (abandoned or replaced), or "" when there is not exactly one.
std::string only_subdir(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  for (const auto& e : fs::directory_iterator(dir)) found.push_back(e.path().string());
  return found.size() == 1 ? found[0] : "";
}

std::vector<int64_t> iota_steps(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t s = from; s <= to; ++s) v.push_back(s);
  return v;
}

TEST_F(CliTest, keep_last_after_resume_from_an_older_step_sets_the_abandoned_line_aside_and_keeps_the_resumed_one) {
  // The reported sequence: 20 steps with a checkpoint every 5, then a resume from step 5 that
  // runs to 12 with --keep-last 1. Pruning used to keep the highest steps (15, 20: the abandoned
  // future) and delete the checkpoint just written and the one resumed from.
  const std::vector<std::string> logged = {"--set", "train.log_every=1"};
  std::vector<std::string> first = {"--steps", "20", "--save-every", "5"};
  first.insert(first.end(), logged.begin(), logged.end());
  ASSERT_EQ(moetrain(tiny_train(first)).exit_code, 0);
  ASSERT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000005", "step-000010", "step-000015", "step-000020"}));
  const std::string step10_before = read_file(run_dir() + "/step-000010/index.json");

  std::vector<std::string> second = {"--steps", "12", "--save-every", "5", "--keep-last", "1", "--resume",
                                     run_dir() + "/step-000005"};
  second.insert(second.end(), logged.begin(), logged.end());
  const CliRun r = moetrain(tiny_train(second));
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  // The new line: the resumed checkpoint (protected) and the newest one; 12 is the final save,
  // which --keep-last 1 leaves as the only unprotected one.
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000005", "step-000012"}));
  // The abandoned line is kept whole, checkpoints and metrics, in one folder.
  const std::string aside = only_subdir(run_dir() + "/abandoned");
  ASSERT_NE(aside, "") << "expected one folder under " << run_dir() << "/abandoned";
  EXPECT_NE(aside.find("after-step-000005"), std::string::npos) << aside;
  EXPECT_EQ(step_dirs(aside), (std::vector<std::string>{"step-000010", "step-000015", "step-000020"}));
  EXPECT_EQ(read_file(aside + "/step-000010/index.json"), step10_before);
  EXPECT_EQ(metric_steps(aside + "/metrics.jsonl"), iota_steps(6, 20));
  // metrics.jsonl never goes backwards: 1..5 of the first run, then 6..12 of the new line.
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), iota_steps(1, 12));

  // --resume latest continues the new line, not the abandoned one.
  const CliRun latest = moetrain(tiny_train({"--steps", "13", "--resume", "latest"}));
  ASSERT_EQ(latest.exit_code, 0) << latest.err;
  EXPECT_NE(latest.out.find("step-000012 at step 12"), std::string::npos) << latest.out;
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), iota_steps(1, 13));
}

// A later checkpoint that is a relative link (its files kept on another disk) is set aside as a
// link that still names them; the files themselves do not move.
TEST_F(CliTest, a_later_checkpoint_that_is_a_relative_link_is_set_aside_as_a_working_link) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "4", "--save-every", "2"})).exit_code, 0);
  const std::string elsewhere = path("disk/step-000004");
  fs::create_directories(path("disk"));
  fs::rename(run_dir() + "/step-000004", elsewhere);
  fs::create_symlink(fs::relative(elsewhere, run_dir()), run_dir() + "/step-000004");
  const std::string index = read_file(elsewhere + "/index.json");
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", run_dir() + "/step-000002"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string aside = only_subdir(run_dir() + "/abandoned");
  ASSERT_TRUE(fs::is_symlink(aside + "/step-000004"));
  EXPECT_EQ(read_file(aside + "/step-000004/index.json"), index);
  EXPECT_EQ(read_file(elsewhere + "/index.json"), index) << "what the link names does not move";
}

TEST_F(CliTest, a_set_aside_interrupted_by_a_crash_is_ignored_by_readers_and_completed_by_the_next_run) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "6", "--save-every", "2", "--set", "train.log_every=1"})).exit_code, 0);
  // As if a resume from step 2 had written its intent and moved step 6 before being killed.
  const std::string aside = run_dir() + "/abandoned/crashed-after-step-000002";
  fs::create_directories(aside);
  fs::rename(run_dir() + "/step-000006", aside + "/step-000006");
  write_file(run_dir() + "/.set-aside.json", R"({"after_step": 2, "dir": "crashed-after-step-000002"})");
  // A reader of the run directory never sees step 4, which the intent is moving away.
  fs::create_directory(path("data"));
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  const CliRun eval = moetrain({"eval", "--checkpoint", run_dir(), "--data", path("data")});
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("step-000002 on"), std::string::npos) << eval.out;
  // The next run completes the move before its first step and continues the line of step 2.
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step-000002 at step 2"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(run_dir() + "/.set-aside.json"));
  EXPECT_EQ(step_dirs(aside), (std::vector<std::string>{"step-000004", "step-000006"}));
  EXPECT_EQ(metric_steps(aside + "/metrics.jsonl"), iota_steps(3, 6));
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), iota_steps(1, 3));
}

TEST_F(CliTest, a_fresh_run_into_a_directory_holding_a_run_is_refused_and_changes_nothing) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const std::string metrics = read_file(run_dir() + "/metrics.jsonl");
  const CliRun r = moetrain(tiny_train({"--steps", "2"}));
  expect_error(r, {run_dir(), "already holds a run", "--resume latest", "--overwrite"});
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl"), metrics);
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
  EXPECT_FALSE(fs::exists(run_dir() + "/.lock"));
}

TEST_F(CliTest, a_run_dir_that_is_or_lies_inside_a_checkpoint_is_refused_and_nothing_is_written_into_it) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const std::string ckpt = run_dir() + "/step-000002";
  const auto listing = [](const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> before = listing(ckpt);
  for (const std::string& dir : {ckpt, ckpt + "/nested", ckpt + "/a/b"}) {
    std::vector<std::string> args = {"train", "--set", "run.dir=" + dir};
    for (const std::string& s : tiny_sets()) args.insert(args.end(), {"--set", s});
    const CliRun r = moetrain(args);
    expect_error(r, {"run.dir '" + dir + "'", dir == ckpt ? "is the checkpoint" : "is inside the checkpoint", ckpt,
                     "nothing is written into a checkpoint"});
  }
  EXPECT_EQ(listing(ckpt), before) << "the checkpoint must be left as it was";
  // Through a link to the checkpoint, too.
  fs::create_directory_symlink(ckpt, path("best"));
  for (const std::string& dir : {path("best"), path("best") + "/run2"}) {
    std::vector<std::string> args = {"train", "--set", "run.dir=" + dir};
    for (const std::string& s : tiny_sets()) args.insert(args.end(), {"--set", s});
    expect_error(moetrain(args),
                 {dir == path("best") ? "is the checkpoint " + ckpt : "is inside the checkpoint " + ckpt});
  }
  EXPECT_EQ(listing(ckpt), before);
}

TEST_F(CliTest, a_fresh_run_into_a_run_without_a_checkpoint_is_told_what_starts_it_not_to_resume_it) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "run.save_final=false"})).exit_code, 0);
  ASSERT_TRUE(step_dirs(run_dir()).empty());
  const CliRun r = moetrain(tiny_train({"--steps", "2"}));
  expect_error(r, {run_dir(), "already holds a run", "without a complete checkpoint", "run.resume = \"auto\"",
                   "--overwrite"});
  EXPECT_EQ(r.err.find("--resume latest"), std::string::npos) << r.err;
  std::vector<std::string> fresh = tiny_train({"--steps", "2"});
  fresh.insert(fresh.end(), {"--set", "run.resume=\"auto\""});
  ASSERT_EQ(moetrain(fresh).exit_code, 0) << "the advice must work";
}

TEST_F(CliTest, overwrite_moves_the_previous_run_aside_and_starts_afresh) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const std::string metrics = read_file(run_dir() + "/metrics.jsonl");
  const CliRun r = moetrain(tiny_train({"--steps", "1", "--overwrite"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000001"});
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), std::vector<int64_t>{1});
  const std::string old = only_subdir(run_dir() + "/replaced");
  ASSERT_NE(old, "");
  EXPECT_EQ(read_file(old + "/metrics.jsonl"), metrics);
  EXPECT_EQ(step_dirs(old), std::vector<std::string>{"step-000002"});
  EXPECT_TRUE(fs::exists(old + "/config.toml"));  // the config moetrain wrote for that run goes with it

  // --overwrite with --resume is a command line that cannot be used (exit 2); with run.resume =
  // "auto", which finds a checkpoint to continue, it is refused naming the key. Nothing moves.
  const CliRun both = moetrain(tiny_train({"--steps", "3", "--overwrite", "--resume", "latest"}));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--overwrite starts afresh, --resume continues"), std::string::npos) << both.err;
  const CliRun auto_resume = moetrain(tiny_train({"--steps", "3", "--overwrite", "--set", "run.resume=auto"}));
  expect_error(auto_resume, {"--overwrite starts afresh", "run.resume = \"auto\"", "step-000001"});
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000001"});
  EXPECT_EQ(only_subdir(run_dir() + "/replaced"), old);
}

// The reported case: the user's config.toml lives in run.dir (run.dir = "."). It is not the
// previous run's: --overwrite leaves it in place, byte for byte, and moves only what moetrain wrote.
TEST_F(CliTest, overwrite_leaves_the_users_own_config_toml_in_run_dir_in_place_and_unchanged) {
  const std::string user_config = read_file(MOE_SOURCE_DIR "/configs/tiny.toml");
  write_file(path("config.toml"), user_config);
  std::vector<std::string> args = {"train", "--config", "config.toml", "--set", "run.dir=."};
  for (const std::string& s : tiny_sets()) args.insert(args.end(), {"--set", s});
  ASSERT_EQ(moetrain(args).exit_code, 0);
  const std::string resolved = read_file(path("config.resolved.toml"));
  EXPECT_EQ(resolved.rfind("# moetrain: the resolved config", 0), 0u) << resolved;
  args.push_back("--overwrite");
  const CliRun r = moetrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(path("config.toml")), user_config);
  EXPECT_EQ(step_dirs(tmp_), std::vector<std::string>{"step-000001"});
  const std::string old = only_subdir(path("replaced"));
  ASSERT_NE(old, "");
  EXPECT_FALSE(fs::exists(old + "/config.toml"));
  EXPECT_EQ(read_file(old + "/config.resolved.toml"), resolved);  // moetrain's own, moved with its run
  EXPECT_TRUE(fs::exists(path("config.resolved.toml")));
}

// With both names the resolved config could take held by files of the user's, the run is refused
// before anything is written instead of overwriting one.
TEST_F(CliTest, a_run_dir_holding_the_users_config_toml_and_config_resolved_toml_is_refused_and_both_kept) {
  fs::create_directories(run_dir());
  write_file(run_dir() + "/config.toml", "# mine\n");
  write_file(run_dir() + "/config.resolved.toml", "# also mine\n");
  expect_error(moetrain(tiny_train()), {run_dir(), "config.resolved.toml", "moetrain did not write"});
  EXPECT_EQ(read_file(run_dir() + "/config.toml"), "# mine\n");
  EXPECT_EQ(read_file(run_dir() + "/config.resolved.toml"), "# also mine\n");
  EXPECT_FALSE(fs::exists(run_dir() + "/metrics.jsonl"));
}

// Inputs of the new run that lie among what --overwrite would move (moetrain's config.toml given
// back as --config, token data under abandoned/) are refused naming both paths; nothing moves.
TEST_F(CliTest, overwrite_refuses_to_move_an_input_of_the_new_run_and_moves_nothing) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const std::string metrics = read_file(run_dir() + "/metrics.jsonl");
  const std::string config = read_file(run_dir() + "/config.toml");
  const CliRun own_config = moetrain({"train", "--config", "run/config.toml", "--steps", "1", "--overwrite"});
  expect_error(own_config, {"--overwrite would move " + run_dir() + "/config.toml",
                            "this run's --config run/config.toml", "copy that out of run.dir", "nothing was moved"});
  EXPECT_EQ(read_file(run_dir() + "/config.toml"), config);

  fs::create_directories(run_dir() + "/abandoned");
  write_file(run_dir() + "/abandoned/tokens.npy", npy_u16(valid_tokens(3000)));
  const CliRun data = moetrain(tiny_train({"--steps", "1", "--overwrite", "--set",
                                           "data.path=\"" + run_dir() + "/abandoned/*.npy\""}));
  expect_error(data, {"--overwrite would move " + run_dir() + "/abandoned",
                      "this run's data.path " + run_dir() + "/abandoned/tokens.npy", "nothing was moved"});
  EXPECT_TRUE(fs::exists(run_dir() + "/abandoned/tokens.npy"));
  EXPECT_FALSE(fs::exists(run_dir() + "/replaced"));
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl"), metrics);
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
}

TEST_F(CliTest, run_resume_auto_starts_when_there_is_nothing_and_continues_when_there_is) {
  const CliRun first = moetrain(tiny_train({"--steps", "2", "--set", "run.resume=auto"}));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out.find("resumed from"), std::string::npos) << first.out;
  const CliRun second = moetrain(tiny_train({"--steps", "3", "--set", "run.resume=auto"}));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.out.find("step-000002 at step 2"), std::string::npos) << second.out;
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), iota_steps(1, 3));
}

// A newest step-N folder without index.json is damage: --resume latest and run.resume = "auto"
// refuse it, naming it, with or without an older complete checkpoint, rather than resume the
// older one (or start afresh) and set the damaged one aside unnamed. Named, the older one resumes.
TEST_F(CliTest, resume_latest_and_auto_refuse_a_damaged_newest_checkpoint_naming_it) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "4", "--save-every", "2"})).exit_code, 0);
  fs::remove(run_dir() + "/step-000004/index.json");
  for (const std::vector<std::string>& how : {std::vector<std::string>{"--resume", "latest"},
                                              std::vector<std::string>{"--set", "run.resume=auto"}}) {
    std::vector<std::string> args = {"--steps", "6"};
    args.insert(args.end(), how.begin(), how.end());
    const CliRun r = moetrain(tiny_train(args));
    expect_error(r, {run_dir() + "/step-000004 is newer than every complete checkpoint", "no index.json",
                     "e.g. " + run_dir() + "/step-000002"});
    EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000002", "step-000004"})) << how[0];
  }
  fs::remove_all(run_dir() + "/step-000002");  // no complete checkpoint left: auto must not start afresh
  expect_error(moetrain(tiny_train({"--steps", "6", "--set", "run.resume=auto"})),
               {run_dir() + "/step-000004 is newer than every complete checkpoint"});
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000004"});
}

TEST_F(CliTest, resume_from_another_directory_into_one_holding_a_run_is_refused) {
  const std::string other = path("other");
  std::vector<std::string> args = tiny_train({"--steps", "2"});
  args.insert(args.end(), {"--set", "run.dir=" + other});  // the later --set wins
  ASSERT_EQ(moetrain(args).exit_code, 0);
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", other + "/step-000002"}));
  expect_error(r, {run_dir(), "another directory", "in a new run.dir"});
  EXPECT_EQ(r.out.find("resumed from"), std::string::npos) << "a refused start did not resume:\n" << r.out;
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000002"});
}

// Another run's newer checkpoint copied into the run directory: --resume latest would pick it and
// continue that run's line here (and keep_last would prune this run's around it). Refused, naming
// both checkpoints and their run ids; nothing in either run changes.
TEST_F(CliTest, resume_latest_into_a_directory_holding_another_runs_checkpoint_is_refused) {
  const std::string other = path("other");
  std::vector<std::string> args = tiny_train({"--steps", "4", "--save-every", "2"});
  args.insert(args.end(), {"--set", "run.dir=" + other});
  ASSERT_EQ(moetrain(args).exit_code, 0);
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  fs::copy(other + "/step-000004", run_dir() + "/step-000004", fs::copy_options::recursive);
  const std::string metrics = read_file(run_dir() + "/metrics.jsonl");
  const CliRun r =
      moetrain(tiny_train({"--steps", "6", "--save-every", "2", "--keep-last", "1", "--resume", "latest"}));
  expect_error(r, {run_dir(), "holds checkpoints of two runs", "step-000004", "step-000002", "run id",
                   "directory of its own"});
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000002", "step-000004"}));
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl"), metrics);
  EXPECT_EQ(step_dirs(other), (std::vector<std::string>{"step-000002", "step-000004"}));
}

// A note the user put inside a checkpoint is not the run's to delete: --keep-last keeps that
// checkpoint whole, says so once on stderr, and prunes the others.
TEST_F(CliTest, keep_last_keeps_a_checkpoint_holding_a_users_file_and_says_so_once) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "1"})).exit_code, 0);
  write_file(run_dir() + "/step-000001/notes.txt", "compare with run 7");
  const CliRun r = moetrain(tiny_train({"--steps", "5", "--save-every", "1", "--keep-last", "1", "--resume", "latest"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Step 2 stays as the checkpoint this run resumed from; 3 and 4 went at later saves.
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000001", "step-000002", "step-000005"}));
  EXPECT_EQ(read_file(run_dir() + "/step-000001/notes.txt"), "compare with run 7");
  const std::string said = "kept " + run_dir() + "/step-000001 (it holds notes.txt)";
  const size_t at = r.err.find(said);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(said, at + 1), std::string::npos) << "said more than once:\n" << r.err;
  EXPECT_NE(r.err.find("move them out"), std::string::npos) << r.err;

  // Moved out, the next save prunes it.
  fs::remove(run_dir() + "/step-000001/notes.txt");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "6", "--save-every", "1", "--keep-last", "1", "--resume", "latest"}))
                .exit_code,
            0);
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000005", "step-000006"}));  // 5: resumed from
}

// A file under the name a later checkpoint takes would fail the run at that save, after all the
// steps since the one before: refused at the start instead, naming it; the file is untouched.
TEST_F(CliTest, a_file_named_like_a_checkpoint_in_run_dir_is_refused_at_the_start) {
  fs::create_directories(run_dir());
  write_file(run_dir() + "/step-000004", "my notes");
  const CliRun r = moetrain(tiny_train({"--steps", "4", "--save-every", "2"}));
  expect_error(r, {run_dir(), "step-000004", "not a folder", "step 4"});
  EXPECT_EQ(read_file(run_dir() + "/step-000004"), "my notes");
  EXPECT_FALSE(fs::exists(run_dir() + "/step-000002"));
  // For a step this run never reaches, the name is no obstacle.
  fs::rename(run_dir() + "/step-000004", run_dir() + "/step-000100");
  ASSERT_EQ(moetrain(tiny_train({"--steps", "4", "--save-every", "2"})).exit_code, 0);
  EXPECT_EQ(read_file(run_dir() + "/step-000100"), "my notes");
}

// The run's config.toml given back as --config, edited by hand, is the user's input: the start
// writes its resolved config beside it (config.resolved.toml) and leaves it as it was.
TEST_F(CliTest, the_runs_config_toml_given_as_config_is_not_rewritten) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "2"})).exit_code, 0);
  const std::string config = run_dir() + "/config.toml";
  std::string text = read_file(config);
  const size_t lr = text.find("\nlr = ");
  ASSERT_NE(lr, std::string::npos) << text;
  text.replace(lr, text.find('\n', lr + 1) - lr, "\nlr = 0.002  # lowered by hand");
  write_file(config, text);
  std::vector<std::string> args = tiny_train({"--resume", "latest", "--steps", "4"});
  args.insert(args.end(), {"--config", config});
  const CliRun r = moetrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(config), text);
  const std::string resolved = read_file(run_dir() + "/config.resolved.toml");
  EXPECT_NE(resolved.find("lr = 0.002"), std::string::npos) << resolved;
  EXPECT_NE(resolved.find("steps = 4"), std::string::npos) << resolved;
  // Edited, it is the user's for later starts too, also without --config.
  ASSERT_EQ(moetrain(tiny_train({"--resume", "latest", "--steps", "5"})).exit_code, 0);
  EXPECT_EQ(read_file(config), text);
  EXPECT_NE(read_file(run_dir() + "/config.resolved.toml").find("steps = 5"), std::string::npos);
  // With config.resolved.toml the user's as well, there is no name left: refused, both files kept.
  write_file(run_dir() + "/config.resolved.toml", "# mine\n");
  expect_error(moetrain(tiny_train({"--resume", "latest", "--steps", "6"})),
               {"config.toml", "config.resolved.toml", "are yours"});
  EXPECT_EQ(read_file(config), text);
  EXPECT_EQ(read_file(run_dir() + "/config.resolved.toml"), "# mine\n");
}

// metrics.jsonl as a link to a file elsewhere: a resume from an older step rewrites the file it
// names (the later records set aside) and keeps the link.
TEST_F(CliTest, a_metrics_link_survives_a_resume_from_an_older_step) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "6", "--save-every", "2", "--set", "train.log_every=1"})).exit_code, 0);
  const std::string elsewhere = path("kept-metrics.jsonl");
  fs::rename(run_dir() + "/metrics.jsonl", elsewhere);
  fs::create_symlink(elsewhere, run_dir() + "/metrics.jsonl");
  const CliRun r = moetrain(tiny_train(
      {"--resume", run_dir() + "/step-000004", "--steps", "5", "--save-every", "2", "--set", "train.log_every=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_symlink(run_dir() + "/metrics.jsonl"));
  EXPECT_EQ(metric_steps(elsewhere), iota_steps(1, 5));
}

// A relative link renamed two folders deeper would name nothing: --overwrite moves it as a link
// that still names the previous run's records, which stay where they are, unchanged.
TEST_F(CliTest, overwrite_moves_a_relative_metrics_link_so_that_it_still_names_the_records) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "train.log_every=1"})).exit_code, 0);
  const std::string elsewhere = path("kept-metrics.jsonl");
  fs::rename(run_dir() + "/metrics.jsonl", elsewhere);
  const std::string records = read_file(elsewhere);
  fs::create_symlink(fs::relative(elsewhere, run_dir()), run_dir() + "/metrics.jsonl");
  ASSERT_TRUE(fs::read_symlink(run_dir() + "/metrics.jsonl").is_relative());
  const CliRun r = moetrain(tiny_train({"--steps", "1", "--overwrite", "--set", "train.log_every=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string old = only_subdir(run_dir() + "/replaced");
  ASSERT_TRUE(fs::is_symlink(old + "/metrics.jsonl"));
  EXPECT_EQ(read_file(old + "/metrics.jsonl"), records) << "the moved link names the previous run's records";
  EXPECT_EQ(read_file(elsewhere), records) << "what the link named is not touched";
  EXPECT_FALSE(fs::is_symlink(run_dir() + "/metrics.jsonl"));
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), std::vector<int64_t>{1});
}

TEST_F(CliTest, a_lock_held_by_a_live_process_is_refused_a_stale_one_is_taken_over_a_corrupt_one_is_named) {
  fs::create_directories(run_dir());
  const std::string lock = run_dir() + "/.lock";
  const std::string content = "{\"pid\": 4242, \"host\": \"elsewhere\", \"started\": \"20260101-000000\"}\n";
  // Held: this test process holds the flock, as a running job would.
  write_file(lock, content);
  const int fd = ::open(lock.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  CliRun r = moetrain(tiny_train());
  expect_error(r, {"in use by process 4242 on host elsewhere", lock});
  EXPECT_FALSE(fs::exists(run_dir() + "/metrics.jsonl"));
  // A resume is told the same, not that the live run has no checkpoint yet.
  r = moetrain(tiny_train({"--resume", "latest"}));
  expect_error(r, {"in use by process 4242 on host elsewhere", lock});
  // Left behind: the same file, no longer held (its process ended, however it ended).
  ::close(fd);
  r = moetrain(tiny_train());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("was left by process 4242"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(lock));  // released at the end
  // Not what moetrain writes.
  write_file(lock, "garbage");
  r = moetrain(tiny_train({"--resume", "latest", "--steps", "2"}));
  expect_error(r, {"lock file", "corrupt", lock});
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), std::vector<int64_t>{1});
}

TEST_F(CliTest, config_toml_and_every_metrics_record_describe_the_run) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "train.log_every=1"})).exit_code, 0);
  const std::string config = read_file(run_dir() + "/config.toml");
  EXPECT_NE(config.find("steps = 2"), std::string::npos) << config;
  EXPECT_NE(config.find("hidden_size = 16"), std::string::npos) << config;
  const auto first = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_EQ(first.size(), 2u);
  const std::string id = first[0]["run_id"].get<std::string>();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(first[1]["run_id"], id);
  EXPECT_EQ(first[0]["time"].get<std::string>().size(), 20u);  // 2026-12-01T12:00:00Z
  // The id stays across a resume.
  ASSERT_EQ(moetrain(tiny_train({"--steps", "3", "--resume", "latest"})).exit_code, 0);
  EXPECT_EQ(read_metrics(run_dir() + "/metrics.jsonl").back()["run_id"], id);
}

TEST_F(CliTest, a_cut_off_last_metrics_line_is_moved_aside_and_every_line_parses) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--set", "train.log_every=1"})).exit_code, 0);
  const std::string whole = read_file(run_dir() + "/metrics.jsonl");
  write_file(run_dir() + "/metrics.jsonl", whole + R"({"step": 3, "loss": 1.2)");  // a crash mid-line
  const CliRun r = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(metric_steps(run_dir() + "/metrics.jsonl"), iota_steps(1, 3));  // read_metrics parses every line
  EXPECT_EQ(read_file(run_dir() + "/metrics.jsonl.partial"), std::string(R"({"step": 3, "loss": 1.2)") + "\n");
}

TEST_F(CliTest, a_quote_in_a_string_value_keeps_the_stored_config_readable_for_eval_and_export) {
  const std::string odd = path("run \"quoted\" \\ dir");
  std::vector<std::string> args = tiny_train({"--steps", "1"});
  args.insert(args.end(), {"--set", "run.dir=\"" + std::string("run \\\"quoted\\\" \\\\ dir") + "\""});
  const CliRun r = moetrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(step_dirs(odd), std::vector<std::string>{"step-000001"});
  fs::create_directory(path("data"));
  write_file(path("data/a.npy"), npy_u16(valid_tokens(3000)));
  const CliRun eval = moetrain({"eval", "--checkpoint", odd, "--data", path("data")});
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  const CliRun exported = moetrain({"export-hf", odd, path("hf")});
  EXPECT_EQ(exported.exit_code, 0) << exported.err;
}

TEST_F(CliTest, diverging_steps_are_recorded_and_end_the_run_with_an_error) {
  // From step 2 on every gradient is non-finite (the test hook of a diverged model): steps 2..4
  // are skipped and recorded as such, then the run gives up.
  const CliRun r = run({"/usr/bin/env", "MOE_TEST_NONFINITE_FROM_STEP=2", MOE_BINARY_DIR "/moetrain", "train", "--set",
                        "run.dir=" + run_dir(), "--set", "run.device=cpu", "--set", "train.steps=20", "--set",
                        "train.max_skipped_steps=3", "--set", "train.log_every=1", "--set", "model.hidden_size=16",
                        "--set", "train.seq_len=16", "--set", "train.micro_batch_size=2", "--set",
                        "train.global_batch_size=2"});
  expect_error(r, {"3 consecutive steps", "train.max_skipped_steps = 3"});
  const auto records = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 4u);
  EXPECT_FALSE(records[0]["skipped"].get<bool>());
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_TRUE(records[i]["skipped"].get<bool>()) << records[i].dump();
    EXPECT_EQ(records[i]["grad_norm"], "nan") << "a non-finite number is recorded as a string, not dropped";
  }
  EXPECT_EQ(records.back()["skipped_steps"].get<int64_t>(), 3);
}

TEST_F(CliTest, a_run_whose_every_step_was_skipped_exits_with_an_error) {
  const CliRun r = run({"/usr/bin/env", "MOE_TEST_NONFINITE_FROM_STEP=1", MOE_BINARY_DIR "/moetrain", "train", "--set",
                        "run.dir=" + run_dir(), "--set", "run.device=cpu", "--set", "train.steps=3", "--set",
                        "model.hidden_size=16", "--set", "train.seq_len=16", "--set", "train.micro_batch_size=2",
                        "--set", "train.global_batch_size=2"});
  expect_error(r, {"every step of this run", "nothing was learned"});
}

TEST_F(CliTest, a_metrics_write_that_hits_the_file_size_limit_leaves_whole_lines_and_an_error) {
  // A full disk, by way of RLIMIT_FSIZE (inherited by the child): config.toml still fits, but the
  // metrics file reaches the limit within a few records. SIGXFSZ is ignored so the write fails
  // with EFBIG instead of killing the run.
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1"})).exit_code, 0);
  const size_t line = read_file(run_dir() + "/metrics.jsonl").size();
  const size_t config = read_file(run_dir() + "/config.toml").size();
  fs::remove_all(run_dir());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = std::max(config, line) + line / 2;
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const CliRun r = moetrain(tiny_train({"--steps", "8", "--set", "train.log_every=1", "--set", "run.save_final=false"}));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  expect_error(r, {"cannot write metrics file", "metrics.jsonl"});
  const std::string text = read_file(run_dir() + "/metrics.jsonl");
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n') << "a cut-off line was left behind";
  const std::vector<int64_t> steps = metric_steps(run_dir() + "/metrics.jsonl");  // every line parses
  EXPECT_EQ(steps, iota_steps(1, static_cast<int64_t>(steps.size())));
  EXPECT_LT(steps.size(), 8u);
}

// A start that cannot write the resolved config (a full disk, by way of RLIMIT_FSIZE, inherited by
// the child, SIGXFSZ ignored) leaves no run directory it made, nor the parents it made for it: an
// empty one would look like a started run. A run directory that existed stays, with what it held.
TEST_F(CliTest, a_start_whose_config_write_hits_the_file_size_limit_leaves_no_run_directory_it_made) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "1", "--set", "run.save_final=false"})).exit_code, 0);
  const size_t config = read_file(run_dir() + "/config.toml").size();
  fs::remove_all(run_dir());
  const auto start_with_a_full_disk = [&](const std::string& dir) {
    struct rlimit old {};
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    struct rlimit small = old;
    small.rlim_cur = config / 2;
    auto* previous = std::signal(SIGXFSZ, SIG_IGN);
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    const CliRun r = moetrain(tiny_train({"--steps", "1", "--set", "run.dir=" + dir}));
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, previous);
    return r;
  };
  expect_error(start_with_a_full_disk(run_dir()), {"config.toml", "File too large"});
  EXPECT_FALSE(fs::exists(run_dir())) << "the failed start left the run directory it made";
  // Nor the missing parents it made for it, however run.dir ends.
  for (const std::string tail : {"", "/", "/."}) {
    expect_error(start_with_a_full_disk(run_dir() + "/a/b/run" + tail), {"config.toml", "File too large"});
    EXPECT_FALSE(fs::exists(run_dir())) << "the failed start left the parent folders it made (run.dir a/b/run" << tail
                                        << ")";
  }
  // A lock file that cannot be written (no byte fits; stderr goes through a pipe to cat, outside
  // the limit): the folders go too, and no emptied .lock stays.
  std::string command = "set -o pipefail; (ulimit -f 0; trap '' XFSZ; exec " MOE_BINARY_DIR "/moetrain";
  for (const std::string& a : tiny_train({"--steps", "1", "--set", "run.dir=" + run_dir() + "/a/run"}))
    command += " '" + a + "'";
  command += ") 2>&1 >/dev/null | cat >&2";
  expect_error(run({"/bin/bash", "-c", command}), {"cannot write the lock file", ".lock"});
  EXPECT_FALSE(fs::exists(run_dir())) << "the start that could not write its lock left folders it made";
  fs::create_directories(run_dir());
  std::ofstream(run_dir() + "/notes.txt") << "mine";
  expect_error(start_with_a_full_disk(run_dir()), {"config.toml", "File too large"});
  EXPECT_EQ(read_file(run_dir() + "/notes.txt"), "mine");
  EXPECT_FALSE(fs::exists(run_dir() + "/.lock"));
}

TEST_F(CliTest, a_checkpoint_that_hits_the_file_size_limit_leaves_no_temp_and_the_previous_one_resumes) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "1"})).exit_code, 0);
  const std::string rank_file = run_dir() + "/step-000002/rank-00000.safetensors";
  const std::string step2_index = read_file(run_dir() + "/step-000002/index.json");
  // A full disk, by way of RLIMIT_FSIZE (inherited by the child, SIGXFSZ ignored): the records and
  // the resolved config fit, the next checkpoint's rank file does not. --keep-last 1 must not
  // take the good checkpoints for the failed one.
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = fs::file_size(rank_file) / 2;
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const CliRun r =
      moetrain(tiny_train({"--steps", "4", "--save-every", "1", "--keep-last", "1", "--resume", "latest"}));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  expect_error(r, {run_dir() + "/.tmp-step-000003/rank-00000.safetensors", "File too large"});
  EXPECT_FALSE(fs::exists(run_dir() + "/.tmp-step-000003")) << "the failed save's temp directory was left behind";
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000001", "step-000002"}));
  EXPECT_EQ(read_file(run_dir() + "/step-000002/index.json"), step2_index);

  // With space again, the same command continues from the last good checkpoint.
  const CliRun again =
      moetrain(tiny_train({"--steps", "4", "--save-every", "1", "--keep-last", "1", "--resume", "latest"}));
  ASSERT_EQ(again.exit_code, 0) << "stdout:\n" << again.out << "\nstderr:\n" << again.err;
  EXPECT_NE(again.out.find("resumed from " + run_dir() + "/step-000002 at step 2"), std::string::npos) << again.out;
  EXPECT_EQ(step_dirs(run_dir()).back(), "step-000004");
}

// tokens_seen counts the tokens each step trained on, through resumes that change the batch's
// shape (it was step x the current tokens per step, rewriting the past).
TEST_F(CliTest, tokens_seen_carries_through_a_resume_with_another_batch_shape) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);  // 2 steps x 2 x 16 tokens
  const CliRun r = moetrain(tiny_train({"--steps", "4", "--resume", "latest", "--set", "train.global_batch_size=4",
                                        "--set", "train.seq_len=8"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<int64_t, double> seen;
  for (const auto& rec : read_metrics(run_dir() + "/metrics.jsonl"))
    if (rec.contains("tokens_seen")) seen[rec["step"].get<int64_t>()] = rec["tokens_seen"].get<double>();
  EXPECT_EQ(seen.at(2), 64.0);
  EXPECT_EQ(seen.at(3), 64.0 + 32.0);
  EXPECT_EQ(seen.at(4), 64.0 + 64.0);
  const nlohmann::json st = nlohmann::json::parse(read_file(run_dir() + "/step-000004/train_state.json"));
  EXPECT_EQ(st.at("tokens_seen").get<int64_t>(), 128);
}

// A resume whose data settings differ from the checkpoint's (here data.seed and train.seq_len)
// says which, and that the remaining steps read another run's windows; the same settings say
// nothing. Before, the change went unmentioned: a step's windows are a function of these keys.
TEST_F(CliTest, a_resume_with_other_data_settings_says_which_differ_and_what_that_means) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2", "--save-every", "1"})).exit_code, 0);
  const CliRun same = moetrain(tiny_train({"--steps", "3", "--resume", "latest"}));
  ASSERT_EQ(same.exit_code, 0) << same.err;
  EXPECT_EQ(same.out.find("data settings differ"), std::string::npos) << same.out;
  const CliRun other =
      moetrain(tiny_train({"--steps", "4", "--resume", "latest", "--set", "data.seed=7", "--set", "train.seq_len=8"}));
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_NE(other.out.find("note: the data settings differ from the checkpoint's (data.seed = 7 (was 1234), "
                           "train.seq_len = 8 (was 16))"),
            std::string::npos)
      << other.out;
  EXPECT_NE(other.out.find("from step 3 on"), std::string::npos) << other.out;
}

// A resume under another model config (the usual cause: the run's config file not given again)
// names the difference and the run's own resolved config, which then continues it.
TEST_F(CliTest, a_resume_under_another_model_names_the_runs_own_config) {
  ASSERT_EQ(moetrain(tiny_train({"--steps", "2"})).exit_code, 0);
  std::vector<std::string> other = tiny_sets();
  for (std::string& s : other)
    if (s.rfind("model.hidden_size=", 0) == 0) s = "model.hidden_size=32";
  const std::string own = run_dir() + "/config.toml";
  expect_error(moetrain(tiny_train({"--steps", "3", "--resume", "latest"}, other)),
               {"the model config differs", "model.hidden_size", "give its config: --config " + own});
  // eval takes the model from the checkpoint: a --set of a model key is what to drop.
  expect_error(moetrain({"eval", "--checkpoint", run_dir(), "--data", "synthetic", "--set", "model.hidden_size=32"}),
               {"the model config differs", "a --set of model keys (drop it)"});
  // The run's own config given, with a --set that changes the model: the hint does not name that
  // same file again.
  const CliRun same = moetrain({"train", "--config", own, "--steps", "3", "--resume", "latest", "--set",
                                "model.hidden_size=32"});
  expect_error(same, {"--config is that run's config.toml already: a --set of model keys"});
  EXPECT_EQ(same.err.find("give its config"), std::string::npos) << same.err;
  const CliRun r = moetrain({"train", "--config", own, "--steps", "3", "--resume", "latest"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step-000002 at step 2"), std::string::npos) << r.out;
  // A run started from the user's own config.toml in run.dir (moetrain writes config.resolved.toml
  // beside it): the hint names that file, and it continues the run.
  const std::string mine = path("mine");
  fs::create_directories(mine);
  write_file(mine + "/config.toml", read_file(own));
  const CliRun first =
      moetrain({"train", "--config", mine + "/config.toml", "--steps", "2", "--set", "run.dir=" + mine});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_TRUE(fs::exists(mine + "/config.resolved.toml"));
  expect_error(moetrain(tiny_train({"--steps", "3", "--resume", "latest", "--set", "run.dir=" + mine}, other)),
               {"give its config: --config " + mine + "/config.toml"});
  const CliRun again = moetrain({"train", "--config", mine + "/config.toml", "--steps", "3", "--resume", "latest",
                                 "--set", "run.dir=" + mine});
  ASSERT_EQ(again.exit_code, 0) << again.err;
}

}  // namespace
