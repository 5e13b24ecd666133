// Every config key, once: its section and name, its field in Config, the values it accepts and
// its documentation line. Reading a TOML file, writing the resolved config, the `moetrain keys`
// listing (and the README table it produces), the resume comparison and the start-up check
// that all ranks run the same config are visitors of this one list, so a key cannot be known to
// one of them and missing from another.
//
// A visitor provides
//   void key(const char* section, const char* name, T& field, Range<T> range, const char* doc)
//       for T in {int64_t, uint64_t, double, bool, std::string};
//   void choice(const char* section, const char* name, E& field, const Choices<E>& choices, const char* doc)
//       for enumerations and fixed string sets;
//   void integer_array(const char* section, const char* name, std::vector<int64_t>& field,
//                      Range<int64_t> element_range, const char* doc)
//       for arrays of integers ([3, 1]), each element in element_range;
//   void table_array(const char* section, const char* name, std::vector<E>& items, const char* doc, Fields fields)
//       for arrays of tables ([[data.sources]]): fields(item, f) calls f.key(name, field, range, doc)
//       for each field of one item (f is the visitor's per-item adapter).
// Checks that involve several keys (divisibility, batch arithmetic, size products) are in
// Config::validate.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe/train/config.h"

namespace moe {

// The accepted interval of a numeric key (both ends optional, each inclusive unless marked open).
// Floating-point keys must also be finite. zero_when: 0 is accepted besides the interval, when this
// condition on other keys holds (a width no layer uses); the condition is checked with the other
// keys, in ModelConfig::validate, and the key table shows it.
template <typename T>
struct Range {
  std::optional<T> lo, hi;
  bool lo_open = false, hi_open = false;
  const char* zero_when = nullptr;
};
template <typename T>
Range<T> any_value() { return {}; }
template <typename T>
Range<T> at_least(T lo) { return {lo, std::nullopt, false, false}; }
template <typename T>
Range<T> above(T lo) { return {lo, std::nullopt, true, false}; }
template <typename T>
Range<T> between(T lo, T hi) { return {lo, hi, false, false}; }
// [lo, hi): e.g. fractions and Adam's betas.
template <typename T>
Range<T> from_up_to(T lo, T hi) { return {lo, hi, false, true}; }

// Counts and sizes: integers from `lo` up to 2^40, far above any real model, so that the size
// products Config::validate forms from them cannot overflow 64 bits before they are checked.
// Keys that multiply a per-layer or per-expert cost (layers, heads, experts) have tighter bounds,
// and floating-point keys bounds that FP32 (where they are used) represents, so an absurd value
// is refused here instead of after minutes of planning or as an infinite learning rate.
constexpr int64_t kMaxCount = int64_t{1} << 40;
constexpr int64_t kMaxKeepLast = int64_t{1} << 30;  // train.keep_last (the --keep-last flag too)
inline Range<int64_t> count_from(int64_t lo) { return between<int64_t>(lo, kMaxCount); }
// A width from 1 up to 2^40, or 0 when `condition` holds (written as the key table shows it).
inline Range<int64_t> width_or_zero_when(const char* condition) {
  Range<int64_t> r = count_from(1);
  r.zero_when = condition;
  return r;
}
constexpr const char* kEveryLayerDense = "every layer is dense (model.first_k_dense_replace = model.num_hidden_layers)";
constexpr const char* kNoLayerDense = "no layer is dense (model.first_k_dense_replace = 0)";

template <typename E>
using Choices = std::vector<std::pair<std::string, E>>;

// Keys in file order: the order of the listing and of resume and rank-agreement diffs.
template <typename C, typename V>
void visit_config_keys(C& c, V&& v) {
  v.key("", "name", c.name, any_value<std::string>(), "run name; run.dir defaults to runs/<name>");

  auto& m = c.model;
  v.key("model", "vocab_size", m.vocab_size, between<int64_t>(2, int64_t{1} << 31), "vocabulary size (OlmoeConfig.vocab_size)");
  v.key("model", "hidden_size", m.hidden_size, count_from(1), "d_model");
  v.key("model", "num_hidden_layers", m.num_hidden_layers, between<int64_t>(1, 1 << 11), "transformer blocks");
  v.key("model", "num_attention_heads", m.num_attention_heads, between<int64_t>(1, 1 << 16), "query heads; divides hidden_size");
  v.key("model", "num_key_value_heads", m.num_key_value_heads, between<int64_t>(1, 1 << 16),
        "key/value heads (grouped-query attention when fewer than the query heads); default: num_attention_heads");
  v.key("model", "intermediate_size", m.intermediate_size, width_or_zero_when(kEveryLayerDense),
        "expert hidden size H");
  v.key("model", "num_experts", m.num_experts, between<int64_t>(1, 1 << 20), "routed experts per MoE layer (N)");
  // Never 0, even without MoE layers: the expert dispatcher is built for every model and sizes its buffers by top-K.
  v.key("model", "num_experts_per_tok", m.num_experts_per_tok, between<int64_t>(1, 1 << 20),
        "experts per token (top-K); at most num_experts");
  v.key("model", "norm_topk_prob", m.norm_topk_prob, any_value<bool>(),
        "L1-normalize the selected routing weights (OLMoE: false)");
  v.choice("model", "router_score", m.router_score, Choices<ScoreFn>{{"softmax", ScoreFn::Softmax}, {"sigmoid", ScoreFn::Sigmoid}},
           "router score function");
  v.choice("model", "qk_norm", m.qk_norm,
           Choices<QkNorm>{{"none", QkNorm::None}, {"full", QkNorm::Full}, {"per_head", QkNorm::PerHead}},
           "RMSNorm of queries and keys: over the whole projection (OLMoE), per head, or none");
  v.key("model", "rope_theta", m.rope_theta, between(1.0, 1e12), "rotary embedding base");
  v.key("model", "rms_norm_eps", m.rms_norm_eps, between(1e-30, 1.0), "RMSNorm epsilon");
  v.key("model", "shared_expert_intermediate_size", m.shared_expert_intermediate_size, count_from(0),
        "hidden size of a shared expert every token uses; 0 = none");
  v.key("model", "first_k_dense_replace", m.first_k_dense_replace, count_from(0),
        "the first k layers use a dense SwiGLU MLP instead of experts; at most num_hidden_layers (every layer dense)");
  v.key("model", "dense_intermediate_size", m.dense_intermediate_size, width_or_zero_when(kNoLayerDense),
        "hidden size of those dense MLPs");
  v.key("model", "router_aux_loss_coef", m.router_aux_loss_coef, between(0.0, 1e3), "load-balancing loss coefficient");
  v.key("model", "router_z_loss_coef", m.router_z_loss_coef, between(0.0, 1e3), "router z-loss coefficient");
  v.choice("model", "routing", m.routing,
           Choices<Routing>{{"learned", Routing::Learned}, {"random", Routing::Random}, {"uniform", Routing::Uniform}},
           "learned, or random / uniform expert choice (benchmarks)");
  v.key("model", "bias_update_rate", m.bias_update_rate, between(0.0, 1.0),
        "> 0: auxiliary-loss-free balancing bias, sign update of this size per step");
  v.key("model", "capacity_factor", m.capacity_factor, between(1e-3, 1e3),
        "each rank's expert buffer holds ceil(capacity_factor x tokens x top-K) rows; routes past it are dropped");
  v.key("model", "dropless", m.dropless, any_value<bool>(), "size the expert buffers for the worst case (no drops)");
  v.key("model", "init_std", m.init_std, between(1e-8, 10.0), "standard deviation of the initial weights");
  v.key("model", "eos_token_id", m.eos_token_id, between<int64_t>(0, int64_t{1} << 31),
        "end-of-document token, below vocab_size; default: vocab_size - 1");

  auto& d = c.data;
  // A config with [[data.sources]] has no data.path: written configs leave it out (the reader refuses
  // both; until 2026-12-07 its unused default beside the sources made a run's own config.toml and
  // checkpoints unreadable). A reader visits a default Config, whose sources are still empty here.
  if (d.sources.empty())
    v.key("data", "path", d.path, any_value<std::string>(),
          "one source: a token file, a folder or a glob, or \"synthetic\" (the built-in corpus)");
  v.table_array("data", "sources", d.sources, "several training sources mixed by weight, instead of data.path",
                [](auto& source, auto& f) {
                  f.key("path", source.path, any_value<std::string>(), "a token file, a folder or a glob");
                  f.key("weight", source.weight, between(1e-12, 1e12),
                        "relative share of the training instances of each epoch");
                });
  v.choice("data", "format", d.format, Choices<std::string>{{"npy", "npy"}, {"raw", "raw"}},
           "npy: .npy files; raw: headerless token arrays of data.dtype (OLMo-core / Dolma tokenized files, "
           "Megatron-LM .bin files, checked against their .idx)");
  v.choice("data", "dtype", d.dtype, Choices<std::string>{{"uint16", "uint16"}, {"uint32", "uint32"}},
           "token type of raw files");
  v.choice("data", "sampling", d.sampling, Choices<std::string>{{"epoch", "epoch"}, {"random", "random"}},
           "epoch: fixed instances of seq_len + 1 tokens, shuffled per epoch, each seen once per pass of its "
           "source; random: windows drawn with replacement");
  v.key("data", "seed", d.seed, at_least<uint64_t>(0), "sampling and synthetic-corpus seed");
  v.key("data", "eval_fraction", d.eval_fraction, from_up_to(0.0, 1.0), "held-out tail of every file");
  v.key("data", "synthetic_tokens", d.synthetic_tokens, count_from(2), "training tokens of the synthetic corpus");
  v.key("data", "synthetic_eval_tokens", d.synthetic_eval_tokens, count_from(0),
        "held-out tokens of the synthetic corpus");
  v.key("data", "synthetic_domains", d.synthetic_domains, count_from(1), "domains of the synthetic corpus");
  v.key("data", "synthetic_successors", d.synthetic_successors, count_from(1),
        "likely next tokens per token inside a synthetic domain");
  v.key("data", "synthetic_doc_end_prob", d.synthetic_doc_end_prob, from_up_to(0.001, 1.0),
        "probability that a synthetic document ends after a token");

  auto& t = c.train;
  v.key("train", "steps", t.steps, count_from(0), "optimizer steps of the run (a new run: at least 1)");
  v.key("train", "global_batch_size", t.global_batch_size, count_from(1),
        "sequences per optimizer step (fixes the math on any topology)");
  v.key("train", "micro_batch_size", t.micro_batch_size, count_from(1),
        "sequences per forward on each rank; accumulation = global / (micro x data-parallel ranks)");
  v.key("train", "seq_len", t.seq_len, count_from(1), "tokens per sequence");
  v.key("train", "lr", t.lr, between(0.0, 10.0), "peak learning rate");
  v.key("train", "min_lr_ratio", t.min_lr_ratio, between(0.0, 1.0),
        "the decay (cosine, linear, wsd) ends at lr x min_lr_ratio on the last step");
  v.key("train", "warmup_steps", t.warmup_steps, count_from(0), "linear warmup steps");
  v.choice("train", "lr_schedule", t.lr_schedule,
           Choices<LrSchedule>{{"cosine", LrSchedule::Cosine},
                               {"linear", LrSchedule::Linear},
                               {"constant", LrSchedule::Constant},
                               {"wsd", LrSchedule::Wsd}},
           "after the warmup: cosine or linear decay over the remaining steps, constant, or wsd (constant, then a "
           "linear decay over the last train.decay_steps steps; a run extended on resume keeps its rate until then)");
  v.key("train", "decay_steps", t.decay_steps, count_from(0),
        "wsd: steps of the final decay (at most the steps after warmup); 0 = a fifth of the steps after warmup");
  v.key("train", "weight_decay", t.weight_decay, between(0.0, 10.0), "AdamW weight decay (matrices only)");
  v.key("train", "beta1", t.beta1, from_up_to(0.0, 1.0), "AdamW beta1");
  v.key("train", "beta2", t.beta2, from_up_to(0.0, 1.0), "AdamW beta2");
  v.key("train", "eps", t.eps, between(1e-30, 1.0), "AdamW epsilon");
  v.key("train", "grad_clip", t.grad_clip, between(0.0, 1e6), "global gradient-norm clip; 0 = off");
  v.key("train", "seed", t.seed, at_least<uint64_t>(0), "initialization and random-routing seed");
  v.key("train", "eval_every", t.eval_every, count_from(0), "held-out evaluation every N steps; 0 = only at the end");
  v.key("train", "eval_batches", t.eval_batches, count_from(0),
        "microbatches of held-out data per evaluation, over all data-parallel ranks (rounded up to a multiple of their "
        "number)");
  v.key("train", "log_every", t.log_every, count_from(1), "progress line and metrics record every N steps");
  v.key("train", "save_every", t.save_every, count_from(0), "checkpoint every N steps; 0 = only the final one");
  v.key("train", "keep_last", t.keep_last, between<int64_t>(0, kMaxKeepLast),
        "keep the newest K checkpoints of this run's line (and the one this process resumed from); 0 = keep all");
  v.key("train", "async_save", t.async_save, any_value<bool>(),
        "write the save_every checkpoints on a background thread from a host copy of each rank's part while "
        "training goes on (committed at a later step; in the foreground where a host lacks the memory); stop and "
        "final checkpoints are written before exit");
  v.key("train", "max_skipped_steps", t.max_skipped_steps, count_from(0),
        "end the run with an error after this many consecutive steps skipped for non-finite gradients; 0 = never");
  v.key("train", "cuda_graph", t.cuda_graph, any_value<bool>(),
        "GPU: capture the step once, replay it every step (not with parallel.pp > 1, parallel.mode = fsdp or "
        "model.routing = random)");
  v.key("train", "deterministic", t.deterministic, any_value<bool>(),
        "GPU: bitwise-reproducible runs (cuDNN's deterministic attention backward, a B x heads x T x T BF16 "
        "workspace); the CPU always is, for a given thread count");
  v.choice("train", "recompute", t.recompute,
           Choices<Recompute>{{"none", Recompute::None},
                              {"experts", Recompute::Experts},
                              {"attention", Recompute::Attention},
                              {"block", Recompute::Block}},
           "activations recomputed in backward instead of kept: none, experts (expert gate/up and SwiGLU outputs), "
           "attention (the attention block's internals) or block (everything but each block's input and routing)");
  v.choice("train", "precision", t.precision, Choices<Precision>{{"bf16", Precision::BF16}, {"fp8", Precision::FP8}},
           "the linear layers' products: bf16, or fp8 (E4M3 with power-of-two 1x128 / 128x128 scales in all three "
           "passes; needs parallel.mode = ddp, any pp; GPU: Hopper only, widths and microbatch tokens multiples of 16; "
           "the CPU emulates it exactly)");
  v.key("train", "max_duration", t.max_duration, any_value<std::string>(),
        "wall-clock budget of this process (decimal numbers with units d, h, m, s from the largest down: \"4h\", \"1h30m\", \"1.5h\", \"90s\"): at the first step boundary past it, save a "
        "checkpoint and stop; \"\" = none");

  v.table_array("eval", "sets", c.eval.sets, "named validation sets, each reported under its name",
                [](auto& set, auto& f) {
                  f.key("name", set.name, any_value<std::string>(), "the name in the log and in metrics");
                  f.key("path", set.path, any_value<std::string>(), "a token file, a folder or a glob (data.format)");
                });

  v.choice("optim", "moment_dtype", c.optim.moment_dtype, Choices<DType>{{"fp32", DType::F32}, {"bf16", DType::BF16}},
           "dtype of the AdamW moments: fp32 (8 bytes per parameter) or bf16 (4; computed in FP32, stored rounded "
           "to nearest even); checkpoints resume under either");

  v.choice("parallel", "mode", c.parallel.mode, Choices<std::string>{{"ddp", "ddp"}, {"fsdp", "fsdp"}},
           "ddp: resident weights + expert parallelism; fsdp: the full-reshard baseline");
  v.key("parallel", "ep", c.parallel.ep, between<int64_t>(1, 1 << 20),
        "expert-parallel degree; divides the world size and num_experts");
  v.key("parallel", "lease_slots", c.parallel.lease_slots, between<int64_t>(0, 1 << 10),
        "expert-buffer slots per MoE layer (microbatches alive at once); 0 = what the pipeline schedule needs, "
        "a smaller value is refused");
  v.key("parallel", "pp", c.parallel.pp, between<int64_t>(1, 1 << 10),
        "pipeline stages (MPI CPU ranks or NCCL GPUs); world = pp x data-parallel ranks, the EP mesh inside each stage");
  v.choice("parallel", "pp_schedule", c.parallel.pp_schedule,
           Choices<std::string>{{"1f1b", "1f1b"}, {"interleaved", "interleaved"}},
           "pipeline schedule: 1f1b, or interleaved (parallel.pp_virtual chunks per rank; microbatches a multiple "
           "of pp)");
  v.key("parallel", "pp_virtual", c.parallel.pp_virtual, between<int64_t>(1, 1 << 10),
        "model chunks per pipeline rank (interleaved schedule)");
  v.integer_array("parallel", "pp_layers", c.parallel.pp_layers, between<int64_t>(1, 1 << 11),
                  "layers per pipeline chunk, an array ([3, 1]; pp x pp_virtual numbers adding up to "
                  "model.num_hidden_layers); empty = balanced by a per-layer cost with the embedding and LM head "
                  "counted");
  v.key("parallel", "overlap_grad_reduce", c.parallel.overlap_grad_reduce, any_value<bool>(),
        "ddp: start each gradient bucket's reduce-scatter during the last microbatch's backward, once the bucket "
        "is final (same results); false: all buckets after the backward");
  v.key("parallel", "grad_bucket_bytes", c.parallel.grad_bucket_bytes, between<int64_t>(4, int64_t{1} << 40),
        "ddp: bytes of FP32 gradient in one reduce-scatter, all ranks' parts together (smaller: finer overlap, more "
        "calls)");
  v.choice("ep", "backend", c.ep.backend, Choices<std::string>{{"rowwise", "rowwise"}, {"alltoall", "alltoall"}},
           "token dispatch: rowwise (symmetric memory) or alltoall (the baseline)");
  v.choice("ep", "payload", c.ep.payload, Choices<Payload>{{"bf16", Payload::BF16}, {"fp8", Payload::FP8}},
           "what dispatch moves to the experts: bf16 (the activation rows) or fp8 (each token row quantized once at "
           "its source: E4M3 codes + 1x128 power-of-two scales, about half the bytes; needs train.precision = fp8 "
           "and, at parallel.ep > 1, ep.backend = rowwise; combine and gradients stay bf16)");

  v.key("run", "dir", c.run.dir, any_value<std::string>(), "output folder; empty = runs/<name>");
  v.key("run", "peak_tflops", c.run.peak_tflops, between(0.0, 1e9),
        "MFU denominator in TFLOP/s; 0 = the device's default (Hopper: 989, CPU: 0.2)");
  v.key("run", "save_final", c.run.save_final, any_value<bool>(), "write a checkpoint after the last step");
  v.choice("run", "device", c.run.device,
           Choices<std::string>{{"auto", "auto"}, {"cpu", "cpu"}, {"cuda", "cuda"}},
           "auto: the GPU when this build has CUDA and one is usable");
  v.choice("run", "resume", c.run.resume, Choices<std::string>{{"no", "no"}, {"auto", "auto"}},
           "auto: continue from run.dir's newest checkpoint when there is one, else start (like --resume latest; a "
           "damaged newest step-N folder is refused, not taken for none)");
  v.key("run", "tensorboard", c.run.tensorboard, any_value<bool>(),
        "rank 0 also writes every metrics record as TensorBoard scalars into <run.dir>/tensorboard/");
}

}  // namespace moe
