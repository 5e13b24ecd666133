#include "moe/data/synthetic.h"

#include <algorithm>
#include <cmath>

#include "moe/core/error.h"
#include "moe/core/rng.h"

namespace moe {

namespace {
// Rng purposes, so corpus parameters and generated streams never share random numbers.
constexpr uint64_t kCorpusParams = 0x5359'4e43'5041'5241ull;  // "SYNCPARA"
constexpr uint64_t kCorpusStream = 0x5359'4e43'5354'524dull;  // "SYNCSTRM"

double xlogx(double x) { return x > 0 ? x * std::log(x) : 0.0; }
}  // namespace

SyntheticCorpus::SyntheticCorpus(int64_t vocab_size, int64_t eos_token_id, const DataConfig& cfg)
    : vocab_size_(vocab_size),
      eos_(eos_token_id),
      successors_(cfg.synthetic_successors),
      end_prob_(cfg.synthetic_doc_end_prob),
      seed_(cfg.seed) {
  // Token ids are int32: ids up to 2^31 - 1, a vocabulary of up to 2^31 (model.vocab_size's range).
  MOE_CHECK(vocab_size >= 2 && vocab_size <= int64_t{1} << 31, "synthetic corpus: model.vocab_size = ", vocab_size,
            " is outside [2, 2147483648]");
  MOE_CHECK(eos_token_id >= 0 && eos_token_id < vocab_size, "synthetic corpus: eos_token_id ", eos_token_id,
            " is not inside the vocabulary [0, ", vocab_size, ")");
  const int64_t domains = cfg.synthetic_domains;
  const int64_t n = vocab_size - 1;  // |T|
  MOE_CHECK(domains >= 1, "data.synthetic_domains must be >= 1, got ", domains);
  MOE_CHECK(successors_ >= 1, "data.synthetic_successors must be >= 1, got ", successors_);
  MOE_CHECK(n / domains >= successors_, "synthetic corpus: ", n, " non-EOS tokens split into ", domains,
            " domains (data.synthetic_domains) leave ", n / domains, " tokens per domain, fewer than ",
            "data.synthetic_successors = ", successors_);
  MOE_CHECK(end_prob_ >= 1e-3 && end_prob_ < 1.0, "data.synthetic_doc_end_prob must be in [0.001, 1), got ",
            end_prob_);

  Rng rng(seed_, kCorpusParams);
  domain_begin_.resize(domains + 1);
  for (int64_t d = 0; d <= domains; ++d) domain_begin_[d] = n * d / domains;

  // Mixing weights pi_d ~ 1/(d+1).
  domain_weight_.resize(domains);
  double total = 0;
  for (int64_t d = 0; d < domains; ++d) total += domain_weight_[d] = 1.0 / static_cast<double>(d + 1);
  domain_cdf_.resize(domains);
  double acc = 0;
  for (int64_t d = 0; d < domains; ++d) {
    domain_weight_[d] /= total;
    acc += domain_weight_[d];
    domain_cdf_[d] = acc;
  }
  domain_cdf_.back() = 1.0;

  initial_prob_.resize(n);
  initial_cdf_.resize(n);
  succ_index_.resize(n * successors_);
  succ_prob_.resize(n * successors_);
  for (int64_t d = 0; d < domains; ++d) {
    const int64_t begin = domain_begin_[d], end = domain_begin_[d + 1], size = end - begin;
    // Initial distribution mu_d.
    double sum = 0;
    for (int64_t i = begin; i < end; ++i) sum += initial_prob_[i] = std::exp(rng.normal());
    double cum = 0;
    for (int64_t i = begin; i < end; ++i) {
      initial_prob_[i] /= sum;
      cum += initial_prob_[i];
      initial_cdf_[i] = cum;
    }
    initial_cdf_[end - 1] = 1.0;
    // Transition rows: S distinct successors in the range with skewed weights.
    const double skew = domains == 1 ? 1.0 : 0.5 + 1.5 * static_cast<double>(d) / static_cast<double>(domains - 1);
    for (int64_t i = begin; i < end; ++i) {
      int32_t* succ = &succ_index_[i * successors_];
      double* prob = &succ_prob_[i * successors_];
      double row_sum = 0;
      for (int64_t k = 0; k < successors_; ++k) {
        int32_t cand;
        do {
          cand = static_cast<int32_t>(begin + static_cast<int64_t>(rng.below(static_cast<uint64_t>(size))));
        } while (std::find(succ, succ + k, cand) != succ + k);
        succ[k] = cand;
        row_sum += prob[k] = std::exp(skew * rng.normal());
      }
      for (int64_t k = 0; k < successors_; ++k) prob[k] /= row_sum;
    }
  }

  // Expected visits per EOS-to-EOS cycle: v = sum_k (1-p)^k x0 P^k (see the header NOTES).
  // x holds x0 P^k (mass 1 per step; the (1-p)^k factor is kept in `mass`).
  const double q = 1.0 - end_prob_;
  std::vector<double> x(n), next(n), visits(n, 0.0);
  for (int64_t d = 0; d < domains; ++d)
    for (int64_t i = domain_begin_[d]; i < domain_begin_[d + 1]; ++i) x[i] = domain_weight_[d] * initial_prob_[i];
  for (double mass = 1.0; mass > 1e-16; mass *= q) {
    std::fill(next.begin(), next.end(), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < successors_; ++k)
        next[succ_index_[i * successors_ + k]] += x[i] * succ_prob_[i * successors_ + k];
    double change = 0;  // ||x P - x||_1
    for (int64_t i = 0; i < n; ++i) change += std::fabs(next[i] - x[i]);
    // Once x is (nearly) invariant under P the rest of the series is x * mass / p; the error of
    // that shortcut is at most mass * change * q / p^2 (P is an L1 contraction), so take it when
    // that is below 1e-13 of the total 1/p.
    if (change * q / end_prob_ <= 1e-13) {
      for (int64_t i = 0; i < n; ++i) visits[i] += mass * x[i] / end_prob_;
      break;
    }
    for (int64_t i = 0; i < n; ++i) visits[i] += mass * x[i];
    x.swap(next);
  }
  const double cycle_length = 1.0 + 1.0 / end_prob_;
  stationary_.assign(vocab_size_, 0.0);
  stationary_[eos_] = 1.0 / cycle_length;
  for (int64_t i = 0; i < n; ++i) stationary_[token_at(i)] = visits[i] / cycle_length;

  // Entropy of each row of Q, weighted by the stationary distribution.
  double h_eos = 0;
  for (int64_t d = 0; d < domains; ++d)
    for (int64_t i = domain_begin_[d]; i < domain_begin_[d + 1]; ++i) h_eos -= xlogx(domain_weight_[d] * initial_prob_[i]);
  double rate = stationary_[eos_] * h_eos;
  for (int64_t i = 0; i < n; ++i) {
    double h = -xlogx(end_prob_);
    for (int64_t k = 0; k < successors_; ++k) h -= xlogx(q * succ_prob_[i * successors_ + k]);
    rate += stationary_[token_at(i)] * h;
  }
  entropy_rate_ = rate;
}

std::pair<int32_t, int32_t> SyntheticCorpus::domain_range(int64_t d) const {
  MOE_CHECK(d >= 0 && d < num_domains(), "synthetic corpus: domain ", d, " out of range");
  return {token_at(domain_begin_[d]), token_at(domain_begin_[d + 1] - 1)};
}

int64_t SyntheticCorpus::domain_of(int32_t token) const {
  MOE_CHECK(token >= 0 && token < vocab_size_, "synthetic corpus: token ", token, " out of range");
  if (token == eos_) return -1;
  const int64_t i = index_of(token);
  return static_cast<int64_t>(std::upper_bound(domain_begin_.begin(), domain_begin_.end(), i) - domain_begin_.begin()) - 1;
}

std::vector<std::pair<int32_t, double>> SyntheticCorpus::next_token_distribution(int32_t token) const {
  std::vector<std::pair<int32_t, double>> row;
  if (domain_of(token) < 0) {
    for (int64_t d = 0; d < num_domains(); ++d)
      for (int64_t i = domain_begin_[d]; i < domain_begin_[d + 1]; ++i)
        row.emplace_back(token_at(i), domain_weight_[d] * initial_prob_[i]);
    return row;
  }
  const int64_t i = index_of(token);
  row.emplace_back(static_cast<int32_t>(eos_), end_prob_);
  for (int64_t k = 0; k < successors_; ++k)
    row.emplace_back(token_at(succ_index_[i * successors_ + k]), (1.0 - end_prob_) * succ_prob_[i * successors_ + k]);
  return row;
}

int32_t SyntheticCorpus::sample_first_token(double u_domain, double u_token) const {
  const int64_t domains = num_domains();
  int64_t d = std::upper_bound(domain_cdf_.begin(), domain_cdf_.end(), u_domain) - domain_cdf_.begin();
  d = std::min(d, domains - 1);
  const auto first = initial_cdf_.begin() + domain_begin_[d];
  const auto last = initial_cdf_.begin() + domain_begin_[d + 1];
  const int64_t i = std::min(std::upper_bound(first, last, u_token) - initial_cdf_.begin(), domain_begin_[d + 1] - 1);
  return token_at(i);
}

int32_t SyntheticCorpus::sample_successor(int64_t index, double u) const {
  const double* prob = &succ_prob_[index * successors_];
  double cum = 0;
  for (int64_t k = 0; k < successors_ - 1; ++k) {
    cum += prob[k];
    if (u < cum) return token_at(succ_index_[index * successors_ + k]);
  }
  return token_at(succ_index_[index * successors_ + successors_ - 1]);
}

void SyntheticCorpus::generate(uint64_t stream, int64_t n_tokens, std::vector<int32_t>& out) const {
  MOE_CHECK(n_tokens >= 0, "synthetic corpus: negative token count ", n_tokens);
  out.resize(static_cast<size_t>(n_tokens));
  Rng rng(hash_counters(seed_, kCorpusStream), stream);
  bool after_eos = true;  // a stream starts as if after an EOS
  int64_t index = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    int32_t token;
    if (after_eos) {
      const double u_domain = rng.uniform();
      token = sample_first_token(u_domain, rng.uniform());
      after_eos = false;
    } else if (rng.uniform() < end_prob_) {
      token = static_cast<int32_t>(eos_);
      after_eos = true;
    } else {
      token = sample_successor(index, rng.uniform());
    }
    if (!after_eos) index = index_of(token);
    out[static_cast<size_t>(t)] = token;
  }
}

}  // namespace moe
