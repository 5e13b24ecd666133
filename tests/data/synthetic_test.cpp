// SyntheticCorpus: determinism, vocabulary and domain structure, and the exact entropy rate
// checked against (a) a dense brute-force stationary solve and (b) the empirical conditional
// entropy of a long generated stream.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/synthetic.h"

using namespace moe;

namespace {

DataConfig small_config() {
  DataConfig cfg;
  cfg.synthetic_domains = 3;
  cfg.synthetic_successors = 4;
  cfg.synthetic_doc_end_prob = 0.05;
  return cfg;
}

// Entropy rate from a dense transition matrix: stationary distribution by Gaussian elimination
// of (Q^T - I) pi = 0 with one equation replaced by sum(pi) = 1.
double brute_force_entropy_rate(const SyntheticCorpus& corpus, std::vector<double>* stationary_out) {
  const int64_t n = corpus.vocab_size();
  std::vector<double> q(n * n, 0.0);
  for (int32_t s = 0; s < n; ++s)
    for (auto [t, p] : corpus.next_token_distribution(s)) q[s * n + t] += p;
  // a = Q^T - I, last row all ones, rhs e_last.
  std::vector<double> a(n * (n + 1), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[i * (n + 1) + j] = q[j * n + i] - (i == j ? 1.0 : 0.0);
  for (int64_t j = 0; j < n; ++j) a[(n - 1) * (n + 1) + j] = 1.0;
  a[(n - 1) * (n + 1) + n] = 1.0;
  for (int64_t c = 0; c < n; ++c) {  // partial pivoting
    int64_t piv = c;
    for (int64_t r = c + 1; r < n; ++r)
      if (std::fabs(a[r * (n + 1) + c]) > std::fabs(a[piv * (n + 1) + c])) piv = r;
    for (int64_t j = 0; j <= n; ++j) std::swap(a[c * (n + 1) + j], a[piv * (n + 1) + j]);
    for (int64_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r * (n + 1) + c] / a[c * (n + 1) + c];
      for (int64_t j = c; j <= n; ++j) a[r * (n + 1) + j] -= f * a[c * (n + 1) + j];
    }
  }
  std::vector<double> pi(n);
  for (int64_t i = 0; i < n; ++i) pi[i] = a[i * (n + 1) + n] / a[i * (n + 1) + i];
  double rate = 0;
  for (int64_t s = 0; s < n; ++s)
    for (int64_t t = 0; t < n; ++t)
      if (q[s * n + t] > 0) rate -= pi[s] * q[s * n + t] * std::log(q[s * n + t]);
  if (stationary_out) *stationary_out = pi;
  return rate;
}

}  // namespace

TEST(Synthetic, same_seed_same_tokens_other_seed_or_stream_different) {
  DataConfig cfg;
  std::vector<int32_t> a, b, c, d;
  SyntheticCorpus(512, 511, cfg).generate(0, 20000, a);
  SyntheticCorpus(512, 511, cfg).generate(0, 20000, b);
  EXPECT_EQ(a, b);
  SyntheticCorpus(512, 511, cfg).generate(1, 20000, d);
  EXPECT_NE(a, d);
  cfg.seed = 99;
  SyntheticCorpus(512, 511, cfg).generate(0, 20000, c);
  EXPECT_NE(a, c);
  EXPECT_NE(SyntheticCorpus(512, 511, DataConfig{}).entropy_rate_nats(), SyntheticCorpus(512, 511, cfg).entropy_rate_nats());
}

TEST(Synthetic, tokens_in_vocab_documents_stay_in_one_domain_and_follow_transition_rows) {
  for (int64_t eos : {511, 0, 200}) {
    const SyntheticCorpus corpus(512, eos, DataConfig{});
    std::vector<int32_t> tokens;
    corpus.generate(0, 200000, tokens);
    int64_t eos_count = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
      ASSERT_GE(tokens[i], 0);
      ASSERT_LT(tokens[i], 512);
      if (tokens[i] == eos) ++eos_count;
      if (i == 0 || tokens[i] == eos || tokens[i - 1] == eos) continue;
      ASSERT_EQ(corpus.domain_of(tokens[i]), corpus.domain_of(tokens[i - 1])) << "position " << i;
      bool allowed = false;
      for (auto [t, p] : corpus.next_token_distribution(tokens[i - 1])) allowed = allowed || (t == tokens[i] && p > 0);
      ASSERT_TRUE(allowed) << "transition " << tokens[i - 1] << " -> " << tokens[i] << " not in the row";
    }
    // p_end = 0.01: EOS frequency is p/(1+p) ~ 0.0099.
    EXPECT_NEAR(static_cast<double>(eos_count) / tokens.size(), 0.01 / 1.01, 0.001);
  }
}

TEST(Synthetic, domain_ranges_are_disjoint_contiguous_and_cover_all_non_eos_tokens) {
  for (int64_t eos : {0, 150, 299}) {
    DataConfig cfg;
    cfg.synthetic_domains = 5;
    const SyntheticCorpus corpus(300, eos, cfg);
    ASSERT_EQ(corpus.num_domains(), 5);
    std::vector<int> owner(300, -1);
    double weight_sum = 0;
    for (int64_t d = 0; d < 5; ++d) {
      weight_sum += corpus.domain_weight(d);
      if (d > 0) {
        EXPECT_LT(corpus.domain_weight(d), corpus.domain_weight(d - 1));  // unequal
      }
      auto [first, last] = corpus.domain_range(d);
      for (int32_t t = first; t <= last; ++t) {
        if (t == eos) continue;
        EXPECT_EQ(owner[t], -1) << "token " << t << " in two domains";
        owner[t] = static_cast<int>(d);
        EXPECT_EQ(corpus.domain_of(t), d);
      }
    }
    EXPECT_NEAR(weight_sum, 1.0, 1e-12);
    for (int32_t t = 0; t < 300; ++t) EXPECT_EQ(owner[t] == -1, t == eos) << "token " << t;
    EXPECT_EQ(corpus.domain_of(static_cast<int32_t>(eos)), -1);
  }
}

TEST(Synthetic, rows_are_distributions_with_successors_inside_the_domain) {
  const SyntheticCorpus corpus(200, 199, small_config());
  for (int32_t s = 0; s < 200; ++s) {
    double sum = 0;
    const auto row = corpus.next_token_distribution(s);
    for (auto [t, p] : row) {
      sum += p;
      if (s != 199 && t != 199) {
        EXPECT_EQ(corpus.domain_of(t), corpus.domain_of(s));
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-12) << "row " << s;
    if (s != 199) {
      EXPECT_EQ(row.size(), 1u + 4u);  // EOS + S distinct successors
    }
  }
}

TEST(Synthetic, entropy_rate_equals_brute_force_stationary_solution) {
  for (int64_t eos : {40, 17}) {
    const SyntheticCorpus corpus(41, eos, small_config());
    std::vector<double> pi;
    const double brute = brute_force_entropy_rate(corpus, &pi);
    EXPECT_NEAR(corpus.entropy_rate_nats(), brute, 1e-10 * brute);
    for (int64_t t = 0; t < 41; ++t) EXPECT_NEAR(corpus.stationary()[t], pi[t], 1e-12) << "token " << t;
  }
  // One successor per token: each domain's chain is periodic, so the series is summed in full.
  DataConfig periodic = small_config();
  periodic.synthetic_successors = 1;
  const SyntheticCorpus cyclic(41, 40, periodic);
  EXPECT_NEAR(cyclic.entropy_rate_nats(), brute_force_entropy_rate(cyclic, nullptr), 1e-10);
  // Default p_end = 0.01 and a larger vocabulary: the series needs thousands of terms.
  const SyntheticCorpus big(257, 256, DataConfig{});
  EXPECT_NEAR(big.entropy_rate_nats(), brute_force_entropy_rate(big, nullptr), 1e-9);
}

// Plug-in conditional entropy from 2M bigrams. Its bias is about (#nonzero cells - #states) /
// (2N) ~ 1e-3 nats and its noise a few 1e-4, so a 1% tolerance is comfortable.
TEST(Synthetic, entropy_rate_matches_empirical_bigram_entropy_within_1_percent) {
  const int64_t vocab = 512;
  const SyntheticCorpus corpus(vocab, 511, DataConfig{});
  std::vector<int32_t> tokens;
  corpus.generate(7, 2'000'000, tokens);
  std::vector<int64_t> pair_count(vocab * vocab, 0), prev_count(vocab, 0);
  for (size_t i = 1; i < tokens.size(); ++i) {
    ++pair_count[tokens[i - 1] * vocab + tokens[i]];
    ++prev_count[tokens[i - 1]];
  }
  const double n = static_cast<double>(tokens.size() - 1);
  double empirical = 0;
  for (int64_t s = 0; s < vocab; ++s)
    for (int64_t t = 0; t < vocab; ++t) {
      const int64_t c = pair_count[s * vocab + t];
      if (c > 0) empirical -= c / n * std::log(static_cast<double>(c) / prev_count[s]);
    }
  const double exact = corpus.entropy_rate_nats();
  EXPECT_NEAR(empirical, exact, 0.01 * exact) << "exact " << exact << " empirical " << empirical;
  // Sanity: far below the unigram bound log(vocab), far above 0.
  EXPECT_GT(exact, 0.5);
  EXPECT_LT(exact, 0.5 * std::log(static_cast<double>(vocab)));
}

TEST(Synthetic, bad_configs_name_the_key) {
  DataConfig cfg;
  cfg.synthetic_domains = 100;  // 511 / 100 = 5 tokens per domain < 6 successors
  try {
    SyntheticCorpus(512, 511, cfg);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic_domains"), std::string::npos) << e.what();
  }
  cfg = DataConfig{};
  cfg.synthetic_doc_end_prob = 0.0;
  EXPECT_THROW(SyntheticCorpus(512, 511, cfg), Error);
  EXPECT_THROW(SyntheticCorpus(512, 512, DataConfig{}), Error);  // EOS outside the vocabulary
}
