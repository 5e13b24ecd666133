// End-to-end: an evaluation that cannot fill one microbatch on each data-parallel rank is named at
// start-up. A [[eval.sets]] entry that small is an error (it used to report a loss of 0.0000); a
// held-out split that small is a warning (its size follows a default the user may not have set),
// and the run then reports no held-out loss rather than a made-up one.
#include "cli_test_util.h"

namespace {

TEST_F(CliTest, an_eval_set_smaller_than_a_microbatch_is_refused_before_anything_is_written) {
  write_file(path("val.npy"), npy_u16(valid_tokens(20)));  // one window of seq_len + 1 = 17 tokens
  const CliRun r = moetrain(
      tiny_train({"--set", "eval.sets=[{name=\"val\", path=\"" + path("val.npy") + "\"}]", "--steps", "2"}));
  expect_error(r, {"eval.sets[0] 'val'", "1 windows of 17 tokens", "fill no microbatch of 2 sequences"});
  EXPECT_FALSE(fs::exists(run_dir()));

  // Two windows fill the microbatch: the run reports a real loss for the set.
  write_file(path("val2.npy"), npy_u16(valid_tokens(40)));
  const CliRun ok = moetrain(
      tiny_train({"--set", "eval.sets=[{name=\"val\", path=\"" + path("val2.npy") + "\"}]", "--steps", "2"}));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const std::vector<nlohmann::json> records = read_metrics(run_dir() + "/metrics.jsonl");
  ASSERT_FALSE(records.empty());
  const nlohmann::json& last = records.back();
  ASSERT_TRUE(last.contains("eval_sets")) << last.dump();
  EXPECT_GT(last["eval_sets"]["val"].get<double>(), 0.0);
}

TEST_F(CliTest, a_held_out_split_smaller_than_a_microbatch_is_warned_of_and_reports_no_loss) {
  std::vector<std::string> sets = tiny_sets();
  for (std::string& s : sets)
    if (s.rfind("data.synthetic_eval_tokens=", 0) == 0) s = "data.synthetic_eval_tokens=20";
  const CliRun r = moetrain(tiny_train({"--steps", "2"}, sets));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warning: the held-out split holds 1 windows"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("data.synthetic_eval_tokens"), std::string::npos) << r.err;
  for (const nlohmann::json& rec : read_metrics(run_dir() + "/metrics.jsonl"))
    EXPECT_FALSE(rec.contains("eval_loss")) << rec.dump();
}

}  // namespace
