// A Hugging Face OLMoE model folder opened for reading: config.json with model.safetensors or a
// sharded model.safetensors.index.json, per-expert (Hub) or fused (transformers 5) experts, F32
// or BF16. import-hf (hf_import.cpp) turns one into a checkpoint; `train --init-from` reads the
// weights straight into a run's parameters. Both read through this class, so both accept and
// refuse exactly the same folders.
//
// Opening checks everything before a weight is read: config.json key by key (hf_config.h), every
// file it reads lies inside the folder (a Hugging Face cache snapshot may link into its own
// blobs/), and the tensors are exactly those config.json implies (layers, experts, shapes,
// dtypes). Reads are of flat ranges of moetrain's logical tensors (fused experts), so any rank
// of any topology reads just the range it holds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "moe/ckpt/safetensors.h"
#include "moe/model/config.h"

namespace moe {

class HfModel {
 public:
  // True when dir holds a config.json (a moetrain run or checkpoint holds none): the folder is
  // then read as a Hugging Face model, and a missing weight file is an error naming it.
  static bool is_hf_folder(const std::string& dir);

  // `tool` ("import-hf", "--init-from") starts the errors that concern the folder as a whole.
  HfModel(const std::string& dir, const std::string& tool);
  ~HfModel();
  HfModel(const HfModel&) = delete;
  HfModel& operator=(const HfModel&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }  // <dir>/config.json, for messages
  const ModelConfig& model() const { return model_; }
  bool fused_experts() const { return fused_experts_; }  // some layer stores its experts fused

  // Elements [begin, end) of moetrain's logical tensor `name` (a registry name: experts fused as
  // [N, 2H, D] gate rows first and [N, D, H]) as F32, BF16 widened exactly. A non-finite value
  // is an error naming the tensor and the element (nothing can be trained from it). Thread-safe.
  void read(const std::string& name, int64_t begin, int64_t end, float* dst) const;

 private:
  std::string dir_, tool_, config_path_, weights_source_;
  ModelConfig model_;
  bool fused_experts_ = false;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, const SafetensorsReader*> holder_;  // HF tensor name -> its file
};

}  // namespace moe
