// Trainer's checkpoint side: resuming from a checkpoint (any topology), starting from another
// run's or a Hugging Face model's weights (`train --init-from`), and saving through the
// multi-rank protocol of ckpt/distributed_checkpoint.h.
#include <chrono>
#include <filesystem>
#include <map>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/distributed_checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/comm/agreed_outcome.h"
#include "moe/comm/host_strings.h"
#include "moe/core/device.h"
#include "moe/core/printable.h"
#include "moe/core/wall_clock.h"
#include "moe/train/data_agreement.h"
#include "moe/train/init_source.h"
#include "moe/train/trainer.h"

namespace fs = std::filesystem;

namespace moe {

namespace {

// The settings a step's training windows are a function of (with the step): the data keys, the
// sequence length and the global batch. "key = new (was old)" for each that differs, or "".
std::string data_order_differences(const Config& before, const Config& now) {
  const auto shapes_order = [](const std::string& key) {
    return key.rfind("data.", 0) == 0 || key == "train.seq_len" || key == "train.global_batch_size";
  };
  const auto old_values = config_values(before);
  const std::map<std::string, std::string> was(old_values.begin(), old_values.end());
  std::string out;
  for (const auto& [key, value] : config_values(now)) {
    if (!shapes_order(key)) continue;
    const auto it = was.find(key);
    const std::string old = it == was.end() ? "(none)" : it->second;
    if (old != value) out += (out.empty() ? "" : ", ") + key + " = " + value + " (was " + old + ")";
  }
  return out;
}

}  // namespace

void Trainer::load_checkpoint(const CheckpointReader& ckpt) {
  const auto t0 = SteadyClock::now();
  const size_t rss_before = peak_rss_bytes();
  const std::string& dir = ckpt.dir();
  // The checks every rank makes alike, printed once (agreed_outcome.h); the range reads below
  // are each rank's own.
  const int64_t step = agree_on_outcome(host_world_, [&] {
    // The model must be the same, compared key by key (values, not the text that stored them).
    const Config stored = parse_config(ckpt.train_state_string("model_config"), dir + "/train_state.json");
    const std::string diff = config_differences(cfg_, stored, "model", "this run", "the checkpoint");
    if (!diff.empty()) {
      // eval takes the model from the checkpoint: only its --set can differ. A resume's usual fix is
      // the run's config: its config.toml (moetrain's resolved copy, or the user's own file that a
      // resolved copy sits beside; either can be given as --config).
      std::string hint;
      const fs::path config = fs::path(dir).parent_path() / "config.toml";
      std::error_code ec;
      if (opts_.evaluation_only)
        hint = "; eval takes the model from the checkpoint's train_state.json: a --set of model keys (drop it), "
               "or a train_state.json whose config and model_config disagree, makes the difference";
      else if (fs::is_regular_file(config, ec) && !opts_.config_file.empty() &&
               fs::equivalent(config, opts_.config_file, ec))
        hint = "; --config is that run's config.toml already: a --set of model keys, or an edit of that file, "
               "makes the difference";
      else if (fs::is_regular_file(config, ec))
        hint = "; to continue that run, give its config: --config " + config.string();
      MOE_FAIL("cannot load ", dir, " into this run: the model config differs:", diff, hint);
    }
    const int64_t step = checked_checkpoint_step(ckpt);
    MOE_CHECK(opts_.bench || step <= cfg_.train.steps, "checkpoint ", dir, " is at step ", step,
              ", past train.steps = ", cfg_.train.steps);
    check_stored_shapes(ckpt, run_->reg, /*moments=*/!opts_.evaluation_only);  // an evaluation reads no moments
    // Every checkpoint moetrain writes holds the router's balancing bias; one without it would
    // restart the bias at zero, and with it which experts the tokens reach.
    const bool bias_matters = cfg_.model.bias_update_rate > 0 && cfg_.model.routing == Routing::Learned;
    MOE_CHECK(ckpt.has("router_bias") || !bias_matters, "checkpoint ", dir, " holds no 'router_bias', but this run ",
              "updates the router's balancing bias (model.bias_update_rate = ", cfg_.model.bias_update_rate,
              "): resuming would restart it at zero and change the routing; the checkpoint is incomplete");
    return step;
  });
  // Every rank reads the ranges it holds under the current topology, whatever wrote them. A range
  // every rank reads (the dense weights, the router bias) that fails its checksum is every rank's
  // error alike: printed once (it was printed by each rank, under Open MPI's abort banner).
  agree_on_outcome(host_world_, [&] {
    run_->store->load(ckpt);
    if (ckpt.has("router_bias")) {
      const int64_t L = cfg_.model.num_hidden_layers, N = cfg_.model.num_experts;
      MOE_CHECK(ckpt.global_shape("router_bias") == std::vector<int64_t>({L, N}), "checkpoint ", dir,
                ": 'router_bias' is not of shape [", L, ", ", N, "] (layers x experts) as this run's model needs");
      ckpt.read("router_bias", DType::F32, 0, static_cast<int64_t>(host_bias_.size()), host_bias_.data());
      copy_to_tensor(state_.get(run_->buffers.router_bias), host_bias_.data());
    }
  });
  start_step_ = step;
  // A checkpoint written before tokens_seen was recorded: step x this run's tokens per step.
  tokens_at_start_ = ckpt.train_state_int("tokens_seen", step * cfg_.train.global_batch_size * cfg_.train.seq_len);
  skipped_steps_ = ckpt.train_state_int("skipped_steps", 0);
  if (ckpt.train_state().contains("run_id")) run_id_ = ckpt.train_state_string("run_id");
  // A fine-tuning run keeps the record of where its first weights came from.
  if (ckpt.train_state().contains("init_from")) init_from_ = ckpt.train_state()["init_from"];
  if (!opts_.quiet && leader()) {
    // Said by run() once the run directory is claimed: a start refused there did not resume.
    char line[1024];
    std::snprintf(line, sizeof line,
                  "resumed from %s at step %ld (read in %.2f s; rank 0 peak resident memory %s "
                  "before, %s after)\n",
                  dir.c_str(), static_cast<long>(start_step_), seconds_since(t0),
                  format_bytes(static_cast<double>(rss_before)).c_str(),
                  format_bytes(static_cast<double>(peak_rss_bytes())).c_str());
    resume_note_ = line;
    if (init_from_.is_object() && init_from_.contains("path") && init_from_["path"].is_string())
      resume_note_ += "  (this run was initialized from " + init_from_["path"].get<std::string>() + ")\n";
    // Precision and payload may change across a resume (the FP32 weights are the truth); say so.
    if (ckpt.train_state().contains("config")) {
      try {
        const Config before = parse_stored_config(ckpt.train_state_string("config"), dir + "/train_state.json", {},
                                                  /*validate=*/false);
        if (before.train.precision != cfg_.train.precision || before.ep.payload != cfg_.ep.payload)
          resume_note_ += std::string("  note: the checkpoint was trained with train.precision = \"") +
                          to_string(before.train.precision) + "\", ep.payload = \"" + to_string(before.ep.payload) +
                          "\"; this run continues with \"" + to_string(cfg_.train.precision) + "\", \"" +
                          to_string(cfg_.ep.payload) + "\"\n";
        // (At step 0, e.g. import-hf's checkpoint, no window was read yet: nothing to say.)
        const std::string data_changes = start_step_ > 0 ? data_order_differences(before, cfg_) : "";
        if (!data_changes.empty())
          resume_note_ += "  note: the data settings differ from the checkpoint's (" + data_changes +
                          "): the remaining steps read the windows a run with these settings reads from step " +
                          std::to_string(start_step_) +
                          " on, so windows the checkpoint's run had not reached may be skipped and others seen "
                          "again\n";
      } catch (const Error&) {
        // A stored config this build cannot read is no reason to refuse the resume: no note.
      }
    }
    // The same names can hold other tokens: a file edited, replaced or added since the save.
    const std::string file_changes = start_step_ > 0 && ckpt.train_state().contains("data_files")
                                         ? token_files_changes(ckpt.train_state()["data_files"], data_)
                                         : "";
    if (!file_changes.empty())
      resume_note_ += "  note: the token files differ from the ones the checkpoint's run read (" + file_changes +
                      "): the remaining steps read windows of the files as they are now, so the run is not the "
                      "one it would have been\n";
  }
}

void Trainer::init_weights_from(const std::string& path) {
  const auto t0 = SteadyClock::now();
  // Errors here are every rank's alike (the same files, the same config): printed once.
  const std::string resolved = leader_decides(host_world_, [&] { return InitSource::resolve(path); });
  const InitSource src = agree_on_outcome(host_world_, [&] {
    InitSource s(resolved);
    // Before anything is read or written: the weights must be of this run's architecture.
    const std::string mismatch = s.architecture_mismatch(cfg_.model);
    MOE_CHECK(mismatch.empty(), mismatch);
    s.check_weight_shapes(run_->reg);
    return s;
  });
  // The same reads as a resume (every rank reads the ranges it holds, onto the device the
  // parameters live on), without the moments: they stay at zero, as after init(). One agreed
  // outcome, as at resume: a damaged range is one error, whichever ranks read it.
  const bool bias = agree_on_outcome(host_world_, [&] {
    run_->store->load_weights([&](const std::string& key, int64_t begin, int64_t end, const Tensor& dst) {
      src.read_into(key, begin, end, dst);
    });
    return src.read_router_bias(static_cast<int64_t>(host_bias_.size()), host_bias_.data());
  });
  if (bias) copy_to_tensor(state_.get(run_->buffers.router_bias), host_bias_.data());
  init_from_ = src.record();
  if (!opts_.quiet && leader())
    std::printf(
        "initialized from %s in %.2f s: weights%s only; step 0, AdamW moments at zero, data and LR schedule "
        "from their start, a new run id\n",
        src.describe().c_str(), seconds_since(t0), bias ? " and router bias" : "");
}

Trainer::SaveParts Trainer::save_parts(int64_t step) {
  SaveParts p;
  p.slices = run_->store->checkpoint_slices();
  // GPU state is streamed through host memory one slice at a time: the writer asks for each
  // slice's bytes just before writing it (or the background copy, all of them at once).
  p.device_data.assign(p.slices.size(), nullptr);
  if (dev_ == Device::CUDA)
    for (size_t i = 0; i < p.slices.size(); ++i) std::swap(p.device_data[i], p.slices[i].data);
  const int64_t L = cfg_.model.num_hidden_layers, N = cfg_.model.num_experts;
  if (leader()) p.slices.push_back({"router_bias", DType::F32, {L, N}, 0, L * N, host_bias_.data()});
  p.device_data.resize(p.slices.size(), nullptr);
  if (leader()) {
    nlohmann::json& st = p.train_state;
    st["step"] = step;
    st["skipped_steps"] = skipped_steps_;
    st["tokens_seen"] = tokens_through(step);
    st["run_id"] = run_id_;
    if (!init_from_.is_null()) st["init_from"] = init_from_;
    st["data_position"] = {{"step", step},
                           {"note", "training windows are a pure function of (data.seed, step, sequence)"}};
    st["rng"] = {{"train.seed", cfg_.train.seed}, {"data.seed", cfg_.data.seed}};
    st["data_files"] = token_files_record(data_);  // a resume says which files changed since
    st["topology"] = {{"world_size", world_.size()},
                      {"mode", cfg_.parallel.mode},
                      {"ep", cfg_.parallel.ep},
                      {"pp", cfg_.parallel.pp},
                      {"pp_virtual", cfg_.parallel.pp_virtual}};
    st["model_config"] = model_config_toml(cfg_.model);
    st["config"] = config_to_toml(cfg_);
  }
  return p;
}

void Trainer::save_checkpoint_now(int64_t step, bool background) {
  // One checkpoint at a time, committed in step order: a save held in the background ends first.
  finish_background_save(/*wait=*/true);
  const auto t0 = SteadyClock::now();
  const size_t rss_before = peak_rss_bytes();
  const std::string run = cfg_.run_dir();
  SaveParts p = save_parts(step);
  const SliceProducer produce = [&](size_t i, void* dst) {
    const CheckpointSlice& s = p.slices[i];
    copy_from_tensor(dst, Tensor(const_cast<void*>(p.device_data[i]), s.dtype, {s.end - s.begin}, dev_));
  };
  if (background && background_save_fits(background_file_.bytes_to_allocate(p.slices))) {
    std::string tmp = leader() ? begin_checkpoint(run, step) : std::string();
    tmp = broadcast_string(host_world_, tmp, 0);  // no rank writes before the directory exists
    background_file_.start(tmp, host_world_.rank(), p.slices, produce);
    background_save_ = BackgroundSave{step, tmp, std::move(p.train_state), t0, seconds_since(t0), rss_before};
    return;
  }
  const std::string dir = save_checkpoint_collective(host_world_, run, step, p.slices, produce, p.train_state);
  if (leader()) after_commit(dir, seconds_since(t0), rss_before, "");
}

void Trainer::after_commit(const std::string& dir, double seconds, size_t rss_before, const std::string& how) {
  const std::string run = cfg_.run_dir();
  // Keep the newest keep_last of this line; the checkpoint this process resumed from stays, and so
  // does any other run's checkpoint found in the directory (said once).
  if (cfg_.train.keep_last > 0) {
    const PruneOutcome pruned = prune_checkpoints(run, static_cast<int>(cfg_.train.keep_last), run_id_, resumed_from_);
    const std::vector<std::string>& others = pruned.others;
    if (!others.empty() && !told_of_other_checkpoints_ && !opts_.quiet) {
      std::string names;
      for (const std::string& o : others) names += (names.empty() ? "" : ", ") + o;
      std::printf(
          "train.keep_last: %s in %s %s no checkpoint of this run's line (run id %s: another run's, or "
          "written without an id, as import-hf does) and %s left in place\n",
          names.c_str(), run.c_str(), others.size() == 1 ? "is" : "are", run_id_.c_str(),
          others.size() == 1 ? "is" : "are");
      told_of_other_checkpoints_ = true;
    }
    // Said on stderr, also where other output is quiet (eval), once per checkpoint: the run keeps
    // more checkpoints than asked, and the disk fills, until the user moves those files.
    for (const std::string& kept : pruned.kept_for_the_user)
      if (told_of_kept_checkpoints_.insert(kept.substr(0, kept.find(' '))).second)
        std::fprintf(stderr,
                     "train.keep_last: kept %s/%s: pruning removes the files saves write, never yours or a "
                     "checkpoint you protected; move them out (or make it writable) and a later save prunes it\n",
                     printable(run).c_str(), printable(kept).c_str());
  }
  if (!opts_.quiet) {
    uintmax_t bytes = 0;
    for (const auto& e : fs::directory_iterator(dir)) bytes += e.is_regular_file() ? e.file_size() : 0;
    // Held back after a stop signal, as the progress lines (Trainer::say).
    say("saved checkpoint %s (%s in %.2f s%s; rank 0 peak resident memory %s before, %s after)\n", dir.c_str(),
        format_bytes(static_cast<double>(bytes)).c_str(), seconds, how.c_str(),
        format_bytes(static_cast<double>(rss_before)).c_str(), format_bytes(static_cast<double>(peak_rss_bytes())).c_str());
  }
}

}  // namespace moe
