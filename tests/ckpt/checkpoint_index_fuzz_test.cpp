// Random mutations of a valid index.json and train_state.json: opening the checkpoint and reading
// every tensor either works (and then reads stay inside the stored data) or throws one moe::Error
// that names the file; never a crash, another exception, or a bare nlohmann::json message.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "moe/ckpt/checkpoint.h"
#include "temp_dir.h"
#include "two_rank_checkpoint.h"

namespace moe {
namespace {

using moe::testing::Model;
using moe::testing::read_bytes;
using moe::testing::save_two_ranks;
using moe::testing::TempDir;
using moe::testing::write_bytes;

TEST(CheckpointIndexFuzz, MutatedIndexAndTrainStateOpenCleanlyOrNameTheFile) {
  TempDir tmp;
  const std::string dir = save_two_ranks(tmp / "run", 3, Model());
  const std::string files[] = {"index.json", "train_state.json"};
  std::string valid[2];
  for (int f = 0; f < 2; ++f) valid[f] = read_bytes(dir + "/" + files[f]);

  std::mt19937_64 rng(20240611);
  auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  const std::string json_chars = "{}[]\":,-0123456789eE.+ tfnul\\";
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const int f = iter % 4 == 3 ? 1 : 0;  // mostly index.json: it has the most structure
    const std::string path = dir + "/" + files[f];
    std::string text = valid[f];
    switch (pick(4)) {
      case 0:  // flip random bits
        for (int k = 1 + pick(4); k > 0; --k) text[pick(text.size())] ^= static_cast<char>(1 << pick(8));
        break;
      case 1:  // JSON-significant characters at random positions (digits hit begin, end, shape)
        for (int k = 1 + pick(3); k > 0; --k) text[pick(text.size())] = json_chars[pick(json_chars.size())];
        break;
      case 2:  // truncate anywhere
        text.resize(pick(text.size()));
        break;
      case 3: {  // delete or duplicate a slice (drops fields, duplicates keys, shifts brackets)
        size_t at = pick(text.size()), n = 1 + pick(24);
        if (rng() & 1)
          text.erase(at, n);
        else
          text.insert(at, text.substr(at, n));
        break;
      }
    }
    write_bytes(path, text);
    try {
      CheckpointReader r(dir);
      for (const std::string& key : r.keys()) {
        int64_t numel = 1;
        for (int64_t d : r.global_shape(key)) numel *= d;
        if (numel > 1024) continue;  // a mutated shape; its chunks cannot cover it anyway
        std::vector<int64_t> out(static_cast<size_t>(numel));
        try {
          r.read(key, 0, numel, out.data());
        } catch (const Error& e) {  // a gap or a checksum mismatch: named like any read error
          ASSERT_NE(std::string(e.what()).find(dir), std::string::npos) << "iteration " << iter << ": " << e.what();
        }
      }
      r.train_state_int("step", 0);
      ++opened;
    } catch (const Error& e) {
      ++refused;
      const std::string msg = e.what();
      ASSERT_NE(msg.find(path), std::string::npos) << "iteration " << iter << ": " << msg;
      for (const char* bare : {"[json.exception.type_error", "[json.exception.out_of_range",
                               "[json.exception.invalid_iterator", "[json.exception.other_error", ": cannot read "})
        ASSERT_EQ(msg.find(bare), std::string::npos) << "iteration " << iter << ": unforeseen error: " << msg;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-moe exception " << e.what();
    }
    write_bytes(path, valid[f]);
  }
  EXPECT_GT(refused, 1000);  // the mutations really do break files
  EXPECT_GT(opened, 50);     // and some survive (whitespace, train_state fields nobody reads, ...)
  std::printf("fuzz: %d opened, %d refused\n", opened, refused);
}

}  // namespace
}  // namespace moe
