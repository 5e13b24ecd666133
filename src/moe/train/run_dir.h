// The run directory of a training job (run.dir): who may use it, and what a run writes there.
//
//   <run>/.lock             held by the job's rank 0 while it runs (pid, host, start time)
//   <run>/config.toml       the resolved config of the latest start (every key); config.resolved.toml
//                           when the user keeps a config.toml of their own there (never moved or
//                           overwritten: moetrain's carry kConfigHeader as their first line)
//   <run>/metrics.jsonl     one record per logged step of the current line
//   <run>/tensorboard/      the same records as TensorBoard events, with run.tensorboard (train/tensorboard_writer.h)
//   <run>/step-XXXXXX/      checkpoints of the current line (ckpt/run_checkpoints.h)
//   <run>/abandoned/...     what a resume from an older step set aside (never deleted)
//   <run>/replaced/...      a previous run's files moved aside by --overwrite (never deleted); an
//                           input of the new run (its --config, a data file) among them is refused
//
// Rules: a fresh run into a directory that holds a run is refused, unless told to continue it
// (--resume latest, run.resume = "auto") or to set it aside (--overwrite); a resume from a
// checkpoint of another directory into one holding a run is refused the same way; a second job
// in a directory whose lock is held by a live process is refused; a lock whose process is gone
// (same host) is reported and taken over.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moe/train/config.h"
#include "moe/train/metrics.h"
#include "moe/train/run_lock.h"
#include "moe/train/tensorboard_writer.h"

namespace moe {

// The checkpoint a run continues from: `resume` ("" = none, "latest" = the run directory's
// newest, or a checkpoint / run directory) or, with run.resume = "auto", the run directory's
// newest when one exists. Returns the checkpoint directory, or "" for a fresh start.
std::string resume_source(const std::string& resume, const Config& cfg);

struct RunStart {
  std::string resumed_from;  // checkpoint directory, "" for a fresh start
  int64_t step = 0;          // the step the run starts after
  bool overwrite = false;    // set a previous run in the directory aside instead of refusing
  bool auto_resume = false;  // run.resume = "auto": with no checkpoint to continue, start afresh
  std::string config_file;   // the --config file the config was read from ("" or "tiny": the built-in)
};

// True when `inner` is `outer` or lies below it (after resolving symlinks where they exist).
bool path_lies_inside(const std::string& inner, const std::string& outer);

class RunDirectory {
 public:
  // Rank 0 of a training job, after the config, data and checkpoint have been validated: checks
  // the directory may be used and takes its lock (creating the directory if need be). Throws
  // naming the directory otherwise, with nothing written. Nothing is moved or written beyond the
  // lock until claim(): the other ranks first check that they see that lock (a run.dir their
  // filesystem does not share with rank 0's must not have moved or written anything).
  RunDirectory(const Config& cfg, const RunStart& start);
  // Releases the lock; a directory this start created and never claimed is removed with it
  // (only its lock was there), and so are the parents it created for it.
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  // Sets aside what the start leaves behind (or, with overwrite, the previous run), writes
  // config.toml and opens the metrics. Once, with the constructor's cfg and start.
  void claim(const Config& cfg, const RunStart& start);

  const std::string& path() const { return dir_; }
  // Where the resolved config went: config.toml, or config.resolved.toml beside a user's own.
  const std::string& config_path() const { return config_path_; }
  // Appends one metrics record to metrics.jsonl and, with run.tensorboard, to the run's
  // TensorBoard event file; throws naming the file that cannot be written.
  void write_record(const nlohmann::json& record);
  // Where something was moved at start-up (for the log), or "".
  const std::string& set_aside() const { return set_aside_; }
  // Whether that was --overwrite moving the previous run (rather than a resume's later steps).
  bool replaced_previous_run() const { return replaced_previous_run_; }

 private:
  void remove_created();  // the folders in created_, innermost first, each only while empty

  std::string dir_;
  std::string held_;     // what the directory held before this start (run_contents), "" if nothing
  std::vector<std::string> created_;  // the folders this start made (run.dir, missing parents), innermost first
  bool claimed_ = false;
  bool replaced_previous_run_ = false;
  std::unique_ptr<RunLock> lock_;
  std::string config_path_;
  std::string set_aside_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;  // null unless run.tensorboard
};

}  // namespace moe
