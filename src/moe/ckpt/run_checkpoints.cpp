#include "moe/ckpt/run_checkpoints.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/durable_file.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"

namespace moe {

namespace fs = std::filesystem;

std::optional<int64_t> step_of_name(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

std::optional<int64_t> checkpoint_step_of_name(const std::string& name, const std::string& prefix) {
  const std::optional<int64_t> step = step_of_name(name, prefix);
  if (!step || name.compare(prefix.size(), std::string::npos, checkpoint_dir_name(*step), 5) != 0) return std::nullopt;
  return step;
}

namespace {

constexpr const char* kIntentFile = ".set-aside.json";

struct Intent {
  int64_t after_step = 0;
  std::string dir;  // name inside <run>/abandoned/
};

// Directories of run_dir named <prefix><digits> as (step, name), ascending; `complete` also
// requires index.json (a committed checkpoint).
std::vector<std::pair<int64_t, std::string>> list_steps(const std::string& run_dir, const std::string& prefix,
                                                        bool complete) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  fs::directory_iterator it(run_dir, ec);
  MOE_CHECK(!ec, "cannot list run directory ", run_dir, ": ", ec.message());
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    const std::optional<int64_t> step = checkpoint_step_of_name(name, prefix);
    if (!step || !entry.is_directory(ec)) continue;
    if (complete && !fs::exists(entry.path() / "index.json", ec)) continue;
    steps.emplace_back(*step, name);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  MOE_CHECK(!ec, "cannot remove ", path, ": ", ec.message());
}

std::optional<Intent> read_intent(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kIntentFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  std::ifstream in(path);
  MOE_CHECK(in.good(), "cannot read ", path, ": ", errno_text());
  try {
    const nlohmann::json j = parse_bounded_json(in, path);
    const nlohmann::json& after = j.at("after_step");
    MOE_CHECK(after.is_number_unsigned() && after.get<uint64_t>() <= uint64_t{1} << 62, path,
              ": \"after_step\" must be a step >= 0, got ", after.dump(),
              "; inspect the run directory, then remove this interrupted set-aside record");
    Intent intent{after.get<int64_t>(), j.at("dir").get<std::string>()};
    MOE_CHECK(intent.dir.find('/') == std::string::npos && !intent.dir.empty() && intent.dir != "." &&
                  intent.dir != "..",
              path, ": \"dir\" must be a plain folder name, got '", intent.dir, "'");
    return intent;
  } catch (const nlohmann::json::exception& e) {
    MOE_FAIL(path, " (an interrupted set-aside of abandoned checkpoints) is malformed: ", e.what(),
             "; inspect it and the run directory, then remove it");
  }
}

// Moves the checkpoints after intent.after_step into abandoned/<dir>, runs also_move, clears the intent.
std::string carry_out(const std::string& run_dir, const Intent& intent, const AlsoSetAside& also_move) {
  const std::string abandoned = run_dir + "/abandoned";
  const std::string dest = abandoned + "/" + intent.dir;
  std::error_code ec;
  fs::create_directories(dest, ec);
  MOE_CHECK(!ec, "cannot create ", dest, ": ", ec.message());
  std::vector<std::string> later;
  for (const auto& [step, name] : list_steps(run_dir, "step-", false))
    if (step > intent.after_step) later.push_back(name);
  move_entries(run_dir, later, dest);
  if (also_move) also_move(dest, intent.after_step);
  fsync_dir(dest);
  fsync_dir(abandoned);
  fsync_dir(run_dir);
  MOE_CHECK(std::remove((run_dir + "/" + kIntentFile).c_str()) == 0, "cannot remove ", run_dir, "/", kIntentFile, ": ",
            errno_text());
  fsync_dir(run_dir);
  return dest;
}

}  // namespace

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& run_dir) {
  auto steps = list_steps(run_dir, "step-", /*complete=*/true);
  if (const std::optional<Intent> intent = read_intent(run_dir))
    steps.erase(std::remove_if(steps.begin(), steps.end(), [&](const auto& s) { return s.first > intent->after_step; }),
                steps.end());
  return steps;
}

namespace {

// What a folder without a complete checkpoint is instead, when that is recognizable: the reason
// the user's path is not one, in the words of what to do ("" when nothing is recognized).
std::string why_no_checkpoint(const std::string& dir) {
  if (const auto intent = read_intent(dir))
    return " (an interrupted set-aside, " + dir + "/" + kIntentFile + ", hides the checkpoints after step " +
           std::to_string(intent->after_step) + "; the next training run in this directory completes it)";
  const std::string name = fs::path(dir).filename().string();
  if (step_of_name(name, ".tmp-step-") || step_of_name(name, "step-"))
    return " (" + name + " is a checkpoint still being written, or one whose save was cut short: it has no "
           "index.json yet; give its run directory for the newest complete one)";
  std::error_code ec;
  if (fs::exists(dir + "/config.json", ec) &&
      (fs::exists(dir + "/model.safetensors", ec) || fs::exists(dir + "/model.safetensors.index.json", ec)))
    return " (it is a Hugging Face model folder: `moetrain import-hf " + dir +
           " OUT` makes a checkpoint of it; train --init-from reads it as it is)";
  return "";
}

}  // namespace

std::string damaged_newest_step(const std::string& run_dir) {
  const auto steps = list_checkpoints(run_dir);
  const int64_t newest = steps.empty() ? -1 : steps.back().first;
  const std::optional<Intent> intent = read_intent(run_dir);
  for (const auto& [step, name] : list_steps(run_dir, "step-", /*complete=*/false)) {
    if (step <= newest || (intent && step > intent->after_step)) continue;
    const std::string dir = run_dir + "/" + name;
    std::error_code ec;
    const bool indexed = fs::exists(dir + "/index.json", ec);
    if (ec) return dir + " cannot be read (" + ec.message() + ")";
    if (!indexed)
      return dir + " is newer than every complete checkpoint there but has no index.json (saves name a folder " +
             "step-N only once it is complete: it was damaged, or copied in unfinished)";
  }
  return "";
}

std::string resolve_checkpoint(const std::string& run_dir_or_ckpt) {
  std::string p = run_dir_or_ckpt;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::error_code ec;
  if (fs::is_directory(p, ec) && fs::exists(p + "/index.json", ec)) return p;  // a checkpoint (or a link to one)
  // "<run>/latest" names the run's newest checkpoint only where no such entry exists: a run
  // directory that is itself called `latest` is that directory.
  std::string run = p;
  if (fs::path(p).filename() == "latest" && !fs::exists(p, ec)) run = parent_dir(p);
  const bool exists = fs::exists(run, ec) || fs::is_symlink(run);
  MOE_CHECK(exists || ec, "cannot resolve checkpoint ", run_dir_or_ckpt, ": ", run, " does not exist");
  MOE_CHECK(!ec, "cannot resolve checkpoint ", run_dir_or_ckpt, ": ", ec.message());
  MOE_CHECK(fs::is_directory(run, ec), "cannot resolve checkpoint ", run_dir_or_ckpt,
            ": neither a checkpoint directory nor a run directory");
  const auto steps = list_checkpoints(run);
  const std::string damaged = damaged_newest_step(run);
  MOE_CHECK(damaged.empty(), "cannot resolve checkpoint ", run_dir_or_ckpt, ": ", damaged, "; move it out of ", run,
            steps.empty() ? std::string() : ", or name the checkpoint to use, e.g. " + run + "/" + steps.back().second);
  MOE_CHECK(!steps.empty(), "no complete checkpoint (step-*/index.json) in ", run, why_no_checkpoint(run));
  return run + "/" + steps.back().second;
}

int64_t checked_checkpoint_step(const CheckpointReader& ckpt) {
  const std::string& dir = ckpt.dir();
  const int64_t step = ckpt.train_state_int("step");
  MOE_CHECK(ckpt.step() == step, "checkpoint ", dir, ": index.json is of step ", ckpt.step(), " but train_state.json of ",
            "step ", step, "; its files do not belong together");
  std::string base = dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = fs::path(base).filename().string();
  if (base.rfind("step-", 0) == 0)
    MOE_CHECK(base == checkpoint_dir_name(step), "checkpoint ", dir, " holds step ", step, ", not the step its name says");
  return step;
}

std::string checkpoint_run_id(const std::string& ckpt_dir) {
  std::ifstream in(ckpt_dir + "/train_state.json");
  if (!in) return "";
  const nlohmann::json st =
      parse_bounded_json(in, ckpt_dir + "/train_state.json", nullptr, /*allow_exceptions=*/false);
  return st.is_object() && st.contains("run_id") && st["run_id"].is_string() ? st["run_id"].get<std::string>() : "";
}

namespace {

// A file a save writes into a checkpoint: its records, a rank's file, or the temp name one of them
// had while being written ("<name>.tmp-<pid>").
bool written_by_a_save(std::string name) {
  if (const size_t tmp = name.rfind(".tmp-"); tmp != std::string::npos && step_of_name(name.substr(tmp), ".tmp-"))
    name.resize(tmp);
  if (name == "index.json" || name == "train_state.json") return true;
  const std::string suffix = ".safetensors";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::optional<int64_t> rank = step_of_name(name.substr(0, name.size() - suffix.size()), "rank-");
  return rank && *rank <= INT32_MAX && name == rank_file_name(static_cast<int>(*rank));
}

// Whether a checkpoint folder, or a file in it, was made read-only (chmod a-w; for root too, who
// could remove it anyway), or this process cannot unlink its files. A link is judged as a link:
// removing it touches nothing it points to.
bool read_only(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return true;
  if (S_ISLNK(st.st_mode)) return false;
  if (!(st.st_mode & S_IWUSR) || ::access(dir.c_str(), W_OK | X_OK) != 0) return true;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (::lstat(entry.path().c_str(), &st) == 0 && !S_ISLNK(st.st_mode) && !(st.st_mode & S_IWUSR)) return true;
  return false;
}

}  // namespace

std::vector<std::string> files_no_save_wrote(const std::string& ckpt_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(ckpt_dir, ec);
  MOE_CHECK(!ec, "cannot list checkpoint ", ckpt_dir, ": ", ec.message());
  for (const auto& entry : it) {
    const std::string name = entry.path().filename().string();
    if (!written_by_a_save(name) || !entry.is_regular_file(ec) || entry.is_symlink(ec)) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

PruneOutcome prune_checkpoints(const std::string& run_dir, int keep_last, const std::string& run_id,
                               const std::string& protect) {
  MOE_CHECK(keep_last >= 0, "prune_checkpoints: keep_last must be >= 0, got ", keep_last);
  MOE_CHECK(!run_id.empty(), "prune_checkpoints: no run id to prune the line of");
  PruneOutcome outcome;
  if (keep_last == 0) return outcome;
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& step : list_checkpoints(run_dir)) {
    if (checkpoint_run_id(run_dir + "/" + step.second) == run_id)
      steps.push_back(step);
    else
      outcome.others.push_back(step.second);
  }
  if (steps.size() <= static_cast<size_t>(keep_last)) return outcome;
  std::error_code ec;
  const fs::path protected_path = protect.empty() ? fs::path() : fs::weakly_canonical(protect, ec);
  const size_t drop = steps.size() - static_cast<size_t>(keep_last);
  for (size_t i = 0; i < drop; ++i) {
    const std::string from = run_dir + "/" + steps[i].second;
    if (!protect.empty() && fs::weakly_canonical(from, ec) == protected_path) continue;
    std::vector<std::string> foreign;
    try {
      foreign = files_no_save_wrote(from);
    } catch (const Error&) {  // unreadable (chmod a-r, say): the user's to sort out, not a failed save
      outcome.kept_for_the_user.push_back(steps[i].second + " (it cannot be listed)");
      continue;
    }
    if (!foreign.empty()) {
      std::string names;
      for (size_t f = 0; f < foreign.size() && f < 3; ++f) names += (f ? ", " : "") + foreign[f];
      if (foreign.size() > 3) names += ", and " + std::to_string(foreign.size() - 3) + " more";
      outcome.kept_for_the_user.push_back(steps[i].second + " (it holds " + names + ")");
      continue;
    }
    // A checkpoint made read-only (chmod a-w) is the user's to keep, also for root, who could
    // remove it; for others its files could not be unlinked, and it would be left half removed.
    if (read_only(from)) {
      outcome.kept_for_the_user.push_back(steps[i].second + " (it is read-only)");
      continue;
    }
    // Rename first so a half-deleted directory never carries a step-* name.
    const std::string trash = run_dir + "/.trash-" + steps[i].second;
    if (fs::exists(trash, ec)) remove_tree(trash);
    MOE_CHECK(std::rename(from.c_str(), trash.c_str()) == 0, "cannot remove checkpoint ", from, ": ", errno_text());
    remove_tree(trash);
  }
  // Temp dirs of saves older than the oldest kept checkpoint can only be crash leftovers.
  const int64_t oldest_kept = steps[drop].first;
  for (const auto& [step, name] : list_steps(run_dir, ".tmp-step-", false))
    if (step < oldest_kept) remove_tree(run_dir + "/" + name);
  fsync_dir(run_dir);
  return outcome;
}

void remove_unfinished_saves(const std::string& run_dir) {
  for (const char* prefix : {".tmp-step-", ".trash-step-"})
    for (const auto& [step, name] : list_steps(run_dir, prefix, false)) remove_tree(run_dir + "/" + name);
}

std::string complete_pending_set_aside(const std::string& run_dir, const AlsoSetAside& also_move) {
  const std::optional<Intent> intent = read_intent(run_dir);
  return intent ? carry_out(run_dir, *intent, also_move) : std::string();
}

std::string set_aside_after(const std::string& run_dir, int64_t step, bool records_after_step,
                            const AlsoSetAside& also_move) {
  complete_pending_set_aside(run_dir, also_move);
  bool later = records_after_step;
  for (const auto& [s, name] : list_steps(run_dir, "step-", false)) {
    if (s <= step) continue;
    later = true;
    // Moving a folder to another parent rewrites its "..": a read-only one cannot move. Found
    // before anything moves, so no set-aside is left half done.
    const std::string path = run_dir + "/" + name;
    MOE_CHECK(fs::is_symlink(path) || ::access(path.c_str(), W_OK | X_OK) == 0, "cannot set aside ", path,
              " (after the resumed step ", step, ": it leaves the run's line, into ", run_dir,
              "/abandoned/): it is read-only; make it writable, or move it out of the run directory yourself");
  }
  if (!later) return "";
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, "-after-step-%06lld", static_cast<long long>(step));
  const Intent intent{step, unused_timestamped_name(run_dir + "/abandoned", suffix)};
  write_file_atomic(run_dir + "/" + kIntentFile,
                    nlohmann::json{{"after_step", intent.after_step}, {"dir", intent.dir}}.dump() + "\n");
  return carry_out(run_dir, intent, also_move);
}

bool is_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  return fs::exists(p / "index.json", ec) && fs::exists(p / "train_state.json", ec);
}

std::string enclosing_checkpoint(const std::string& path) {
  std::error_code ec;
  // Through links (a `best -> run/step-000100` link names that checkpoint), and whatever the
  // folder's name (a copied or renamed checkpoint is one all the same).
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::absolute(path, ec).lexically_normal();
  for (p = p.parent_path(); !p.empty(); p = p.parent_path()) {
    if (is_checkpoint_dir(p.string())) return p.string();
    if (p == p.parent_path()) break;
  }
  return "";
}

}  // namespace moe
