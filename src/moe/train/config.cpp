#include "moe/train/config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "moe/core/error.h"
#include "moe/train/builtin_configs.h"

namespace moe {
namespace {

// Pulls typed values out of the parsed table and remembers which keys were read, so that any
// key left over afterwards is reported as unknown (a typo never silently falls back to a default).
class KeyReader {
 public:
  KeyReader(toml::table& root, std::string source) : root_(root), source_(std::move(source)) {}

  template <typename T>
  void read(const std::string& section, const std::string& key, T& out) {
    known_[section].insert(key);
    const toml::node* node = find(section, key);
    if (!node) return;
    if constexpr (std::is_same_v<T, bool>) {
      auto v = node->value<bool>();
      MOE_CHECK(v.has_value(), where(section, key), " must be true or false");
      out = *v;
    } else if constexpr (std::is_integral_v<T>) {
      auto v = node->value<int64_t>();
      MOE_CHECK(v.has_value() && node->is_integer(), where(section, key), " must be an integer");
      MOE_CHECK(!std::is_unsigned_v<T> || *v >= 0, where(section, key), " must be >= 0");
      out = static_cast<T>(*v);
    } else if constexpr (std::is_floating_point_v<T>) {
      auto v = node->value<double>();
      MOE_CHECK(v.has_value() && (node->is_floating_point() || node->is_integer()), where(section, key),
                " must be a number");
      out = static_cast<T>(*v);
    } else {
      auto v = node->value<std::string>();
      MOE_CHECK(v.has_value(), where(section, key), " must be a string");
      out = *v;
    }
  }

  // A string key restricted to a fixed set of choices.
  template <typename E>
  void read_choice(const std::string& section, const std::string& key, E& out,
                   const std::vector<std::pair<std::string, E>>& choices) {
    std::string text;
    bool present = find(section, key) != nullptr;
    read(section, key, text);
    if (!present) return;
    for (const auto& [name, value] : choices)
      if (name == text) {
        out = value;
        return;
      }
    std::string names;
    for (const auto& c : choices) names += (names.empty() ? "" : ", ") + c.first;
    MOE_FAIL(where(section, key), " = \"", text, "\" is not one of: ", names);
  }

  // Every key present in the file must have been read by some read() call.
  void reject_unknown() const {
    for (auto&& [k, v] : root_) {
      const std::string key(k.str());
      if (v.is_table()) {
        auto it = known_.find(key);
        MOE_CHECK(it != known_.end(), "unknown config section [", key, "] in ", source_,
                  "; known sections: model, data, train, parallel, ep, run");
        for (auto&& [k2, v2] : *v.as_table()) {
          (void)v2;
          const std::string key2(k2.str());
          if (!it->second.count(key2)) {
            std::string names;
            for (const auto& n : it->second) names += (names.empty() ? "" : ", ") + n;
            MOE_FAIL("unknown config key '", key, ".", key2, "' in ", source_, "; known keys in [", key, "]: ", names);
          }
        }
      } else {
        MOE_CHECK(known_.count("") && known_.at("").count(key), "unknown top-level config key '", key, "' in ",
                  source_);
      }
    }
  }

 private:
  const toml::node* find(const std::string& section, const std::string& key) const {
    if (section.empty()) return root_.get(key);
    const toml::table* t = root_.get_as<toml::table>(section);
    return t ? t->get(key) : nullptr;
  }
  std::string where(const std::string& section, const std::string& key) const {
    return "config key '" + (section.empty() ? key : section + "." + key) + "' in " + source_;
  }

  toml::table& root_;
  std::string source_;
  std::map<std::string, std::set<std::string>> known_;
};

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    MOE_FAIL("malformed TOML in ", source, " at line ", where.line, ", column ", where.column, ": ",
             std::string(e.description()));
  }
}

// "section.key=value": the value is parsed as a TOML value; a bare word becomes a string.
void apply_override(toml::table& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  MOE_CHECK(eq != std::string::npos && eq > 0, "--set expects section.key=value, got '", assignment, "'");
  const std::string path = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const auto dot = path.find('.');
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    parsed.insert_or_assign("v", value);  // a bare word: take it as a string
  }
  toml::node* v = parsed.get("v");
  if (dot == std::string::npos) {
    root.insert_or_assign(path, *v);
    return;
  }
  const std::string section = path.substr(0, dot), key = path.substr(dot + 1);
  MOE_CHECK(key.find('.') == std::string::npos, "--set ", path, ": expected section.key");
  if (!root.get_as<toml::table>(section)) root.insert_or_assign(section, toml::table{});
  root.get_as<toml::table>(section)->insert_or_assign(key, *v);
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  toml::table root = parse_toml(toml_text, source_name);
  for (const auto& o : overrides) apply_override(root, o);
  const std::string source = overrides.empty() ? source_name : source_name + " (with --set overrides)";
  KeyReader r(root, source);
  Config c;
  r.read("", "name", c.name);

  ModelConfig& m = c.model;
  r.read("model", "vocab_size", m.vocab_size);
  r.read("model", "hidden_size", m.hidden_size);
  r.read("model", "num_hidden_layers", m.num_hidden_layers);
  r.read("model", "num_attention_heads", m.num_attention_heads);
  m.num_key_value_heads = m.num_attention_heads;  // default: no grouping, as in OlmoeConfig
  r.read("model", "num_key_value_heads", m.num_key_value_heads);
  r.read("model", "intermediate_size", m.intermediate_size);
  r.read("model", "num_experts", m.num_experts);
  r.read("model", "num_experts_per_tok", m.num_experts_per_tok);
  r.read("model", "norm_topk_prob", m.norm_topk_prob);
  r.read_choice("model", "router_score", m.router_score, {{"softmax", ScoreFn::Softmax}, {"sigmoid", ScoreFn::Sigmoid}});
  r.read_choice("model", "qk_norm", m.qk_norm,
                {{"none", QkNorm::None}, {"full", QkNorm::Full}, {"per_head", QkNorm::PerHead}});
  r.read("model", "rope_theta", m.rope_theta);
  r.read("model", "rms_norm_eps", m.rms_norm_eps);
  r.read("model", "shared_expert_intermediate_size", m.shared_expert_intermediate_size);
  r.read("model", "first_k_dense_replace", m.first_k_dense_replace);
  r.read("model", "dense_intermediate_size", m.dense_intermediate_size);
  r.read("model", "router_aux_loss_coef", m.router_aux_loss_coef);
  r.read("model", "router_z_loss_coef", m.router_z_loss_coef);
  r.read_choice("model", "routing", m.routing,
                {{"learned", Routing::Learned}, {"random", Routing::Random}, {"uniform", Routing::Uniform}});
  r.read("model", "bias_update_rate", m.bias_update_rate);
  r.read("model", "capacity_factor", m.capacity_factor);
  r.read("model", "dropless", m.dropless);
  r.read("model", "init_std", m.init_std);
  m.eos_token_id = m.vocab_size - 1;  // default: the last id
  r.read("model", "eos_token_id", m.eos_token_id);

  DataConfig& d = c.data;
  r.read("data", "path", d.path);
  r.read("data", "seed", d.seed);
  r.read("data", "eval_fraction", d.eval_fraction);
  r.read("data", "synthetic_tokens", d.synthetic_tokens);
  r.read("data", "synthetic_eval_tokens", d.synthetic_eval_tokens);
  r.read("data", "synthetic_domains", d.synthetic_domains);
  r.read("data", "synthetic_successors", d.synthetic_successors);
  r.read("data", "synthetic_doc_end_prob", d.synthetic_doc_end_prob);

  TrainConfig& t = c.train;
  r.read("train", "steps", t.steps);
  r.read("train", "global_batch_size", t.global_batch_size);
  r.read("train", "micro_batch_size", t.micro_batch_size);
  r.read("train", "seq_len", t.seq_len);
  r.read("train", "lr", t.lr);
  r.read("train", "min_lr_ratio", t.min_lr_ratio);
  r.read("train", "warmup_steps", t.warmup_steps);
  r.read("train", "weight_decay", t.weight_decay);
  r.read("train", "beta1", t.beta1);
  r.read("train", "beta2", t.beta2);
  r.read("train", "eps", t.eps);
  r.read("train", "grad_clip", t.grad_clip);
  r.read("train", "seed", t.seed);
  r.read("train", "eval_every", t.eval_every);
  r.read("train", "eval_batches", t.eval_batches);
  r.read("train", "log_every", t.log_every);
  r.read("train", "save_every", t.save_every);
  r.read("train", "keep_last", t.keep_last);
  r.read("train", "cuda_graph", t.cuda_graph);

  r.read("parallel", "mode", c.parallel.mode);
  r.read("parallel", "ep", c.parallel.ep);
  r.read("parallel", "lease_slots", c.parallel.lease_slots);
  r.read("ep", "backend", c.ep.backend);

  r.read("run", "dir", c.run.dir);
  r.read("run", "peak_tflops", c.run.peak_tflops);
  r.read("run", "save_final", c.run.save_final);
  r.read("run", "device", c.run.device);

  r.reject_unknown();
  c.validate();
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty() || path == "tiny") return parse_config(builtin::kTinyToml, "built-in config 'tiny'", overrides);
  std::ifstream in(path);
  MOE_CHECK(in.good(), "cannot read config file '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

void Config::validate(int64_t dp) const {
  model.validate();
  const TrainConfig& t = train;
  MOE_CHECK(t.steps >= 0, "train.steps must be >= 0, got ", t.steps);
  MOE_CHECK(t.seq_len > 0, "train.seq_len must be > 0, got ", t.seq_len);
  MOE_CHECK(t.micro_batch_size > 0, "train.micro_batch_size must be > 0, got ", t.micro_batch_size);
  MOE_CHECK(t.global_batch_size > 0 && t.global_batch_size % (t.micro_batch_size * dp) == 0,
            "train.global_batch_size (", t.global_batch_size, ") must be a positive multiple of train.micro_batch_size (",
            t.micro_batch_size, ") x data-parallel ranks (", dp, ")");
  for (const auto& [key, v] : {std::pair<const char*, double>{"train.lr", t.lr}, {"train.min_lr_ratio", t.min_lr_ratio},
                                {"train.weight_decay", t.weight_decay}, {"train.beta1", t.beta1}, {"train.beta2", t.beta2},
                                {"train.eps", t.eps}, {"train.grad_clip", t.grad_clip}, {"run.peak_tflops", run.peak_tflops},
                                {"data.eval_fraction", data.eval_fraction}})
    MOE_CHECK(std::isfinite(v), key, " must be a finite number, got ", v);
  MOE_CHECK(t.lr >= 0, "train.lr must be >= 0");
  MOE_CHECK(t.weight_decay >= 0, "train.weight_decay must be >= 0, got ", t.weight_decay);
  constexpr int64_t kIntMax = 2147483647;
  MOE_CHECK(t.keep_last <= kIntMax && parallel.ep <= kIntMax && parallel.lease_slots <= kIntMax,
            "train.keep_last, parallel.ep and parallel.lease_slots must fit in 32 bits");
  MOE_CHECK(t.min_lr_ratio >= 0 && t.min_lr_ratio <= 1, "train.min_lr_ratio must be in [0, 1]");
  MOE_CHECK(t.warmup_steps >= 0, "train.warmup_steps must be >= 0");
  MOE_CHECK(t.beta1 >= 0 && t.beta1 < 1 && t.beta2 >= 0 && t.beta2 < 1, "train.beta1 and train.beta2 must be in [0, 1)");
  MOE_CHECK(t.eps > 0, "train.eps must be > 0");
  MOE_CHECK(t.grad_clip >= 0, "train.grad_clip must be >= 0 (0 = off)");
  MOE_CHECK(t.log_every > 0, "train.log_every must be > 0");
  MOE_CHECK(t.eval_every >= 0 && t.eval_batches >= 0, "train.eval_every and train.eval_batches must be >= 0");
  MOE_CHECK(t.save_every >= 0 && t.keep_last >= 0, "train.save_every and train.keep_last must be >= 0");
  MOE_CHECK(parallel.mode == "ddp" || parallel.mode == "fsdp", "parallel.mode = \"", parallel.mode,
            "\" is not one of: ddp, fsdp");
  MOE_CHECK(parallel.ep >= 1, "parallel.ep must be >= 1, got ", parallel.ep);
  MOE_CHECK(parallel.mode != "fsdp" || parallel.ep == 1,
            "parallel.mode = \"fsdp\" holds every expert on every rank (no expert parallelism); set parallel.ep = 1");
  MOE_CHECK(parallel.lease_slots >= 1, "parallel.lease_slots must be >= 1");
  MOE_CHECK(ep.backend == "rowwise" || ep.backend == "alltoall", "ep.backend = \"", ep.backend,
            "\" is not one of: rowwise, alltoall");
  MOE_CHECK(run.peak_tflops >= 0, "run.peak_tflops must be >= 0 (0 = the device's default)");
  MOE_CHECK(run.device == "auto" || run.device == "cpu" || run.device == "cuda", "run.device = \"", run.device,
            "\" is not one of: auto, cpu, cuda");
  MOE_CHECK(!t.cuda_graph || run.device != "cpu", "train.cuda_graph = true needs the GPU, but run.device = \"cpu\"");
  MOE_CHECK(data.eval_fraction >= 0 && data.eval_fraction < 1, "data.eval_fraction must be in [0, 1)");
}

std::string model_config_toml(const ModelConfig& m) {
  std::ostringstream os;
  os.precision(17);
  os << "[model]\n"
     << "vocab_size = " << m.vocab_size << "\nhidden_size = " << m.hidden_size
     << "\nnum_hidden_layers = " << m.num_hidden_layers << "\nnum_attention_heads = " << m.num_attention_heads
     << "\nnum_key_value_heads = " << m.num_key_value_heads << "\nintermediate_size = " << m.intermediate_size
     << "\nnum_experts = " << m.num_experts << "\nnum_experts_per_tok = " << m.num_experts_per_tok
     << "\nnorm_topk_prob = " << (m.norm_topk_prob ? "true" : "false") << "\nrouter_score = \""
     << to_string(m.router_score) << "\"\nqk_norm = \"" << to_string(m.qk_norm) << "\"\nrope_theta = " << m.rope_theta
     << "\nrms_norm_eps = " << m.rms_norm_eps
     << "\nshared_expert_intermediate_size = " << m.shared_expert_intermediate_size
     << "\nfirst_k_dense_replace = " << m.first_k_dense_replace
     << "\ndense_intermediate_size = " << m.dense_intermediate_size
     << "\nrouter_aux_loss_coef = " << m.router_aux_loss_coef << "\nrouter_z_loss_coef = " << m.router_z_loss_coef
     << "\nrouting = \"" << to_string(m.routing) << "\"\nbias_update_rate = " << m.bias_update_rate
     << "\ncapacity_factor = " << m.capacity_factor << "\ndropless = " << (m.dropless ? "true" : "false")
     << "\ninit_std = " << m.init_std << "\neos_token_id = " << m.eos_token_id << "\n";
  return os.str();
}

std::string config_to_toml(const Config& c) {
  std::ostringstream os;
  os.precision(17);
  const TrainConfig& t = c.train;
  const DataConfig& d = c.data;
  os << "name = \"" << c.name << "\"\n\n" << model_config_toml(c.model) << "\n[data]\npath = \"" << d.path
     << "\"\nseed = " << d.seed << "\neval_fraction = " << d.eval_fraction << "\nsynthetic_tokens = "
     << d.synthetic_tokens << "\nsynthetic_eval_tokens = " << d.synthetic_eval_tokens
     << "\nsynthetic_domains = " << d.synthetic_domains << "\nsynthetic_successors = " << d.synthetic_successors
     << "\nsynthetic_doc_end_prob = " << d.synthetic_doc_end_prob << "\n\n[train]\nsteps = " << t.steps
     << "\nglobal_batch_size = " << t.global_batch_size << "\nmicro_batch_size = " << t.micro_batch_size
     << "\nseq_len = " << t.seq_len << "\nlr = " << t.lr << "\nmin_lr_ratio = " << t.min_lr_ratio
     << "\nwarmup_steps = " << t.warmup_steps << "\nweight_decay = " << t.weight_decay << "\nbeta1 = " << t.beta1
     << "\nbeta2 = " << t.beta2 << "\neps = " << t.eps << "\ngrad_clip = " << t.grad_clip << "\nseed = " << t.seed
     << "\neval_every = " << t.eval_every << "\neval_batches = " << t.eval_batches << "\nlog_every = " << t.log_every
     << "\nsave_every = " << t.save_every << "\nkeep_last = " << t.keep_last
     << "\ncuda_graph = " << (t.cuda_graph ? "true" : "false") << "\n\n[parallel]\nmode = \""
     << c.parallel.mode << "\"\nep = " << c.parallel.ep << "\nlease_slots = " << c.parallel.lease_slots
     << "\n\n[ep]\nbackend = \"" << c.ep.backend << "\"\n\n[run]\ndir = \"" << c.run.dir
     << "\"\npeak_tflops = " << c.run.peak_tflops << "\nsave_final = " << (c.run.save_final ? "true" : "false")
     << "\ndevice = \"" << c.run.device << "\"\n";
  return os.str();
}

}  // namespace moe
