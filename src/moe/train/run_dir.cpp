#include "moe/train/run_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "moe/ckpt/durable_file.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/core/error.h"
#include "moe/data/token_sources.h"
#include "moe/train/run_lock.h"

namespace moe {

namespace fs = std::filesystem;

namespace {

// The run files a directory holds (checkpoints, a save in progress, metrics), for messages; ""
// when it holds none.
std::string run_contents(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return "";
  int64_t checkpoints = 0, newest = -1, partial = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (const std::optional<int64_t> step = checkpoint_step_of_name(name, "step-"); step && e.is_directory(ec)) {
      ++checkpoints;
      newest = std::max(newest, *step);
    } else if (checkpoint_step_of_name(name, ".tmp-step-")) {
      ++partial;
    }
  }
  const std::string metrics = dir + "/metrics.jsonl";
  const bool has_metrics = fs::exists(metrics, ec) && fs::file_size(metrics, ec) > 0;
  std::string what;
  if (checkpoints > 0)
    what += std::to_string(checkpoints) + " checkpoint" + (checkpoints == 1 ? "" : "s") + " (newest step " +
            std::to_string(newest) + ")";
  if (partial > 0) what += std::string(what.empty() ? "" : ", ") + "an unfinished save";
  if (has_metrics) what += std::string(what.empty() ? "" : ", ") + "metrics.jsonl";
  return what;
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// The resolved config goes to config.toml; beside a user's own config.toml, to config.resolved.toml.
constexpr const char* kConfigName = "config.toml";
constexpr const char* kResolvedConfigName = "config.resolved.toml";

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal().string() : p.string();
}

// True when the file at `path` is a config moetrain wrote and nobody edited since: its first line
// is kConfigHeader and the rest is exactly what moetrain writes, or an older moetrain wrote, for the
// config it holds. One with a hand edit or a comment is the user's now, and is not rewritten or moved.
bool written_by_moetrain(const std::string& path) {
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  if (first != kConfigHeader) return false;
  std::ostringstream rest;
  rest << in.rdbuf();
  return written_config_text(rest.str());
}

bool exists_not_by_moetrain(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec) && !written_by_moetrain(path);
}

// Where this start writes its resolved config: config.toml, unless that name holds a file of the
// user's (one moetrain did not write, or one edited since, or this start's own --config, which
// the user may have edited); then config.resolved.toml on the same terms; "" when both are the
// user's.
std::string resolved_config_path(const std::string& dir, const std::string& config_file) {
  for (const char* name : {kConfigName, kResolvedConfigName}) {
    const std::string path = dir + "/" + name;
    if (exists_not_by_moetrain(path) || (!config_file.empty() && same_file(config_file, path))) continue;
    return path;
  }
  return "";
}

// What --overwrite moves aside: the previous run's checkpoints (and unfinished saves), its records,
// what it had set aside itself, and the configs moetrain wrote. A config.toml of the user's own is
// not the previous run's: it stays.
std::vector<fs::path> previous_run_entries(const std::string& dir) {
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool run_file = checkpoint_step_of_name(name, "step-") || checkpoint_step_of_name(name, ".tmp-step-") ||
                          name == "metrics.jsonl" || name == "metrics.jsonl.partial" || name == ".set-aside.json" ||
                          name == "abandoned" || name == "tensorboard" ||
                          ((name == kConfigName || name == kResolvedConfigName) && written_by_moetrain(e.path()));
    if (run_file) entries.push_back(e.path());
  }
  return entries;
}

// The files this run reads, each with the flag or key that names it: the --config file and the
// token data (a glob's matches; a file or folder as given). The synthetic corpus and the built-in
// config have no file.
std::vector<std::pair<std::string, std::string>> run_inputs(const Config& cfg, const std::string& config_file) {
  std::vector<std::pair<std::string, std::string>> inputs;
  if (!config_file.empty() && config_file != "tiny") inputs.emplace_back("--config", config_file);
  const auto data = [&](const std::string& key, const std::string& path) {
    if (path.find_first_of("*?[") == std::string::npos) {
      inputs.emplace_back(key, path);
      return;
    }
    for (const TokenFile& f : source_files(path, cfg.data.format, key)) inputs.emplace_back(key, f.path);
  };
  if (cfg.data.sources.empty() && cfg.data.path != "synthetic") data("data.path", cfg.data.path);
  for (size_t i = 0; i < cfg.data.sources.size(); ++i)
    data("data.sources[" + std::to_string(i) + "].path", cfg.data.sources[i].path);
  for (size_t i = 0; i < cfg.eval.sets.size(); ++i)
    data("eval.sets[" + std::to_string(i) + "].path", cfg.eval.sets[i].path);
  return inputs;
}

// --overwrite must not carry away what this very run reads: refused naming both paths.
void refuse_moving_inputs(const std::string& dir, const std::vector<fs::path>& entries,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const fs::path& entry : entries)
    for (const auto& [key, input] : inputs) {
      if (!path_lies_inside(input, entry.string())) continue;
      const bool same = absolute_path(input) == absolute_path(entry.string());
      MOE_FAIL("--overwrite would move ", entry.string(), " into ", dir, "/replaced/ with the rest of the previous "
               "run, but ", same ? "it is" : "it holds", " this run's ", key, " ", input,
               "; copy that out of run.dir and point ", key, " at the copy, or choose another run.dir (nothing was "
               "moved)");
    }
}

// Moves the previous run's files into <dir>/replaced/<time>/ (--overwrite: nothing is deleted;
// links keep naming what they named, move_entries).
std::string move_previous_run(const std::string& dir) {
  const std::string dest = dir + "/replaced/" + unused_timestamped_name(dir + "/replaced", "");
  std::error_code ec;
  fs::create_directories(dest, ec);
  MOE_CHECK(!ec, "cannot create ", dest, ": ", ec.message());
  std::vector<std::string> names;
  for (const fs::path& entry : previous_run_entries(dir)) names.push_back(entry.filename().string());
  move_entries(dir, names, dest);
  fsync_dir(dest);
  fsync_dir(dir);
  return dest;
}

// Continuing a run in its directory must not mix it with another run's checkpoints found there
// (copied in by hand, say): --resume latest would pick whichever is newest, and keep_last would
// prune around it. Checkpoints without a run id (import-hf's) belong to no run and are left out.
void refuse_mixed_runs(const std::string& dir, const std::string& resumed_from) {
  const std::string id = checkpoint_run_id(resumed_from);
  if (id.empty()) return;
  for (const auto& checkpoint : list_checkpoints(dir)) {
    const std::string& name = checkpoint.second;
    const std::string other = checkpoint_run_id(dir + "/" + name);
    MOE_CHECK(other.empty() || other == id, "run.dir '", dir, "' holds checkpoints of two runs: ", resumed_from,
              " (run id ", id, ") and ", dir, "/", name, " (run id ", other,
              "); continuing would mix them. Move one run's checkpoints into a directory of its own and resume "
              "from there");
  }
}

}  // namespace

bool path_lies_inside(const std::string& inner, const std::string& outer) {
  const fs::path rel = fs::path(absolute_path(inner)).lexically_relative(absolute_path(outer));
  return !rel.empty() && *rel.begin() != "..";
}

std::string resume_source(const std::string& resume, const Config& cfg) {
  if (resume == "latest") return resolve_checkpoint(cfg.run_dir());
  if (!resume.empty()) return resolve_checkpoint(resume);
  if (cfg.run.resume == "auto") {
    std::error_code ec;
    // A damaged newest step-N is refused by resolve_checkpoint, not taken for "no checkpoint".
    if (fs::is_directory(cfg.run_dir(), ec) &&
        (!list_checkpoints(cfg.run_dir()).empty() || !damaged_newest_step(cfg.run_dir()).empty()))
      return resolve_checkpoint(cfg.run_dir());
  }
  return "";
}

RunDirectory::RunDirectory(const Config& cfg, const RunStart& start) : dir_(cfg.run_dir()) {
  std::error_code ec;
  MOE_CHECK(!fs::exists(dir_, ec) || fs::is_directory(dir_, ec), "run.dir '", dir_, "' exists and is not a directory");
  // A checkpoint is never written into: a run's records and checkpoints inside another run's
  // checkpoint would be mixed with its files, and deleted with it when that run prunes it.
  const bool is_one = is_checkpoint_dir(dir_);
  std::string checkpoint = is_one ? fs::weakly_canonical(fs::absolute(dir_), ec).string() : enclosing_checkpoint(dir_);
  if (is_one && checkpoint.empty()) checkpoint = dir_;  // named as given when it cannot be resolved
  MOE_CHECK(checkpoint.empty(), "run.dir '", dir_, "' ", is_one ? "is the checkpoint " : "is inside the checkpoint ",
            checkpoint, "; nothing is written into a checkpoint: choose a run.dir outside it");
  for (const char* name : {"metrics.jsonl", kConfigName, kResolvedConfigName, ".lock"})
    MOE_CHECK(!fs::exists(dir_ + "/" + name, ec) || fs::is_regular_file(dir_ + "/" + name, ec), "run.dir '", dir_,
              "' holds '", name, "', which is not a file: moetrain writes that name; move it away or choose another "
              "run.dir");
  // A save renames its folder onto step-<N>: anything else under that name, for a step this run
  // may save, would fail the run at that save, after the steps since the last one. (A folder of
  // that name is a checkpoint, or is refused below as a run's files; --overwrite moves it aside.)
  if (fs::is_directory(dir_, ec) && !start.overwrite)
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const std::optional<int64_t> step = checkpoint_step_of_name(name, "step-");
      MOE_CHECK(!step || *step <= start.step || *step > cfg.train.steps || e.is_directory(ec), "run.dir '", dir_,
                "' holds '", name,
                "', which is not a folder: moetrain gives that name to the checkpoint of step ", *step,
                " and would fail to save it; move it away or choose another run.dir");
    }
  // --resume with --overwrite is refused on the command line; here run.resume = "auto" found a checkpoint.
  MOE_CHECK(!(start.overwrite && !start.resumed_from.empty()), "--overwrite starts afresh, but run.resume = \"auto\" "
            "continues from ", start.resumed_from, ": drop --overwrite, or set run.resume = \"no\"");
  // Refusals first: nothing is created or moved before the directory is known to be usable.
  held_ = run_contents(dir_);
  const std::string& held = held_;
  const bool continues_this_run = !start.resumed_from.empty() && same_directory(parent_dir(start.resumed_from), dir_);
  if (continues_this_run) refuse_mixed_runs(dir_, start.resumed_from);
  // run.resume = "auto" found no checkpoint: an earlier attempt that never saved one left only
  // records, which a fresh start sets aside.
  const bool auto_fresh = start.resumed_from.empty() && start.auto_resume && (!fs::is_directory(dir_, ec) || list_checkpoints(dir_).empty());
  if (!held.empty() && !continues_this_run && !start.overwrite && !auto_fresh) {
    // Without a complete checkpoint there is nothing for --resume latest to continue: say what works.
    if (start.resumed_from.empty() && list_checkpoints(dir_).empty())
      MOE_FAIL("run.dir '", dir_, "' already holds a run (", held,
               ") without a complete checkpoint to continue from; start it afresh with run.resume = \"auto\" (its "
               "records are set aside in the directory) or --overwrite (its files move into ", dir_,
               "/replaced/), or choose another run.dir");
    if (start.resumed_from.empty())
      MOE_FAIL("run.dir '", dir_, "' already holds a run (", held,
               "); continue it with --resume latest (or run.resume = \"auto\"), choose another run.dir, or pass "
               "--overwrite to move its files into ", dir_, "/replaced/ and start afresh");
    MOE_FAIL("run.dir '", dir_, "' already holds a run (", held, ") and the resume checkpoint ", start.resumed_from,
             " belongs to another directory; continue from it in a new run.dir");
  }
  // The resolved config needs a name that holds none of the user's files (chosen once, here;
  // claim writes it).
  config_path_ = resolved_config_path(dir_, start.config_file);
  MOE_CHECK(!config_path_.empty(), "run.dir '", dir_, "' holds a ", kConfigName,
            " and a ", kResolvedConfigName, " that are yours (moetrain did not write them, or they were edited since, "
            "or one is this start's --config); it writes the run's resolved config under one of these names and never "
            "over a file of yours: move one of them out of run.dir");
  if (start.overwrite && !held.empty())
    refuse_moving_inputs(dir_, previous_run_entries(dir_), run_inputs(cfg, start.config_file));
  // The folders this start makes (run.dir and any missing parents), innermost first.
  fs::path innermost = fs::absolute(dir_, ec).lexically_normal();
  if (!innermost.has_filename()) innermost = innermost.parent_path();  // "run/" and "run/." name run
  for (fs::path p = innermost; !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    created_.push_back(p.string());
    if (p == p.parent_path()) break;
  }
  fs::create_directories(dir_, ec);
  MOE_CHECK(!ec, "cannot create run directory '", dir_, "' (run.dir): ", ec.message());
  try {
    lock_ = std::make_unique<RunLock>(dir_ + "/.lock");
  } catch (...) {
    remove_created();  // no destructor runs for a constructor that throws
    throw;
  }
}

void RunDirectory::claim(const Config& cfg, const RunStart& start) {
  MOE_CHECK(!claimed_, "run.dir '", dir_, "' is claimed once");
  const std::string metrics_path = dir_ + "/metrics.jsonl";
  const std::string tensorboard_dir = dir_ + "/tensorboard";
  // Saves that never finished (a crash mid-save or mid-prune) are garbage, whatever their step:
  // this job holds the lock, so no other job is writing them.
  remove_unfinished_saves(dir_);
  if (start.overwrite && !held_.empty()) {
    set_aside_ = move_previous_run(dir_);
    replaced_previous_run_ = true;
  } else {
    // Whatever the old line holds after the resume step (or, for a fresh start, after step 0)
    // leaves the current line: pruning and --resume latest must never see it again.
    // The TensorBoard events of that line go with it, whether or not this run writes any.
    const AlsoSetAside move_records = [&](const std::string& dest, int64_t after) {
      move_metrics_after(metrics_path, after, dest);
      move_tensorboard_events_after(tensorboard_dir, after, dest);
    };
    complete_pending_set_aside(dir_, move_records);  // first: what it moves is not "after" any more
    const bool records_after =
        metrics_after(metrics_path, start.step) || tensorboard_events_after(tensorboard_dir, start.step);
    set_aside_ = set_aside_after(dir_, start.step, records_after, move_records);
  }
  const std::string header = std::string(kConfigHeader) + "\n";
  write_file_atomic(config_path_, header + config_to_toml(cfg));
  metrics_ = std::make_unique<MetricsLog>(metrics_path);
  if (cfg.run.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
  claimed_ = true;
}

void RunDirectory::write_record(const nlohmann::json& record) {
  metrics_->write(record);
  if (tensorboard_) tensorboard_->write(record);
}

RunDirectory::~RunDirectory() {
  // A start that ends before its claim is done (ranks that do not share run.dir, a full disk
  // refusing config.toml) leaves no run directory it made, nor the parents it made for it: only
  // its lock can be in it, and an empty run.dir would look like a run that was started.
  lock_.reset();  // removes the lock file
  if (!claimed_) remove_created();
}

void RunDirectory::remove_created() {
  std::error_code ec;
  for (const std::string& d : created_)  // innermost first; each only if empty: whatever else is there stays
    if (!fs::remove(d, ec)) break;
}

}  // namespace moe
