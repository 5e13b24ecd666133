// `train --init-from`: the weights a new run starts from (fine-tuning, continued pretraining).
//
// The source is a moetrain checkpoint (a step-* directory, or a run directory: its newest
// complete checkpoint, as --resume takes them) or a Hugging Face OLMoE folder (config.json with
// model.safetensors or model.safetensors.index.json, read by HfModel as import-hf reads it).
// Only the model is taken: the weights and, from a checkpoint, the router's load-balancing bias
// (it decides which experts a token reaches, so it is part of what the model computes). The run
// itself is new: step 0, AdamW moments at zero, the data from its start, the LR schedule from
// step 0, a new run id. The source is only read (no lock, nothing written), so it may belong to
// a job that is still running.
//
// The architecture must be the run's: every model.* key except the training settings of the
// model section (fine_tuning_model_keys) must agree, or the run is refused naming the first key
// that differs and both values, before anything is written. Train, optim, data, eval, parallel
// and run settings may differ: that is the point of fine-tuning.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/core/tensor.h"
#include "moe/model/config.h"
#include "moe/model/params.h"
#include "moe/train/config.h"
#include "moe/train/hf_model.h"

namespace moe {

// Refuses, naming the tensor and both shapes, a checkpoint whose stored tensors do not have the
// shapes `reg` gives them (the weights, and their AdamW moments when `moments`): the stored model
// config is compared key by key before, but it is text beside the weights, and the weights are
// read by element ranges, so a tensor of another shape would hand over its first elements.
// `model` names whose model `reg` describes, for the message.
void check_stored_shapes(const CheckpointReader& ckpt, const ParamRegistry& reg, bool moments,
                         const char* model = "this run's model");

// model.* keys that may differ between a run and the weights it starts from: loss coefficients,
// the balancing bias's update rate, routing for benchmarks, capacity, the initialization scale
// (unused when the weights are given) and the data's end-of-document token. Every other model.*
// key fixes the shapes or the computation of the weights.
const std::vector<std::string>& fine_tuning_model_keys();

// Why --init-from cannot be used together with how this run would start ("" when it can): a
// --resume, run.resume = "auto" finding a checkpoint in run.dir, or a source inside run.dir (a new
// run there may set that directory's files aside). A usage error: the caller decides which.
std::string init_from_conflict(const std::string& init_from, const std::string& resume, const Config& cfg);

class InitSource {
 public:
  // The directory `path` names: a Hugging Face folder as it is, a checkpoint as it is, a run
  // directory's newest complete checkpoint. Every error names the path. A multi-rank run resolves
  // once and hands the result to every rank: a source that is still training may save a newer
  // checkpoint meanwhile, and all ranks must read the same one.
  static std::string resolve(const std::string& path);
  // Opens and validates the source at a resolved directory; reads no weights yet.
  explicit InitSource(const std::string& resolved_dir);

  bool is_hugging_face() const { return hf_ != nullptr; }
  const std::string& dir() const { return dir_; }  // the checkpoint directory or the model folder
  const ModelConfig& model() const { return model_; }
  // "checkpoint D (step S of run R)" or "Hugging Face model D".
  std::string describe() const;
  // What the run records as "init_from" in train_state.json: path (absolute), format, and for a
  // checkpoint its step and run id.
  nlohmann::json record() const;

  // "" when the run's model has this architecture; otherwise one error line naming the first
  // model.* key that differs, both values and where the source's value was read.
  std::string architecture_mismatch(const ModelConfig& run_model) const;

  // check_stored_shapes for a checkpoint source (weights only); a Hugging Face folder's shapes are
  // checked by HfModel as it reads them.
  void check_weight_shapes(const ParamRegistry& reg) const;
  // Elements [begin, end) of logical tensor `key` (a weight) into dst, on any device.
  void read_into(const std::string& key, int64_t begin, int64_t end, const Tensor& dst) const;
  // The router bias ([L, N] = n values) of a checkpoint that saved one; false (dst untouched)
  // for a Hugging Face model, which has none.
  bool read_router_bias(int64_t n, float* dst) const;

 private:
  std::string dir_;
  std::string model_source_;  // where model_ was read, for messages
  ModelConfig model_;
  std::unique_ptr<CheckpointReader> ckpt_;
  int64_t step_ = 0;  // a checkpoint's step
  std::unique_ptr<HfModel> hf_;
};

}  // namespace moe
