#include "moe/train/run_dir.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moe/ckpt/durable_file.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/core/error.h"
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
    if (name.rfind("step-", 0) == 0 && e.is_directory(ec)) {
      ++checkpoints;
      newest = std::max<int64_t>(newest, std::atoll(name.c_str() + 5));
    } else if (name.rfind(".tmp-step-", 0) == 0) {
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

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

// Moves the previous run's files into <dir>/replaced/<time>/ (--overwrite: nothing is deleted).
std::string move_previous_run(const std::string& dir) {
  const std::string dest = dir + "/replaced/" + unused_timestamped_name(dir + "/replaced", "");
  std::error_code ec;
  fs::create_directories(dest, ec);
  MOE_CHECK(!ec, "cannot create ", dest, ": ", ec.message());
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const bool run_file = name.rfind("step-", 0) == 0 || name.rfind(".tmp-step-", 0) == 0 ||
                          name == "metrics.jsonl" || name == "metrics.jsonl.partial" || name == "config.toml" ||
                          name == ".set-aside.json" || name == "abandoned" || name == "tensorboard";
    if (!run_file) continue;
    const std::string to = dest + "/" + name;
    MOE_CHECK(std::rename(e.path().c_str(), to.c_str()) == 0, "cannot move ", e.path().string(), " to ", to, ": ",
              errno_text());
  }
  fsync_dir(dest);
  fsync_dir(dir);
  return dest;
}

}  // namespace

std::string resume_source(const std::string& resume, const Config& cfg) {
  if (resume == "latest") return resolve_checkpoint(cfg.run_dir());
  if (!resume.empty()) return resolve_checkpoint(resume);
  if (cfg.run.resume == "auto") {
    std::error_code ec;
    if (fs::is_directory(cfg.run_dir(), ec) && !list_checkpoints(cfg.run_dir()).empty())
      return resolve_checkpoint(cfg.run_dir());
  }
  return "";
}

RunDirectory::RunDirectory(const Config& cfg, const RunStart& start) : dir_(cfg.run_dir()) {
  std::error_code ec;
  MOE_CHECK(!fs::exists(dir_, ec) || fs::is_directory(dir_, ec), "run.dir '", dir_, "' exists and is not a directory");
  for (const char* name : {"metrics.jsonl", "config.toml", ".lock"})
    MOE_CHECK(!fs::exists(dir_ + "/" + name, ec) || fs::is_regular_file(dir_ + "/" + name, ec), "run.dir '", dir_,
              "' holds '", name, "', which is not a file: moetrain writes that name; move it away or choose another "
              "run.dir");
  MOE_CHECK(!(start.overwrite && !start.resumed_from.empty()), "--overwrite starts afresh, --resume continues: give "
            "one of them");
  // Refusals first: nothing is created or moved before the directory is known to be usable.
  const std::string held = run_contents(dir_);
  const bool continues_this_run = !start.resumed_from.empty() && same_directory(parent_dir(start.resumed_from), dir_);
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
             " belongs to another directory; choose another run.dir, or pass --overwrite to move the run's files into ",
             dir_, "/replaced/ first");
  }
  fs::create_directories(dir_, ec);
  MOE_CHECK(!ec, "cannot create run directory '", dir_, "' (run.dir): ", ec.message());
  lock_ = std::make_unique<RunLock>(dir_ + "/.lock");
  claim(cfg, start, held);
}

void RunDirectory::claim(const Config& cfg, const RunStart& start, const std::string& held) {
  const std::string metrics_path = dir_ + "/metrics.jsonl";
  const std::string tensorboard_dir = dir_ + "/tensorboard";
  // Saves that never finished (a crash mid-save or mid-prune) are garbage, whatever their step:
  // this job holds the lock, so no other job is writing them.
  remove_unfinished_saves(dir_);
  if (start.overwrite && !held.empty()) {
    set_aside_ = move_previous_run(dir_);
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
  // config.toml: the resolved config of this start, unless the user keeps a config.toml of their
  // own there (moetrain's carries its header line), which is never overwritten.
  config_path_ = dir_ + "/config.toml";
  const std::string header = std::string(kConfigHeader) + "\n";
  std::error_code ec;
  if (fs::exists(config_path_, ec)) {
    std::ifstream in(config_path_);
    std::string first;
    std::getline(in, first);
    if (first + "\n" != header) config_path_ = dir_ + "/config.resolved.toml";
  }
  write_file_atomic(config_path_, header + config_to_toml(cfg));
  metrics_ = std::make_unique<MetricsLog>(metrics_path);
  if (cfg.run.tensorboard) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
}

void RunDirectory::write_record(const nlohmann::json& record) {
  metrics_->write(record);
  if (tensorboard_) tensorboard_->write(record);
}

RunDirectory::~RunDirectory() = default;

}  // namespace moe
