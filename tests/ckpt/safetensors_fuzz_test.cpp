// Random mutations of a valid safetensors file: each one either opens, and then every tensor
// lies inside the file, or throws moe::Error. Nothing else (no crash, no other exception).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "moe/ckpt/safetensors.h"
#include "moe/core/error.h"
#include "temp_dir.h"

namespace moe {
namespace {

using moe::testing::read_bytes;
using moe::testing::TempDir;
using moe::testing::write_bytes;

TEST(SafetensorsFuzz, MutatedHeadersOpenCleanlyOrThrowMoeError) {
  TempDir tmp;
  std::string valid_path = tmp / "valid.safetensors";
  std::vector<float> w(12, 0.5f);
  std::vector<int32_t> ids = {1, 2, 3};
  std::vector<uint16_t> h = {1, 2, 3, 4, 5};
  write_safetensors(valid_path,
                    {{"layers.0.w", DType::F32, {3, 4}, w.data()},
                     {"ids", DType::I32, {3}, ids.data()},
                     {"h", DType::BF16, {5}, h.data()},
                     {"e", DType::U8, {0}, nullptr}},
                    {{"format", "pt"}});
  const std::string valid = read_bytes(valid_path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(valid[i]);

  std::mt19937_64 rng(20240607);
  auto pick = [&](uint64_t n) { return static_cast<size_t>(rng() % n); };
  const std::string json_chars = "{}[]\":,-0123456789eE.+ tfnul\\";
  std::string path = tmp / "fuzz.safetensors";
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    std::string f = valid;
    switch (iter % 5) {
      case 0:  // flip random bits in the header
        for (int k = 1 + pick(4); k > 0; --k) f[8 + pick(header_len)] ^= static_cast<char>(1 << pick(8));
        break;
      case 1:  // JSON-significant characters at random header positions (digits hit offsets and shapes)
        for (int k = 1 + pick(3); k > 0; --k) f[8 + pick(header_len)] = json_chars[pick(json_chars.size())];
        break;
      case 2: {  // the length field: small deltas, random bytes, random values
        uint64_t len = header_len;
        int mode = pick(3);
        if (mode == 0) len += static_cast<uint64_t>(static_cast<int64_t>(pick(33)) - 16);
        if (mode == 1) len ^= uint64_t{0xff} << (8 * pick(8));
        if (mode == 2) len = rng();
        for (int i = 0; i < 8; ++i) f[i] = static_cast<char>(len >> (8 * i));
        break;
      }
      case 3:  // truncate anywhere
        f.resize(pick(f.size()));
        break;
      case 4: {  // delete or duplicate a slice of the header (shifts everything after it)
        size_t at = 8 + pick(header_len), n = 1 + pick(8);
        if (rng() & 1)
          f.erase(at, n);
        else
          f.insert(at, f.substr(at, n));
        break;
      }
    }
    // Unlink, not truncate: on ext4 truncating a file to zero forces a flush to disk.
    std::remove(path.c_str());
    write_bytes(path, f);
    try {
      SafetensorsReader r(path);
      ++opened;
      ASSERT_EQ(r.file_size(), f.size());
      for (const auto& e : r.entries()) {
        ASSERT_LE(e.begin, e.end) << "iteration " << iter;
        ASSERT_LE(r.data_offset() + e.end, r.file_size()) << "iteration " << iter << " tensor " << e.name;
        // Touch every byte: a bad range would fault here.
        const auto* p = static_cast<const unsigned char*>(r.data(e.name));
        unsigned sum = 0;
        for (uint64_t i = 0; i < e.end - e.begin; ++i) sum += p[i];
        (void)sum;
      }
    } catch (const Error& e) {
      ++refused;
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << "iteration " << iter << ": " << e.what();
    } catch (const std::exception& e) {
      FAIL() << "iteration " << iter << ": non-moe exception " << e.what();
    }
  }
  EXPECT_GT(refused, 1000);  // the mutations really do break files
  EXPECT_GT(opened, 10);     // and some survive (spaces, bit flips in names, ...)
  std::printf("fuzz: %d opened, %d refused\n", opened, refused);
}

}  // namespace
}  // namespace moe
