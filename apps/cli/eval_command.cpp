// moetrain eval: the mean LM loss of a checkpoint over token data (.npy file or folder).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/arguments.h"
#include "cli/command.h"
#include "cli/eval_layout.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/comm/host_strings.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/train/config.h"
#include "moe/train/memory_plan.h"
#include "moe/train/metrics.h"
#include "moe/train/trainer.h"

namespace moe::cli {

namespace {

struct EvalArgs {
  std::string checkpoint, data, logits;
  int64_t tokens = 0;
  std::vector<std::string> overrides;
};

int run_eval(const EvalArgs& a, Job& job) {
  moe::Communicator& world = job.world();
  // Every rank must evaluate the same thing, or the collective forward passes fall out of step.
  const moe::StringAgreement args =
      moe::agree_on_string(world, "--checkpoint " + a.checkpoint + " --data " + a.data + " --tokens " +
                                      std::to_string(a.tokens) + " --logits " + a.logits);
  MOE_CHECK(args.differing_rank < 0, "the ranks of this job were given different eval arguments: '", args.leader,
            "' on rank 0 but '", args.differing, "' on rank ", args.differing_rank);
  std::shared_ptr<const moe::CheckpointReader> ckpt;
  moe::Config cfg;
  const int startup = job.agree_at_startup([&] {
    check_new_output("eval --logits", a.logits);
    // Opened once: its files stay readable even if a running job prunes the checkpoint meanwhile.
    ckpt = std::make_shared<const moe::CheckpointReader>(moe::resolve_checkpoint(a.checkpoint));
    // The checkpoint's own config, without its data source (the data is given here) and with a
    // global batch that fits this topology.
    // The training data is not read (--data names what is evaluated): a small synthetic corpus
    // stands in, or, for --data synthetic, the checkpoint's own synthetic corpus.
    std::vector<std::string> o = {"data.path=synthetic", "data.sources=[]", "eval.sets=[]"};
    if (a.data != "synthetic") o.insert(o.end(), {"data.synthetic_tokens=65536", "data.synthetic_eval_tokens=8192"});
    // Whole-model DDP ranks (any number) and block recompute (eval_layout.h); --set, applied after
    // these, may ask for a layout again.
    const std::vector<std::string> layout = eval_layout_sets();
    o.insert(o.end(), layout.begin(), layout.end());
    const size_t fixed = o.size();  // eval's own: an error in the stored config is not the user's --set
    o.insert(o.end(), a.overrides.begin(), a.overrides.end());
    cfg = moe::parse_stored_config(ckpt->train_state_string("config"), ckpt->dir() + "/train_state.json", o,
                                   /*validate=*/false, fixed);
    // The training stream is never evaluated (only --data, or the synthetic held-out stream, which
    // does not depend on its length): it holds one window of a --set train.seq_len longer than it.
    cfg.data.synthetic_tokens = std::max(cfg.data.synthetic_tokens, cfg.train.seq_len + 1);
    settle_eval_layout(cfg, world.size(), a.overrides);  // the checkpoint's EP where these ranks hold it
    cfg.validate();
    // --tokens N evaluates whole microbatches (micro_batch_size windows of seq_len predicted
    // tokens on every data rank), at most N tokens: an N below one of them would evaluate nothing.
    const int64_t microbatch_tokens = cfg.train.micro_batch_size * cfg.train.seq_len * cfg.parallel.dp(world.size());
    if (a.tokens > 0 && a.tokens < microbatch_tokens)
      throw UsageError("--tokens " + std::to_string(a.tokens) + " is fewer than the " +
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
  MOE_CHECK(same.differing_rank < 0, "the ranks resolved --checkpoint ", a.checkpoint, " to different checkpoints: ",
            same.leader, " on rank 0 but ", same.differing, " on rank ", same.differing_rank,
            " (a job saving into that run meanwhile?); give the checkpoint's own directory");
  const std::string& dir = ckpt->dir();
  moe::TrainOptions opts;
  opts.checkpoint = ckpt;
  opts.bench = true;
  opts.quiet = true;
  opts.evaluation_only = true;  // the weights only: a model is evaluated where it could not be trained
  moe::Trainer trainer(cfg, opts, world);
  // Whole windows of seq_len predicted tokens, at most --tokens of them (EvalWindows takes whole
  // windows itself; the synthetic corpus's path would round a partial window up).
  const int64_t max_tokens = a.tokens / cfg.train.seq_len * cfg.train.seq_len;
  const moe::EvalReport r = trainer.evaluate_data(a.data, max_tokens, a.logits);
  if (job.leader()) {
    std::printf("eval %s on %s: mean loss %.6f over %ld tokens (%s tokens/s)\n", dir.c_str(), a.data.c_str(),
                r.mean_loss, static_cast<long>(r.tokens), moe::format_count(r.tokens_per_s).c_str());
    if (r.windows_skipped > 0)
      std::printf("  %ld trailing windows did not fill a microbatch on every rank and were not evaluated\n",
                  static_cast<long>(r.windows_skipped));
    if (!a.logits.empty()) std::printf("  logits of the first microbatch: %s\n", a.logits.c_str());
    // What it held, as `moetrain plan --eval` states it (the largest rank's plan), and on the GPU
    // what was in use at the end, so the two can be compared.
    const moe::MemoryRoles plan =
        moe::plan_largest_rank(cfg, world.size(), trainer.device(), moe::StoreUse::Evaluation);
    std::printf("  memory: %s planned per rank (weights %s, other state %s, activations %s, expert heap %s; no "
                "gradients or optimizer state, train.recompute = \"%s\")",
                moe::format_bytes(static_cast<double>(plan.total())).c_str(),
                moe::format_bytes(static_cast<double>(plan.parameters + plan.compute_weights)).c_str(),
                moe::format_bytes(static_cast<double>(plan.other_state)).c_str(),
                moe::format_bytes(static_cast<double>(plan.activations)).c_str(),
                moe::format_bytes(static_cast<double>(plan.heap)).c_str(), moe::to_string(cfg.train.recompute));
    if (trainer.device() == moe::Device::CUDA) {
      const moe::DeviceMemory m = moe::device_memory();
      std::printf("; GPU memory in use at the end %s (CUDA context and library workspaces included)",
                  moe::format_bytes(static_cast<double>(m.total_bytes - m.free_bytes)).c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* eval = app.add_subcommand("eval", "mean LM loss of a checkpoint over token data (.npy file or folder)");
  eval->add_option("--checkpoint", a->checkpoint, "checkpoint dir (or run dir: its newest checkpoint)")->required();
  eval->add_option("--data", a->data, "token file, folder or glob (in the checkpoint's data.format), or 'synthetic'")
      ->required();
  eval->add_option("--tokens", a->tokens,
                   "evaluate at most N predicted tokens: the whole microbatches of seq_len-token windows that fit "
                   "(0 = all)")
      ->check(kAnyNonNegative)
      ->transform(kDecimal);
  eval->add_option("--logits", a->logits, "write the first microbatch's logits to this .npy (float32)")
      ->check(kNonEmpty);
  eval->add_option("--set", a->overrides, "override a key of the checkpoint's config (e.g. train.seq_len)")
      ->check(set_form_error);
  return {eval, [a](Job& job) { return run_eval(*a, job); }, /*agreed_flags=*/nullptr};
}

}  // namespace moe::cli
