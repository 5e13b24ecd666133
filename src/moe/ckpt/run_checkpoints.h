// The checkpoints of one run directory as a line of training: listing them, finding the newest,
// keeping the newest K, and setting aside the ones a resume from an older step abandons.
//
// Resuming from step S while the run directory holds checkpoints after S starts a new line from
// S: what came after S on the old line (checkpoints and metrics records) belongs to a future
// that will not happen. It is never deleted and never mixed with the new line: before the first
// step of the new line it is moved into <run>/abandoned/<time>-after-step-S/, so pruning and
// `--resume latest` only ever see the current line. The move is made crash-safe by an intent
// file (<run>/.set-aside.json) written before it and removed after it: while one exists, every
// reader ignores the checkpoints it names, and the next run in the directory completes the move.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace moe {

// The step of a directory name `<prefix><digits>` (prefix "step-" or ".tmp-step-"); nullopt for
// any other name, so a user's `step-notes/` is never taken for a checkpoint.
std::optional<int64_t> step_of_name(const std::string& name, const std::string& prefix);
// The same for the names saves give (checkpoint_dir_name: at least six digits, zero-padded, so
// "step-000002" but not a user's copy named "step-2"), which alone are a run's checkpoints,
// unfinished saves (".tmp-step-") and removals (".trash-step-").
std::optional<int64_t> checkpoint_step_of_name(const std::string& name, const std::string& prefix);

// The checkpoint (a folder holding index.json and train_state.json, whatever its name, reached
// through links too) that `path` would lie inside, or "": outputs are never written into one.
std::string enclosing_checkpoint(const std::string& path);
// Whether `path` itself is such a checkpoint folder.
bool is_checkpoint_dir(const std::string& path);

// Complete checkpoints (step-*/index.json) of run_dir as (step, directory name), ascending,
// without those a pending set-aside intent is moving away.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir);

// A step-* dir as is; "<run>/latest" or a run dir -> its newest complete step-* dir, refused
// (naming it) when a newer step-* folder is damaged (damaged_newest_step).
std::string resolve_checkpoint(const std::string& run_dir_or_ckpt);
// Saves give a folder its step-N name only once it is complete, so a step-N newer than every
// complete checkpoint of run_dir (and not hidden by a pending set-aside) without index.json is
// damage, or a copy taken mid-save: "the newest" would silently be an older checkpoint, and a
// resume would set the damaged one aside unnamed. Its path and what is wrong with it, or "".
std::string damaged_newest_step(const std::string& run_dir);

class CheckpointReader;
// The step of an opened checkpoint, once its three records of it agree (index.json,
// train_state.json and, for a step-* directory, the name): files copied between checkpoints
// would otherwise pass one step's weights off as another's.
int64_t checked_checkpoint_step(const CheckpointReader& ckpt);

// The run id a checkpoint's train_state.json records ("" when it has none or cannot be read):
// every checkpoint of one run, across resumes, carries the same id.
std::string checkpoint_run_id(const std::string& ckpt_dir);

// What prune_checkpoints left in place that a plain count would have removed, for the caller to say.
struct PruneOutcome {
  // Checkpoints of another run's line (or without a run id): never this run's to remove.
  std::vector<std::string> others;
  // Checkpoints of this run's line that were due for removal but hold files no save writes (a
  // user's notes, an evaluation's output) or were made read-only, with why: "step-000003 (it holds
  // notes.txt, plots)", "step-000002 (it is read-only)". Kept whole.
  std::vector<std::string> kept_for_the_user;
};

// Keeps the newest keep_last checkpoints of run_id's line in run_dir (0 = keep all) and never
// removes `protect` (a checkpoint path, e.g. the one this process resumed from; empty = none).
// Only checkpoints whose train_state.json records run_id count and may go: another run's (or
// one without an id) is never removed, nor is one that holds anything besides the files a save
// writes (index.json, train_state.json, rank-*.safetensors) or that cannot be written: pruning
// removes checkpoints, never a user's files or one the user protected. Checkpoint directories are
// renamed before they are removed, so a half-removed one never carries a step-* name; temp dirs of
// saves older than the oldest kept checkpoint are crash leftovers and are removed too.
PruneOutcome prune_checkpoints(const std::string& run_dir, int keep_last, const std::string& run_id,
                               const std::string& protect = "");

// The names of a checkpoint directory's entries that no save writes, sorted; empty when it holds
// only a save's files.
std::vector<std::string> files_no_save_wrote(const std::string& ckpt_dir);

// Removes the directories of saves that never finished: .tmp-step-* (a crash before the commit)
// and .trash-step-* (a crash while pruning). Only for a job that holds the run's lock.
void remove_unfinished_saves(const std::string& run_dir);

// Called with the set-aside directory and the step S of a resume, before the intent is cleared,
// so the caller can move its own records of the steps after S (metrics) into the same place. It
// must be idempotent: after a crash it runs again when the move is completed.
using AlsoSetAside = std::function<void(const std::string& dir, int64_t after_step)>;

// Moves every checkpoint after `step` into a
// new <run_dir>/abandoned/<UTC time>-after-step-<step>/ and calls also_move there. Completes a
// pending intent left by a crash first. Nothing is removed. Makes no directory and returns ""
// when there is no checkpoint after `step` and records_after_step is false.
std::string set_aside_after(const std::string& run_dir, int64_t step, bool records_after_step,
                            const AlsoSetAside& also_move);

// Completes a set-aside that a crash interrupted (no-op when there is none); returns its directory.
std::string complete_pending_set_aside(const std::string& run_dir, const AlsoSetAside& also_move);

}  // namespace moe
