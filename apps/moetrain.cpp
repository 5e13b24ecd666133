// moetrain: the command line. Subcommands: train, bench, eval, plan, export-hf, import-hf, prepare, keys.
// Every error is reported as one "error: ..." line and a non-zero exit.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe/comm/host_strings.h"
#include "moe/comm/launcher.h"
#include "moe/comm/local_communicator.h"
#include "moe/comm/mpi_communicator.h"
#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/core/gpu_power.h"
#include "moe/core/interrupt_guard.h"
#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/data/prepare.h"
#include "moe/train/hf_interop.h"
#include "moe/train/init_source.h"
#include "moe/train/job_power.h"
#include "moe/train/bench_report.h"
#include "moe/train/config.h"
#include "moe/train/flops.h"
#include "moe/train/memory_plan.h"
#include "moe/train/metrics.h"
#include "moe/ops/kernel_choice.h"
#include "moe/perf/calibrate.h"
#include "moe/perf/hardware_profile.h"
#include "moe/perf/prediction_report.h"
#include "moe/perf/step_model.h"
#include "moe/perf/topology_search.h"
#include "moe/train/step_split.h"
#include "moe/train/step_work.h"
#include "moe/train/stop_request.h"
#include "moe/train/trainer.h"

namespace {

// A --set without "section.key=" is a command line that cannot be used (exit 2, as CLI11's own
// errors); what the value means is the config's to judge (exit 1).
std::string set_form_error(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  const std::string key = eq == std::string::npos ? "" : assignment.substr(0, eq);
  // A key nests at most one level (`name`, `section.key`), and one --set holds one value: a
  // newline would end it there and the rest was dropped.
  if (eq == 0 || eq == std::string::npos || std::count(key.begin(), key.end(), '.') > 1 ||
      assignment.find_first_of("\n\r") != std::string::npos) {
    std::string shown;  // one line: line breaks written as \n
    for (char c : assignment) shown += c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
    return "expects section.key=value, got '" + shown + "'";
  }
  return "";
}

struct ConfigArgs {
  std::string config = "tiny";
  std::vector<std::string> overrides;
  void add_to(CLI::App* cmd) {
    cmd->add_option("--config", config, "TOML config file, or 'tiny' for the built-in default")
        ->capture_default_str();
    cmd->add_option("--set", overrides, "override a config key: --set section.key=value (repeatable)")
        ->check(set_form_error);
  }
};

// Exit status of a command line that cannot be parsed (errors while running exit 1).
constexpr int kUsageError = 2;

// A command line that cannot be used, found only once the config or run.dir is read (exit 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// bench --check: fast vs reference kernels on one batch, both BF16 with FP32 accumulation in a
// different order: the losses (~1 to 11 nats) agree to well under 1%.
constexpr double kCheckRelTol = 5e-3;

void print_summary(const moe::TrainSummary& s, bool bench) {
  if (s.steps.empty()) {
    std::printf("nothing to do: already at step %ld\n", static_cast<long>(s.last_step));
    return;
  }
  const moe::StepRecord& last = s.steps.back();
  if (!s.stop_reason.empty())
    std::printf("\nstopped after step %ld of the run's %ld (%s); a checkpoint of step %ld is saved: continue with "
                "--resume latest\n",
                static_cast<long>(last.step), static_cast<long>(s.planned_steps), s.stop_reason.c_str(),
                static_cast<long>(last.step));
  std::printf("\n%s after step %ld: loss %.4f (lm %.4f)\n", bench ? "bench" : "done", static_cast<long>(last.step),
              last.loss, last.lm_loss);
  if (s.eval_loss)
    std::printf("  held-out loss:   %.4f%s\n", *s.eval_loss, std::isfinite(*s.eval_loss) ? "" : " (not finite)");
  for (const auto& [name, loss] : s.eval_sets) std::printf("  eval loss on %s: %.4f\n", name.c_str(), loss);
  if (s.attainable_loss)
    std::printf("  attainable loss: %.4f (entropy rate of the synthetic corpus)\n", *s.attainable_loss);
  // Which steps the means are over, true for any count: the first (start-up work) is left out when others ran.
  const std::string timed = s.first_step_timed    ? "the only step run, its start-up work included"
                            : s.timed_steps == 1 ? "the one step after the first"
                                                 : "mean over the " + std::to_string(s.timed_steps) +
                                                       " steps after the first";
  std::printf("  throughput: %s tokens/s, MFU %.2f%% per device, %.3f s/step (%s)\n",
              moe::format_count(s.mean_tokens_per_s).c_str(), 100 * s.mean_mfu, s.mean_step_time_s, timed.c_str());
  if (bench && s.timed_steps > 1 && !s.first_step_timed) {
    // The spread says whether the mean is steady (a GPU at its power limit varies from step to step).
    std::vector<double> ms;
    for (size_t i = 1; i < s.steps.size(); ++i) ms.push_back(1e3 * s.steps[i].step_time_s);
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double median = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    std::printf("  step time over those steps: min %.1f ms, median %.1f ms, max %.1f ms\n", ms.front(), median,
                ms.back());
  }
  std::printf("  memory: arena %s, peak resident (host) %s", moe::format_bytes(static_cast<double>(s.arena_bytes)).c_str(),
              moe::format_bytes(static_cast<double>(s.peak_rss_bytes)).c_str());
  if (s.device == moe::Device::CUDA)
    std::printf(", GPU high-water %s (device memory in use after a step, CUDA context and library workspaces included)",
                moe::format_bytes(static_cast<double>(s.device_peak_bytes)).c_str());
  std::printf("\n");
  if (s.graph_nodes > 0) std::printf("  CUDA graph: the step replays as one graph of %zu nodes\n", s.graph_nodes);
  if (s.skipped_steps > 0) std::printf("  skipped steps (non-finite gradients): %ld\n", static_cast<long>(s.skipped_steps));
}

// Why an output file named on the command line could not be written at the end of the command
// ("" when it can): checked before the work, so a typo does not cost a whole bench or eval.
std::string unwritable_output(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::absolute(path).parent_path();
  std::error_code ec;
  if (!std::filesystem::is_directory(parent, ec)) return "its folder " + parent.string() + " does not exist";
  if (access(parent.c_str(), W_OK) != 0) return "its folder " + parent.string() + " is not writable";
  return "";
}

// Refuses (moe::Error, exit 1) an output file `flag` names that could not be written at the end of
// the command or that already exists: nothing is overwritten. "" (not asked for) passes.
void check_new_output(const char* flag, const std::string& path) {
  if (path.empty()) return;
  if (const std::string why = unwritable_output(path); !why.empty())
    MOE_FAIL(flag, " ", path, " cannot be written: ", why);
  MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(path)), flag, " ", path,
            " exists; choose a new file name (nothing is overwritten)");
}

// Counts on the command line, with errors that state their range in plain integers (CLI11's
// NonNegativeNumber / PositiveNumber print it as doubles up to 1.8e308).
const CLI::Range kCountFromZero(int64_t{0}, std::numeric_limits<int64_t>::max());
const CLI::Range kCountFromOne(int64_t{1}, std::numeric_limits<int64_t>::max());

// Integers on the command line are decimal. CLI11 converts them with base detection (strtoll base
// 0), so `--steps 010` ran 8 steps and `0x10` 16; here leading zeros are dropped ("010" is 10) and
// any other form is refused, before the range check.
const CLI::Validator kDecimal(
    [](std::string& text) -> std::string {
      const size_t sign = !text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0;
      if (sign == text.size() ||
          !std::all_of(text.begin() + static_cast<std::ptrdiff_t>(sign), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return "'" + text + "' is not a decimal integer";
      const size_t first = text.find_first_not_of('0', sign);
      const std::string digits = first == std::string::npos ? "0" : text.substr(first);
      // strtoll saturates what does not fit, and CLI11 took the saturated value.
      const std::string max = std::to_string(std::numeric_limits<int64_t>::max());
      if (digits.size() > max.size() || (digits.size() == max.size() && digits > max))
        return "'" + text + "' is out of range";
      text = text.substr(0, sign) + digits;
      return "";
    },
    "DECIMAL");

// A path flag given as "" (a script's unset variable) would silently mean "not given".
const CLI::Validator kNonEmpty([](std::string& text) { return text.empty() ? std::string("must not be empty") : ""; },
                               "NONEMPTY");

}  // namespace

int main(int argc, char** argv) {
  // OpenMP threads that spin while waiting (libgomp's default) steal the cores from OpenBLAS and
  // from each other whenever anything else runs on the machine: on 2 busy cores a step ran 17x
  // slower. libgomp reads OMP_WAIT_POLICY once at load time, so set it and re-execute once.
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    execv("/proc/self/exe", argv);  // returns only on failure; then run with the default policy
  }
  // A write past the file-size limit (ulimit -f) raises SIGXFSZ, whose default action kills the
  // process with no message and leaves its temporary files. Ignored, the write fails with EFBIG
  // instead, and the writers' own error path names the file and removes what they started.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"moetrain: Mixture-of-Experts training"};
  app.require_subcommand(1);

  ConfigArgs train_args;
  std::string resume;
  int64_t save_every = 0, keep_last = 0, steps = 0;
  bool overwrite = false;
  CLI::App* train = app.add_subcommand("train", "train a model (default: the built-in tiny config on synthetic data)");
  train_args.add_to(train);
  train->add_option("--resume", resume, "continue from a checkpoint dir, a run dir, or 'latest'")->check(kNonEmpty);
  std::string init_from;
  train->add_option("--init-from", init_from,
                    "start a new run (step 0, fresh optimizer state) from the weights of a checkpoint dir, a run dir "
                    "(its newest checkpoint) or a Hugging Face OLMoE folder; the model config must match")
      ->check(kNonEmpty);
  train->add_option("--save-every", save_every, "checkpoint every N steps (train.save_every)")
      ->check(kCountFromZero)
      ->transform(kDecimal);
  train->add_option("--keep-last", keep_last, "keep only the newest K checkpoints (train.keep_last)")
      ->check(kCountFromZero)
      ->transform(kDecimal);
  train->add_option("--steps", steps, "total optimizer steps (train.steps)")->check(kCountFromZero)->transform(kDecimal);
  train->add_flag("--overwrite", overwrite,
                  "run.dir holds another run: move its files into <run.dir>/replaced/ and start afresh");

  ConfigArgs bench_args;
  int64_t bench_steps = 10;
  CLI::App* bench = app.add_subcommand("bench", "time N training steps; prints tokens/s, MFU and the step-time split");
  bench_args.add_to(bench);
  bench->add_option("--steps", bench_steps, "steps to run")
      ->capture_default_str()
      ->check(kCountFromOne)
      ->transform(kDecimal);
  bool bench_check = false;
  std::string bench_json;
  bench->add_option("--json", bench_json,
                    "also write the run's numbers (throughput, MFU, step split) to this JSON file (rank 0)")
      ->check(kNonEmpty);
  std::string bench_calibrate, bench_base = "h200";
  bench->add_option("--calibrate", bench_calibrate,
                    "measure this GPU's efficiencies (GEMMs, attention, memory; the links under mpirun) alone and "
                    "inside profiled steps of the built-in bench-olmoe-4l into a new hardware profile JSON file for "
                    "plan --hardware, instead of training")
      ->check(kNonEmpty);
  bench->add_option("--hardware", bench_base,
                    "with --calibrate: the profile whose peaks and unmeasured curves the result keeps (built-in name or "
                    "file)")
      ->capture_default_str();
  size_t bench_top_kernels = 20;
  bench->add_option("--top-kernels", bench_top_kernels, "rows of the GPU kernel table (the heaviest kernels first)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1000}))
      ->transform(kDecimal);
  bench->add_flag("--check", bench_check,
                  "first compare one batch's loss between the fast and the reference kernels; fail if they differ");

  std::vector<std::string> prepare_inputs;
  std::string prepare_out;
  CLI::App* prepare = app.add_subcommand("prepare", "turn text files into byte-level .npy token files");
  prepare->add_option("files", prepare_inputs, "text files")->required();
  prepare->add_option("--out", prepare_out, "output folder: new or empty, unless --append")->required();
  bool prepare_append = false;
  prepare->add_flag("--append", prepare_append,
                    "add the files to the dataset already in --out (written by prepare); existing files are never "
                    "overwritten");

  std::string eval_ckpt, eval_data, eval_logits;
  int64_t eval_tokens = 0;
  std::vector<std::string> eval_overrides;
  CLI::App* eval = app.add_subcommand("eval", "mean LM loss of a checkpoint over token data (.npy file or folder)");
  eval->add_option("--checkpoint", eval_ckpt, "checkpoint dir (or run dir: its newest checkpoint)")->required();
  eval->add_option("--data", eval_data, "token file, folder or glob (in the checkpoint's data.format), or 'synthetic'")
      ->required();
  eval->add_option("--tokens", eval_tokens,
                   "evaluate at most N predicted tokens: the whole microbatches of seq_len-token windows that fit "
                   "(0 = all)")
      ->check(kCountFromZero)
      ->transform(kDecimal);
  eval->add_option("--logits", eval_logits, "write the first microbatch's logits to this .npy (float32)")
      ->check(kNonEmpty);
  eval->add_option("--set", eval_overrides, "override a key of the checkpoint's config (e.g. train.seq_len)")
      ->check(set_form_error);

  std::string export_ckpt, export_out;
  double export_shard_gb = 5.0;
  std::vector<std::string> export_tokenizer;
  CLI::App* export_hf = app.add_subcommand("export-hf", "write a checkpoint as a Hugging Face OlmoeForCausalLM directory");
  export_hf->add_option("checkpoint", export_ckpt, "checkpoint dir (or run dir)")->required()->check(kNonEmpty);
  export_hf->add_option("out", export_out, "output directory (must not exist)")->required()->check(kNonEmpty);
  export_hf->add_option("--max-shard-gb", export_shard_gb, "largest safetensors shard, GB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e6));
  export_hf->add_option("--tokenizer", export_tokenizer, "tokenizer files to copy in (tokenizer.json, ...)")
      ->check(kNonEmpty);
  std::string export_dtype = "f32";
  export_hf->add_option("--dtype", export_dtype, "dtype of the exported weights: f32, or bf16 (rounded to nearest even)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));

  std::string import_dir, import_out;
  CLI::App* import_hf = app.add_subcommand("import-hf", "turn a Hugging Face OLMoE directory into a moetrain checkpoint");
  import_hf->add_option("hf_dir", import_dir, "directory with config.json and safetensors")
      ->required()
      ->check(kNonEmpty);
  import_hf->add_option("out", import_out, "run directory to create (step-000000/ and config.toml)")
      ->required()
      ->check(kNonEmpty);

  ConfigArgs plan_args;
  int plan_gpus = 1;
  double plan_memory_gib = 0;
  std::string plan_device;
  CLI::App* plan = app.add_subcommand(
      "plan", "each rank's memory plan by role for a config and topology, without a GPU and without allocating; "
              "whether it fits, and which of recompute, moment_dtype, a larger EP or a smaller microbatch would");
  plan_args.add_to(plan);
  plan->add_option("--gpus", plan_gpus, "ranks to plan for (GPUs; CPU processes with --device cpu)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->transform(kDecimal);
  plan->add_option("--gpu-memory", plan_memory_gib,
                   "memory free on each GPU when the run starts, GiB (default: the --hardware profile's, 139 for the "
                   "h200); with --device cpu, "
                   "memory per rank (default: this machine's physical memory shared by the ranks)")
      ->check(CLI::Range(1e-6, 1e6));
  plan->add_option("--device", plan_device, "the device the run will use (default: run.device; auto plans the GPU)")
      ->check(CLI::IsMember({"cuda", "cpu"}));
  int plan_nodes = 1;
  std::string plan_hardware, plan_json;
  bool plan_search = false;
  plan->add_option("--nodes", plan_nodes, "nodes the GPUs are spread over (evenly)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096))
      ->transform(kDecimal);
  plan->add_option("--hardware", plan_hardware,
                   "GPU profile for the predicted step time: a built-in name (h200, h100, b200, b300) or a JSON "
                   "file (from bench --calibrate); default h200");
  plan->add_flag("--search", plan_search,
                 "rank every layout the trainer runs on --gpus (DDP with each EP, FSDP) by predicted tokens/s per "
                 "GPU, each with its memory and the memory levers it needs to fit");
  plan->add_option("--json", plan_json, "also write the prediction (or the ranked search) to this JSON file")
      ->check(kNonEmpty);

  CLI::App* keys = app.add_subcommand("keys", "list every config key: type, default, accepted values, meaning");

  // Usage errors (an unknown flag, a bad value) exit 2 with one line; --help exits 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank parses the same words: the launcher's rank 0 alone reports them.
    if (moe::launch_rank() != 0) return kUsageError;
    // A misspelled command ("trian") reaches CLI11 as a stray word, reported as "a subcommand is
    // required": name the word and the commands instead.
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      std::string names;
      for (const CLI::App* sub : app.get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
      std::fprintf(stderr, "error: unknown command '%s'; the commands are %s (see moetrain --help)\n", argv[1],
                   names.c_str());
      return kUsageError;
    }
    std::fprintf(stderr, "error: %s (see moetrain --help)\n", e.what());
    return kUsageError;
  }

  // Under mpirun (or srun) every process is one rank; otherwise one process without MPI.
  std::unique_ptr<moe::MpiRuntime> mpi;
  moe::LocalCommunicator local;
  const moe::LaunchInfo launch = moe::detect_launcher();
  if (launch.kind == moe::Launcher::Refused) {
    std::fprintf(stderr, "error: %s\n", launch.why.c_str());
    return 1;
  }
  if (launch.kind == moe::Launcher::Mpi) mpi = std::make_unique<moe::MpiRuntime>(&argc, &argv);
  moe::Communicator& world = mpi ? mpi->world() : static_cast<moe::Communicator&>(local);
  const bool leader = world.rank() == 0;
  // An error every rank meets alike (the same arguments): printed by rank 0, which the others wait
  // for before they return `code`.
  auto usage_or_error_once = [&](const std::string& what, int code) {
    if (leader) std::fprintf(stderr, "error: %s\n", what.c_str());
    if (world.size() > 1) world.barrier();
    return code;
  };
  // Every rank must run the same command. Ranks started with different subcommands, a train whose
  // --resume, --init-from or --overwrite differ, or a bench whose --check or --calibrate do (an
  // MPMD launch, `mpirun A : B`), would wait in different collectives for ever; the config's own agreement covers --config, --set and the
  // flags that become config keys.
  if (world.size() > 1) {
    std::string command = app.get_subcommands().front()->get_name();
    if (train->parsed())
      command += " --resume '" + resume + "' --init-from '" + init_from + "'" + (overwrite ? " --overwrite" : "");
    if (bench->parsed())  // each mode runs other collectives
      command += std::string(bench_check ? " --check" : "") + (bench_calibrate.empty() ? "" : " --calibrate");
    const moe::StringAgreement same = moe::agree_on_string(world, command);
    if (same.differing_rank >= 0)
      return usage_or_error_once("the ranks were started with different commands: rank 0 runs `moetrain " +
                                     same.leader + "` but rank " + std::to_string(same.differing_rank) +
                                     " runs `moetrain " + same.differing + "`; every rank must run the same one",
                                 kUsageError);
  }
  auto fail = [&](const char* what) {
    // A rank that throws ends the whole job (no rank is left waiting in a collective).
    if (mpi && world.size() > 1) moe::MpiRuntime::abort_job(what, 1);
    std::fprintf(stderr, "error: %s\n", what);
    return 1;
  };
  // Start-up work every rank does alike: the command line's checks and reading the config, which
  // are the same on every rank. An error that every rank meets with the same message is printed
  // once, by rank 0, and every rank returns its exit status: MPI_Abort would print it once per rank
  // that got there first, under Open MPI's abort banner. An error only some ranks meet (a file one
  // node cannot read) ends the job as any error does. Returns -1 to go on, else the exit status.
  // Sizes are checked against memory where they are read; this is what slips through.
  auto out_of_memory = [&] {
    return "out of memory in `moetrain " + app.get_subcommands().front()->get_name() +
           "`: a size in the config, the data or a checkpoint is too large for this machine";
  };
  auto agree_at_startup = [&](const std::function<void()>& work) -> int {
    int code = 0;
    std::string what;
    try {
      work();
    } catch (const UsageError& e) {
      code = kUsageError, what = e.what();
    } catch (const std::bad_alloc&) {
      code = 1, what = out_of_memory();
    } catch (const std::exception& e) {
      code = 1, what = e.what();
    }
    if (world.size() > 1 && moe::agree_on_string(world, std::to_string(code) + " " + what).differing_rank >= 0) {
      if (code != 0) moe::MpiRuntime::abort_job(what.c_str(), code);
      return -1;  // another rank failed: its abort ends this one
    }
    if (code == 0) return -1;
    return usage_or_error_once(what, code);
  };

  try {
    // These write one output or print one listing: several ranks would race each other.
    for (CLI::App* single : {export_hf, import_hf, prepare, keys, plan})
      if (single->parsed() && world.size() > 1)
        return usage_or_error_once("`moetrain " + single->get_name() + "` runs in one process; run it without "
                                   "mpirun or srun (this job has " + std::to_string(world.size()) + " ranks)", 1);
    if (keys->parsed()) {
      std::printf("%s", moe::config_keys_markdown().c_str());
      return 0;
    }
    if (plan->parsed()) {
      if (!std::isfinite(plan_memory_gib)) {
        std::fprintf(stderr, "error: --gpu-memory: %g is not a number of GiB (see moetrain --help)\n", plan_memory_gib);
        return kUsageError;
      }
      // The run's own planning code on stand-in ranks (memory_plan.h): nothing is allocated.
      const moe::Config cfg = moe::load_config(plan_args.config, plan_args.overrides);
      // Without --device, the config's run.device; auto is the GPU in a CUDA build, as a run on a GPU machine.
#if defined(MOE_HAVE_CUDA)
      const bool built_with_cuda = true;
#else
      const bool built_with_cuda = false;
#endif
      const bool gpu = plan_device.empty() ? cfg.run.device == "cuda" || (cfg.run.device == "auto" && built_with_cuda)
                                           : plan_device == "cuda";
#if !defined(MOE_HAVE_CUDA)
      MOE_CHECK(!gpu, "moetrain plan --device cuda: this binary was built without CUDA (MOE_CUDA=OFF), so it cannot "
                "plan the GPU's buffers (BF16 activations, the GPU dispatcher's heap); build with nvcc, or plan a CPU "
                "run with --device cpu");
#endif
      if (gpu && cfg.train.precision == moe::Precision::FP8) moe::check_fp8_gpu_shapes(cfg);
      const bool predicts = !plan_hardware.empty() || plan_search || !plan_json.empty() || plan->count("--nodes");
      if (predicts && !gpu) {
        std::fprintf(stderr, "error: --hardware, --search, --nodes and --json predict a GPU run's step time; this plans "
                     "a CPU run (--device cpu or run.device); plan the GPU (--device cuda, in a build with CUDA)\n");
        return kUsageError;
      }
      // Exit 1 here and for an existing file, as for bench and eval: the folder, not the command line, is at fault.
      if (const std::string why = plan_json.empty() ? "" : unwritable_output(plan_json); !why.empty()) {
        std::fprintf(stderr, "error: plan --json %s cannot be written: %s\n", plan_json.c_str(), why.c_str());
        return 1;
      }
      if (!plan_json.empty() && std::filesystem::exists(std::filesystem::symlink_status(plan_json))) {
        std::fprintf(stderr, "error: plan --json %s exists; choose a new file name (nothing is overwritten)\n",
                     plan_json.c_str());
        return 1;  // as for every output that exists (bench --json, eval --logits, export-hf, run.dir)
      }
      if (plan_gpus % plan_nodes != 0) {
        std::fprintf(stderr, "error: --gpus %d cannot be spread evenly over --nodes %d (see moetrain --help)\n",
                     plan_gpus, plan_nodes);
        return kUsageError;
      }
      moe::HardwareProfile hw;
      if (gpu) {
        try {
          hw = moe::load_hardware_profile(plan_hardware.empty() ? "h200" : plan_hardware);
        } catch (const moe::Error& e) {
          std::fprintf(stderr, "error: --hardware: %s\n", e.what());
          return kUsageError;
        }
      }
      // Without --nodes: as few nodes as hold the GPUs, evenly.
      if (gpu && !plan->count("--nodes")) {
        plan_nodes = (plan_gpus + hw.gpus_per_node - 1) / hw.gpus_per_node;
        while (plan_gpus % plan_nodes != 0) ++plan_nodes;
      }
      const double gib = plan_memory_gib > 0 ? plan_memory_gib
                         : gpu              ? hw.memory_gib
                                            : static_cast<double>(moe::physical_memory_bytes()) / (1u << 30) / plan_gpus;
      if (gpu && plan_memory_gib > 0) hw.memory_gib = plan_memory_gib;
      if (plan_search) {
        if (cfg.parallel.pp > 1) {
          std::fprintf(stderr, "error: --search ranks layouts without pipeline stages (DDP with each EP, FSDP), but "
                               "parallel.pp = %ld; drop --search to predict this pipeline, or set parallel.pp = 1\n",
                       static_cast<long>(cfg.parallel.pp));
          return kUsageError;
        }
        const auto ranked = moe::search_topologies(cfg, plan_gpus, plan_nodes, hw, moe::Device::CUDA);
        std::printf("%s", moe::format_search(ranked, cfg, plan_gpus, plan_nodes, hw).c_str());
        if (!plan_json.empty()) moe::write_prediction_json(plan_json, ranked, hw);
        return 0;
      }
      moe::TopologyCandidate c;
      if (gpu) {
        // Checked first: a layout the hardware cannot hold (an EP group across nodes, more GPUs per
        // node than a node has) is refused before anything prints, never after a "fits" line.
        c.topo.gpus = plan_gpus, c.topo.nodes = plan_nodes, c.topo.layout = moe::rank_layout(cfg, plan_gpus);
        c.cfg = cfg;
        moe::check_topology(c.topo, hw);
      }
      // Built whole before printing: a config this size cannot run is an error with nothing printed.
      const std::string memory_plan = moe::plan_report(cfg, plan_gpus, gpu ? moe::Device::CUDA : moe::Device::CPU,
                                                       static_cast<size_t>(gib * (1u << 30)));
      if (gpu) c.prediction = moe::predict_step(cfg, c.topo, hw);
      std::printf("%s", memory_plan.c_str());
      if (gpu) {
        c.memory = moe::plan_largest_rank(cfg, plan_gpus, moe::Device::CUDA);
        c.memory_gib = static_cast<double>(c.memory.total()) / (1u << 30) + hw.runtime_reserve_gib;
        c.feasible = c.memory_gib <= hw.memory_gib;
        if (!c.feasible) c.why_not = "does not fit in " + moe::format_bytes(hw.memory_gib * (1u << 30)) + " per GPU";
        std::printf("%s", moe::format_prediction(c.prediction, hw).c_str());
        std::printf("predicted GPU high-water: %s (the plan + %.2f GiB of CUDA context and library workspaces)\n",
                    moe::format_bytes(c.memory_gib * (1u << 30)).c_str(), hw.runtime_reserve_gib);
        if (!plan_json.empty()) moe::write_prediction_json(plan_json, {c}, hw);
      }
      return 0;
    }
    if (train->parsed()) {
      moe::Config cfg;
      const int startup = agree_at_startup([&] {
        // Usage errors (exit 2) that only the config and run.dir reveal.
        if (!init_from.empty() && !resume.empty()) throw UsageError(moe::init_from_conflict(init_from, resume, {}));
        if (overwrite && !resume.empty())
          throw UsageError("--overwrite starts afresh, --resume continues: give one of them");
        std::vector<std::string> overrides = train_args.overrides;
        if (train->count("--save-every")) overrides.push_back("train.save_every=" + std::to_string(save_every));
        if (train->count("--keep-last")) overrides.push_back("train.keep_last=" + std::to_string(keep_last));
        if (train->count("--steps")) overrides.push_back("train.steps=" + std::to_string(steps));
        cfg = moe::load_config(train_args.config, overrides);
        if (const std::string conflict = moe::init_from_conflict(init_from, resume, cfg); !conflict.empty())
          throw UsageError(conflict);
      });
      if (startup >= 0) return startup;
      moe::TrainOptions opts;
      opts.resume = resume;
      opts.init_from = init_from;
      opts.overwrite = overwrite;
      opts.config_file = train_args.config;
      opts.stop_on_signals = true;  // SIGTERM / SIGUSR1 / SIGHUP / Ctrl-C: checkpoint at the next step, then stop
      // Already while the data and any checkpoint are read (minutes for a large run): a scheduler's
      // warning signal then stops the run at its first step boundary instead of killing it.
      moe::install_stop_handlers();
      moe::Trainer trainer(cfg, opts, world);
      const moe::TrainSummary s = trainer.run();
      if (leader) print_summary(s, false);
    } else if (bench->parsed() && !bench_calibrate.empty()) {
      moe::HardwareProfile base;
      const int startup = agree_at_startup([&] {
        if (bench->count("--check") || bench->count("--json") || bench->count("--steps") || bench->count("--set") ||
            bench->count("--config"))
          throw UsageError("bench --calibrate measures the GPU, not a config: it takes no --config, --set, --steps, "
                           "--json or --check (see moetrain --help)");
        // Exit 1: the folder, not the command line, is at fault.
        MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(bench_calibrate)), "bench --calibrate ",
                  bench_calibrate, " exists; choose a new file name (nothing is overwritten)");
        try {
          base = moe::load_hardware_profile(bench_base);
        } catch (const moe::Error& e) {
          throw UsageError(std::string("--hardware: ") + e.what());
        }
      });
      if (startup >= 0) return startup;
      const moe::HardwareProfile measured = moe::calibrate_hardware(base, world);
      if (leader) {
        moe::save_hardware_profile(measured, bench_calibrate);
        std::printf("hardware profile: %s (use it with moetrain plan --hardware %s)\n", bench_calibrate.c_str(),
                    bench_calibrate.c_str());
      }
    } else if (bench->parsed() && bench->count("--hardware")) {
      return usage_or_error_once("bench --hardware names the base profile of --calibrate; give --calibrate OUT.json "
                                 "too (see moetrain --help)", kUsageError);
    } else if (bench->parsed()) {
      moe::Config cfg;
      const int startup = agree_at_startup([&] {
        check_new_output("bench --json", bench_json);
        std::vector<std::string> overrides = bench_args.overrides;
        overrides.push_back("train.steps=" + std::to_string(bench_steps));
        cfg = moe::load_config(bench_args.config, overrides);
      });
      if (startup >= 0) return startup;
      moe::TrainOptions opts;
      opts.bench = true;
      moe::KernelProfiler profiler;
      opts.profiler = &profiler;  // used on the GPU only
      moe::PowerMonitor power;
      opts.power = &power;  // each rank's own GPU; used on the GPU only
      moe::Trainer trainer(cfg, opts, world);
      if (bench_check) {
        // The fast kernels must give the plain reference kernels' loss on the same batch (BF16
        // rounding apart) before any timing is worth reading.
        moe::set_kernel_choice(moe::KernelChoice::Reference);
        const double plain = trainer.microbatch_loss(0);
        moe::set_kernel_choice(moe::KernelChoice::Fast);
        const double fast = trainer.microbatch_loss(0);
        const double rel = std::abs(fast - plain) / std::max(std::abs(plain), 1e-12);
        if (leader)
          std::printf("check: first microbatch loss %.6f with the fast kernels, %.6f with the reference kernels "
                      "(relative difference %.2e, bar %.0e)\n", fast, plain, rel, kCheckRelTol);
        MOE_CHECK(rel <= kCheckRelTol, "bench --check: the fast kernels' loss ", fast, " differs from the reference ",
                  "kernels' ", plain, " by ", rel, " (relative), more than ", kCheckRelTol);
      }
      const moe::TrainSummary s = trainer.run();
      // Every rank's GPU over the timed steps, each GPU once (collective: every rank of a GPU run has
      // the same device and steps).
      std::optional<moe::JobPower> job_power;
      if (s.device == moe::Device::CUDA && s.steps.size() > 1)
        job_power = moe::gather_job_power(world, s.power, power.why());
      std::vector<moe::SplitRow> split;
      moe::Ceilings ceilings;
      if (leader) {
        print_summary(s, true);
        const double ideal = s.mean_step_time_s * s.mean_mfu;
        std::printf("  step-time split: ideal model time at peak %.4f s, the rest (tax) %.4f s (%.1f%%); "
                    "in collectives %.4f s",
                    ideal, s.mean_step_time_s - ideal, 100 * (1 - s.mean_mfu), s.mean_comm_time_s);
        if (s.device == moe::Device::CPU)
          std::printf(", optimizer step %.4f s (gradient reduction after the backward %.4f s)\n",
                      s.mean_optimizer_time_s, s.mean_reduction_wait_time_s);
        else
          std::printf(" (GPU work is asynchronous: the kernel table below splits the step)\n");
        if (s.device == moe::Device::CUDA) {
          if (!profiler.available())
            std::printf("  top kernels: not recorded (%s)\n", profiler.why().c_str());
          else if (s.steps.size() > 1) {
            const int timed = static_cast<int>(s.steps.size() - 1);
            std::printf("%s", moe::format_kernel_table(profiler.top(bench_top_kernels), profiler.total_ms(), timed).c_str());
            // Each kind of kernel against its ceiling, measured now on the same GPU.
            ceilings = moe::measure_ceilings(cfg.train.precision == moe::Precision::FP8);
            // The printing rank's own work: under pp, stage 0's (job rank 0 is in stage 0).
            const moe::StepWork work = moe::step_work(cfg, moe::rank_layout(cfg, world.size(), /*stage=*/0));
            split = moe::split_step(profiler.top(SIZE_MAX), timed, work, ceilings);
            std::printf("%s", moe::format_step_split(split, ceilings).c_str());
          }
        }
        if (job_power) {
          const double tokens_per_step = static_cast<double>(cfg.train.global_batch_size * cfg.train.seq_len);
          std::printf("%s", moe::format_job_power(*job_power, s.mean_step_time_s, tokens_per_step).c_str());
        }
        if (!bench_json.empty()) {
          moe::write_bench_report(bench_json, cfg, s, world.size(), split, ceilings,
                                  job_power ? &*job_power : nullptr);
          std::printf("  report: %s\n", bench_json.c_str());
        }
      }
    } else if (eval->parsed()) {
      // Every rank must evaluate the same thing, or the collective forward passes fall out of step.
      const moe::StringAgreement args = moe::agree_on_string(
          world, "--checkpoint " + eval_ckpt + " --data " + eval_data + " --tokens " + std::to_string(eval_tokens) +
                     " --logits " + eval_logits);
      MOE_CHECK(args.differing_rank < 0, "the ranks of this job were given different eval arguments: '", args.leader,
                "' on rank 0 but '", args.differing, "' on rank ", args.differing_rank);
      std::shared_ptr<const moe::CheckpointReader> ckpt;
      moe::Config cfg;
      const int startup = agree_at_startup([&] {
        check_new_output("eval --logits", eval_logits);
        // Opened once: its files stay readable even if a running job prunes the checkpoint meanwhile.
        ckpt = std::make_shared<const moe::CheckpointReader>(moe::resolve_checkpoint(eval_ckpt));
        // The checkpoint's own config, without its data source (the data is given here) and with a
        // global batch that fits this topology.
        // The training data is not read (--data names what is evaluated): a small synthetic corpus
        // stands in, or, for --data synthetic, the checkpoint's own synthetic corpus.
        std::vector<std::string> o = {"data.path=synthetic", "data.sources=[]", "eval.sets=[]", "parallel.mode=ddp"};
        if (eval_data != "synthetic")
          o.insert(o.end(), {"data.synthetic_tokens=65536", "data.synthetic_eval_tokens=8192"});
        // Pipeline stages are a training layout: a checkpoint trained under them is evaluated by
        // whole-model ranks (any number); --set, applied after these, may ask for a layout again.
        o.insert(o.end(),
                 {"parallel.pp=1", "parallel.pp_virtual=1", "parallel.pp_schedule=1f1b", "parallel.pp_layers=[]"});
        o.insert(o.end(), eval_overrides.begin(), eval_overrides.end());
        cfg = moe::parse_stored_config(ckpt->train_state_string("config"), ckpt->dir() + "/train_state.json", o,
                                       /*validate=*/false);
        cfg.train.global_batch_size = cfg.train.micro_batch_size * world.size();
        if (cfg.parallel.ep > world.size() || world.size() % cfg.parallel.ep != 0) cfg.parallel.ep = 1;
        cfg.validate();
        // --tokens N evaluates whole microbatches (micro_batch_size windows of seq_len predicted
        // tokens on every data rank), at most N tokens: an N below one of them would evaluate nothing.
        const int64_t microbatch_tokens =
            cfg.train.micro_batch_size * cfg.train.seq_len * cfg.parallel.dp(world.size());
        if (eval_tokens > 0 && eval_tokens < microbatch_tokens)
          throw UsageError("--tokens " + std::to_string(eval_tokens) + " is fewer than the " +
                           std::to_string(microbatch_tokens) + " predicted tokens of one microbatch on every rank (" +
                           "train.micro_batch_size " + std::to_string(cfg.train.micro_batch_size) + " x train.seq_len " +
                           std::to_string(cfg.train.seq_len) + " x " + std::to_string(cfg.parallel.dp(world.size())) +
                           " data rank(s)), and eval evaluates at most N tokens in whole microbatches; give --tokens " +
                           std::to_string(microbatch_tokens) + " or more, or --set train.micro_batch_size=... lower");
      });
      if (startup >= 0) return startup;
      // "latest" or a run directory is resolved by each rank: a job saving into that run meanwhile
      // could give the ranks different checkpoints, and they would evaluate different weights.
      const moe::StringAgreement same = moe::agree_on_string(world, ckpt->dir());
      MOE_CHECK(same.differing_rank < 0, "the ranks resolved --checkpoint ", eval_ckpt, " to different checkpoints: ",
                same.leader, " on rank 0 but ", same.differing, " on rank ", same.differing_rank,
                " (a job saving into that run meanwhile?); give the checkpoint's own directory");
      const std::string& dir = ckpt->dir();
      moe::TrainOptions opts;
      opts.checkpoint = ckpt;
      opts.bench = true;
      opts.quiet = true;
      moe::Trainer trainer(cfg, opts, world);
      // Whole windows of seq_len predicted tokens, at most --tokens of them (EvalWindows takes whole
      // windows itself; the synthetic corpus's path would round a partial window up).
      const int64_t max_tokens = eval_tokens / cfg.train.seq_len * cfg.train.seq_len;
      const moe::EvalReport r = trainer.evaluate_data(eval_data, max_tokens, eval_logits);
      if (leader) {
        std::printf("eval %s on %s: mean loss %.6f over %ld tokens (%s tokens/s)\n", dir.c_str(), eval_data.c_str(),
                    r.mean_loss, static_cast<long>(r.tokens), moe::format_count(r.tokens_per_s).c_str());
        if (r.windows_skipped > 0)
          std::printf("  %ld trailing windows did not fill a microbatch on every rank and were not evaluated\n",
                      static_cast<long>(r.windows_skipped));
        if (!eval_logits.empty()) std::printf("  logits of the first microbatch: %s\n", eval_logits.c_str());
      }
    } else if (export_hf->parsed()) {
      if (!std::isfinite(export_shard_gb)) {  // CLI::Range lets NaN through
        std::fprintf(stderr, "error: --max-shard-gb: %g is not a number of GB (see moetrain --help)\n", export_shard_gb);
        return kUsageError;
      }
      const bool bf16 = export_dtype == "bf16";
      const moe::ExportResult r = moe::export_hf(export_ckpt, export_out, static_cast<int64_t>(export_shard_gb * 1e9),
                                                 export_tokenizer, bf16 ? moe::DType::BF16 : moe::DType::F32);
      std::printf("exported %ld tensors (%s, %s) in %d shard(s) to %s; peak resident memory %s\n",
                  static_cast<long>(r.tensors), moe::format_bytes(static_cast<double>(r.bytes)).c_str(),
                  bf16 ? "bfloat16" : "float32", r.shards, r.out_dir.c_str(),
                  moe::format_bytes(static_cast<double>(r.peak_rss_bytes)).c_str());
      if (!r.note.empty()) std::printf("  note: %s\n", r.note.c_str());
    } else if (import_hf->parsed()) {
      const moe::ImportResult r = moe::import_hf(import_dir, import_out);
      std::printf("imported %ld tensors (%s expert layout) into %s\n  config: %s\n  AdamW moments start at zero.\n"
                  "  continue with: moetrain train --config %s --resume %s\n",
                  static_cast<long>(r.tensors), r.fused_experts ? "fused" : "per-expert", r.checkpoint_dir.c_str(),
                  r.config_path.c_str(), r.config_path.c_str(), r.checkpoint_dir.c_str());
    } else if (prepare->parsed()) {
      const moe::PrepareResult r = moe::prepare_byte_level(prepare_inputs, prepare_out, prepare_append);
      for (const auto& f : r.files)
        std::printf("%s -> %s/%s: %ld tokens, %ld documents\n", f.source.c_str(), r.out_dir.c_str(), f.name.c_str(),
                    static_cast<long>(f.tokens), static_cast<long>(f.documents));
      std::printf("wrote %ld tokens (vocab %ld, EOS %ld) and %s/dataset.json, which lists %ld file%s\n",
                  static_cast<long>(r.total_tokens), static_cast<long>(moe::kByteVocabSize),
                  static_cast<long>(moe::kByteEosTokenId), r.out_dir.c_str(), static_cast<long>(r.listed_files),
                  r.listed_files == 1 ? "" : "s");
    }
  } catch (const std::bad_alloc&) {
    return fail(out_of_memory().c_str());
  } catch (const moe::Interrupted& e) {  // export-hf, import-hf: their temporaries are gone
    fail(e.what());
    moe::die_of_signal(e.signal());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
