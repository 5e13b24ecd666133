#include "moe/train/hf_tokenizer_files.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "moe/ckpt/durable_file.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"

namespace moe {

namespace {

namespace fs = std::filesystem;

// The names transformers' tokenizer and generation loaders look for in a model folder.
bool hugging_face_looks_for(const std::string& name) {
  static const char* const kNames[] = {
      "tokenizer.json",    "tokenizer_config.json",   "special_tokens_map.json", "added_tokens.json",
      "vocab.json",        "vocab.txt",               "vocab.bpe",               "merges.txt",
      "tokenizer.model",   "spiece.model",            "spm.model",               "sentencepiece.bpe.model",
      "source.spm",        "target.spm",              "generation_config.json",  "chat_template.jinja",
      "chat_template.json"};
  return name.ends_with(".tiktoken") ||
         std::any_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; });
}

// The highest token ids a tokenizer.json gives in its model's vocabulary (a token -> id object, or
// a Unigram [piece, score] list) and in its added_tokens, or a vocab.json (token -> id); nullopt
// where the file holds none in a form known here (nothing to compare).
struct HighestIds {
  std::optional<int64_t> vocab, added;
};

HighestIds highest_ids(const nlohmann::json& j, bool is_vocab_json) {
  HighestIds top;
  const auto take = [](std::optional<int64_t>& into, const nlohmann::json& id) {
    if (id.is_number_integer()) into = std::max(into.value_or(-1), id.get<int64_t>());
  };
  const nlohmann::json* vocab = is_vocab_json ? &j : nullptr;
  if (!is_vocab_json && j.contains("model") && j["model"].is_object() && j["model"].contains("vocab"))
    vocab = &j["model"]["vocab"];
  if (vocab && vocab->is_object())
    for (const auto& [token, id] : vocab->items()) take(top.vocab, id);
  if (vocab && vocab->is_array() && !vocab->empty()) top.vocab = static_cast<int64_t>(vocab->size()) - 1;
  if (!is_vocab_json && j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("id")) take(top.added, t["id"]);
  return top;
}

}  // namespace

void check_tokenizer_file_name(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  static const char* const kWeightEndings[] = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf",
                                                ".h5", ".msgpack", ".index.json"};
  const bool weights = name.rfind("model-", 0) == 0 || name.rfind("pytorch_model", 0) == 0 ||
                       std::any_of(std::begin(kWeightEndings), std::end(kWeightEndings),
                                   [&](const char* e) { return name.ends_with(e); });
  MOE_CHECK(!weights, "export-hf: --tokenizer '", path, "' is named like a weight file (", name,
            "); transformers would load it instead of the exported weights. --tokenizer copies the tokenizer's "
            "files: tokenizer.json, tokenizer_config.json, special_tokens_map.json, ...");
}

std::string check_tokenizer_files_fit(const std::vector<std::string>& paths, int64_t vocab_size) {
  std::string unknown, added_past;
  for (const std::string& path : paths) {
    const std::string name = fs::path(path).filename().string();
    if (!hugging_face_looks_for(name)) unknown += (unknown.empty() ? "" : ", ") + name;
    if (name != "tokenizer.json" && name != "vocab.json") continue;
    nlohmann::json j;
    try {
      j = parse_bounded_json(read_whole_file(path, "tokenizer file"), "'" + path + "'");
    } catch (const nlohmann::json::exception& e) {
      MOE_FAIL("export-hf: --tokenizer '", path, "' cannot be read as JSON (", e.what(), ")");
    }
    const HighestIds top = highest_ids(j, name == "vocab.json");
    MOE_CHECK(!top.vocab || *top.vocab < vocab_size, "export-hf: --tokenizer '", path, "' has token ids up to ",
              *top.vocab, ", but the model's vocabulary has ", vocab_size,
              " (model.vocab_size): it is another model's tokenizer, whose ids the exported model could not embed");
    // Tokens added after training (a pad token) without a larger embedding load, but cannot be fed.
    if (top.added && *top.added >= vocab_size)
      added_past = name + " adds tokens with ids up to " + std::to_string(*top.added) + ", past the model's " +
                   std::to_string(vocab_size) + " (model.vocab_size): the exported model cannot embed them; resize "
                   "its embeddings before feeding them";
  }
  std::string note = added_past;
  if (!unknown.empty())
    note += (note.empty() ? "" : "; ") + ("copied " + unknown) +
            " under the name given; Hugging Face's loaders look for tokenizer.json, tokenizer_config.json, "
            "special_tokens_map.json, vocab.json, merges.txt, tokenizer.model, ... by name: rename a file that is "
            "one of these";
  return note;
}

}  // namespace moe
