#include "moe/train/hf_interop.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/durable_file.h"
#include "moe/ckpt/run_checkpoints.h"
#include "moe/ckpt/safetensors.h"
#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/core/printable.h"
#include "moe/core/interrupt_guard.h"
#include "moe/model/weights.h"
#include "moe/train/config.h"
#include "moe/train/hf_config.h"
#include "moe/train/hf_tokenizer_files.h"
#include "moe/train/init_source.h"

namespace fs = std::filesystem;

namespace moe {
namespace {

std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.dims.begin(), s.dims.begin() + s.ndim); }

// One tensor of the Hugging Face layout and how to produce its FP32 values.
struct HfTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* dst)> fill;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The selection bias decides which experts a token reaches, and OlmoeForCausalLM has none: a
// checkpoint whose bias is not zero is refused, also when its config no longer updates it (a run
// started with --init-from from one that did keeps the bias with model.bias_update_rate = 0; its
// export loaded and evaluated, routing differently, without a word).
void check_router_bias_is_zero(const CheckpointReader& ckpt) {
  if (!ckpt.has("router_bias")) return;
  int64_t n = 1;
  for (int64_t d : ckpt.global_shape("router_bias")) n *= d;
  std::vector<float> bias(static_cast<size_t>(n));
  ckpt.read("router_bias", DType::F32, 0, n, bias.data());
  const auto nonzero = std::find_if(bias.begin(), bias.end(), [](float b) { return b != 0.0f; });
  MOE_CHECK(nonzero == bias.end(), "export-hf: checkpoint ", ckpt.dir(), " holds a router_bias that is not zero (",
            *nonzero, " at element ", nonzero - bias.begin(), " of ", n,
            "): the auxiliary-loss-free selection bias decides which experts a token reaches, and OlmoeForCausalLM "
            "has none, so the export would route differently (a run started with --init-from from a run with "
            "model.bias_update_rate > 0 keeps its bias)");
}

// Expert tensors are stored fused ([N, 2H, D] gate rows first, [N, D, H]); the Hub layout has
// one gate_proj [H, D], up_proj [H, D] and down_proj [D, H] per expert.
std::vector<HfTensor> hf_tensors(const ModelConfig& mc, const CheckpointReader& ckpt) {
  const ParamRegistry reg = build_registry(mc, 0, mc.num_experts, ParamLayout::ByBlock);
  // The weights are read by element ranges from the config in train_state.json, which is text
  // beside them: a config giving fewer experts or layers than were saved exported a truncated
  // model without a word. Every weight must have the config's shape, and none may be left over.
  constexpr const char* kDescribed = "the model its train_state.json describes";
  check_stored_shapes(ckpt, reg, /*moments=*/false, kDescribed);
  std::set<std::string> weights;
  for (const ParamEntry& e : reg.entries()) weights.insert(e.name);
  for (const std::string& key : ckpt.keys()) {
    const bool is_moment = key.ends_with(".exp_avg") || key.ends_with(".exp_avg_sq");
    MOE_CHECK(is_moment || key == "router_bias" || weights.count(key), "export-hf: checkpoint ", ckpt.dir(),
              " holds tensor '", key, "', which ", kDescribed, " (model.num_hidden_layers = ", mc.num_hidden_layers,
              ", model.num_experts = ", mc.num_experts, ") does not have; it refuses rather than export part of it");
  }
  std::vector<HfTensor> out;
  const std::string fused_gate_up = ".mlp.experts.gate_up_proj", fused_down = ".mlp.experts.down_proj";
  const int64_t D = mc.hidden_size, H = mc.intermediate_size;
  auto ends_with = [](const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const ParamEntry& e : reg.entries()) {
    const std::string name = e.name;
    if (ends_with(name, fused_gate_up)) {
      const std::string base = name.substr(0, name.size() - std::string("gate_up_proj").size());
      for (int64_t x = 0; x < mc.num_experts; ++x) {
        const int64_t at = x * 2 * H * D;
        out.push_back({base + std::to_string(x) + ".gate_proj.weight", {H, D},
                       [&ckpt, name, at, H, D](float* dst) { ckpt.read(name, DType::F32, at, at + H * D, dst); }});
        out.push_back({base + std::to_string(x) + ".up_proj.weight", {H, D}, [&ckpt, name, at, H, D](float* dst) {
                         ckpt.read(name, DType::F32, at + H * D, at + 2 * H * D, dst);
                       }});
      }
    } else if (ends_with(name, fused_down)) {
      const std::string base = name.substr(0, name.size() - std::string("down_proj").size());
      for (int64_t x = 0; x < mc.num_experts; ++x) {
        const int64_t at = x * D * H;
        out.push_back({base + std::to_string(x) + ".down_proj.weight", {D, H},
                       [&ckpt, name, at, H, D](float* dst) { ckpt.read(name, DType::F32, at, at + D * H, dst); }});
      }
    } else {
      const int64_t n = e.global_shape.numel();
      out.push_back({name, dims(e.global_shape), [&ckpt, name, n](float* dst) { ckpt.read(name, DType::F32, 0, n, dst); }});
    }
  }
  return out;
}

}  // namespace

std::string output_folder(const std::string& path, const char* command) {
  MOE_CHECK(!path.empty(), command, ": the output path is empty");
  MOE_CHECK(is_valid_utf8(path), command, ": output '", printable(path),
            "' is not valid UTF-8 (moetrain records paths as UTF-8 text); choose a UTF-8 name");
  fs::path p = fs::path(path).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();  // "hf/" names "hf"
  const std::string name = p.filename().string();
  MOE_CHECK(name != "." && name != ".." && !name.empty(), command, ": output '", path,
            "' names the current folder, its parent or the root; give the new folder's own name (from its parent "
            "folder)");
  return p.string();
}

ExportResult export_hf(const std::string& checkpoint, const std::string& out_arg, int64_t max_shard_bytes,
                       const std::vector<std::string>& tokenizer_files, DType dtype, const HfProgress& progress) {
  // "hf/" or "hf/." built the temporary folder inside the output and failed at the final rename.
  const std::string out_dir = output_folder(out_arg, "export-hf");
  MOE_CHECK(max_shard_bytes > 0, "export-hf: the shard size (--max-shard-gb) must be > 0");
  MOE_CHECK(dtype == DType::F32 || dtype == DType::BF16, "export-hf: the dtype must be F32 or BF16, got ",
            dtype_name(dtype));
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  std::error_code ec;
  const fs::file_status out_status = fs::symlink_status(out_dir, ec);
  // A link, even one to nothing, would only be replaced by the final rename, after all the work.
  MOE_CHECK(!fs::is_symlink(out_status), "export-hf: output '", out_dir,
            "' is a symbolic link; choose a new directory");
  MOE_CHECK(!fs::exists(out_status), "export-hf: output '", out_dir, "' exists; choose a new directory");
  // A checkpoint is never written into (`export-hf run/step-000100 run/step-000100/hf` would be).
  const std::string inside = enclosing_checkpoint(out_dir);
  MOE_CHECK(inside.empty(), "export-hf: output '", out_dir, "' is inside the checkpoint ", inside,
            "; nothing is written into a checkpoint: choose a folder outside it");
  std::set<std::string> names = {"config.json", "model.safetensors.index.json"};
  for (const auto& t : tokenizer_files) {
    MOE_CHECK(fs::exists(t), "export-hf: tokenizer file '", t, "' not found");
    MOE_CHECK(fs::is_regular_file(t), "export-hf: --tokenizer '", t, "' is not a file (give each file: tokenizer.json, ",
              "tokenizer_config.json, ...)");
    check_tokenizer_file_name(t);
    const std::string name = fs::path(t).filename().string();
    MOE_CHECK(names.insert(name).second, "export-hf: --tokenizer '", t, "' would be written as ", name,
              ", a name the export already uses");
  }
  const std::string dir = resolve_checkpoint(checkpoint);
  CheckpointReader ckpt(dir);
  const Config cfg = parse_stored_config(ckpt.train_state_string("config"), dir + "/train_state.json");
  // The model is recorded twice in train_state.json; a start that loads the checkpoint compares
  // "model_config" (eval refused an edited one), so the export does too rather than describe a
  // model from the other record.
  if (ckpt.train_state().contains("model_config")) {
    const Config stored = parse_config(ckpt.train_state_string("model_config"), dir + "/train_state.json");
    const std::string diff = config_differences(cfg, stored, "model", "its config", "its model_config");
    MOE_CHECK(diff.empty(), "export-hf: ", dir, "/train_state.json records two different models:", diff,
              "; the checkpoint was edited or damaged");
  }
  nlohmann::json hf_config = olmoe_hf_config(cfg.model);
  const std::string tokenizer_note = check_tokenizer_files_fit(tokenizer_files, cfg.model.vocab_size);
  std::string note;
  // (A step-0 checkpoint, such as import-hf's, was never trained: nothing was dropped.)
  // Whether any route was dropped is in metrics.jsonl, not the checkpoint (an earlier start of the run
  // may have had another parallel.ep): the note says where to look.
  if (!cfg.model.dropless && ckpt.train_state_int("step", 0) > 0) {
    char factor[32];
    const auto done = std::to_chars(factor, factor + sizeof factor, cfg.model.capacity_factor);
    note = "trained with model.capacity_factor = " + std::string(factor, done.ptr) +
           " and model.dropless = false: with a factor below 1 or under expert parallelism, routes past a rank's "
           "expert buffer are dropped (metrics.jsonl's dropped_fraction says how many were); OlmoeForCausalLM drops "
           "none, so its outputs differ where training dropped routes";
  }
  if (dtype == DType::BF16) hf_config["torch_dtype"] = "bfloat16";  // from_pretrained(dtype="auto") keeps BF16
  check_router_bias_is_zero(ckpt);
  const std::vector<HfTensor> tensors = hf_tensors(cfg.model, ckpt);

  int64_t total_bytes = 0;
  for (const HfTensor& t : tensors) total_bytes += t.numel() * esize;
  // Shards: consecutive tensors up to max_shard_bytes each (a larger tensor gets a shard alone).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t bytes = tensors[i].numel() * esize;
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(i);
    in_shard += bytes;
  }
  // Ctrl-C, SIGTERM or SIGHUP from here on stop the export at the next tensor, with the cleanup
  // below (made after the guard, so it runs before the guard restores the handlers).
  InterruptGuard interrupt("export-hf");
  // A fresh directory beside the output (mkdtemp never reuses an existing one, so nothing of the
  // user's can be under the temporary name); renamed into place when complete. Nothing
  // half-written stays behind: if anything below fails, the temporary directory goes, and so do
  // the output's parent folders this call created (each only while empty: never others' files).
  struct RemoveOnFailure {
    std::string path;
    std::vector<fs::path> created_parents;  // deepest first
    bool armed = true;
    ~RemoveOnFailure() {
      std::error_code ignored;
      if (!armed) return;
      if (!path.empty()) fs::remove_all(path, ignored);
      for (const fs::path& p : created_parents) fs::remove(p, ignored);
    }
  } cleanup;
  const fs::path parent = fs::absolute(out_dir).lexically_normal().parent_path();
  for (fs::path p = parent; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path())
    cleanup.created_parents.push_back(p);
  fs::create_directories(parent, ec);
  MOE_CHECK(!ec, "export-hf: cannot create the parent folder of ", out_dir, ": ", ec.message());
  std::string tmp_template = out_dir + ".tmp-XXXXXX";
  MOE_CHECK(::mkdtemp(tmp_template.data()) != nullptr, "export-hf: cannot create a temporary folder beside ", out_dir,
            ": ", std::strerror(errno));
  const std::string tmp = tmp_template;
  cleanup.path = tmp;
  const mode_t mask = ::umask(0);  // mkdtemp makes the folder 0700; the export gets the usual mode
  ::umask(mask);
  ::chmod(tmp.c_str(), 0777 & ~mask);
  ExportResult r;
  r.out_dir = out_dir;
  r.shards = static_cast<int>(shards.size());
  for (const std::string& n : {note, tokenizer_note})
    if (!n.empty()) r.notes.push_back(n);
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<float> buffer;     // one tensor at a time
  std::vector<uint16_t> rounded;  // its BF16 values, for a BF16 export
  char name_buf[64];
  const std::string undone = "it removed its temporary folder " + tmp + ", so " + out_dir + " was not created";
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(name_buf, sizeof(name_buf), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    SafetensorsWriter w;
    w.set_metadata("format", "pt");
    for (size_t i : shards[s]) w.add(tensors[i].name, dtype, tensors[i].shape);
    w.open(tmp + "/" + name_buf);
    for (size_t i : shards[s]) {
      interrupt.check(undone);
      buffer.resize(static_cast<size_t>(tensors[i].numel()));
      tensors[i].fill(buffer.data());
      if (dtype == DType::BF16) {
        rounded.resize(buffer.size());
        std::transform(buffer.begin(), buffer.end(), rounded.begin(), f32_to_bf16);
        w.write(rounded.data(), rounded.size() * 2);
      } else {
        w.write(buffer.data(), buffer.size() * 4);
      }
      weight_map[tensors[i].name] = name_buf;
      r.bytes += tensors[i].numel() * esize;
      ++r.tensors;
      if (progress) progress(r.bytes, total_bytes);
      // Test hook: wait here, one tensor written, for a signal (tests/cli/hf_interop_test.cpp); at
      // most a minute, so a test that fails to send one leaves no process behind for long.
      if (r.tensors == 1 && std::getenv("MOE_TEST_HF_PAUSE")) ::sleep(60);
    }
    w.finish();
  }
  // Each file fsynced before the folder is renamed into place (the shards are, by their writer): a
  // crash after the rename must not leave an export whose config.json or index is empty.
  write_file_atomic(tmp + "/config.json", hf_config.dump(2) + "\n");
  const nlohmann::json index = {{"metadata", {{"total_size", r.bytes}}}, {"weight_map", weight_map}};
  write_file_atomic(tmp + "/model.safetensors.index.json", index.dump(2) + "\n");
  for (const auto& t : tokenizer_files)
    write_file_atomic(tmp + "/" + fs::path(t).filename().string(), read_whole_file(t, "tokenizer file"));
  interrupt.check(undone);
  fs::rename(tmp, out_dir, ec);
  MOE_CHECK(!ec, "export-hf: cannot rename ", tmp, " to ", out_dir, ": ", ec.message());
  cleanup.armed = false;
  fsync_dir(parent.string());
  r.peak_rss_bytes = peak_rss_bytes();
  return r;
}

}  // namespace moe
