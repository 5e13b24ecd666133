// Byte-level data preparation: text files -> .npy token files that TokenDataset reads.
//
// Tokenizer: vocabulary 257, token b (0..255) is the byte b, EOS = 256.
// Documents: every input file is one or more documents. The one rule: a line that consists of
// exactly a form feed ("\f\n", "\f\r\n", or "\f" at the end of the file) separates documents
// and is dropped. Every non-empty document is written as its bytes followed by one EOS, so a
// plain text file (no form-feed lines) becomes its bytes followed by a single EOS.
// Output: <out>/<stem>.npy (uint16) per input, plus <out>/dataset.json (token_folder.h)
//   {"tokenizer":"byte","vocab_size":257,"eos_token_id":256,"dtype":"uint16",
//    "files":[{"name":"<stem>.npy","tokens":N,"documents":D,"source":"<input path>"}, ...]}
// Nothing is ever overwritten. <out> must be new or empty, unless `append`: then the inputs are
// added to the dataset already there, whose dataset.json must be byte-level (the four keys above)
// and match the folder, and no input may become a file already listed or present; dataset.json
// afterwards lists the old files, then the new ones. With `append`, a non-empty folder without
// dataset.json is accepted only when it holds no .npy file.
// Every file is written under a temporary name in <out> (".<stem>.npy.tmp-<pid>",
// ".dataset.json.tmp-<pid>") and renamed when all are complete (dataset.json last). Everything
// is checked before anything is written or any input read: a missing input, an input path that is
// not UTF-8 (it goes into dataset.json), two inputs with the same stem, a folder that is not empty
// (or not appendable), a name collision, or an output folder that cannot be created or written (a
// ".write-check.tmp-<pid>" is created and removed there first) is a
// moe::Error, and leaves no partial files (nor an output folder this call created). A folder
// holding temporary files of that naming (left by a prepare or tokenize_hf.py that was killed)
// is refused, with or without `append`, naming them; they are never deleted here.
// While it runs, SIGINT, SIGTERM and SIGHUP (those not ignored) remove the temporary files and
// the folders this call created, print one "error: ..." line and end the process by the same
// signal; the previous handlers are back when the call returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

constexpr int64_t kByteVocabSize = 257;
constexpr int64_t kByteEosTokenId = 256;

struct PreparedFile {
  std::string name;    // file name inside out_dir, "<stem>.npy"
  std::string source;  // the input path as given
  int64_t tokens = 0;
  int64_t documents = 0;
};

struct PrepareResult {
  std::string out_dir;
  std::vector<PreparedFile> files;
  int64_t total_tokens = 0;   // of the new files
  int64_t listed_files = 0;   // files dataset.json lists afterwards (more than files.size() after an append)
};

// Byte-level tokenization of a file's bytes with the document rule above (exposed for tests).
std::vector<uint16_t> byte_tokenize(const std::string& bytes, int64_t* documents = nullptr);

PrepareResult prepare_byte_level(const std::vector<std::string>& inputs, const std::string& out_dir,
                                 bool append = false);

}  // namespace moe
