// moetrain train: a training run (default: the built-in tiny config on synthetic data).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/run_summary.h"
#include "moe/train/config.h"
#include "moe/train/init_source.h"
#include "moe/train/stop_request.h"
#include "moe/train/trainer.h"

namespace moe::cli {

namespace {

struct TrainArgs {
  CLI::App* cmd = nullptr;
  ConfigArgs config;
  std::string resume, init_from;
  int64_t save_every = 0, keep_last = 0, steps = 0;
  bool overwrite = false;
};

int run_train(TrainArgs& a, Job& job) {
  moe::Config cfg;
  const int startup = job.agree_at_startup([&] {
    // Usage errors (exit 2) that only the config and run.dir reveal.
    if (!a.init_from.empty() && !a.resume.empty()) throw UsageError(moe::init_from_conflict(a.init_from, a.resume, {}));
    if (a.overwrite && !a.resume.empty())
      throw UsageError("--overwrite starts afresh, --resume continues: give one of them");
    std::vector<KeyFlag> flags;
    if (a.cmd->count("--save-every"))
      flags.push_back({"--save-every", "train.save_every", &moe::TrainConfig::save_every, a.save_every});
    if (a.cmd->count("--keep-last"))
      flags.push_back({"--keep-last", "train.keep_last", &moe::TrainConfig::keep_last, a.keep_last});
    if (a.cmd->count("--steps")) flags.push_back({"--steps", "train.steps", &moe::TrainConfig::steps, a.steps});
    cfg = a.config.load(flags);
    if (const std::string conflict = moe::init_from_conflict(a.init_from, a.resume, cfg); !conflict.empty())
      throw UsageError(conflict);
  });
  if (startup >= 0) return startup;
  moe::TrainOptions opts;
  opts.resume = a.resume;
  opts.init_from = a.init_from;
  opts.overwrite = a.overwrite;
  opts.config_file = a.config.config;
  opts.stop_on_signals = true;  // SIGTERM / SIGUSR1 / SIGHUP / Ctrl-C: checkpoint at the next step, then stop
  // Already while the data and any checkpoint are read (minutes for a large run): a scheduler's
  // warning signal then stops the run at its first step boundary instead of killing it.
  moe::install_stop_handlers();
  moe::Trainer trainer(cfg, opts, job.world());
  const moe::TrainSummary s = trainer.run();
  if (job.leader()) print_summary(s, false);
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* train =
      app.add_subcommand("train", "train a model (default: the built-in tiny config on synthetic data)");
  a->cmd = train;
  a->config.add_to(train);
  train->add_option("--resume", a->resume, "continue from a checkpoint dir, a run dir, or 'latest'")
      ->check(kNonEmpty);
  train->add_option("--init-from", a->init_from,
                    "start a new run (step 0, fresh optimizer state) from the weights of a checkpoint dir, a run dir "
                    "(its newest checkpoint) or a Hugging Face OLMoE folder; the model config must match")
      ->check(kNonEmpty);
  train->add_option("--save-every", a->save_every, "checkpoint every N steps (train.save_every)")
      ->check(kCountFromZero)
      ->transform(kDecimal);
  train->add_option("--keep-last", a->keep_last, "keep only the newest K checkpoints (train.keep_last)")
      ->check(kKeepLastRange)
      ->transform(kDecimal);
  train->add_option("--steps", a->steps, "total optimizer steps (train.steps)")
      ->check(kCountFromZero)
      ->transform(kDecimal);
  train->add_flag("--overwrite", a->overwrite,
                  "run.dir holds another run: move its files into <run.dir>/replaced/ and start afresh");
  // Each starts or continues another run, with other collectives.
  // Only the flags given (an empty value is refused as a usage error), as the error shows them.
  auto agreed_flags = [a] {
    return (a->resume.empty() ? "" : " --resume '" + a->resume + "'") +
           (a->init_from.empty() ? "" : " --init-from '" + a->init_from + "'") + (a->overwrite ? " --overwrite" : "");
  };
  return {train, [a](Job& job) { return run_train(*a, job); }, agreed_flags};
}

}  // namespace moe::cli
