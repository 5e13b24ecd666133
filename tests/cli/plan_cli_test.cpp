// `moetrain plan` as a user runs it: without a GPU and without allocating, it prints each rank's
// plan by role, the same bytes the run's start-up printout and metrics.jsonl report for that
// config; a config that does not fit gets the planned options; bad arguments get one error. Also
// what bench prints about its timed steps, and the performance model's flags.
#include <sys/stat.h>

#include <chrono>
#include <regex>

#include "cli_test_util.h"

namespace {

class PlanCli : public CliTest {
 protected:
  // `moetrain plan --device cpu` of the tiny run's config, then `extra`.
  static std::vector<std::string> plan_args(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"plan", "--device", "cpu"};
    for (const std::string& s : tiny_sets())
      if (s != "run.device=cpu") args.insert(args.end(), {"--set", s});
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

// The total of the first rank row of a plan table, and of a run's "memory plan" start-up line.
std::string plan_total(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(\n0(?:-\d+)?\s.*\s(\S+ \S?i?B)\s+(?:yes|NO)\n)"))) << out;
  return m.size() > 1 ? m[1].str() : "";
}
std::string run_total(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(memory plan \(cpu.*; total (\S+ \S?i?B)\n)"))) << out;
  return m.size() > 1 ? m[1].str() : "";
}

TEST_F(PlanCli, plan_prints_the_bytes_the_run_reserves_and_writes_nothing) {
  for (const std::vector<std::string>& variant :
       {std::vector<std::string>{}, {"--set", "train.recompute=block"}, {"--set", "optim.moment_dtype=bf16"}}) {
    const CliRun plan = moetrain(plan_args(variant));
    ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
    EXPECT_NE(plan.out.find("fits: the largest rank plans"), std::string::npos) << plan.out;
    EXPECT_FALSE(fs::exists(run_dir()));
    EXPECT_FALSE(fs::exists(path("runs")));  // nothing written where a run would write
    std::vector<std::string> train = tiny_train(variant);
    const CliRun run = moetrain(train);
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_EQ(plan_total(plan.out), run_total(run.out)) << plan.out << "\n---\n" << run.out;
    // metrics.jsonl carries the same state and activation bytes, which make up the arena.
    const auto records = read_metrics(run_dir() + "/metrics.jsonl");
    ASSERT_FALSE(records.empty());
    const auto& r = records.back();
    EXPECT_GT(r["state_bytes"].get<int64_t>(), 0);
    EXPECT_GT(r["activation_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(r["state_bytes"].get<int64_t>() + r["activation_bytes"].get<int64_t>(), r["arena_bytes"].get<int64_t>());
    fs::remove_all(run_dir());
  }
}

TEST_F(PlanCli, plan_of_a_config_that_does_not_fit_names_the_planned_options) {
  const CliRun r = moetrain(plan_args({"--gpu-memory", "0.0005"}));  // 0.5 MiB: nothing fits
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("does not fit: the run needs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters + gradients + optimizer take"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optim.moment_dtype = \"bf16\": saves"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train.recompute = \"block\": needs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("none of these fits at 1 rank"), std::string::npos) << r.out;
}

TEST_F(PlanCli, plan_on_several_ranks_lists_them_and_offers_a_larger_ep) {
  const CliRun r = moetrain(plan_args({"--gpus", "4", "--set", "train.global_batch_size=8", "--gpu-memory", "0.0007"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("on 4 CPU ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parallel.ep = 2"), std::string::npos) << r.out;
}

TEST_F(PlanCli, plan_refuses_bad_arguments_with_one_error) {
  const CliRun zero = moetrain(plan_args({"--gpus", "0"}));
  EXPECT_EQ(zero.exit_code, 2) << zero.out << zero.err;
  const CliRun ep = moetrain(plan_args({"--gpus", "3", "--set", "parallel.ep=2", "--set", "train.global_batch_size=6"}));
  EXPECT_EQ(ep.exit_code, 1) << ep.out << ep.err;
  EXPECT_NE(ep.err.find("parallel.ep = 2 does not divide"), std::string::npos) << ep.err;
  const CliRun nan = moetrain(plan_args({"--gpu-memory", "nan"}));
  EXPECT_EQ(nan.exit_code, 2) << nan.out << nan.err;
  const CliRun gpu = moetrain({"plan", "--device", "cuda"});
  const CliRun by_config = moetrain({"plan"});  // run.device = auto: the GPU where the build has CUDA
  EXPECT_EQ(by_config.exit_code, 0) << by_config.err;
#if defined(MOE_HAVE_CUDA)
  EXPECT_EQ(gpu.exit_code, 0) << gpu.err;  // a CUDA build plans the GPU without one
  EXPECT_NE(gpu.out.find("on 1 GPU"), std::string::npos) << gpu.out;
  EXPECT_NE(by_config.out.find("on 1 GPU"), std::string::npos) << by_config.out;
#else
  EXPECT_EQ(gpu.exit_code, 1) << gpu.out;
  EXPECT_NE(gpu.err.find("built without CUDA"), std::string::npos) << gpu.err;
  EXPECT_NE(by_config.out.find("on 1 CPU rank"), std::string::npos) << by_config.out;
#endif
  const CliRun cpu_config = moetrain({"plan", "--set", "run.device=cpu"});
  EXPECT_EQ(cpu_config.exit_code, 0) << cpu_config.err;
  EXPECT_NE(cpu_config.out.find("on 1 CPU rank"), std::string::npos) << cpu_config.out;
}

// train.deterministic on the GPU: cuDNN's deterministic attention backward keeps a B x Hq x T x T
// BF16 workspace outside the arenas (4 GiB for bench-olmoe-4l's 8 x 4096 tokens, 16 heads). The
// plan counts it in every rank's total and says so; on a GPU with room for the plain run but not
// for the workspace, the run does not fit, the message names the workspace and how to free it,
// and the planned smaller microbatch (which shrinks it too) fits.
TEST_F(PlanCli, a_gpu_plan_counts_the_deterministic_attention_workspace) {
#if !defined(MOE_HAVE_CUDA)
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#else
  const std::vector<std::string> base = {"plan", "--device", "cuda", "--config",
                                         MOE_SOURCE_DIR "/configs/bench-olmoe-4l.toml"};
  const CliRun plain = moetrain(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  EXPECT_EQ(plain.out.find("deterministic"), std::string::npos) << plain.out;
  std::vector<std::string> det = base;
  det.insert(det.end(), {"--set", "train.deterministic=true"});
  const CliRun with = moetrain(det);
  ASSERT_EQ(with.exit_code, 0) << with.out << with.err;
  EXPECT_NE(with.out.find("each total counts 4.00 GiB for cuDNN's deterministic attention backward"),
            std::string::npos)
      << with.out;
  EXPECT_NE(with.out.find("train.deterministic's algorithm is not modelled"), std::string::npos) << with.out;
  EXPECT_EQ(plain.out.find("not modelled"), std::string::npos) << plain.out;
  const double plain_gib = std::stod(plan_total(plain.out)), with_gib = std::stod(plan_total(with.out));
  EXPECT_NEAR(with_gib - plain_gib, 4.0, 0.02) << plain.out << "\n---\n" << with.out;

  // Room for the plain run (+ the 2 GiB library reserve + 1 GiB), not for the workspace.
  const std::string memory = std::to_string(plain_gib + 3.0);
  std::vector<std::string> tight = det;
  tight.insert(tight.end(), {"--gpu-memory", memory});
  std::vector<std::string> tight_plain = base;
  tight_plain.insert(tight_plain.end(), {"--gpu-memory", memory});
  const CliRun fits = moetrain(tight_plain), not_fit = moetrain(tight);
  EXPECT_NE(fits.out.find("fits: the largest rank plans"), std::string::npos) << fits.out;
  EXPECT_NE(not_fit.out.find("does not fit"), std::string::npos) << not_fit.out;
  EXPECT_NE(not_fit.out.find("cuDNN's deterministic attention backward 4.00 GiB (train.deterministic = false frees it)"),
            std::string::npos)
      << not_fit.out;
  EXPECT_NE(not_fit.out.find("train.micro_batch_size = 4: total"), std::string::npos) << not_fit.out;
#endif
}

// The header states the whole layout and precision the plan is for: pipeline stages (schedule,
// chunks, given layer split), EP with its dispatch and payload, besides mode and precision.
TEST_F(PlanCli, plan_header_states_pipeline_stages_and_the_ep_payload) {
  const CliRun pipeline = moetrain(plan_args({"--gpus", "4", "--set", "parallel.pp=2", "--set", "parallel.ep=2",
                                              "--set", "parallel.pp_layers=[1,1]", "--set",
                                              "train.global_batch_size=8"}));
  ASSERT_EQ(pipeline.exit_code, 0) << pipeline.err;
  EXPECT_NE(pipeline.out.find("on 4 CPU ranks (ddp, pp 2 (1f1b, layers per chunk [1, 1]), ep 2 (rowwise, bf16 "
                              "payload); "),
            std::string::npos)
      << pipeline.out;
  const CliRun fp8 = moetrain(plan_args({"--gpus", "2", "--set", "parallel.ep=2", "--set", "train.precision=fp8",
                                         "--set", "ep.payload=fp8", "--set", "train.global_batch_size=4"}));
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.out.find("(ddp, pp 1, ep 2 (rowwise, fp8 payload); "), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out.find("precision fp8)"), std::string::npos) << fp8.out;
}

// Options are every smaller microbatch that divides the current one (5 -> 1) and every larger EP
// that divides the ranks and the experts (3 and 6 of 6 ranks and 12 experts, not only doublings).
TEST_F(PlanCli, plan_offers_every_dividing_microbatch_and_ep) {
  const CliRun mb = moetrain(plan_args({"--set", "train.micro_batch_size=5", "--set", "train.global_batch_size=20",
                                        "--gpu-memory", "0.0001"}));
  ASSERT_EQ(mb.exit_code, 0) << mb.err;
  EXPECT_NE(mb.out.find("train.micro_batch_size = 1:"), std::string::npos) << mb.out;
  // A size with a few divisors offers each of them (12: 6, 4, 3, 2 and 1), not only halvings.
  const CliRun twelve = moetrain(plan_args({"--set", "train.micro_batch_size=12", "--set",
                                            "train.global_batch_size=12", "--gpu-memory", "0.0001"}));
  ASSERT_EQ(twelve.exit_code, 0) << twelve.err;
  for (const char* m : {"train.micro_batch_size = 6:", "train.micro_batch_size = 4:", "train.micro_batch_size = 3:",
                        "train.micro_batch_size = 2:", "train.micro_batch_size = 1:"})
    EXPECT_NE(twelve.out.find(m), std::string::npos) << m << "\n" << twelve.out;
  const CliRun ep = moetrain(plan_args({"--gpus", "6", "--set", "model.num_experts=12", "--set",
                                        "train.global_batch_size=48", "--gpu-memory", "0.0001"}));
  ASSERT_EQ(ep.exit_code, 0) << ep.err;
  for (const char* e : {"parallel.ep = 2:", "parallel.ep = 3:", "parallel.ep = 6:"})
    EXPECT_NE(ep.out.find(e), std::string::npos) << e << "\n" << ep.out;
}

}  // namespace

namespace {

// A run that cannot fit this machine stops before any work (nothing written) with the same
// computed advice: what takes the memory and what the planned options would need.
TEST_F(PlanCli, a_train_run_that_does_not_fit_names_the_planned_options_and_writes_nothing) {
  std::vector<std::string> sets = tiny_sets();
  sets.insert(sets.end(), {"model.hidden_size=4096", "model.intermediate_size=16384", "model.num_experts=1024"});
  const CliRun r = moetrain(tiny_train({}, sets));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("parameters + gradients + optimizer take"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("optim.moment_dtype = \"bf16\": saves"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir() + "/metrics.jsonl"));
  EXPECT_TRUE(step_dirs(run_dir()).empty());
}

// A global batch whose tokens alone cannot fit (512 GiB of the step's tokens and targets here, the
// arena's and the host's copies) is refused by the plan, naming train.global_batch_size, before the
// host's copies of the batch are made (they were allocated first: the process was killed for
// memory, or failed naming no key).
TEST_F(PlanCli, a_global_batch_too_large_for_memory_is_refused_naming_the_key_before_allocating_it) {
  const auto t0 = std::chrono::steady_clock::now();
  const CliRun r = moetrain(tiny_train({}, [] {
    std::vector<std::string> sets = tiny_sets();
    sets.push_back("train.global_batch_size=33554432");  // x 1024 tokens x 8 bytes (tokens, targets) x 2 copies = 512 GiB
    sets.push_back("train.seq_len=1024");
    return sets;
  }()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("of it the step's tokens and targets, two copies, 512.00 GiB: train.global_batch_size 33554432 x "
                       "train.seq_len 1024 over 1 data rank"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("a smaller train.global_batch_size"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 20.0);
  EXPECT_FALSE(fs::exists(run_dir()));
}

// The microbatch options: at each halving the largest divisor of the current size, and none
// smaller than the largest that fits (a smaller one only costs more), instead of every divisor.
TEST_F(PlanCli, microbatch_options_halve_and_stop_at_the_largest_that_fits) {
  const CliRun r = moetrain(tiny_train({}, [] {
    std::vector<std::string> sets = tiny_sets();
    sets.insert(sets.end(), {"train.micro_batch_size=720720", "train.global_batch_size=720720",
                             "train.eval_batches=0"});  // 240 divisors
    return sets;
  }()));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  std::vector<int64_t> offered;
  const std::regex option(R"(train\.micro_batch_size = (\d+): total .* \((fits|does not fit)\))");
  int fitting = 0;
  for (auto it = std::sregex_iterator(r.err.begin(), r.err.end(), option); it != std::sregex_iterator(); ++it) {
    offered.push_back(std::stoll((*it)[1].str()));
    fitting += (*it)[2].str() == "fits";
  }
  ASSERT_FALSE(offered.empty()) << r.err;
  EXPECT_LE(offered.size(), 20u) << r.err;  // log2(720720) ~ 19.5 halvings at most
  EXPECT_LE(fitting, 1) << r.err;
  for (size_t k = 0; k < offered.size(); ++k) {
    EXPECT_EQ(720720 % offered[k], 0) << offered[k];
    if (k > 0) {
      EXPECT_LT(offered[k], offered[k - 1]);
    }
  }
  EXPECT_EQ(offered[0], 360360) << r.err;
}

}  // namespace

// The performance model's flags: they predict a GPU run, so a CPU plan refuses them (exit 2), as
// does a bad value; in a CUDA build the prediction and the search print (without a GPU).
TEST_F(PlanCli, plan_predicts_gpu_step_time_and_refuses_bad_model_flags) {
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--hardware", "h200"}, {"--search"}, {"--nodes", "2", "--gpus", "2"}}) {
    const CliRun cpu = moetrain(plan_args(flags));
    EXPECT_EQ(cpu.exit_code, 2) << flags[0] << "\n" << cpu.out << cpu.err;
    EXPECT_NE(cpu.err.find("predict a GPU run"), std::string::npos) << cpu.err;
  }
  const std::string json = path("prediction.json");
#if defined(MOE_HAVE_CUDA)
  const std::vector<std::string> gpu = {"plan", "--device", "cuda", "--set", "train.global_batch_size=16"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = gpu;
    a.insert(a.end(), extra.begin(), extra.end());
    return moetrain(a);
  };
  const CliRun unknown = with({"--hardware", "a100"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("unknown hardware 'a100'"), std::string::npos) << unknown.err;
  const CliRun uneven = with({"--gpus", "3", "--nodes", "2"});
  EXPECT_EQ(uneven.exit_code, 2) << uneven.err;
  const CliRun b300 = with({"--hardware", "b300", "--json", json});
  ASSERT_EQ(b300.exit_code, 0) << b300.err;
  EXPECT_NE(b300.out.find("predicted step on B300"), std::string::npos) << b300.out;
  EXPECT_NE(b300.out.find("expert GEMMs"), std::string::npos) << b300.out;
  EXPECT_NE(read_file(json).find("\"tokens_per_s_per_gpu\""), std::string::npos);
  const CliRun again = with({"--json", json});  // never overwritten; exit 1 as any output that exists
  EXPECT_EQ(again.exit_code, 1) << again.err;
  EXPECT_NE(again.err.find("exists; choose a new file name"), std::string::npos) << again.err;
  const CliRun search = with({"--search", "--gpus", "2"});
  ASSERT_EQ(search.exit_code, 0) << search.err;
  EXPECT_NE(search.out.find("ranked by predicted tokens/s per GPU"), std::string::npos) << search.out;
  EXPECT_NE(search.out.find("ddp ep 2"), std::string::npos) << search.out;
  EXPECT_NE(search.out.find("fsdp"), std::string::npos) << search.out;
  // The search has no pipeline layouts: a pipeline config is refused rather than ranked as if pp = 1.
  const CliRun pipeline_search = with({"--search", "--gpus", "2", "--set", "parallel.pp=2"});
  EXPECT_EQ(pipeline_search.exit_code, 2) << pipeline_search.out;
  EXPECT_NE(pipeline_search.err.find("parallel.pp = 2"), std::string::npos) << pipeline_search.err;
  // Without --search the pipeline is predicted: no gradient reduction (one data-parallel rank per
  // stage), a bubble.
  const CliRun pipeline = with({"--gpus", "2", "--set", "parallel.pp=2"});
  ASSERT_EQ(pipeline.exit_code, 0) << pipeline.err;
  EXPECT_NE(pipeline.out.find("pipeline bubble"), std::string::npos) << pipeline.out;
  EXPECT_EQ(pipeline.out.find("gradient reduction"), std::string::npos) << pipeline.out;
#else
  const CliRun gpu = moetrain({"plan", "--hardware", "h200"});  // run.device auto: a CPU plan in this build
  EXPECT_EQ(gpu.exit_code, 2) << gpu.err;
#endif
}

// The throughput line says which steps its means are over, true for every step count: the only
// step (start-up work included), the one after the first, or the N after the first; the JSON
// report carries the same count.
// 16 GPUs are two nodes of 8 (the h200 profile): an EP group of 16 would span both, which the trainer
// does not run. The plan refuses it with the error alone (no memory table, no "fits" line), exit 1,
// before planning anything, whether --nodes is given or follows from the GPUs.
TEST_F(PlanCli, a_gpu_plan_whose_ep_group_spans_nodes_prints_only_the_error) {
#if !defined(MOE_HAVE_CUDA)
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#endif
  for (const std::vector<std::string>& nodes : {std::vector<std::string>{}, {"--nodes", "2"}}) {
    std::vector<std::string> args = {"plan", "--device", "cuda", "--gpus", "16", "--set", "parallel.ep=16",
                                     "--set", "model.num_experts=16", "--set", "train.global_batch_size=128"};
    args.insert(args.end(), nodes.begin(), nodes.end());
    const CliRun r = moetrain(args);
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_EQ(r.out, "") << "nothing but the error: " << r.out;
    EXPECT_NE(r.err.find("parallel.ep = 16 spans more than one node"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("set parallel.ep to at most 8"), std::string::npos) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
}

TEST_F(PlanCli, bench_says_which_steps_its_means_are_over_for_every_step_count) {
  const struct {
    int steps;
    const char* words;
    int timed;
  } cases[] = {{1, "(the only step run, its start-up work included)", 1},
               {2, "(the one step after the first)", 1},
               {4, "(mean over the 3 steps after the first)", 3}};
  for (const auto& c : cases) {
    const std::string json = path("bench-" + std::to_string(c.steps) + ".json");
    std::vector<std::string> args = {"bench", "--steps", std::to_string(c.steps), "--json", json};
    for (const std::string& s : tiny_sets())
      if (s.rfind("train.steps=", 0) != 0) args.insert(args.end(), {"--set", s});
    const CliRun r = moetrain(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find(std::string("s/step ") + c.words), std::string::npos) << c.steps << " steps:\n" << r.out;
    const auto report = nlohmann::json::parse(read_file(json));
    EXPECT_EQ(report.at("steps_timed"), c.timed) << c.steps;
    EXPECT_EQ(report.at("first_step_timed"), c.steps == 1) << c.steps;
    EXPECT_GT(report.at("step_s").get<double>(), 0) << c.steps;
  }
  const CliRun train = moetrain(tiny_train());  // train.steps = 1: the same printer
  ASSERT_EQ(train.exit_code, 0) << train.err;
  EXPECT_NE(train.out.find("(the only step run, its start-up work included)"), std::string::npos) << train.out;
}

TEST_F(PlanCli, bench_calibrate_refuses_config_flags_and_existing_files) {
  const CliRun steps = moetrain({"bench", "--calibrate", path("gpu.json"), "--steps", "3"});
  EXPECT_EQ(steps.exit_code, 2) << steps.err;
  EXPECT_NE(steps.err.find("takes no --config"), std::string::npos) << steps.err;
  write_file(path("taken.json"), "{}");
  const CliRun taken = moetrain({"bench", "--calibrate", path("taken.json")});
  EXPECT_EQ(taken.exit_code, 1) << taken.err;  // the file, not the command line: as any output that exists
  EXPECT_EQ(read_file(path("taken.json")), "{}");
  const CliRun bad_base = moetrain({"bench", "--calibrate", path("new.json"), "--hardware", "a100"});
  EXPECT_EQ(bad_base.exit_code, 2) << bad_base.err;
  EXPECT_FALSE(fs::exists(path("new.json")));
  const CliRun alone = moetrain({"bench", "--hardware", "h200"});  // the base of --calibrate only
  EXPECT_EQ(alone.exit_code, 2) << alone.err;
}

// The output's folder is checked before anything is measured: a missing folder, or a file where the
// folder should be, was found only when saving, after minutes of calibration on a GPU (without one,
// the error named the GPU instead).
TEST_F(PlanCli, bench_calibrate_checks_its_output_folder_before_measuring) {
  const CliRun missing = moetrain({"bench", "--calibrate", path("nowhere/gpu.json")});
  expect_error(missing, {"bench --calibrate " + path("nowhere/gpu.json") + " cannot be written: its folder " +
                         path("nowhere") + " does not exist"});
  write_file(path("file"), "");
  const CliRun file = moetrain({"bench", "--calibrate", path("file/gpu.json")});
  expect_error(file, {"its folder " + path("file") + " is not a folder"});
}

// Bad values of plan's own flags, each one error line naming the flag (exit 2): --hardware ""
// (a script's unset variable) planned the default h200 silently; --gpu-memory took "0x10" as 16
// GiB and called "x" a value out of range; a CPU plan given one of the prediction flags listed all
// four as if all were given.
TEST_F(PlanCli, plan_names_the_flag_of_each_bad_value) {
  const CliRun empty = moetrain({"plan", "--hardware", ""});
  EXPECT_EQ(empty.exit_code, 2) << empty.out << empty.err;
  EXPECT_NE(empty.err.find("--hardware: must not be empty"), std::string::npos) << empty.err;
  EXPECT_EQ(empty.out, "");
  for (const char* memory : {"x", "0x10", "inf", "1e6.5", "0"}) {
    const CliRun r = moetrain(plan_args({"--gpu-memory", memory}));
    EXPECT_EQ(r.exit_code, 2) << memory << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(std::string("--gpu-memory: '") + memory + "' is not a number of GiB from 0.000001 to 1000000"),
              std::string::npos)
        << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
  const CliRun search = moetrain(plan_args({"--search"}));
  EXPECT_EQ(search.exit_code, 2) << search.err;
  EXPECT_NE(search.err.find("error: --search asks to predict a GPU run's step time, but this plans a CPU run"),
            std::string::npos)
      << search.err;
  EXPECT_NE(search.err.find("drop it, or plan the GPU"), std::string::npos) << search.err;
  const CliRun two = moetrain(plan_args({"--nodes", "1", "--json", path("p.json")}));
  EXPECT_EQ(two.exit_code, 2) << two.err;
  EXPECT_NE(two.err.find("error: --nodes and --json ask to predict"), std::string::npos) << two.err;
  EXPECT_FALSE(fs::exists(path("p.json")));
}

// A hardware profile that is not a regular file is one error naming it (exit 2): a folder was
// reported as invalid JSON, and a FIFO blocked plan until something wrote to it (here the test's
// alarm would kill it after 120 s).
TEST_F(PlanCli, plan_hardware_that_is_a_folder_or_a_fifo_is_one_error) {
#if !defined(MOE_HAVE_CUDA)
  GTEST_SKIP() << "GPU plans need a build with the CUDA backend (no GPU needed)";
#else
  fs::create_directories(path("profiles.json"));
  ASSERT_EQ(mkfifo(path("fifo.json").c_str(), 0600), 0);
  for (const char* name : {"profiles.json", "fifo.json"}) {
    const CliRun r = moetrain({"plan", "--device", "cuda", "--hardware", path(name)});
    EXPECT_EQ(r.exit_code, 2) << name << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find("error: --hardware: hardware profile '" + path(name) + "' is "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::string(name) == "fifo.json" ? "is not a regular file" : "is a folder"), std::string::npos)
        << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // Nothing fits on one GPU of 1 GiB (the 2.1 GiB runtime reserve alone): said of "1 GPU".
  const CliRun none = moetrain({"plan", "--device", "cuda", "--search", "--gpu-memory", "1"});
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("no layout fits in the memory of 1 GPU\n"), std::string::npos) << none.out;
#endif
}
