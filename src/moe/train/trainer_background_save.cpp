// train.async_save: a periodic checkpoint whose rank files are written on a thread while training
// goes on (ckpt/background_rank_file.h). The protocol is the foreground one of
// ckpt/distributed_checkpoint.h with the writes moved off the main thread; every collective stays
// on it, at points every rank reaches in the same order:
//   save step S   rank 0 creates .tmp-step-S, a broadcast; each rank copies its slices into host
//                 memory and starts its writer thread;
//   each step     a one-float reduction: has every rank's thread ended?  When it has (or at the
//                 next save, a stop or the end of the run, which wait for it): the chunk records
//                 (or a rank's error) gathered to all; rank 0 writes index.json, renames the
//                 directory (the commit) and prunes, a broadcast.
// Until the commit the directory is .tmp-step-S, which no resume reads: a crash while it is written
// leaves the checkpoints before it as they were; a failed write is reported on every rank and the
// directory removed.
#include <nlohmann/json.hpp>

#include "moe/ckpt/checkpoint.h"
#include "moe/comm/host_strings.h"
#include "moe/core/host_name.h"
#include "moe/core/wall_clock.h"
#include "moe/train/trainer.h"

namespace moe {

namespace {

// Host memory kept free beside the copies (the page cache the writes go through, the run's own growth).
constexpr size_t kHostMarginBytes = size_t{1} << 30;

}  // namespace

bool Trainer::background_save_fits(size_t new_snapshot_bytes) {
  // Ranks on one host copy at the same time: each host must hold the sum of its ranks' new copies
  // (none where every rank reuses the buffers it kept from the last save).
  const nlohmann::json mine = {
      {"host", host_name()}, {"bytes", new_snapshot_bytes}, {"available", available_memory_bytes()}};
  std::map<std::string, std::pair<size_t, size_t>> hosts;  // host -> (bytes of its ranks, least available seen)
  for (const std::string& text : all_gather_strings(host_world_, mine.dump())) {
    const nlohmann::json r = nlohmann::json::parse(text);
    auto [it, fresh] = hosts.try_emplace(r["host"].get<std::string>(), 0, r["available"].get<size_t>());
    it->second.first += r["bytes"].get<size_t>();
    it->second.second = std::min(it->second.second, r["available"].get<size_t>());
  }
  for (const auto& [host, need] : hosts) {
    const auto [bytes, available] = need;
    if (bytes == 0 || bytes + kHostMarginBytes <= available) continue;
    if (leader() && !opts_.quiet && !told_save_in_foreground_)
      std::printf(
          "train.async_save: the host copy of this checkpoint needs %s on %s, which has %s available (and %s "
          "stay free): saving in the foreground instead\n",
          format_bytes(static_cast<double>(bytes)).c_str(), host.c_str(),
          format_bytes(static_cast<double>(available)).c_str(),
          format_bytes(static_cast<double>(kHostMarginBytes)).c_str());
    told_save_in_foreground_ = true;
    return false;
  }
  return true;
}

void Trainer::finish_background_save(bool wait) {
  if (!background_save_) return;  // the same on every rank: saves start collectively
  if (!wait) {
    float busy = background_file_.done() ? 0.0f : 1.0f;
    host_world_.all_reduce(Tensor(&busy, DType::F32, {1}), ReduceOp::Max);
    if (busy != 0.0f) return;
  } else if (!background_file_.done() && leader() && !opts_.quiet) {
    // A stop, the next save or the run's end waits here, for as long as the disk takes: say so.
    say("waiting for checkpoint %s, still being written in the background (train.async_save)\n",
        checkpoint_dir_name(background_save_->step).c_str());
  }
  const BackgroundSave save = std::move(*background_save_);
  background_save_.reset();
  std::string record;
  try {
    record = chunks_to_json(background_file_.finish()).dump();
  } catch (const std::exception& e) {
    record = nlohmann::json{{"error", e.what()}}.dump();
  }
  // After the gather no rank writes into the temp directory: a failed save removes it (as a
  // foreground one does), since on a full disk its files are the space the user needs back.
  const std::vector<std::string> records = all_gather_strings(host_world_, record);
  std::vector<CheckpointChunk> all;
  for (size_t r = 0; r < records.size(); ++r) {
    const nlohmann::json j = nlohmann::json::parse(records[r]);
    if (j.is_object() && j.contains("error")) {
      if (leader()) abandon_checkpoint(cfg_.run_dir(), save.step);
      host_world_.barrier();  // the temp folder is gone before any rank's error can abort the job
      MOE_FAIL_AGREED("checkpoint ", checkpoint_dir_name(save.step), " was not saved: rank ", r,
               "'s file, written in the background (train.async_save), failed: ", j["error"].get<std::string>(),
               "; the checkpoints before it are intact");
    }
    if (leader()) {
      const std::vector<CheckpointChunk> theirs = chunks_from_json(j);
      all.insert(all.end(), theirs.begin(), theirs.end());
    }
  }
  std::string dir;
  if (leader()) {
    try {
      write_checkpoint_index(save.tmp_dir, save.step, all, save.train_state);
      dir = commit_checkpoint(cfg_.run_dir(), save.step);
    } catch (...) {
      abandon_checkpoint(cfg_.run_dir(), save.step);
      throw;
    }
  }
  dir = broadcast_string(host_world_, dir, 0);  // every rank goes on after the commit
  if (!leader()) return;
  char how[160];
  std::snprintf(how, sizeof how, ": host copy %.2f s, then written in the background", save.snapshot_s);
  after_commit(dir, seconds_since(save.started), save.rss_before, how);
}

}  // namespace moe
