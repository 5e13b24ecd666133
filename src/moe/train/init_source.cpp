#include "moe/train/init_source.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "moe/ckpt/run_checkpoints.h"
#include "moe/core/device.h"
#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/train/run_dir.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
  return ec ? fs::absolute(path).lexically_normal().string() : p.string();
}

}  // namespace

const std::vector<std::string>& fine_tuning_model_keys() {
  static const std::vector<std::string> keys = {
      "model.router_aux_loss_coef", "model.router_z_loss_coef", "model.routing",  "model.bias_update_rate",
      "model.capacity_factor",      "model.dropless",           "model.init_std", "model.eos_token_id"};
  return keys;
}

std::string init_from_conflict(const std::string& init_from, const std::string& resume, const Config& cfg) {
  if (init_from.empty()) return "";
  if (!resume.empty())
    return "--init-from starts a new run from other weights and --resume continues a run; give one of them (a "
           "resumed run keeps the weights its own checkpoint holds)";
  const std::string run_dir = cfg.run_dir();
  if (path_lies_inside(init_from, run_dir))
    return "--init-from " + init_from + " lies inside run.dir '" + run_dir +
           "', but a new run does not start from weights in its own directory (--overwrite would move them aside); "
           "to continue that run use --resume, to fine-tune from it choose another run.dir";
  if (cfg.run.resume == "auto") {
    const std::string found = resume_source("", cfg);
    if (!found.empty())
      return "--init-from starts a new run, but run.resume = \"auto\" finds checkpoint " + found +
             " to continue in run.dir; to continue that run drop --init-from (its checkpoints record where it was "
             "initialized from), to start another choose another run.dir";
  }
  return "";
}

std::string InitSource::resolve(const std::string& path) {
  std::error_code ec;
  MOE_CHECK(fs::exists(path, ec), "--init-from ", printable(path), ": no such file or directory");
  // Every checkpoint of the run records the source's absolute path in train_state.json (JSON
  // text): one that is not UTF-8 failed the first save, after the steps before it had run.
  const std::string absolute = fs::absolute(path, ec).lexically_normal().string();
  MOE_CHECK(is_valid_utf8(absolute), "--init-from ", printable(absolute),
            ": the path is not valid UTF-8 (every checkpoint records it as UTF-8 text); rename it or link it under "
            "a UTF-8 name");
  MOE_CHECK(fs::is_directory(path, ec), "--init-from ", path, " is not a directory; give a checkpoint (step-*), a run ",
            "directory or a Hugging Face model folder (config.json with model.safetensors)");
  if (HfModel::is_hf_folder(path) && !fs::exists(fs::path(path) / "index.json", ec)) return path;
  try {
    return resolve_checkpoint(path);
  } catch (const Error& e) {
    MOE_FAIL("--init-from ", path, " is neither a moetrain checkpoint or run directory nor a Hugging Face model folder ",
             "(config.json with model.safetensors or model.safetensors.index.json): ", e.what());
  }
}

InitSource::InitSource(const std::string& resolved_dir) : dir_(resolved_dir) {
  std::error_code ec;
  if (!fs::exists(fs::path(dir_) / "index.json", ec)) {
    hf_ = std::make_unique<HfModel>(dir_, "--init-from");
    model_ = hf_->model();
    model_source_ = hf_->config_path() + " (read as OlmoeForCausalLM)";
    return;
  }
  ckpt_ = std::make_unique<CheckpointReader>(dir_);
  step_ = checked_checkpoint_step(*ckpt_);
  model_source_ = dir_ + "/train_state.json";
  model_ = parse_config(ckpt_->train_state_string("model_config"), model_source_).model;
}

std::string InitSource::describe() const {
  if (hf_) return "Hugging Face model " + dir_;
  std::string d = "checkpoint " + dir_ + " (step " + std::to_string(step_);
  if (ckpt_->train_state().contains("run_id")) d += " of run " + ckpt_->train_state_string("run_id");
  return d + ")";
}

nlohmann::json InitSource::record() const {
  nlohmann::json r = {{"path", absolute_path(dir_)}, {"format", hf_ ? "hugging_face" : "moetrain_checkpoint"}};
  if (!hf_) {
    r["step"] = step_;
    if (ckpt_->train_state().contains("run_id")) r["run_id"] = ckpt_->train_state_string("run_id");
  }
  return r;
}

void check_stored_shapes(const CheckpointReader& ckpt, const ParamRegistry& reg, bool moments, const char* model) {
  const auto expect = [&](const std::string& key, const std::vector<int64_t>& want) {
    const std::vector<int64_t> got = ckpt.global_shape(key);
    MOE_CHECK(got == want, "checkpoint ", ckpt.dir(), ": tensor '", key, "' is stored as ", nlohmann::json(got).dump(),
              " but ", model, " needs ", nlohmann::json(want).dump(),
              "; the checkpoint does not hold this model's weights");
  };
  for (const ParamEntry& e : reg.entries()) {
    const std::vector<int64_t> want(e.global_shape.dims.begin(), e.global_shape.dims.begin() + e.global_shape.ndim);
    expect(e.name, want);
    if (moments) {
      expect(e.name + ".exp_avg", want);
      expect(e.name + ".exp_avg_sq", want);
    }
  }
}

void InitSource::check_weight_shapes(const ParamRegistry& reg) const {
  if (ckpt_) check_stored_shapes(*ckpt_, reg, /*moments=*/false);
}

std::string InitSource::architecture_mismatch(const ModelConfig& run_model) const {
  Config run, source;
  run.model = run_model;
  source.model = model_;
  const auto run_values = config_values(run);
  const std::map<std::string, std::string> source_values = [&] {
    const auto v = config_values(source);
    return std::map<std::string, std::string>(v.begin(), v.end());
  }();
  const std::vector<std::string>& settings = fine_tuning_model_keys();
  for (const auto& [key, value] : run_values) {
    if (key.rfind("model.", 0) != 0 || std::find(settings.begin(), settings.end(), key) != settings.end()) continue;
    const std::string& theirs = source_values.at(key);
    if (theirs == value) continue;
    return "--init-from: " + key + " is " + value + " in this run's config but " + theirs + " in " + model_source_ +
           "; a run starts only from weights of its own architecture (set " + key + " = " + theirs +
           "; the train, optim, data and parallel settings may differ)";
  }
  return "";
}

void InitSource::read_into(const std::string& key, int64_t begin, int64_t end, const Tensor& dst) const {
  if (ckpt_) return ckpt_->read_into(key, begin, end, dst);
  MOE_CHECK(dst.dtype == DType::F32 && dst.numel() == end - begin, "--init-from: weights of '", key,
            "' are read into ", end - begin, " F32 elements, got a ", dtype_name(dst.dtype), " tensor of ",
            dst.numel());
  if (dst.device == Device::CPU) return hf_->read(key, begin, end, dst.f32());
  std::vector<float> host(static_cast<size_t>(end - begin));
  hf_->read(key, begin, end, host.data());
  copy_to_tensor(dst, host.data());
}

bool InitSource::read_router_bias(int64_t n, float* dst) const {
  if (!ckpt_ || !ckpt_->has("router_bias")) return false;
  int64_t stored = 1;
  for (int64_t d : ckpt_->global_shape("router_bias")) stored *= d;
  MOE_CHECK(stored == n, "checkpoint ", ckpt_->dir(), ": 'router_bias' holds ", stored, " values, but this run's model "
            "has ", n, " (layers x experts); the checkpoint does not hold this model's weights");
  ckpt_->read("router_bias", DType::F32, 0, n, dst);
  return true;
}

}  // namespace moe
