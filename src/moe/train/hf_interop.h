// Hugging Face OLMoE interop: export a moetrain checkpoint as a directory
// that transformers loads with OlmoeForCausalLM.from_pretrained, and import such a directory
// (per-expert Hub layout or the fused transformers-5 layout) as a moetrain checkpoint.
// Both stream one logical tensor (for experts: one expert) at a time through host memory.
// hf_interop.cpp exports, hf_import.cpp imports, hf_config.h maps config.json.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <functional>
#include <string>
#include <vector>

#include "moe/core/dtype.h"
#include "moe/train/hf_config.h"

namespace moe {

// Progress of a long export or import: called after each tensor with the bytes of weights done so
// far and in all (the caller decides how often to say so).
using HfProgress = std::function<void(int64_t done_bytes, int64_t total_bytes)>;

struct ExportResult {
  std::string out_dir;
  int shards = 0;
  int64_t tensors = 0;
  int64_t bytes = 0;
  size_t peak_rss_bytes = 0;
  // What to tell the user: where the exported model does differently from the trained one, and
  // tokenizer files Hugging Face will not find by their names.
  std::vector<std::string> notes;
};
// Writes config.json, model-0000i-of-0000n.safetensors (per-expert tensors, in `dtype`: F32, or
// BF16 rounded to nearest even from the FP32 main weights, with config.json's torch_dtype to match)
// and model.safetensors.index.json into out_dir (via a temporary directory renamed at the end);
// optional tokenizer files are copied in. max_shard_bytes bounds each shard.
ExportResult export_hf(const std::string& checkpoint, const std::string& out_dir, int64_t max_shard_bytes,
                       const std::vector<std::string>& tokenizer_files = {}, DType dtype = DType::F32,
                       const HfProgress& progress = {});

// The folder an output path names, lexically normal and without a trailing separator ("hf/" and
// "hf/." name "hf"); refused, naming `command` and the path, when that is "." or ".." (the
// current folder or its parent cannot be renamed into place) or not valid UTF-8 (the import
// records its output in config.toml, the export's notes name it).
std::string output_folder(const std::string& path, const char* command);

struct ImportResult {
  std::string checkpoint_dir;  // <out>/step-000000
  std::string config_path;     // <out>/config.toml (the model from config.json, the rest defaults)
  int64_t tensors = 0;
  bool fused_experts = false;  // the source stored experts fused ([N, 2H, D]) rather than per expert
};
// Reads <hf_dir>/config.json and its safetensors (model.safetensors or the sharded index) and
// writes a moetrain checkpoint at step 0 with fresh (zero) AdamW moments (hf_import.cpp).
// Refuses, before writing anything, a config.json key it would drop, a file outside hf_dir,
// and tensors that are not exactly those config.json implies; out_run_dir must not exist or be
// an empty directory, and holds nothing new unless the import completes.
ImportResult import_hf(const std::string& hf_dir, const std::string& out_run_dir, const HfProgress& progress = {});

}  // namespace moe
