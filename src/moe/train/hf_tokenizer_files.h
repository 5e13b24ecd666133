// The tokenizer files `export-hf --tokenizer` copies beside the exported weights. A weight file's
// name is refused (transformers would load that file instead of the export's shards, and import-hf
// refuses a folder holding both); tokenizer.json and vocab.json whose ids reach past the model's
// vocabulary are refused (another model's tokenizer: the exported model would index past its
// embedding), added tokens past it are noted; a name Hugging Face's loaders do not look for is
// copied as given, with a note.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

// Refuses `path` when its name is a weight or index file's (model.safetensors, pytorch_model.bin,
// *.safetensors, *.bin, *.pt, *.pth, *.gguf, *.index.json, ...). Read nothing.
void check_tokenizer_file_name(const std::string& path);

// Reads tokenizer.json and vocab.json among `paths` and refuses one whose vocabulary's highest
// token id is not below vocab_size, naming the file and both numbers. Returns a note ("" when there
// is nothing to say) on added tokens past vocab_size and on files Hugging Face does not find by name.
std::string check_tokenizer_files_fit(const std::vector<std::string>& paths, int64_t vocab_size);

}  // namespace moe
