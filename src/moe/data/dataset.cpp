#include "moe/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/core/rng.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_folder.h"

namespace moe {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t kTrainWindows = 0x5452'4149'4e57'494eull;  // "TRAINWIN"
constexpr uint64_t kSyntheticTrainStream = 0;
constexpr uint64_t kSyntheticEvalStream = 1;

// Index of the first token >= vocab_size, or -1. Parallel: token files can be large.
int64_t first_out_of_vocab(const NpyTokens& file, int64_t vocab_size) {
  const int64_t n = file.size();
  if (file.dtype() == TokenDType::U16 && vocab_size > 65535) return -1;
  int64_t first_bad = n;
#pragma omp parallel for schedule(static) reduction(min : first_bad)
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<int64_t>(file.at(i)) >= vocab_size && i < first_bad) first_bad = i;
  return first_bad == n ? -1 : first_bad;
}
}  // namespace

TokenDataset TokenDataset::open(const DataConfig& cfg, int64_t vocab_size, int64_t eos_token_id) {
  MOE_CHECK(vocab_size >= 2, "data: vocab_size must be >= 2, got ", vocab_size);
  MOE_CHECK(cfg.eval_fraction >= 0.0 && cfg.eval_fraction < 1.0, "data.eval_fraction must be in [0, 1), got ",
            cfg.eval_fraction);
  TokenDataset ds;
  ds.cfg_ = cfg;
  ds.vocab_size_ = vocab_size;
  ds.path_ = cfg.path;

  if (cfg.path == "synthetic") {
    MOE_CHECK(cfg.synthetic_tokens >= 2, "data.synthetic_tokens must be >= 2, got ", cfg.synthetic_tokens);
    // The corpus is generated in memory (4 bytes a token, twice while it is assembled).
    const double bytes = 8.0 * (static_cast<double>(cfg.synthetic_tokens) + static_cast<double>(cfg.synthetic_eval_tokens));
    MOE_CHECK(bytes < 0.5 * static_cast<double>(physical_memory_bytes()), "data.synthetic_tokens (",
              cfg.synthetic_tokens, ") + data.synthetic_eval_tokens (", cfg.synthetic_eval_tokens, ") need ",
              bytes / double(1 << 30), " GiB to generate, more than half of this machine's memory; lower them");
    MOE_CHECK(cfg.synthetic_eval_tokens >= 0, "data.synthetic_eval_tokens must be >= 0, got ",
              cfg.synthetic_eval_tokens);
    const SyntheticCorpus corpus(vocab_size, eos_token_id, cfg);
    std::vector<int32_t> train, held_out;
    corpus.generate(kSyntheticTrainStream, cfg.synthetic_tokens, train);
    corpus.generate(kSyntheticEvalStream, cfg.synthetic_eval_tokens, held_out);
    ds.synthetic_tokens_.reserve(train.size() + held_out.size());
    ds.synthetic_tokens_.insert(ds.synthetic_tokens_.end(), train.begin(), train.end());
    ds.synthetic_tokens_.insert(ds.synthetic_tokens_.end(), held_out.begin(), held_out.end());
    ds.sources_.push_back({"synthetic", 0, cfg.synthetic_tokens, cfg.synthetic_tokens, cfg.synthetic_eval_tokens});
    ds.attainable_loss_ = corpus.entropy_rate_nats();
    std::ostringstream os;
    os << "synthetic corpus (vocab " << vocab_size << ", eos " << eos_token_id << ", " << cfg.synthetic_domains
       << " domains, " << cfg.synthetic_successors << " successors, doc end p " << cfg.synthetic_doc_end_prob
       << ", seed " << cfg.seed << ")";
    ds.synthetic_summary_ = os.str();
  } else {
    const fs::path dir(cfg.path);
    std::error_code ec;
    MOE_CHECK(fs::is_directory(dir, ec), "data.path: '", cfg.path,
              "' is not a folder of .npy token files (nor \"synthetic\")");
    for (const TokenFile& token_file : list_token_files(cfg.path)) {
      const std::string& name = token_file.path;
      NpyTokens file = NpyTokens::open(name);
      MOE_CHECK(!token_file.listed_tokens || *token_file.listed_tokens == file.size(), name, " holds ", file.size(),
                " tokens, but ", (dir / "dataset.json").string(), " lists it with ",
                token_file.listed_tokens.value_or(0),
                ": the file changed after dataset.json was written; prepare the dataset again into a new folder");
      const int64_t bad = first_out_of_vocab(file, vocab_size);
      MOE_CHECK(bad < 0, name, ": token ", (bad < 0 ? 0 : file.at(bad)), " at index ", bad,
                " is outside the model vocabulary (vocab_size ", vocab_size, ")");
      const int64_t n = file.size();
      const int64_t held_out = static_cast<int64_t>(std::floor(cfg.eval_fraction * static_cast<double>(n)));
      ds.sources_.push_back({name, 0, n - held_out, n - held_out, held_out});
      ds.files_.push_back(std::move(file));
    }
  }

  ds.train_cumulative_.assign(1, 0);
  for (const Source& s : ds.sources_) ds.train_cumulative_.push_back(ds.train_cumulative_.back() + s.train_length);
  return ds;
}

void TokenDataset::copy_window(size_t source, int64_t start, int64_t seq_len, int32_t* inputs,
                               int32_t* targets) const {
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[t] = static_cast<int32_t>(token(source, start + t));
    targets[t] = static_cast<int32_t>(token(source, start + t + 1));
  }
}

void TokenDataset::check_window(int64_t seq_len) const {
  for (const Source& s : sources_)
    MOE_CHECK(s.train_length >= seq_len + 1, s.name, ": training split has ", s.train_length,
              " tokens, fewer than the seq_len+1 = ", seq_len + 1, " a training window needs (data.eval_fraction ",
              cfg_.eval_fraction, " held out)");
}

void TokenDataset::train_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                               int32_t* targets) const {
  MOE_CHECK(seq_len >= 1, "train_batch: seq_len must be >= 1, got ", seq_len);
  MOE_CHECK(step >= 0 && first_seq >= 0 && n_seqs >= 0, "train_batch: negative step ", step, ", first_seq ",
            first_seq, " or n_seqs ", n_seqs);
  check_window(seq_len);
  const uint64_t total = static_cast<uint64_t>(train_cumulative_.back());
  const uint64_t step_seed = hash_counters(cfg_.seed, kTrainWindows, static_cast<uint64_t>(step));
  for (int64_t r = 0; r < n_seqs; ++r) {
    Rng rng(step_seed, static_cast<uint64_t>(first_seq + r));
    const int64_t pick = static_cast<int64_t>(rng.below(total));
    const size_t source = static_cast<size_t>(
        std::upper_bound(train_cumulative_.begin(), train_cumulative_.end(), pick) - train_cumulative_.begin() - 1);
    const Source& s = sources_[source];
    const int64_t start =
        s.train_begin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(s.train_length - seq_len)));
    copy_window(source, start, seq_len, inputs + r * seq_len, targets + r * seq_len);
  }
}

int64_t TokenDataset::eval_num_sequences(int64_t seq_len) const {
  MOE_CHECK(seq_len >= 1, "eval_num_sequences: seq_len must be >= 1, got ", seq_len);
  int64_t n = 0;
  for (const Source& s : sources_) n += s.eval_length / (seq_len + 1);
  return n;
}

void TokenDataset::eval_batch(int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                              int32_t* targets) const {
  const int64_t available = eval_num_sequences(seq_len);
  MOE_CHECK(first_seq >= 0 && n_seqs >= 0 && first_seq + n_seqs <= available, "eval_batch: sequences [", first_seq,
            ", ", first_seq + n_seqs, ") outside the ", available, " held-out windows of seq_len ", seq_len);
  for (int64_t r = 0; r < n_seqs; ++r) {
    int64_t k = first_seq + r;
    size_t source = 0;
    while (k >= sources_[source].eval_length / (seq_len + 1)) k -= sources_[source++].eval_length / (seq_len + 1);
    const int64_t start = sources_[source].eval_begin + k * (seq_len + 1);
    copy_window(source, start, seq_len, inputs + r * seq_len, targets + r * seq_len);
  }
}

int64_t TokenDataset::train_tokens() const { return train_cumulative_.empty() ? 0 : train_cumulative_.back(); }

int64_t TokenDataset::eval_tokens() const {
  int64_t n = 0;
  for (const Source& s : sources_) n += s.eval_length;
  return n;
}

std::string TokenDataset::describe() const {
  std::ostringstream os;
  os << "data: ";
  if (!synthetic_summary_.empty()) {
    os << synthetic_summary_;
  } else {
    bool all_u16 = true, all_u32 = true;
    for (const NpyTokens& f : files_) {
      all_u16 = all_u16 && f.dtype() == TokenDType::U16;
      all_u32 = all_u32 && f.dtype() == TokenDType::U32;
    }
    os << files_.size() << " .npy file" << (files_.size() == 1 ? "" : "s") << " in " << path_ << " ("
       << (all_u16 ? "uint16" : all_u32 ? "uint32" : "uint16+uint32") << ")";
  }
  os << ": " << train_tokens() + eval_tokens() << " tokens, train " << train_tokens() << ", held-out "
     << eval_tokens();
  if (synthetic_summary_.empty()) os << " (eval_fraction " << cfg_.eval_fraction << " of each file)";
  if (attainable_loss_) os << ", attainable loss " << *attainable_loss_ << " nats";
  return os.str();
}

}  // namespace moe
