// Checks of a whole Config: every key's range again (for configs built or changed in code), then
// the rules across keys (batch arithmetic, size products that must not overflow, parallelism and
// precision combinations that are not built), each refusal naming the keys and a way out. Also the
// GPU's FP8 shape rule, checked where the device is known.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "moe/core/error.h"
#include "moe/train/config.h"
#include "moe/train/config_key_text.h"
#include "moe/train/config_keys.h"
#include "moe/train/pipeline_layout.h"

namespace moe {
namespace {

// One value at a time: the same ranges the reader applies, for configs built in code.
struct RangeCheck {
  template <typename T>
  void key(const char* section, const char* name, const T& v, const Range<T>& r, const char*) {
    if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, std::string>)
      MOE_CHECK(in_range(r, v), dotted_key(section, name), " must be ",
                std::is_floating_point_v<T> ? "a finite number " : "", range_text(r), ", got ", v);
  }
  template <typename E>
  void choice(const char* section, const char* name, const E& v, const Choices<E>& choices, const char*) {
    bool found = false;
    for (const auto& c : choices) found = found || c.second == v;
    MOE_CHECK(found, dotted_key(section, name), " is not one of: ", choice_names(choices));
  }
  void integer_array(const char* section, const char* name, const std::vector<int64_t>& v, const Range<int64_t>& r,
                     const char*) {
    for (size_t i = 0; i < v.size(); ++i)
      MOE_CHECK(in_range(r, v[i]), dotted_key(section, name), " = ", integers_text(v), ": element ", i, " must be ",
                range_text(r), ", got ", v[i]);
  }
  template <typename E, typename Fields>
  void table_array(const char* section, const char* name, const std::vector<E>& items, const char*, Fields fields) {
    for (size_t i = 0; i < items.size(); ++i) {
      ItemAsSection<RangeCheck> item{*this, dotted_key(section, name) + "[" + std::to_string(i) + "]"};
      fields(items[i], item);
    }
  }
};

// a x b x ... as int64, or an error naming the factors and what the product is used for.
int64_t checked_product(const std::vector<std::pair<std::string, int64_t>>& factors, const char* what,
                        int64_t limit = std::numeric_limits<int64_t>::max()) {
  int64_t p = 1;
  bool overflow = false;
  std::string names;
  for (const auto& [name, v] : factors) {
    names += (names.empty() ? "" : " x ") + name + " (" + std::to_string(v) + ")";
    overflow = overflow || v < 0 || __builtin_mul_overflow(p, v, &p);
  }
  MOE_CHECK(!overflow && p <= limit, what, " = ", names, overflow ? " does not fit in 64 bits" : " = ",
            overflow ? "" : std::to_string(p), overflow ? "" : " exceeds the limit of " + std::to_string(limit),
            "; lower one of these keys");
  return p;
}

}  // namespace

int64_t ParallelConfig::dp(int64_t world) const {
  if (world % pp != 0) {
    std::string divisors;
    for (int64_t d = 1; d <= world; ++d)
      if (world % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    MOE_FAIL("parallel.pp = ", pp, " does not divide the ", world, " ranks; use one of ", divisors);
  }
  return world / pp;
}

void Config::validate(int64_t dp) const {
  visit_config_keys(*this, RangeCheck{});
  parse_duration(train.max_duration, "train.max_duration");
  // A peak this small (a denormal, say) would print an MFU of inf%; no device is that slow.
  MOE_CHECK(run.peak_tflops == 0 || run.peak_tflops >= 1e-6, "run.peak_tflops = ", run.peak_tflops,
            " is not a device's peak: give its TFLOP/s (at least 1e-6), or 0 for the device's default");
  // The name becomes a folder (runs/<name>) when run.dir is empty.
  MOE_CHECK(!name.empty() && name != "." && name != ".." &&
                name.find_first_not_of(kRunNameCharacters) == std::string::npos,
            "name = \"", name, "\" must be a plain folder name (letters, digits, '.', '_', '-'): run.dir defaults to "
            "runs/<name>");
  MOE_CHECK(run.dir.empty() || run.dir[0] != '~', "run.dir = \"", run.dir,
            "\" starts with '~', which is not expanded (no shell reads the config); write the full path");
  MOE_CHECK(data.sources.empty() || data.path == "synthetic" || data.path.empty(),
            "data.path and [[data.sources]] are both given: use one of them, not both");
  MOE_CHECK(!data.path.empty() || !data.sources.empty(), "data.path is empty: give token files, a folder, a glob or "
            "\"synthetic\"");
  for (size_t i = 0; i < data.sources.size(); ++i)
    MOE_CHECK(!data.sources[i].path.empty(), "data.sources[", i, "].path is missing or empty");
  for (size_t i = 0; i < eval.sets.size(); ++i) {
    MOE_CHECK(!eval.sets[i].name.empty() && !eval.sets[i].path.empty(), "eval.sets[", i,
              "] needs a name and a path");
    for (size_t j = 0; j < i; ++j)
      MOE_CHECK(eval.sets[j].name != eval.sets[i].name, "eval.sets: the name '", eval.sets[i].name, "' is used twice");
  }
  model.validate();
  const TrainConfig& t = train;
  MOE_CHECK(t.decay_steps == 0 || t.lr_schedule == LrSchedule::Wsd, "train.decay_steps = ", t.decay_steps,
            " sets the final decay of train.lr_schedule = \"wsd\"; the schedule here decays over every step after "
            "the warmup (or not at all): set train.lr_schedule = \"wsd\" or train.decay_steps = 0");
  MOE_CHECK(dp >= 1, "data-parallel ranks must be >= 1, got ", dp);
  // Size products the run forms, checked before anything multiplies them. Route indices and
  // expert-buffer rows are 32-bit on the device: tokens x top-K x capacity x EP stays below 2^31.
  const int64_t micro_tokens =
      checked_product({{"train.micro_batch_size", t.micro_batch_size}, {"train.seq_len", t.seq_len}},
                      "tokens per microbatch", int64_t{1} << 31);
  checked_product({{"train.global_batch_size", t.global_batch_size}, {"train.seq_len", t.seq_len}}, "tokens per step",
                  int64_t{1} << 53);
  MOE_CHECK(t.global_batch_size % t.micro_batch_size == 0 && (t.global_batch_size / t.micro_batch_size) % dp == 0,
            "train.global_batch_size (", t.global_batch_size,
            ") must be a positive multiple of train.micro_batch_size (", t.micro_batch_size, ")",
            // Checked once at load time with one rank (the job's count is not known yet), then with the real one.
            dp > 1 ? " x data-parallel ranks (" + std::to_string(dp) + ")"
                   : std::string(" (x the data-parallel ranks)"));
  const double expert_rows = std::ceil(model.capacity_factor * static_cast<double>(micro_tokens) *
                                       static_cast<double>(model.num_experts_per_tok)) *
                             static_cast<double>(parallel.ep);
  MOE_CHECK(expert_rows < 2147483648.0, "expert-buffer rows ceil(model.capacity_factor (", model.capacity_factor,
            ") x tokens per microbatch (", micro_tokens, ") x model.num_experts_per_tok (", model.num_experts_per_tok,
            ")) x parallel.ep (", parallel.ep, ") = ", expert_rows,
            " must stay below 2^31 (32-bit route indices); lower train.micro_batch_size or train.seq_len");
  checked_product({{"model.vocab_size", model.vocab_size}, {"model.hidden_size", model.hidden_size}},
                  "embedding elements", int64_t{1} << 40);
  checked_product({{"model.num_experts", model.num_experts},
                   {"model.intermediate_size", model.intermediate_size},
                   {"model.hidden_size", model.hidden_size},
                   {"model.num_hidden_layers", model.num_hidden_layers}},
                  "expert weight elements", int64_t{1} << 44);
  checked_product({{"tokens per microbatch", micro_tokens}, {"model.hidden_size", model.hidden_size}},
                  "activation elements per microbatch row block", int64_t{1} << 44);
  MOE_CHECK(parallel.mode != "fsdp" || parallel.ep == 1,
            "parallel.mode = \"fsdp\" holds every expert on every rank (no expert parallelism); set parallel.ep = 1");
  MOE_CHECK(!t.cuda_graph || run.device != "cpu", "train.cuda_graph = true needs the GPU, but run.device = \"cpu\"");
  const ParallelConfig& par = parallel;
  if (par.pp > 1) {
    MOE_CHECK(par.mode == "ddp", "parallel.pp = ", par.pp, " is built for parallel.mode = \"ddp\", not \"",
              par.mode, "\"; use parallel.mode = \"ddp\" or parallel.pp = 1");
    // The executor follows its op list on the host (which chunk, which activation set, which
    // message): a captured step would have to be one graph per rank, built from that list (not built).
    MOE_CHECK(!t.cuda_graph, "parallel.pp = ", par.pp, " runs its schedule eagerly; set train.cuda_graph = false or "
              "parallel.pp = 1");
  }
  MOE_CHECK(par.pp_virtual == 1 || (par.pp_schedule == "interleaved" && par.pp > 1), "parallel.pp_virtual = ",
            par.pp_virtual, " needs parallel.pp_schedule = \"interleaved\" and parallel.pp >= 2; use "
            "parallel.pp_virtual = 1");
  MOE_CHECK(par.pp_schedule != "interleaved" || par.pp > 1, "parallel.pp_schedule = \"interleaved\" needs "
            "parallel.pp >= 2 (one stage has nothing to interleave); use parallel.pp_schedule = \"1f1b\"");
  // One chunk per rank is the 1F1B schedule: asked for interleaving, the run would silently not interleave.
  MOE_CHECK(par.pp_schedule != "interleaved" || par.pp_virtual > 1, "parallel.pp_schedule = \"interleaved\" needs "
            "parallel.pp_virtual >= 2 chunks per rank (with 1 it is the 1F1B schedule); set parallel.pp_virtual, or "
            "use parallel.pp_schedule = \"1f1b\"");
  // The chunks must split the layers (given sizes must also match the chunk count and the layers):
  // refused here, inside the start-up's agreed checks, before any rank builds its stage.
  if (par.pp > 1 || !par.pp_layers.empty())
    plan_pipeline_layout(model, t.seq_len, static_cast<int>(par.pp), static_cast<int>(par.pp_virtual), par.pp_layers);
  // FSDP holds a block's weights only between its gather and its release: an FP8 cache per step
  // would have to be gathered with them (not built).
  MOE_CHECK(t.precision != Precision::FP8 || parallel.mode != "fsdp",
            "train.precision = \"fp8\" is built for parallel.mode = \"ddp\" (resident weights with their FP8 "
            "caches), not for \"fsdp\"; use parallel.mode = \"ddp\" or train.precision = \"bf16\"");
  // The moved FP8 rows are the expert GEMM's operand: a BF16 product would dequantize them again.
  MOE_CHECK(ep.payload != Payload::FP8 || t.precision == Precision::FP8,
            "ep.payload = \"fp8\" moves the FP8 operand of the expert GEMM and needs train.precision = \"fp8\"; "
            "set train.precision = \"fp8\" or ep.payload = \"bf16\"");
  MOE_CHECK(ep.payload != Payload::FP8 || parallel.ep == 1 || ep.backend == "rowwise",
            "ep.payload = \"fp8\" is built for ep.backend = \"rowwise\" (the alltoall baseline moves BF16 rows); "
            "set ep.backend = \"rowwise\" or ep.payload = \"bf16\"");
}

void check_fp8_gpu_shapes(const Config& c) {
  const ModelConfig& m = c.model;
  const auto need16 = [](int64_t v, const std::string& what) {
    MOE_CHECK(v % 16 == 0, "train.precision = \"fp8\" on the GPU needs ", what, " to be a multiple of 16 (the FP8 "
              "matmuls read 16-byte rows of codes); it is ", v, ". Change it, set train.precision = \"bf16\", or run "
              "on the CPU (run.device = \"cpu\"; plan --device cpu), where FP8 is emulated with no such limit");
  };
  need16(m.hidden_size, "model.hidden_size");
  need16(m.num_attention_heads * m.head_dim(), "model.num_attention_heads x head dim (the query width)");
  need16(m.num_key_value_heads * m.head_dim(), "model.num_key_value_heads x head dim (the key and value width)");
  if (m.num_hidden_layers > m.first_k_dense_replace) need16(m.intermediate_size, "model.intermediate_size");
  if (m.shared_expert_intermediate_size > 0)
    need16(m.shared_expert_intermediate_size, "model.shared_expert_intermediate_size");
  if (m.first_k_dense_replace > 0) need16(m.dense_intermediate_size, "model.dense_intermediate_size");
  need16(c.train.micro_batch_size * c.train.seq_len,
         "train.micro_batch_size x train.seq_len (" + std::to_string(c.train.micro_batch_size) + " x " +
             std::to_string(c.train.seq_len) + ", the tokens of a microbatch)");
}

}  // namespace moe
