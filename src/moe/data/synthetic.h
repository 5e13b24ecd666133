// SyntheticCorpus: the built-in zero-setup corpus, a seeded mixture of "domains" whose best
// attainable next-token loss is known exactly.
//
// Definition. Let T be the vocabulary without EOS, in increasing id order. T is split into
// D = synthetic_domains disjoint contiguous pieces: domain d owns T[d*|T|/D, (d+1)*|T|/D)
// (contiguous token ids when EOS is the last id, as usual). Each domain has
//   - a mixing weight pi_d, pi_d proportional to 1/(d+1) (unequal by construction);
//   - an initial distribution mu_d over its range, mu_d(t) proportional to exp(z_t), z ~ N(0,1);
//   - a transition row for every token s of its range: S = synthetic_successors distinct
//     tokens of the same range, drawn uniformly, with weights proportional to exp(k_d * z),
//     z ~ N(0,1), where the skew k_d grows linearly from 0.5 (domain 0) to 2.0 (domain D-1),
//     so domains differ in how predictable they are.
// All of these come from Rng(seed, purpose) only, so a seed fixes the corpus.
//
// Generation. At the start of a stream and after every EOS: pick d ~ pi, emit a first token
// ~ mu_d. After a domain token s: with probability p = synthetic_doc_end_prob emit EOS, else
// emit a token from s's transition row. Since ranges are disjoint the current token tells the
// domain, so the stream is a first-order Markov chain over the whole vocabulary (EOS included)
// with transition rows
//   Q[EOS, t] = pi_d mu_d(t)  (t in domain d),
//   Q[s, EOS] = p,  Q[s, t] = (1-p) P_d[s, t].
// entropy_rate_nats() = sum_s stationary(s) * H(Q[s, :]), the best mean next-token loss any
// predictor can attain on the stream (a window's first target already has its previous token
// as context, so the bound holds for every position of a training window).
//
// NOTES: stationary() is computed by renewal at EOS: the expected number of visits to each
// token between two EOS is v = sum_k (1-p)^k x0 P^k with x0 = sum_d pi_d mu_d, and
// stationary = v / (1 + 1/p) (EOS gets 1 / (1 + 1/p)). The series is summed term by term; once
// x0 P^k is invariant under P up to a bounded error (each domain's chain has mixed) the tail is
// added in closed form, otherwise summing runs until the terms' mass (1-p)^k is below 1e-16.
// Either way the result is accurate to about 1e-13 relative (checked against a dense solve in
// tests/data/synthetic_test.cpp). p >= 1e-3 is required to bound the worst-case cost.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "moe/data/data_config.h"

namespace moe {

class SyntheticCorpus {
 public:
  SyntheticCorpus(int64_t vocab_size, int64_t eos_token_id, const DataConfig& cfg);

  // Exact best attainable mean next-token loss of the stream (see the header comment).
  double entropy_rate_nats() const { return entropy_rate_; }
  // Writes n_tokens tokens of stream `stream` into out (resized). Deterministic in (seed, stream).
  void generate(uint64_t stream, int64_t n_tokens, std::vector<int32_t>& out) const;

  int64_t vocab_size() const { return vocab_size_; }
  int64_t eos_token_id() const { return eos_; }
  int64_t num_domains() const { return static_cast<int64_t>(domain_weight_.size()); }
  // Token ids of domain d: {first, last} of its piece of T (inclusive), in increasing order.
  std::pair<int32_t, int32_t> domain_range(int64_t d) const;
  double domain_weight(int64_t d) const { return domain_weight_[d]; }
  // Domain of a token, -1 for EOS.
  int64_t domain_of(int32_t token) const;
  // The full row Q[token, :] of the chain as (next token, probability) pairs, EOS included.
  std::vector<std::pair<int32_t, double>> next_token_distribution(int32_t token) const;
  // Stationary probability of every token id (EOS included).
  const std::vector<double>& stationary() const { return stationary_; }

 private:
  // Index of token id in T (ids above EOS shift down by one) and back.
  int64_t index_of(int32_t token) const { return token < eos_ ? token : token - 1; }
  int32_t token_at(int64_t index) const { return static_cast<int32_t>(index < eos_ ? index : index + 1); }
  int32_t sample_first_token(double u_domain, double u_token) const;
  int32_t sample_successor(int64_t index, double u) const;

  int64_t vocab_size_ = 0;
  int64_t eos_ = 0;
  int64_t successors_ = 0;
  double end_prob_ = 0;
  uint64_t seed_ = 0;
  std::vector<int64_t> domain_begin_;   // D+1 boundaries in T index space
  std::vector<double> domain_weight_;   // pi_d
  std::vector<double> domain_cdf_;      // cumulative pi
  std::vector<double> initial_prob_;    // mu over T index space (each domain's piece sums to 1)
  std::vector<double> initial_cdf_;     // cumulative mu within each domain's piece
  std::vector<int32_t> succ_index_;     // [|T|, S] successors as T indices
  std::vector<double> succ_prob_;       // [|T|, S] P_d weights
  std::vector<double> stationary_;      // by token id
  double entropy_rate_ = 0;
};

}  // namespace moe
