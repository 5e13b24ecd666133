#include "moe/train/hf_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "moe/core/bounded_json.h"
#include "moe/core/dtype.h"
#include "moe/core/error.h"
#include "moe/train/hf_config.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

using nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) { return json(shape).dump(); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A JSON file whose parse errors name it (`shown`: the path as the user spelled it) and whose
// duplicate keys are refused: nlohmann keeps the last of two equal keys silently, which in a
// weight_map would hide which file holds a tensor. Only a regular file is opened: a FIFO would
// block the open until something wrote to it.
json read_json_file(const std::string& path, const std::string& shown) {
  std::error_code ec;
  MOE_CHECK(fs::is_regular_file(path, ec), shown, " is not a regular file");
  std::ifstream in(path, std::ios::binary);
  MOE_CHECK(in.good(), "cannot read ", shown);
  try {
    return parse_bounded_json(in, shown, nullptr, /*allow_exceptions=*/true, /*unique_keys=*/true);
  } catch (const json::exception& e) {
    MOE_FAIL(shown, " is not valid JSON: ", e.what());
  }
}

// The model folder. A file is read only where it resolves (through any symlinks) to a place
// inside the folder or, when the folder is a Hugging Face cache snapshot
// (<repo>/snapshots/<revision>, whose files are symlinks into <repo>/blobs), inside that
// repository's blobs folder. Nothing else is read, whatever config or index names it.
class ModelFolder {
 public:
  ModelFolder(const std::string& dir, const std::string& tool) : dir_(dir), tool_(tool) {
    std::error_code ec;
    MOE_CHECK(fs::is_directory(dir, ec), tool, ": model folder '", dir, "' does not exist or is not a directory");
    root_ = fs::canonical(dir, ec);
    MOE_CHECK(!ec, tool, ": cannot resolve the model folder '", dir, "': ", ec.message());
    allowed_.push_back(root_);
    const fs::path blobs = root_.parent_path().parent_path() / "blobs";
    if (root_.parent_path().filename() == "snapshots" && fs::is_directory(blobs, ec))
      allowed_.push_back(fs::canonical(blobs, ec));
  }

  const std::string& dir() const { return dir_; }
  std::string shown(const std::string& name) const { return dir_ + "/" + name; }  // for messages
  bool has(const std::string& name) const {
    std::error_code ec;
    return fs::exists(fs::symlink_status(root_ / name, ec));
  }
  // The resolved path of `name` (as written in the folder); `referrer` (who names it) starts
  // every error.
  std::string resolve(const std::string& name, const std::string& referrer) const {
    const fs::path p(name);
    bool leaves = name.empty() || !p.is_relative();
    for (const fs::path& part : p) leaves = leaves || part == "..";
    MOE_CHECK(!leaves, referrer, ": '", name, "' is not a file inside the model folder ", dir_, "; ", tool_,
              " reads only files inside it");
    std::error_code ec;
    const fs::path real = fs::canonical(root_ / p, ec);
    if (ec == std::errc::no_such_file_or_directory) MOE_FAIL(referrer, ": '", name, "' does not exist in ", dir_);
    MOE_CHECK(!ec, referrer, ": cannot resolve '", name, "' in ", dir_, ": ", ec.message());
    // ("." or a subfolder would otherwise read as a link out of the folder below.)
    MOE_CHECK(!fs::is_directory(real, ec), referrer, ": '", name, "' is a folder in ", dir_, ", not a file");
    bool inside = false;
    for (const fs::path& base : allowed_) {
      const fs::path rel = real.lexically_relative(base);
      inside = inside || (!rel.empty() && rel != "." && *rel.begin() != "..");
    }
    MOE_CHECK(inside, referrer, ": '", name, "' resolves to ", real.string(), ", outside the model folder ", dir_,
              " (a symlink); ", tool_, " reads only files inside it, so copy the file in");
    return real.string();
  }

 private:
  std::string dir_, tool_;
  fs::path root_;
  std::vector<fs::path> allowed_;
};

// The tensors the folder offers and the file holding each: the weight_map of
// model.safetensors.index.json when there is one, else every tensor of model.safetensors. A folder
// with both is read only where the index names model.safetensors alone (some repositories carry
// such an index): transformers loads model.safetensors when it is present and ignores the index,
// so an index naming other shards beside it leaves which of the two is the model unclear.
struct WeightFiles {
  std::string source;  // the index or model.safetensors, for messages
  std::vector<std::unique_ptr<SafetensorsReader>> files;
  std::map<std::string, const SafetensorsReader*> holder;  // tensor name -> its file
};

WeightFiles open_weight_files(const ModelFolder& folder, const std::string& tool, std::string& doing) {
  WeightFiles w;
  std::map<std::string, const SafetensorsReader*> by_real_path;  // "./a" and "a" are one file
  auto open = [&](const std::string& real) -> const SafetensorsReader& {
    const SafetensorsReader*& slot = by_real_path[real];
    if (!slot) {
      doing = "reading " + real;
      w.files.push_back(std::make_unique<SafetensorsReader>(real));
      slot = w.files.back().get();
    }
    return *slot;
  };
  if (folder.has("model.safetensors.index.json")) {
    w.source = folder.shown("model.safetensors.index.json");
    doing = "reading " + w.source;
    const json index = read_json_file(folder.resolve("model.safetensors.index.json", tool), w.source);
    MOE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), w.source,
              " has no \"weight_map\" object (tensor name -> file name)");
    const std::string single = folder.has("model.safetensors") ? folder.resolve("model.safetensors", tool) : "";
    for (const auto& [name, file] : index["weight_map"].items()) {
      const std::string entry = w.source + ": weight_map entry '" + name + "'";
      MOE_CHECK(file.is_string(), entry, " maps to ", file.dump(), ", not a file name");
      const SafetensorsReader& f = open(folder.resolve(file.get<std::string>(), entry));
      MOE_CHECK(single.empty() || f.path() == single, folder.dir(), " holds both model.safetensors and ", w.source,
                ", which maps '", name, "' to ", file.get<std::string>(),
                ": transformers would load model.safetensors and ignore the index, so which of them is the model is "
                "unclear; remove whichever is stale");
      MOE_CHECK(f.has(name), entry, ": ", f.path(), " holds no tensor '", name, "'");
      w.holder[name] = &f;
    }
  } else {
    MOE_CHECK(folder.has("model.safetensors"), tool, ": ", folder.dir(),
              " has neither model.safetensors nor model.safetensors.index.json");
    w.source = folder.shown("model.safetensors");
    const SafetensorsReader& f = open(folder.resolve("model.safetensors", tool));
    for (const SafetensorsEntry& e : f.entries()) w.holder[e.name] = &f;
  }
  // A tensor stored in two shards is ambiguous (transformers keeps whichever it loads last).
  std::map<std::string, const SafetensorsReader*> first_file;
  for (const auto& f : w.files)
    for (const SafetensorsEntry& e : f->entries()) {
      const auto [it, fresh] = first_file.emplace(e.name, f.get());
      MOE_CHECK(fresh, tool, ": tensor '", e.name, "' is stored twice, in ", it->second->path(), " and in ", f->path(),
                "; keep one copy");
    }
  return w;
}

// One tensor of the Hugging Face layout: name, shape, and the config.json keys that give the
// shape (for messages).
struct HfTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  const char* dims;
};

std::string layer_prefix(int64_t l) { return "model.layers." + std::to_string(l) + "."; }

// The decimal number that follows `prefix` in `name` and ends at a '.', or -1.
int64_t index_after(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return -1;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size();
  int64_t value = -1;
  const auto [stop, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || stop == end || *stop != '.' || (*begin == '0' && stop - begin > 1)) return -1;
  return value;
}

// Visits the tensors of the HF layout of `mc` in registry order; `fused(l)` says whether layer
// l stores its experts fused ([N, 2H, D] and [N, D, H], transformers 5) or per expert (the Hub).
void for_each_hf_tensor(const ModelConfig& mc, const std::function<bool(int64_t)>& fused,
                        const std::function<void(const HfTensorSpec&)>& visit) {
  const int64_t V = mc.vocab_size, D = mc.hidden_size, H = mc.intermediate_size, N = mc.num_experts;
  const int64_t q_out = mc.num_attention_heads * mc.head_dim(), kv_out = mc.num_key_value_heads * mc.head_dim();
  visit({"model.embed_tokens.weight", {V, D}, "[vocab_size, hidden_size]"});
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    visit({p + "input_layernorm.weight", {D}, "[hidden_size]"});
    visit({p + "self_attn.q_proj.weight", {q_out, D}, "[num_attention_heads * head_dim, hidden_size]"});
    visit({p + "self_attn.k_proj.weight", {kv_out, D}, "[num_key_value_heads * head_dim, hidden_size]"});
    visit({p + "self_attn.v_proj.weight", {kv_out, D}, "[num_key_value_heads * head_dim, hidden_size]"});
    visit({p + "self_attn.o_proj.weight", {D, q_out}, "[hidden_size, num_attention_heads * head_dim]"});
    visit({p + "self_attn.q_norm.weight", {q_out}, "[num_attention_heads * head_dim]"});
    visit({p + "self_attn.k_norm.weight", {kv_out}, "[num_key_value_heads * head_dim]"});
    visit({p + "post_attention_layernorm.weight", {D}, "[hidden_size]"});
    visit({p + "mlp.gate.weight", {N, D}, "[num_experts, hidden_size]"});
    if (fused(l)) {
      visit({p + "mlp.experts.gate_up_proj", {N, 2 * H, D}, "[num_experts, 2 * intermediate_size, hidden_size]"});
      visit({p + "mlp.experts.down_proj", {N, D, H}, "[num_experts, hidden_size, intermediate_size]"});
      continue;
    }
    for (int64_t x = 0; x < N; ++x) {
      const std::string e = p + "mlp.experts." + std::to_string(x) + ".";
      visit({e + "gate_proj.weight", {H, D}, "[intermediate_size, hidden_size]"});
      visit({e + "up_proj.weight", {H, D}, "[intermediate_size, hidden_size]"});
      visit({e + "down_proj.weight", {D, H}, "[hidden_size, intermediate_size]"});
    }
  }
  visit({"model.norm.weight", {D}, "[hidden_size]"});
  visit({"lm_head.weight", {V, D}, "[vocab_size, hidden_size]"});
}

bool fused_layer(const WeightFiles& w, int64_t l) {
  return w.holder.count(layer_prefix(l) + "mlp.experts.gate_up_proj") != 0;
}

// The weight files hold exactly the model config.json describes: its layers and experts, every
// tensor with the shape config.json implies and dtype F32 or BF16, and nothing else.
void check_weights(const ModelConfig& mc, const std::string& config_path, const WeightFiles& w,
                   const std::string& tool) {
  // Layer and expert numbers first, so a count that disagrees with the files is named as such.
  // The checks stop at the first layer missing, so a huge num_hidden_layers cannot run away.
  std::set<int64_t> layers;
  for (const auto& [name, file] : w.holder) {
    const int64_t l = index_after(name, "model.layers.");
    if (l < 0) continue;
    layers.insert(l);
    MOE_CHECK(l < mc.num_hidden_layers, file->path(), " holds '", name, "' of layer ", l, ", but ", config_path,
              " has num_hidden_layers = ", mc.num_hidden_layers, "; ", tool, " refuses rather than drop layers");
    const int64_t x = index_after(name, layer_prefix(l) + "mlp.experts.");
    MOE_CHECK(x < mc.num_experts, file->path(), " holds '", name, "' of expert ", x, ", but ", config_path,
              " has num_experts = ", mc.num_experts, "; ", tool, " refuses rather than drop experts");
  }
  for (int64_t l = 0; l < mc.num_hidden_layers; ++l)
    MOE_CHECK(layers.count(l), config_path, " has num_hidden_layers = ", mc.num_hidden_layers, ", but ", w.source,
              " has no layer ", l, " (no tensor named 'model.layers.", l, ".*')");

  // Then tensor by tensor; the enumeration stops at the first tensor missing, so it visits at
  // most one more tensor than the files hold, whatever num_experts says.
  const std::string head_dim_note =
      " (head_dim = hidden_size / num_attention_heads = " + std::to_string(mc.head_dim()) + ")";
  std::set<std::string> expected;
  for_each_hf_tensor(
      mc, [&](int64_t l) { return fused_layer(w, l); },
      [&](const HfTensorSpec& t) {
        const auto it = w.holder.find(t.name);
        MOE_CHECK(it != w.holder.end(), w.source, ": tensor '", t.name, "' is missing; ", config_path,
                  " implies it, shape ", t.dims, " = ", shape_text(t.shape));
        const SafetensorsEntry& e = it->second->entry(t.name);
        MOE_CHECK(e.shape == t.shape, it->second->path(), ": tensor '", t.name, "' has shape ", shape_text(e.shape),
                  ", but ", config_path, " implies ", t.dims, " = ", shape_text(t.shape),
                  std::strstr(t.dims, "head_dim") ? head_dim_note : "");
        MOE_CHECK(e.dtype == DType::F32 || e.dtype == DType::BF16, it->second->path(), ": tensor '", t.name,
                  "' has dtype ", dtype_name(e.dtype), "; ", tool,
                  " reads F32 and BF16 (convert the checkpoint to one of them)");
        expected.insert(t.name);
      });
  for (const auto& [name, file] : w.holder) {
    if (expected.count(name)) continue;
    const int64_t l = index_after(name, "model.layers.");
    if (l >= 0 && fused_layer(w, l) && index_after(name, layer_prefix(l) + "mlp.experts.") >= 0)
      MOE_FAIL(file->path(), " holds both the fused '", layer_prefix(l),
               "mlp.experts.gate_up_proj' and the per-expert '", name, "'; a layer stores its experts one way");
    MOE_FAIL(file->path(), " holds '", name, "', which the OLMoE model ", config_path, " describes does not have; ",
             tool, " refuses rather than drop it");
  }
}

// A shard may hold only tensors the index lists: one it leaves out would be dropped unseen, where
// the same tensor in a single model.safetensors is refused. (Checked after check_weights, so a
// tensor the model needs is named as missing from the index first.)
void check_shards_hold_only_listed_tensors(const WeightFiles& w, const std::string& tool) {
  for (const auto& f : w.files)
    for (const SafetensorsEntry& e : f->entries())
      MOE_CHECK(w.holder.count(e.name), f->path(), " holds '", e.name, "', which ", w.source, " does not list; ", tool,
                " refuses rather than drop it (list it in the weight_map, or remove it from the file)");
}

// Widens elements [begin, end) of a checked F32 or BF16 tensor into dst. Read from the file, not
// the mapping (SafetensorsReader::read): a folder rewritten in place while it is imported (a
// save_pretrained into it) is an error naming the file, not a SIGBUS.
void to_f32(const SafetensorsReader& f, const std::string& name, int64_t begin, int64_t end, float* dst) {
  const SafetensorsEntry& e = f.entry(name);
  const uint64_t esize = dtype_size(e.dtype);
  MOE_CHECK(begin >= 0 && begin <= end && static_cast<uint64_t>(end) * esize <= e.end - e.begin, f.path(),
            ": tensor '", name, "' does not hold elements [", begin, ", ", end, ")");
  const uint64_t first = static_cast<uint64_t>(begin) * esize, last = static_cast<uint64_t>(end) * esize;
  const int64_t n = end - begin;
  if (e.dtype == DType::F32) {
    f.read(name, first, last, dst);
    return;
  }
  MOE_CHECK(e.dtype == DType::BF16, f.path(), ": tensor '", name, "' has dtype ", dtype_name(e.dtype));
  std::vector<uint16_t> bf16(static_cast<size_t>(n));
  f.read(name, first, last, bf16.data());
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(bf16[static_cast<size_t>(i)]);
}

}  // namespace

bool HfModel::is_hf_folder(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / "config.json", ec);
}

HfModel::HfModel(const std::string& dir, const std::string& tool) : dir_(dir), tool_(tool) {
  // Errors of moetrain name their file and key already; those of libraries (a JSON type error, a
  // filesystem call) get what was being done when they came.
  std::string doing = "reading " + dir;
  try {
    const ModelFolder folder(dir, tool);
    config_path_ = folder.shown("config.json");
    doing = "reading " + config_path_;
    model_ = model_config_from_hf(read_json_file(folder.resolve("config.json", tool), config_path_), config_path_);
    WeightFiles w = open_weight_files(folder, tool, doing);
    doing = "checking " + w.source + " against " + config_path_;
    check_weights(model_, config_path_, w, tool);
    check_shards_hold_only_listed_tensors(w, tool);
    for (int64_t l = 0; l < model_.num_hidden_layers; ++l) fused_experts_ = fused_experts_ || fused_layer(w, l);
    weights_source_ = w.source;
    files_ = std::move(w.files);
    holder_ = std::move(w.holder);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    MOE_FAIL(tool, ": out of memory while ", doing);
  } catch (const std::exception& e) {
    MOE_FAIL(tool, ": ", doing, ": ", e.what());
  }
}

HfModel::~HfModel() = default;

void HfModel::read(const std::string& name, int64_t begin, int64_t end, float* dst) const {
  auto read_tensor = [&](const std::string& hf_name, int64_t b, int64_t e, float* out) {
    const auto it = holder_.find(hf_name);
    MOE_CHECK(it != holder_.end(), weights_source_, " holds no tensor '", hf_name, "' (", tool_, " needs it for '",
              name, "')");
    const SafetensorsReader& f = *it->second;
    to_f32(f, hf_name, b, e, out);
    for (int64_t i = 0; i < e - b; ++i)
      MOE_CHECK(std::isfinite(out[i]), tool_, ": tensor '", hf_name, "' of ", f.path(), " holds a non-finite value (",
                out[i], ") at element ", b + i, "; a model with NaN or infinite weights cannot be trained from");
  };
  const bool gate_up = ends_with(name, ".mlp.experts.gate_up_proj"), down = ends_with(name, ".mlp.experts.down_proj");
  if (!(gate_up || down) || holder_.count(name)) return read_tensor(name, begin, end, dst);
  // The Hub layout: expert x's rows of the fused tensor are its gate_proj then up_proj [H, D]
  // (gate_up) or its down_proj [D, H]; a range may start and end inside any of them.
  const int64_t D = model_.hidden_size, H = model_.intermediate_size;
  const int64_t per_expert = gate_up ? 2 * H * D : D * H;
  MOE_CHECK(begin >= 0 && begin <= end && end <= model_.num_experts * per_expert, tool_, ": elements [", begin, ", ",
            end, ") lie outside '", name, "' (", model_.num_experts * per_expert, " elements)");
  const std::string base = name.substr(0, name.rfind('.') + 1);  // "model.layers.<l>.mlp.experts."
  for (int64_t i = begin; i < end;) {
    const int64_t x = i / per_expert, within = i % per_expert;
    const bool up = gate_up && within >= H * D;
    const char* part = gate_up ? (up ? "up_proj.weight" : "gate_proj.weight") : "down_proj.weight";
    const int64_t part_begin = up ? within - H * D : within, part_size = gate_up ? H * D : D * H;
    const int64_t n = std::min(end - i, part_size - part_begin);
    read_tensor(base + std::to_string(x) + "." + part, part_begin, part_begin + n, dst + (i - begin));
    i += n;
  }
}

}  // namespace moe
