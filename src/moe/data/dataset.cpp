#include "moe/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "moe/core/arena.h"
#include "moe/core/error.h"
#include "moe/core/rng.h"
#include "moe/data/synthetic.h"
#include "moe/data/token_sources.h"

namespace moe {

namespace {
constexpr uint64_t kTrainWindows = 0x5452'4149'4e57'494eull;  // "TRAINWIN"
constexpr uint64_t kSyntheticTrainStream = 0;
constexpr uint64_t kSyntheticEvalStream = 1;
}  // namespace

TokenDataset TokenDataset::open(const DataConfig& cfg, int64_t vocab_size, int64_t eos_token_id) {
  MOE_CHECK(vocab_size >= 2, "data: vocab_size must be >= 2, got ", vocab_size);
  MOE_CHECK(cfg.eval_fraction >= 0.0 && cfg.eval_fraction < 1.0, "data.eval_fraction must be in [0, 1), got ",
            cfg.eval_fraction);
  TokenDataset ds;
  ds.cfg_ = cfg;
  ds.vocab_size_ = vocab_size;

  if (cfg.sources.empty() && cfg.path == "synthetic") {
    MOE_CHECK(cfg.synthetic_tokens >= 2, "data.synthetic_tokens must be >= 2, got ", cfg.synthetic_tokens);
    // The corpus is generated in memory (4 bytes a token, twice while it is assembled).
    const double bytes = 8.0 * (static_cast<double>(cfg.synthetic_tokens) + static_cast<double>(cfg.synthetic_eval_tokens));
    MOE_CHECK(bytes < 0.5 * static_cast<double>(physical_memory_bytes()), "data.synthetic_tokens (",
              cfg.synthetic_tokens, ") + data.synthetic_eval_tokens (", cfg.synthetic_eval_tokens, ") need ",
              bytes / double(1 << 30), " GiB to generate, more than half of this machine's memory; lower them");
    MOE_CHECK(cfg.synthetic_eval_tokens >= 0, "data.synthetic_eval_tokens must be >= 0, got ",
              cfg.synthetic_eval_tokens);
    // Its Markov chain keeps tables over the vocabulary (~48 bytes a token plus 12 per successor):
    // a vocabulary too large for them is named here, not met by the kernel's out-of-memory killer.
    const double table_bytes = static_cast<double>(vocab_size) *
                               (48.0 + 12.0 * static_cast<double>(std::max<int64_t>(cfg.synthetic_successors, 0)));
    MOE_CHECK(table_bytes < 0.5 * static_cast<double>(physical_memory_bytes()), "model.vocab_size = ", vocab_size,
              " needs ", table_bytes / double(1 << 30), " GiB for the synthetic corpus's tables (with ",
              "data.synthetic_successors = ", cfg.synthetic_successors, "), more than half of this machine's ",
              "memory; lower model.vocab_size, or train on token files (data.path)");
    const SyntheticCorpus corpus(vocab_size, eos_token_id, cfg);
    std::vector<int32_t> train, held_out;
    corpus.generate(kSyntheticTrainStream, cfg.synthetic_tokens, train);
    corpus.generate(kSyntheticEvalStream, cfg.synthetic_eval_tokens, held_out);
    ds.synthetic_tokens_.reserve(train.size() + held_out.size());
    ds.synthetic_tokens_.insert(ds.synthetic_tokens_.end(), train.begin(), train.end());
    ds.synthetic_tokens_.insert(ds.synthetic_tokens_.end(), held_out.begin(), held_out.end());
    ds.files_.push_back({"synthetic", 0, 0, cfg.synthetic_tokens, cfg.synthetic_tokens, cfg.synthetic_eval_tokens});
    ds.sources_.push_back({"data.path", "synthetic", 1.0, {0}});
    ds.attainable_loss_ = corpus.entropy_rate_nats();
    std::ostringstream os;
    os << "synthetic corpus (vocab " << vocab_size << ", eos " << eos_token_id << ", " << cfg.synthetic_domains
       << " domains, " << cfg.synthetic_successors << " successors, doc end p " << cfg.synthetic_doc_end_prob
       << ", seed " << cfg.seed << ")";
    ds.synthetic_summary_ = os.str();
    return ds;
  }

  std::vector<DataSource> sources = cfg.sources;
  if (sources.empty()) sources.push_back({cfg.path, 1.0});
  const TokenDType raw_dtype = token_dtype_from_name(cfg.dtype);
  for (size_t s = 0; s < sources.size(); ++s) {
    const std::string key = cfg.sources.empty() ? "data.path" : "data.sources[" + std::to_string(s) + "].path";
    MOE_CHECK(sources[s].path != "synthetic", key,
              " = \"synthetic\": the synthetic corpus is not a source of "
              "[[data.sources]] (it is not mixed with token files); use data.path = \"synthetic\" instead");
    MOE_CHECK(std::isfinite(sources[s].weight) && sources[s].weight > 0, key, ": weight must be > 0, got ",
              sources[s].weight);
    Source src{cfg.sources.empty() ? "data.path" : "data.sources[" + std::to_string(s) + "]", sources[s].path,
               sources[s].weight, {}};
    std::vector<uint64_t> checksums;
    std::vector<TokenArray> opened = open_token_files(sources[s].path, cfg.format, raw_dtype, key, vocab_size,
                                                      eos_token_id, &ds.warnings_, &checksums);
    for (size_t k = 0; k < opened.size(); ++k) {
      TokenArray& file = opened[k];
      const std::string name = file.path();
      const int64_t n = file.size();
      const int64_t held_out = static_cast<int64_t>(std::floor(cfg.eval_fraction * static_cast<double>(n)));
      src.files.push_back(ds.files_.size());
      ds.files_.push_back({name, s, 0, n - held_out, n - held_out, held_out, checksums[k]});
      ds.arrays_.push_back(std::move(file));
    }
    ds.sources_.push_back(std::move(src));
  }
  return ds;
}

void TokenDataset::copy_window(size_t file, int64_t start, int64_t seq_len, int32_t* inputs, int32_t* targets) const {
  for (int64_t t = 0; t < seq_len; ++t) {
    inputs[t] = static_cast<int32_t>(token(file, start + t));
    targets[t] = static_cast<int32_t>(token(file, start + t + 1));
  }
}

std::vector<std::string> TokenDataset::check_window(int64_t seq_len) const {
  MOE_CHECK(seq_len >= 1, "seq_len must be >= 1, got ", seq_len);
  std::vector<std::string> skipped;
  for (const Source& src : sources_) {
    int64_t usable = 0;
    for (size_t f : src.files) {
      if (files_[f].train_length >= seq_len + 1) {
        ++usable;
        continue;
      }
      skipped.push_back(files_[f].name + ": its training split has " + std::to_string(files_[f].train_length) +
                        " tokens, fewer than the seq_len + 1 = " + std::to_string(seq_len + 1) +
                        " of one training window; skipped");
    }
    MOE_CHECK(usable > 0, src.key, " (", src.path, "): no file holds a training window of seq_len + 1 = ", seq_len + 1,
              " tokens (data.eval_fraction ", cfg_.eval_fraction, " of each file is held out); the first: ",
              files_[src.files.front()].name, " with ", files_[src.files.front()].train_length, " training tokens");
  }
  return skipped;
}

void TokenDataset::train_batch(int64_t step, int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                               int32_t* targets) const {
  MOE_CHECK(step >= 0 && first_seq >= 0 && n_seqs >= 0, "train_batch: negative step ", step, ", first_seq ",
            first_seq, " or n_seqs ", n_seqs);
  check_window(seq_len);
  // Per source: the training tokens of its usable files (prefix sums), and the source weights.
  std::vector<std::vector<int64_t>> cumulative(sources_.size());
  double total_weight = 0;
  for (size_t s = 0; s < sources_.size(); ++s) {
    cumulative[s].assign(1, 0);
    for (size_t f : sources_[s].files)
      cumulative[s].push_back(cumulative[s].back() + (files_[f].train_length >= seq_len + 1 ? files_[f].train_length : 0));
    total_weight += sources_[s].weight;
  }
  const uint64_t step_seed = hash_counters(cfg_.seed, kTrainWindows, static_cast<uint64_t>(step));
  for (int64_t r = 0; r < n_seqs; ++r) {
    Rng rng(step_seed, static_cast<uint64_t>(first_seq + r));
    size_t s = 0;
    if (sources_.size() > 1) {
      double u = rng.uniform() * total_weight;
      while (s + 1 < sources_.size() && u >= sources_[s].weight) u -= sources_[s++].weight;
    }
    const std::vector<int64_t>& cum = cumulative[s];
    const int64_t pick = static_cast<int64_t>(rng.below(static_cast<uint64_t>(cum.back())));
    const size_t k = static_cast<size_t>(std::upper_bound(cum.begin(), cum.end(), pick) - cum.begin() - 1);
    const File& f = files_[sources_[s].files[k]];
    const int64_t start = f.train_begin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(f.train_length - seq_len)));
    copy_window(sources_[s].files[k], start, seq_len, inputs + r * seq_len, targets + r * seq_len);
  }
}

int64_t TokenDataset::eval_num_sequences(int64_t seq_len) const {
  MOE_CHECK(seq_len >= 1, "eval_num_sequences: seq_len must be >= 1, got ", seq_len);
  int64_t n = 0;
  for (const File& f : files_) n += f.eval_length / (seq_len + 1);
  return n;
}

void TokenDataset::eval_batch(int64_t first_seq, int64_t n_seqs, int64_t seq_len, int32_t* inputs,
                              int32_t* targets) const {
  const int64_t available = eval_num_sequences(seq_len);
  MOE_CHECK(first_seq >= 0 && n_seqs >= 0 && first_seq + n_seqs <= available, "eval_batch: sequences [", first_seq,
            ", ", first_seq + n_seqs, ") outside the ", available, " held-out windows of seq_len ", seq_len);
  for (int64_t r = 0; r < n_seqs; ++r) {
    int64_t k = first_seq + r;
    size_t file = 0;
    while (k >= files_[file].eval_length / (seq_len + 1)) k -= files_[file++].eval_length / (seq_len + 1);
    const int64_t start = files_[file].eval_begin + k * (seq_len + 1);
    copy_window(file, start, seq_len, inputs + r * seq_len, targets + r * seq_len);
  }
}

int64_t TokenDataset::train_tokens() const {
  int64_t n = 0;
  for (const File& f : files_) n += f.train_length;
  return n;
}

int64_t TokenDataset::eval_tokens() const {
  int64_t n = 0;
  for (const File& f : files_) n += f.eval_length;
  return n;
}

std::string TokenDataset::describe() const {
  std::ostringstream os;
  os << "data: ";
  if (!synthetic_summary_.empty()) {
    os << synthetic_summary_;
  } else {
    bool all_u16 = true, all_u32 = true;
    for (const TokenArray& f : arrays_) {
      all_u16 = all_u16 && f.dtype() == TokenDType::U16;
      all_u32 = all_u32 && f.dtype() == TokenDType::U32;
    }
    os << arrays_.size() << (cfg_.format == "raw" ? " raw token file" : " .npy file") << (arrays_.size() == 1 ? "" : "s");
    if (sources_.size() == 1) {
      os << " in " << sources_[0].path;
    } else {
      double total = 0;
      for (const Source& s : sources_) total += s.weight;
      os << " from " << sources_.size() << " sources (";
      for (size_t i = 0; i < sources_.size(); ++i)
        os << (i ? ", " : "") << sources_[i].path << " " << std::round(1000 * sources_[i].weight / total) / 10 << "%";
      os << ")";
    }
    os << " (" << (all_u16 ? "uint16" : all_u32 ? "uint32" : "uint16+uint32") << ")";
  }
  os << ": " << train_tokens() + eval_tokens() << " tokens, train " << train_tokens() << ", held-out "
     << eval_tokens();
  if (synthetic_summary_.empty()) os << " (eval_fraction " << cfg_.eval_fraction << " of each file)";
  if (attainable_loss_) os << ", attainable loss " << *attainable_loss_ << " nats";
  return os.str();
}

}  // namespace moe
