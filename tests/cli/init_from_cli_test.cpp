// `moetrain train --init-from` on the command line: a new run from another run's checkpoint or
// from a Hugging Face folder says where it started and records it, leaves the source exactly as
// it was, refuses another architecture (exit 1, naming the key, nothing written), and refuses to
// be combined with a resume (exit 2); a later resume of the fine-tuning run continues it.
#include <cmath>
#include <map>

#include "cli_test_util.h"

namespace {

class InitFromCli : public CliTest {
 protected:
  // `moetrain train` with the tiny overrides into run.dir = dir, `extra` arguments after.
  std::vector<std::string> train_in(const std::string& dir, const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"train", "--set", "run.dir=" + dir};
    for (const std::string& s : tiny_sets()) args.insert(args.end(), {"--set", s});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
  void SetUp() override {
    CliTest::SetUp();
    const CliRun r = moetrain(train_in(source(), {"--steps", "2"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::string source() const { return path("source"); }
  // Every file under dir with its bytes (folders as "(dir)").
  static std::map<std::string, std::string> contents(const std::string& dir) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? read_file(e.path().string()) : "(dir)";
    return out;
  }
};

// Exit status 2 (a usage error) with one "error: ..." line containing every needle.
void expect_usage_error(const CliRun& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.exit_code, 2) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  for (const std::string& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "stderr lacks '" << n << "':\n" << r.err;
}

TEST_F(InitFromCli, a_new_run_says_and_records_where_it_started_and_leaves_the_source_as_it_was) {
  const auto before = contents(source());
  const CliRun r = moetrain(train_in(run_dir(), {"--init-from", source(), "--steps", "2", "--set", "train.lr=1e-4",
                                                 "--set", "train.log_every=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("initialized from checkpoint " + source() + "/step-000002 (step 2 of run "), std::string::npos)
      << r.out;
  const auto records = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["step"], 1) << "the fine-tuning run did not start at step 0";
  const auto st = nlohmann::json::parse(read_file(run_dir() + "/step-000002/train_state.json"));
  EXPECT_EQ(st["init_from"]["path"], fs::canonical(source() + "/step-000002").string());
  EXPECT_EQ(contents(source()), before) << "the source run directory changed";
}

TEST_F(InitFromCli, a_hugging_face_folder_is_a_source_and_its_config_json_names_a_mismatch) {
  ASSERT_EQ(moetrain({"export-hf", source(), path("hf")}).exit_code, 0);
  const CliRun ok = moetrain(train_in(run_dir(), {"--init-from", path("hf")}));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("initialized from Hugging Face model " + path("hf")), std::string::npos) << ok.out;

  const CliRun bad = moetrain(train_in(path("other"), {"--init-from", path("hf"), "--set", "model.hidden_size=32"}));
  expect_error(bad, {"model.hidden_size is 32 in this run's config but 16 in " + path("hf") + "/config.json"});
  EXPECT_FALSE(fs::exists(path("other"))) << "a refused run wrote its run.dir";
}

TEST_F(InitFromCli, another_architecture_exits_1_naming_the_key_and_both_values_and_writes_nothing) {
  const CliRun r = moetrain(train_in(run_dir(), {"--init-from", source(), "--set", "model.num_experts_per_tok=1"}));
  expect_error(r, {"model.num_experts_per_tok is 1 in this run's config but 2 in " + source() +
                   "/step-000002/train_state.json"});
  EXPECT_FALSE(fs::exists(run_dir())) << "a refused run wrote its run.dir";
  // Training settings are no mismatch.
  const CliRun ok = moetrain(train_in(run_dir(), {"--init-from", source(), "--set", "train.seq_len=8", "--set",
                                                  "model.router_aux_loss_coef=0.1", "--set", "data.seed=5"}));
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(InitFromCli, with_resume_it_is_a_usage_error) {
  expect_usage_error(moetrain(train_in(run_dir(), {"--init-from", source(), "--resume", source()})),
                     {"--init-from", "--resume", "give one of them"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

TEST_F(InitFromCli, with_auto_resume_finding_a_checkpoint_it_is_a_usage_error_and_the_run_resumes_without_it) {
  const std::vector<std::string> start = {"--init-from", source(), "--set", "run.resume=auto", "--steps", "2"};
  // No checkpoint in run.dir yet: the run starts from the source.
  const CliRun first = moetrain(train_in(run_dir(), start));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // The same command again would have to choose between the two.
  expect_usage_error(moetrain(train_in(run_dir(), start)),
                     {"run.resume = \"auto\" finds checkpoint " + run_dir() + "/step-000002", "drop --init-from"});
  // Without --init-from the fine-tuning run continues from its own checkpoint.
  const CliRun resumed = moetrain(train_in(run_dir(), {"--set", "run.resume=auto", "--steps", "3"}));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + run_dir() + "/step-000002 at step 2"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("this run was initialized from"), std::string::npos) << resumed.out;
  EXPECT_EQ(step_dirs(run_dir()), (std::vector<std::string>{"step-000002", "step-000003"}));
}

TEST_F(InitFromCli, a_source_inside_run_dir_is_refused_even_with_overwrite) {
  const auto before = contents(source());
  expect_usage_error(moetrain(train_in(source(), {"--init-from", source(), "--overwrite"})),
                     {"--init-from " + source() + " lies inside run.dir", "choose another run.dir"});
  EXPECT_EQ(contents(source()), before);
}

// bench --init-from times steps from the source's weights: its loss after 2 steps is train
// --init-from's (the same computation on the CPU; 1e-9 relative for the JSON's decimal round trip),
// not a bench from the initial weights', its report names the source, and it writes nothing, so a
// source inside run.dir is no conflict.
TEST_F(InitFromCli, bench_times_steps_from_the_sources_weights_and_names_it_in_its_report) {
  const auto before = contents(source());
  std::vector<std::string> bench = {"bench", "--set", "run.dir=" + source(), "--steps", "2"};
  for (const std::string& s : tiny_sets()) bench.insert(bench.end(), {"--set", s});
  std::vector<std::string> from = bench;
  from.insert(from.end(), {"--init-from", source(), "--json", path("from.json")});
  const CliRun r = moetrain(from);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("initialized from checkpoint " + source() + "/step-000002"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  weights: from " + fs::canonical(source() + "/step-000002").string() + " (step 2)\n"),
            std::string::npos)
      << r.out;
  bench.insert(bench.end(), {"--json", path("fresh.json")});
  const CliRun plain = moetrain(bench);
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_NE(plain.out.find("  weights: the config's initial ones"), std::string::npos) << plain.out;
  const CliRun t = moetrain(train_in(run_dir(), {"--init-from", source(), "--steps", "2", "--set", "train.log_every=1"}));
  ASSERT_EQ(t.exit_code, 0) << t.err;

  const auto report = nlohmann::json::parse(read_file(path("from.json")));
  const auto fresh = nlohmann::json::parse(read_file(path("fresh.json")));
  const double trained = read_metrics(run_dir() + "/metrics.jsonl").back()["loss"].get<double>();
  const double timed = report["final_loss"].get<double>();
  EXPECT_NEAR(timed, trained, 1e-9 * std::abs(trained));
  EXPECT_GT(std::abs(timed - fresh["final_loss"].get<double>()), 1e-4 * std::abs(trained))
      << "bench --init-from ran from the initial weights";
  EXPECT_EQ(report["init_from"]["path"], fs::canonical(source() + "/step-000002").string());
  EXPECT_EQ(report["init_from"]["step"], 2);
  EXPECT_TRUE(fresh["init_from"].is_null());
  EXPECT_EQ(contents(source()), before) << "bench wrote into the source run directory";

  const CliRun calibrate = moetrain({"bench", "--calibrate", path("gpu.json"), "--init-from", source()});
  expect_usage_error(calibrate, {"bench --calibrate", "--init-from"});
}

TEST_F(InitFromCli, a_missing_or_unrecognized_source_is_named) {
  expect_error(moetrain(train_in(run_dir(), {"--init-from", path("nowhere")})),
               {"--init-from " + path("nowhere") + ": no such file or directory"});
  fs::create_directories(path("empty"));
  expect_error(moetrain(train_in(run_dir(), {"--init-from", path("empty")})),
               {"--init-from " + path("empty") + " is neither a moetrain checkpoint or run directory nor a Hugging "
                                                  "Face model folder"});
  EXPECT_FALSE(fs::exists(run_dir()));
}

}  // namespace
