// Preemption: SIGTERM or SIGUSR1 (what schedulers send before they stop a job), Ctrl-C, or
// train.max_duration make the run save a checkpoint at the next step boundary and exit cleanly,
// and --resume latest continues from it with the losses the uninterrupted run would have had.
#include "cli_test_util.h"

namespace {

std::vector<double> losses_of(const std::string& metrics) {
  std::vector<double> out;
  for (const auto& r : read_metrics(metrics)) out.push_back(r["loss"].get<double>());
  return out;
}

class StopTest : public CliTest {
 protected:
  // A run long enough to be stopped, logging every step.
  std::vector<std::string> long_run(const std::string& dir, int steps) const {
    std::vector<std::string> args = tiny_train({"--steps", std::to_string(steps), "--set", "train.log_every=1",
                                                "--set", "train.eval_every=0", "--set", "train.eval_batches=0"});
    args.insert(args.end(), {"--set", "run.dir=" + dir});
    return args;
  }
  // Starts `moetrain args` in the background, waits for its first metrics record, sends `signal`.
  // The run waits after step 1 until a stop signal comes (a test hook): on a loaded machine it would
  // otherwise reach its last step before this shell got to send it.
  CliRun signalled(const std::vector<std::string>& args, const std::string& metrics, const char* signal) {
    std::string cmd = std::string("MOE_TEST_AWAIT_STOP_AFTER_STEP=1 '") + MOE_BINARY_DIR + "/moetrain'";
    for (const std::string& a : args) cmd += " '" + a + "'";
    cmd += " & pid=$!; while [ ! -s '" + metrics + "' ]; do sleep 0.02; done; kill -" + signal +
           " $pid; wait $pid";
    return run({"/bin/bash", "-c", cmd});
  }
};

TEST_F(StopTest, sigterm_saves_a_checkpoint_at_the_next_step_and_resume_continues_the_same_run) {
  const int steps = 40;
  ASSERT_EQ(moetrain(long_run(path("whole"), steps)).exit_code, 0);
  const std::vector<double> whole = losses_of(path("whole/metrics.jsonl"));

  const CliRun r = signalled(long_run(run_dir(), steps), run_dir() + "/metrics.jsonl", "TERM");
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_NE(r.out.find("(SIGTERM); a checkpoint of step"), std::string::npos) << r.out;
  const std::vector<std::string> saved = step_dirs(run_dir());
  ASSERT_EQ(saved.size(), 1u);
  const int64_t stopped = std::stoll(saved[0].substr(5));
  EXPECT_EQ(stopped, 2) << "signalled while step 1 was the last done: the stop comes at the next step boundary";
  EXPECT_EQ(read_metrics(run_dir() + "/metrics.jsonl").back()["step"].get<int64_t>(), stopped);
  EXPECT_FALSE(fs::exists(run_dir() + "/.lock"));

  const CliRun resumed = moetrain(long_run(run_dir(), steps));
  ASSERT_NE(resumed.exit_code, 0) << "a fresh start into the stopped run's directory must be refused";
  std::vector<std::string> cont = long_run(run_dir(), steps);
  cont.insert(cont.end(), {"--resume", "latest"});
  ASSERT_EQ(moetrain(cont).exit_code, 0);
  EXPECT_EQ(losses_of(run_dir() + "/metrics.jsonl"), whole) << "stop + resume must reproduce the uninterrupted run";
}

// A scheduler's signal while the run is still starting (here generating a 50M-token corpus, ~1.5 s)
// stops it at the first step boundary with a checkpoint; the signal's default action killed it.
TEST_F(StopTest, a_signal_during_start_up_stops_at_the_first_step_boundary) {
  std::vector<std::string> args = long_run(run_dir(), 400);
  args.insert(args.end(), {"--set", "data.synthetic_tokens=50000000"});
  std::string cmd = std::string("'") + MOE_BINARY_DIR + "/moetrain'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  // Once the process catches SIGUSR1 (bit 10 of SigCgt; it re-executes itself first, which resets
  // it), while the corpus is still being generated.
  cmd += " & pid=$!; for i in $(seq 3000); do m=$(awk '/^SigCgt/ {print $2}' /proc/$pid/status 2> /dev/null); "
         "[ -n \"$m\" ] && (( (0x$m >> 9) & 1 )) && break; sleep 0.005; done; kill -USR1 $pid; wait $pid";
  const CliRun r = run({"/bin/bash", "-c", cmd});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(SIGUSR1); a checkpoint of step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stopped after step 1 of"), std::string::npos) << "the signal came after start-up:\n" << r.out;
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000001"});
}

// A second Ctrl-C stops at once, also when the first came during start-up and the second while
// the first step runs (slow here: a wider model). Before, run() installed the handlers again, which
// re-armed SIGINT, so the second was only recorded and the run went on to save its checkpoint.
TEST_F(StopTest, a_second_ctrl_c_after_one_during_start_up_stops_at_once) {
  std::vector<std::string> args = long_run(run_dir(), 400);
  args.insert(args.end(), {"--set", "data.synthetic_tokens=50000000", "--set", "model.hidden_size=256", "--set",
                           "model.intermediate_size=512", "--set", "train.seq_len=256", "--set",
                           "train.global_batch_size=16", "--set", "train.micro_batch_size=16"});
  std::string cmd = std::string("'") + MOE_BINARY_DIR + "/moetrain'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  // The first once the process catches SIGINT (bit 1 of SigCgt), while the corpus is generated;
  // the second 0.3 s after run() has claimed the run directory (its .lock): past the handlers'
  // second install (a signal before it would die of the default action either way), inside the
  // first step (about a second here).
  cmd += " & pid=$!; for i in $(seq 3000); do m=$(awk '/^SigCgt/ {print $2}' /proc/$pid/status 2> /dev/null); "
         "[ -n \"$m\" ] && (( (0x$m >> 1) & 1 )) && break; sleep 0.005; done; kill -INT $pid; "
         "for i in $(seq 3000); do [ -e '" +
         run_dir() + "/.lock' ] && break; sleep 0.005; done; sleep 0.3; kill -INT $pid; wait $pid";
  const CliRun r = run({"/bin/bash", "-c", cmd});
  EXPECT_EQ(r.exit_code, 128 + 2) << r.out << r.err;
  EXPECT_TRUE(step_dirs(run_dir()).empty()) << "no checkpoint after the second Ctrl-C";
}

// Under nohup (SIGHUP ignored) the terminal closing must not stop the run.
TEST_F(StopTest, a_sighup_that_nohup_ignores_stays_ignored) {
  std::vector<std::string> args = long_run(run_dir(), 300);
  std::string cmd = "trap '' HUP; '" + std::string(MOE_BINARY_DIR) + "/moetrain'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " & pid=$!; for i in $(seq 3000); do [ -s '" + run_dir() +
         "/metrics.jsonl' ] && break; sleep 0.02; done; kill -HUP $pid; wait $pid";
  const CliRun r = run({"/bin/bash", "-c", cmd});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("(SIGHUP)"), std::string::npos) << r.out;
  EXPECT_EQ(step_dirs(run_dir()), std::vector<std::string>{"step-000300"}) << "the run did not go on to its end";
}

TEST_F(StopTest, sigusr1_and_ctrl_c_stop_the_same_way) {
  for (const char* signal : {"USR1", "INT"}) {
    const std::string dir = path(std::string("run-") + signal);
    const CliRun r = signalled(long_run(dir, 40), dir + "/metrics.jsonl", signal);
    ASSERT_EQ(r.exit_code, 0) << signal << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("(SIG") + signal + ")"), std::string::npos) << r.out;
    EXPECT_EQ(step_dirs(dir), std::vector<std::string>{"step-000002"}) << signal;
    // Ctrl-C says at once what a second one would do (it stops without a checkpoint).
    const bool warned = r.err.find("Ctrl-C again stops at once, without one") != std::string::npos;
    EXPECT_EQ(warned, std::string(signal) == "INT") << signal << "\n" << r.err;
  }
}

TEST_F(StopTest, max_duration_stops_with_a_checkpoint_before_the_budget_runs_out) {
  std::vector<std::string> args = long_run(run_dir(), 100000);
  args.insert(args.end(), {"--set", "train.max_duration=\"1s\""});
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r = moetrain(args);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("train.max_duration = \"1s\" reached"), std::string::npos) << r.out;
  EXPECT_EQ(step_dirs(run_dir()).size(), 1u);
  EXPECT_LT(seconds, 20.0);
  const CliRun bad = moetrain(tiny_train({"--set", "train.max_duration=\"ten minutes\""}));
  expect_error(bad, {"train.max_duration", "is not a duration"});
  // Past the steady clock's range the deadline would wrap into the past and stop at step 1.
  const CliRun huge = moetrain(tiny_train({"--set", "train.max_duration=\"3000000h\""}));
  expect_error(huge, {"train.max_duration", "longer than 100 years"});
}

// train.async_save with each write held back 1.5 s (test hook): the stop at max_duration waits for
// the checkpoint still being written before it writes its own, so the run exits 0 with every
// checkpoint it started committed (one every 2 steps, and the stop's), no temp folder left, and a
// resume continues from the stop's.
TEST_F(StopTest, a_stop_commits_the_checkpoint_written_in_the_background_before_its_own) {
  std::vector<std::string> args = long_run(run_dir(), 100000);
  args.insert(args.end(), {"--set", "train.max_duration=\"2s\"", "--set", "train.save_every=2", "--set",
                           "train.async_save=true"});
  std::vector<std::string> argv = {"/usr/bin/env", "MOE_TEST_SLOW_BACKGROUND_SAVE=1500",
                                   std::string(MOE_BINARY_DIR) + "/moetrain"};
  argv.insert(argv.end(), args.begin(), args.end());
  const CliRun r = run(argv);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("train.max_duration = \"2s\" reached"), std::string::npos) << r.out;
  const std::vector<std::string> saved = step_dirs(run_dir());
  ASSERT_GE(saved.size(), 2u) << r.out;
  const int64_t stopped = read_metrics(run_dir() + "/metrics.jsonl").back()["step"].get<int64_t>();
  EXPECT_EQ(saved.back(), "step-" + std::string(6 - std::to_string(stopped).size(), '0') + std::to_string(stopped));
  for (size_t i = 0; i + 1 < saved.size(); ++i) EXPECT_EQ(std::stoll(saved[i].substr(5)), 2 * static_cast<int64_t>(i + 1));
  EXPECT_NE(r.out.find("then written in the background"), std::string::npos) << r.out;
  for (const auto& e : fs::directory_iterator(run_dir()))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  std::vector<std::string> cont = long_run(run_dir(), static_cast<int>(stopped) + 1);
  cont.insert(cont.end(), {"--resume", "latest"});
  const CliRun resumed = moetrain(cont);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
}

// A run stopped after its first step times that step (its start-up work included) and says so,
// instead of printing zeros as a mean "over steps after the first".
TEST_F(StopTest, a_stop_after_the_first_step_reports_that_steps_time_and_says_it_is_the_only_one) {
  std::vector<std::string> args = long_run(run_dir(), 50);
  args.insert(args.end(), {"--set", "train.max_duration=\"0.0001s\""});  // past at the first step boundary
  const CliRun r = moetrain(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_NE(r.out.find("stopped after step 1 of the run's 50"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("s/step (the only step run, its start-up work included)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("after the first"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" 0.000 s/step"), std::string::npos) << r.out;
}

}  // namespace

namespace {

TEST_F(CliTest, a_torchrun_launch_is_refused_before_anything_is_written) {
  const CliRun r = run({"/usr/bin/env", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=localhost",
                        "MASTER_PORT=29500", MOE_BINARY_DIR "/moetrain", "train", "--set", "run.dir=" + run_dir(),
                        "--set", "run.device=cpu"});
  expect_error(r, {"torchrun", "mpirun -np N"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

}  // namespace
