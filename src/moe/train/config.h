// The run configuration: TOML sections [model], [data], [train], [optim], [parallel], [ep], [run], loaded
// from a file (or the built-in tiny config) with `--set section.key=value` overrides. Every key
// in the file must be known: an unknown key is an error that names it and lists the known ones.
// The keys themselves (type, default, accepted values, documentation) are listed once, in
// config_keys.h. Implemented by config_parse.cpp (text, files and --set overrides into a table),
// config_reader.cpp (the table into a Config), config_validate.cpp (the checks across keys) and
// config_write.cpp (TOML, value lists, differences and the key table out).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/dtype.h"
#include "moe/data/data_config.h"
#include "moe/model/config.h"
#include "moe/model/dispatch.h"
#include "moe/model/precision.h"
#include "moe/model/recompute.h"
#include "moe/optim/lr_schedule.h"

namespace moe {

struct TrainConfig {
  int64_t steps = 300;
  int64_t global_batch_size = 16;  // sequences per optimizer step (fixes the math)
  int64_t micro_batch_size = 8;    // sequences per rank per forward
  int64_t seq_len = 128;
  double lr = 3e-3;                // peak learning rate
  double min_lr_ratio = 0.1;       // the decay ends at lr * min_lr_ratio
  int64_t warmup_steps = 30;       // linear warmup from 0
  LrSchedule lr_schedule = LrSchedule::Cosine;  // after the warmup (optim/lr_schedule.h)
  int64_t decay_steps = 0;         // wsd: the final decay's steps; 0 = a fifth of the steps after warmup
  double weight_decay = 0.1;       // applied to matrices (ndim >= 2) only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;          // global norm clip; 0 = off
  uint64_t seed = 42;              // initialization and random routing
  int64_t eval_every = 100;        // 0 = no eval
  int64_t eval_batches = 4;        // microbatches of held-out data per eval, over all data ranks
  int64_t log_every = 10;
  int64_t save_every = 0;          // 0 = only a final checkpoint when run.save_final
  int64_t keep_last = 0;           // 0 = keep all checkpoints of this run's line
  bool async_save = false;         // save_every checkpoints written on a thread from a host copy
  int64_t max_skipped_steps = 10;  // consecutive non-finite (skipped) steps that end the run; 0 = never
  bool cuda_graph = false;         // GPU: capture the whole step once, replay it every step
  bool deterministic = false;      // GPU: the same bits on every run (attention's deterministic backward)
  Recompute recompute = Recompute::None;  // activations dropped in forward and recomputed in backward
  Precision precision = Precision::BF16;  // the linear layers' products: bf16 or fp8 (model/precision.h)
  std::string max_duration;        // wall-clock budget of this process ("90m", "4h", "1h30m"); "" = none
};

// How the optimizer stores its state (AdamW's learning rate, betas, epsilon and weight decay are train.* keys).
struct OptimConfig {
  // AdamW moments (exp_avg, exp_avg_sq): F32, or BF16 as DeepSeek-V3 stores them (half the bytes;
  // the update computes in FP32 and rounds the new moments to nearest even). Main weights stay FP32.
  DType moment_dtype = DType::F32;
};

struct ParallelConfig {
  std::string mode = "ddp";  // ddp: resident weights + expert parallelism; fsdp: the full-reshard baseline
  int64_t ep = 1;            // expert-parallel degree (ranks per EP group); divides the world size and N
  // Expert-buffer slots per MoE layer (microbatches alive at once); 0 = what the pipeline schedule
  // needs (1 without pipeline); a value below that need is refused.
  int64_t lease_slots = 0;
  int64_t pp = 1;                      // pipeline stages; world = pp x data-parallel ranks
  std::string pp_schedule = "1f1b";    // 1f1b | interleaved
  int64_t pp_virtual = 1;              // model chunks per pipeline rank (interleaved)
  std::vector<int64_t> pp_layers;      // layers per chunk, {3, 1} (pp x pp_virtual numbers); {} = balanced by cost
  // The data-parallel ranks of a stage for a job of `world` ranks; throws naming parallel.pp and
  // the values that would work when pp does not divide the world.
  int64_t dp(int64_t world) const;
  bool overlap_grad_reduce = true;  // ddp: reduce gradient buckets during the last microbatch's backward
  int64_t grad_bucket_bytes = int64_t{16} << 20;  // ddp: bytes of one gradient reduce-scatter (all ranks' parts)
};

struct EpConfig {
  std::string backend = "rowwise";  // rowwise | alltoall (the baseline); EP = 1 always runs local
  Payload payload = Payload::BF16;  // what dispatch moves: activation-dtype rows, or FP8 codes + scales (model/dispatch.h)
};

struct RunConfig {
  std::string dir;              // output folder; empty = runs/<name>
  double peak_tflops = 0;       // MFU denominator; 0 = the device's default (Hopper GPUs: 989, the CPU: 0.2)
  bool save_final = true;       // write a checkpoint after the last step
  std::string device = "auto";  // auto (the GPU when this build has CUDA and one is present) | cpu | cuda
  std::string resume = "no";    // auto: continue the run directory's newest checkpoint when one exists
  bool tensorboard = false;     // rank 0 also writes the metrics as TensorBoard events (<dir>/tensorboard/)
};

struct EvalConfig {
  std::vector<EvalSetConfig> sets;  // named validation sets, besides the held-out tail of the training data
};

// The characters of a run's name (Config::name, which becomes the folder runs/<name>).
inline constexpr const char* kRunNameCharacters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";

struct Config {
  std::string name = "tiny";
  ModelConfig model;
  DataConfig data;
  EvalConfig eval;
  TrainConfig train;
  OptimConfig optim;
  ParallelConfig parallel;
  EpConfig ep;
  RunConfig run;

  int64_t accumulation_steps(int64_t dp) const { return train.global_batch_size / (train.micro_batch_size * dp); }
  std::string run_dir() const { return run.dir.empty() ? "runs/" + name : run.dir; }
  // Throws moe::Error naming the keys when values are inconsistent (shapes, batch sizes, ranges).
  void validate(int64_t dp = 1) const;
};

// train.precision = "fp8" on the GPU: cuBLASLt's block-scaled FP8 matmul and the CUTLASS grouped
// GEMM read 16-byte rows of FP8 codes, so every product's inner dimension (the model's feature
// widths, and the tokens of a microbatch, the weight gradient's) must be a multiple of 16. Throws
// moe::Error naming the keys (the CPU emulation has no such limit). Run at start-up and by plan.
void check_fp8_gpu_shapes(const Config& c);

// Parses TOML text (source_name is used in messages) and applies overrides "section.key=value"
// (values parsed as TOML: 3, 1e-3, true, "text" or a bare word taken as a string).
// validate = false leaves Config::validate to the caller (which adjusts a key first).
Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {}, bool validate = true);
// The key of an override "section.key=value" without the spaces TOML allows around its parts
// (" train . steps = 2" -> "train.steps"), or "" when it has no '=', a part of it is empty, or it
// has no section and is not the top-level `name` ("train={steps=2}" would replace a whole section).
std::string override_key(const std::string& assignment);
// "1h30m", "45m", "90s", "2d", "3600" (seconds) -> seconds; "" -> 0 (no limit). Throws naming `key`.
double parse_duration(const std::string& text, const std::string& key);
// Reads the file; path "tiny" (or empty) selects the built-in tiny config.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// A config a checkpoint stored (train_state.json): as parse_config, and keys whose form changed since
// are also read in the form older checkpoints wrote (parallel.pp_layers = "3,1", now [3, 1]).
// Overrides are read in today's form only. The first `callers_overrides` of them are the caller's
// own (eval's fixed data and layout keys), not the user's: errors say "(with --set overrides)"
// only when the user gave some.
Config parse_stored_config(const std::string& toml_text, const std::string& source_name,
                           const std::vector<std::string>& overrides = {}, bool validate = true,
                           size_t callers_overrides = 0);
// The first line of the config.toml moetrain writes in a run folder (a user's own config.toml lacks
// it). load_config reads a file that starts with it as a checkpoint's stored config (older forms too).
constexpr const char* kConfigHeader = "# moetrain: the resolved config of this run's latest start (every key)";
// True when toml_text is exactly what config_to_toml writes for the config it holds, today or in
// the forms older versions wrote (parse_stored_config's): a config moetrain wrote and nobody
// edited, as far as text can tell (a hand edit that keeps the layout is not seen).
bool written_config_text(const std::string& toml_text);
// The model section and the whole resolved config as TOML text (written by the TOML library,
// so any string value reads back unchanged).
std::string model_config_toml(const ModelConfig& m);
std::string config_to_toml(const Config& c);
// ("section.key", canonical value text) for every key, in the order of config_keys.h.
std::vector<std::pair<std::string, std::string>> config_values(const Config& c);
// The keys (of `section` only, when not empty) whose values differ, on one line: " key = a in
// a_label, b in b_label; key2 = ..."; empty when they agree.
std::string config_differences(const Config& a, const Config& b, const std::string& section, const std::string& a_label,
                               const std::string& b_label);
// Every key as a markdown table (key, type, default, accepted values, meaning): `moetrain keys`.
std::string config_keys_markdown();

}  // namespace moe
