// import-hf: a Hugging Face OLMoE folder (config.json with model.safetensors or a sharded
// model.safetensors.index.json) -> a moetrain run folder with a step-0 checkpoint.
//
// Everything is checked before anything is written (HfModel, hf_model.h: config.json key by
// key, every file it reads lies inside the model folder, the tensors are exactly those that
// config.json implies). The run folder is then assembled under a fresh name next to the output
// and renamed into place, so an error leaves the output as it was. Tensors stream one logical
// tensor at a time through host memory.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/ckpt/durable_file.h"
#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/core/interrupt_guard.h"
#include "moe/model/weights.h"
#include "moe/train/config.h"
#include "moe/train/hf_interop.h"
#include "moe/train/hf_model.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

using nlohmann::json;

// The output run folder, assembled under a fresh name next to it and renamed into place by
// commit(). Until then the output is as it was (absent, or the empty folder it was); parents
// created for it are removed again when import fails.
class StagedRunDir {
 public:
  explicit StagedRunDir(const fs::path& out) : out_(out), parent_(out.has_parent_path() ? out.parent_path() : ".") {
    for (fs::path p = parent_; !p.empty() && !fs::exists(fs::symlink_status(p)); p = p.parent_path())
      created_.push_back(p);  // deepest first
    try {
      std::error_code ec;
      fs::create_directories(parent_, ec);
      MOE_CHECK(!ec, "import-hf: cannot create ", parent_.string(), ": ", ec.message());
      // A name no one else uses: mkdir fails rather than reuse an existing entry.
      const std::string stem =
          (parent_ / ".").string() + out.filename().string() + ".import-" + std::to_string(::getpid());
      for (int attempt = 0;; ++attempt) {
        staging_ = stem + "-" + std::to_string(attempt);
        if (::mkdir(staging_.c_str(), 0777) == 0) break;
        MOE_CHECK(errno == EEXIST && attempt < 100, "import-hf: cannot create ", staging_, ": ", errno_text());
      }
    } catch (...) {
      staging_.clear();
      abandon();
      throw;
    }
  }
  ~StagedRunDir() {
    if (!committed_) abandon();
  }
  StagedRunDir(const StagedRunDir&) = delete;
  StagedRunDir& operator=(const StagedRunDir&) = delete;

  const std::string& path() const { return staging_; }
  void commit() {
    // rename() replaces an empty folder and fails on one that is not empty, so files that
    // appeared in the output meanwhile are never overwritten.
    if (::rename(staging_.c_str(), out_.c_str()) != 0) {
      const std::string why = errno_text();
      MOE_FAIL("import-hf: cannot move ", staging_, " to ", out_.string(), ": ", why);
    }
    committed_ = true;
    fsync_dir(parent_.string());
  }

 private:
  void abandon() noexcept {
    std::error_code ec;
    if (!staging_.empty()) fs::remove_all(staging_, ec);
    for (const fs::path& p : created_) fs::remove(p, ec);  // only while empty: never others' files
  }

  fs::path out_, parent_;
  std::vector<fs::path> created_;
  std::string staging_;
  bool committed_ = false;
};

// A run's name from its folder's: run.dir is given, so any plain name serves, but config.toml's
// name must be one (letters, digits, '.', '_', '-'): other characters become '_' (a folder
// "my run" gave name = "my run", which every later start refused).
std::string run_name_of(const std::string& folder) {
  std::string name = folder;
  for (size_t at = name.find_first_not_of(kRunNameCharacters); at != std::string::npos;
       at = name.find_first_not_of(kRunNameCharacters, at + 1))
    name[at] = '_';
  return name;
}

ImportResult import_checked(const std::string& hf_dir, const std::string& out_run_dir, std::string& doing,
                            const HfProgress& progress) {
  const fs::path out = output_folder(out_run_dir, "import-hf");  // "run/" names "run"; "." is refused
  // The source is recorded in train_state.json (JSON text): a path that is not UTF-8 failed there,
  // after the rank file was written.
  MOE_CHECK(is_valid_utf8(hf_dir), "import-hf: the model folder '", printable(hf_dir),
            "' is not valid UTF-8 (the checkpoint records it as UTF-8 text); rename it or link it under a UTF-8 name");
  std::error_code ec;
  const std::string inside = enclosing_checkpoint(out.string());
  MOE_CHECK(inside.empty(), "import-hf: output '", out_run_dir, "' is inside the checkpoint ", inside,
            "; nothing is written into a checkpoint: choose a folder outside it");
  const fs::file_status out_status = fs::symlink_status(out, ec);
  if (fs::exists(out_status)) {
    // A symbolic link is refused as it is (the import renames its result into place, which would
    // replace the link, not fill the folder it points to).
    MOE_CHECK(!fs::is_symlink(out_status), "import-hf: output '", out_run_dir,
              "' is a symbolic link; give the folder itself, or a new path");
    MOE_CHECK(fs::is_directory(out_status), "import-hf: output '", out_run_dir,
              "' exists and is not a directory; choose a new directory");
    MOE_CHECK(fs::is_empty(out, ec) && !ec, "import-hf: output '", out_run_dir,
              "' exists and is not empty; choose a new directory");
  }

  doing = "reading " + hf_dir;
  const HfModel model(hf_dir, "import-hf");
  const ModelConfig& mc = model.model();

  const ParamRegistry reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByReplicaGroup);
  ImportResult r;
  r.fused_experts = model.fused_experts();
  // The slices of one rank-0 file: weights (produced from the HF tensors) and zero moments.
  std::vector<CheckpointSlice> slices;
  std::vector<bool> is_weight;
  int64_t weight_bytes = 0, read_bytes = 0;  // the weights' FP32 bytes, in all and read so far
  for (const ParamEntry& e : reg.entries()) {
    const int64_t n = e.global_shape.numel();
    weight_bytes += n * 4;
    const std::vector<int64_t> shape(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"}) {
      slices.push_back({e.name + suffix, DType::F32, shape, 0, n, nullptr});
      is_weight.push_back(*suffix == '\0');
    }
  }
  // Ctrl-C, SIGTERM or SIGHUP once the output is being written stop the import at the next
  // tensor; the staging folder (made after the guard) is removed before the handlers are back.
  InterruptGuard interrupt("import-hf");
  std::string undone;  // set once the staging folder exists
  auto produce = [&](size_t s, void* dst_bytes) {
    interrupt.check(undone);
    float* dst = static_cast<float*>(dst_bytes);
    const CheckpointSlice& slice = slices[s];
    const int64_t n = slice.end - slice.begin;
    if (!is_weight[s]) {
      std::memset(dst, 0, static_cast<size_t>(n) * 4);
      return;
    }
    doing = "reading tensor '" + slice.key + "' of " + hf_dir;
    model.read(slice.key, 0, n, dst);
    read_bytes += n * 4;
    if (progress) progress(read_bytes, weight_bytes);
    // Test hook: wait here, the staging folder written to, for a signal (tests/cli/hf_interop_test.cpp);
    // at most a minute, so a test that fails to send one leaves no process behind for long.
    if (s == 0 && std::getenv("MOE_TEST_HF_PAUSE")) ::sleep(60);
  };

  Config cfg;
  cfg.name = run_name_of(out.filename().string());
  cfg.model = mc;
  // Absolute, so the printed "continue with" command works from any directory.
  cfg.run.dir = fs::absolute(out).lexically_normal().string();
  MOE_CHECK(is_valid_utf8(cfg.run.dir), "import-hf: the output's absolute path '", printable(cfg.run.dir),
            "' is not valid UTF-8 (config.toml records it as run.dir); choose a UTF-8 path");
  const std::string config_text = config_to_toml(cfg);
  json st;
  st["step"] = 0;
  st["skipped_steps"] = 0;
  st["source"] = {{"import_hf", hf_dir}, {"note", "AdamW moments start at zero"}};
  st["model_config"] = model_config_toml(mc);
  st["config"] = config_text;

  doing = "creating the output folder " + out.string();
  StagedRunDir staged(out);
  undone = "it removed its staging folder " + staged.path() + ", so " + out.string() + " is as it was before";
  doing = "writing " + staged.path();
  const std::string checkpoint_tmp = begin_checkpoint(staged.path(), 0);
  const std::vector<CheckpointChunk> chunks = write_rank_file(checkpoint_tmp, 0, slices, produce);
  doing = "writing the index and config.toml in " + staged.path();
  write_checkpoint_index(checkpoint_tmp, 0, chunks, st);
  commit_checkpoint(staged.path(), 0);
  write_file_atomic(staged.path() + "/config.toml", config_text);
  interrupt.check(undone);
  staged.commit();
  r.tensors = static_cast<int64_t>(reg.entries().size());
  r.checkpoint_dir = (out / checkpoint_dir_name(0)).string();
  r.config_path = (out / "config.toml").string();
  return r;
}

}  // namespace

ImportResult import_hf(const std::string& hf_dir, const std::string& out_run_dir, const HfProgress& progress) {
  // Errors of moetrain name their file and key already; those of libraries (a JSON type
  // error, an allocation failure, a filesystem call) get what was being done when they came.
  std::string doing = "starting";
  try {
    return import_checked(hf_dir, out_run_dir, doing, progress);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    MOE_FAIL("import-hf: out of memory while ", doing);
  } catch (const std::exception& e) {
    MOE_FAIL("import-hf: ", doing, ": ", e.what());
  }
}

}  // namespace moe
