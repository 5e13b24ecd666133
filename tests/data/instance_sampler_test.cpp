// Epoch sampling and the data sources it reads: raw token arrays, globs, mixtures. An epoch
// visits every instance of a source once (when the weights follow the sizes), the order is a
// pure function of (seed, global sequence index) so any split of a batch reads the same tokens,
// epochs differ, mixture weights set each source's share, and bad sources are named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "moe/core/error.h"
#include "moe/data/dataset.h"
#include "moe/data/instance_sampler.h"
#include "moe/data/npy.h"
#include "moe/data/shuffle.h"
#include "../error_of.h"

using namespace moe;
namespace fs = std::filesystem;

namespace {

// Token i of file f is f * kFileStride + i, so a window tells its file and position.
constexpr uint32_t kFileStride = 1u << 20;
constexpr int64_t kVocab = int64_t{8} << 20;

using moe::testing::error_of;

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("moe_sampler_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<uint32_t> positional(int file, int64_t n) const {
    std::vector<uint32_t> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = file * kFileStride + static_cast<uint32_t>(i);
    return v;
  }
  std::string npy(const std::string& sub, int file, int64_t n) const {
    fs::create_directories(dir_ / sub);
    const std::string p = (dir_ / sub / ("f" + std::to_string(file) + ".npy")).string();
    write_npy(p, positional(file, n));
    return p;
  }
  // A headerless little-endian array, as OLMo-core and Dolma write them.
  std::string raw(const std::string& name, int file, int64_t n, bool u16 = false) const {
    const std::string p = (dir_ / name).string();
    std::ofstream out(p, std::ios::binary);
    for (uint32_t t : positional(file, n)) {
      if (u16) {
        const uint16_t v = static_cast<uint16_t>(t);
        out.write(reinterpret_cast<const char*>(&v), 2);
      } else {
        out.write(reinterpret_cast<const char*>(&t), 4);
      }
    }
    return p;
  }
  DataConfig folder(const std::string& sub) const {
    DataConfig c;
    c.path = (dir_ / sub).string();
    c.eval_fraction = 0;
    return c;
  }

  fs::path dir_;
};

TEST(Shuffle, IsAPermutationForEverySizeAndDiffersBySeedAndStream) {
  for (uint64_t n : {1ull, 2ull, 3ull, 7ull, 64ull, 100ull, 1000ull, 4097ull}) {
    const Shuffle s(n, 11, 3);
    std::vector<bool> seen(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = s(i);
      ASSERT_LT(x, n);
      ASSERT_FALSE(seen[x]) << "n " << n << ": " << x << " twice";
      seen[x] = true;
    }
  }
  int same_seed = 0, same_stream = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_seed += Shuffle(1000, 1, 0)(i) == Shuffle(1000, 2, 0)(i);
    same_stream += Shuffle(1000, 1, 0)(i) == Shuffle(1000, 1, 1)(i);
  }
  EXPECT_LT(same_seed, 20);  // a random pair of permutations agrees at ~1 place in 1000
  EXPECT_LT(same_stream, 20);
}

TEST_F(SamplerTest, AnEpochVisitsEveryInstanceOnceAndTheNextEpochReshuffles) {
  npy("d", 0, 17 * 10 + 5);  // 10 instances of 17 tokens, a remainder of 5 unused
  npy("d", 1, 17 * 6);
  const TokenDataset ds = TokenDataset::open(folder("d"), kVocab, 0);
  const int64_t T = 16, batch = 4;
  const InstanceSampler sampler(ds, T, batch, 7);
  ASSERT_EQ(sampler.epoch_size(), 16);
  std::set<std::pair<size_t, int64_t>> first, second;
  std::vector<std::pair<size_t, int64_t>> order1, order2;
  for (uint64_t g = 0; g < 16; ++g) {
    const auto a = sampler.instance(g), b = sampler.instance(16 + g);
    EXPECT_EQ(a.start % 17, 0) << "instances are aligned to seq_len + 1";
    first.insert({a.file, a.start});
    second.insert({b.file, b.start});
    order1.push_back({a.file, a.start});
    order2.push_back({b.file, b.start});
  }
  EXPECT_EQ(first.size(), 16u) << "an instance was repeated within an epoch";
  EXPECT_EQ(first, second) << "both epochs hold all instances";
  EXPECT_NE(order1, order2) << "the second epoch must be reshuffled";
  // Inputs and targets: the instance's tokens, shifted by one.
  std::vector<int32_t> in(batch * T), tg(batch * T);
  sampler.batch(0, 0, batch, in.data(), tg.data());
  for (int64_t r = 0; r < batch; ++r) {
    const auto inst = sampler.instance(static_cast<uint64_t>(r));
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(static_cast<uint32_t>(in[r * T + t]), inst.file * kFileStride + inst.start + t);
      EXPECT_EQ(static_cast<uint32_t>(tg[r * T + t]), inst.file * kFileStride + inst.start + t + 1);
    }
  }
}

TEST_F(SamplerTest, TheBatchDoesNotDependOnHowItIsSplitOverRanks) {
  npy("d", 0, 2000);
  const TokenDataset ds = TokenDataset::open(folder("d"), kVocab, 0);
  const int64_t T = 32, batch = 8;
  const InstanceSampler a(ds, T, batch, 3), b(ds, T, batch, 3);
  std::vector<int32_t> whole(batch * T), tg(batch * T), parts(batch * T), tg2(batch * T);
  a.batch(5, 0, batch, whole.data(), tg.data());
  for (int64_t first = 0; first < batch; first += 2) b.batch(5, first, 2, parts.data() + first * T, tg2.data() + first * T);
  EXPECT_EQ(whole, parts);
  std::vector<int32_t> other(batch * T);
  InstanceSampler(ds, T, batch, 4).batch(5, 0, batch, other.data(), tg.data());
  EXPECT_NE(whole, other) << "another seed must give another order";
}

TEST_F(SamplerTest, MixtureWeightsSetEachSourcesShareAndSmallSourcesRepeatOnlyAfterAFullPass) {
  npy("big", 0, 17 * 90);   // 90 instances
  npy("small", 1, 17 * 10);  // 10 instances
  DataConfig c;
  c.eval_fraction = 0;
  c.sources = {{(dir_ / "big").string(), 1.0}, {(dir_ / "small").string(), 1.0}};  // half and half
  const TokenDataset ds = TokenDataset::open(c, kVocab, 0);
  const InstanceSampler sampler(ds, 16, 10, 9);
  ASSERT_EQ(sampler.epoch_size(), 100);
  std::map<size_t, int> per_file;
  std::vector<int64_t> small_starts;
  for (uint64_t g = 0; g < 100; ++g) {
    const auto inst = sampler.instance(g);
    ++per_file[inst.file];
    if (inst.file == 1) small_starts.push_back(inst.start);
  }
  EXPECT_EQ(per_file[0], 50);
  EXPECT_EQ(per_file[1], 50);
  // The small source is read in passes: each 10 consecutive draws of it hold all its instances.
  ASSERT_EQ(small_starts.size(), 50u);
  std::map<int64_t, int> count;
  for (int64_t s : small_starts) ++count[s];
  EXPECT_EQ(count.size(), 10u);
  for (const auto& [start, n] : count) EXPECT_EQ(n, 5) << "instance at " << start;
}

TEST_F(SamplerTest, RawArraysAndGlobsAreRead) {
  raw("part-0.npy", 0, 1000);
  raw("part-1.npy", 1, 500);
  raw("other.bin", 2, 500);
  DataConfig c;
  c.path = (dir_ / "part-*.npy").string();
  c.format = "raw";
  c.dtype = "uint32";
  c.eval_fraction = 0.1;
  const TokenDataset ds = TokenDataset::open(c, kVocab, 0);
  ASSERT_EQ(ds.files().size(), 2u);
  EXPECT_EQ(ds.train_tokens(), 900 + 450);
  std::vector<int32_t> in(8 * 16), tg(8 * 16);
  InstanceSampler(ds, 16, 8, 1).batch(0, 0, 8, in.data(), tg.data());
  for (int32_t t : in) EXPECT_LT(static_cast<uint32_t>(t) / kFileStride, 2u);
  // uint16 raw files.
  const std::string p16 = raw("small16.bin", 0, 300, /*u16=*/true);
  c.path = p16;
  c.dtype = "uint16";
  const TokenDataset ds16 = TokenDataset::open(c, kVocab, 0);
  EXPECT_EQ(ds16.files()[0].train_length + ds16.files()[0].eval_length, 300);
}

TEST_F(SamplerTest, BadSourcesAreNamed) {
  raw("odd.bin", 0, 100, /*u16=*/true);  // 200 bytes, then one more: not a whole number of tokens
  {
    std::ofstream out((dir_ / "odd.bin").string(), std::ios::binary | std::ios::app);
    out.put('x');
  }
  DataConfig c;
  c.path = (dir_ / "odd.bin").string();
  c.format = "raw";
  c.dtype = "uint16";
  std::string msg = error_of([&] { TokenDataset::open(c, kVocab, 0); });
  EXPECT_NE(msg.find("not a multiple of 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.dtype"), std::string::npos) << msg;
  c.path = (dir_ / "missing-*.npy").string();
  msg = error_of([&] { TokenDataset::open(c, kVocab, 0); });
  EXPECT_NE(msg.find("matches no token file"), std::string::npos) << msg;
  npy("ok", 0, 500);
  c = DataConfig{};
  c.sources = {{(dir_ / "ok").string(), 1.0}, {(dir_ / "nope").string(), 1.0}};
  msg = error_of([&] { TokenDataset::open(c, kVocab, 0); });
  EXPECT_NE(msg.find("data.sources[1].path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  c.sources = {{(dir_ / "ok").string(), 0.0}};
  msg = error_of([&] { TokenDataset::open(c, kVocab, 0); });
  EXPECT_NE(msg.find("weight must be > 0"), std::string::npos) << msg;
}

}  // namespace
