// Shared helpers for trainer tests: a small fast config and a temporary run directory.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "moe/comm/local_communicator.h"
#include "moe/train/config.h"

namespace moe::testing {

// The world of a single-process run.
inline Communicator& local_world() {
  static LocalCommunicator world;
  return world;
}

// A temp directory removed when the object goes away.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/moetrain-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// The built-in tiny config shrunk so a step takes milliseconds, on the CPU (these tests check the
// CPU path bit for bit; on a machine with a GPU, run.device = auto would move them there). A
// later run.device in `extra` wins.
inline Config small_config(const std::string& run_dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {"model.hidden_size=32",        "model.intermediate_size=32",
                                "train.seq_len=32",            "train.micro_batch_size=2",
                                "train.global_batch_size=4",   "train.warmup_steps=2",
                                "train.eval_every=0",          "train.log_every=1",
                                "data.synthetic_tokens=50000", "data.synthetic_eval_tokens=5000",
                                "run.device=\"cpu\"",         "run.dir=\"" + run_dir + "\""};
  o.insert(o.end(), extra.begin(), extra.end());
  return load_config("tiny", o);
}

}  // namespace moe::testing
