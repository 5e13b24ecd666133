// Chunk checksums: a byte flipped in any chunk of a rank file is an error naming the checkpoint,
// the rank file and the tensor; intact chunks read back bit-exactly and are hashed once, whole,
// on first touch; checkpoints of format version 1 (no checksums) still load, unverified.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/checksum.h"
#include "moe/ckpt/safetensors.h"
#include "temp_dir.h"
#include "two_rank_checkpoint.h"

namespace moe {
namespace {

namespace fs = std::filesystem;
using moe::testing::error_of;
using moe::testing::Model;
using moe::testing::read_bytes;
using moe::testing::save_two_ranks;
using moe::testing::TempDir;
using moe::testing::write_bytes;
using nlohmann::json;

// Byte offset in `path` of the stored bytes of tensor `file_key`, and their count.
std::pair<uint64_t, uint64_t> stored_range(const std::string& path, const std::string& file_key) {
  SafetensorsReader f(path);
  const SafetensorsEntry& e = f.entry(file_key);
  return {f.data_offset() + e.begin, e.end - e.begin};
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(CheckpointChecksum, IsXxh3Of64Bits) {
  // Reference values of XXH3-64 with seed 0 (the empty input from xxHash's own tests; "hello"
  // as StarRocks documents xx_hash3_64('hello') = -7685981735718036227).
  EXPECT_EQ(checksum_bytes(nullptr, 0), 0x2d06800538d394c2u);
  EXPECT_EQ(checksum_bytes("hello", 5), 0x9555e8555c62dcfdu);
  EXPECT_EQ(checksum_hex(0x9555e8555c62dcfdu), "9555e8555c62dcfd");
  EXPECT_EQ(checksum_hex(0x2a), "000000000000002a");
  EXPECT_EQ(checksum_from_hex("9555e8555c62dcfd"), 0x9555e8555c62dcfdu);
  EXPECT_EQ(checksum_from_hex("9555E8555C62DCFD"), 0x9555e8555c62dcfdu);
  for (const char* bad :
       {"", "9555e8555c62dcf", "9555e8555c62dcfd0", "9555e8555c62dcfg", "+555e8555c62dcfd", " 555e8555c62dcfd"})
    EXPECT_FALSE(checksum_from_hex(bad)) << "'" << bad << "'";
}

TEST(CheckpointChecksum, IntactCheckpointReadsBackBitExactlyAndVerifiesEveryChunk) {
  TempDir tmp;
  Model m;
  const std::string dir = save_two_ranks(tmp / "run", 3, m);
  CheckpointReader r(dir);
  EXPECT_TRUE(r.has_checksums());
  std::vector<float> w1(24);
  std::vector<int64_t> ids(10);
  r.read("experts.w1", 0, 24, w1.data());
  r.read("embed.ids", 0, 10, ids.data());
  EXPECT_TRUE(same_bytes(w1, m.w1));
  EXPECT_TRUE(same_bytes(ids, m.ids));
  EXPECT_EQ(r.bytes_verified(), 24 * 4 + 10 * 8);  // every stored byte, once
}

TEST(CheckpointChecksum, EachChunkIsHashedWholeOnFirstTouchAndNeverAgain) {
  TempDir tmp;
  Model m;
  CheckpointReader r(save_two_ranks(tmp / "run", 3, m));
  EXPECT_EQ(r.bytes_verified(), 0) << "opening hashes nothing";
  std::vector<float> out(24);
  r.read("experts.w1", 1, 3, out.data());  // touches chunk [0, 7)
  EXPECT_EQ(r.bytes_verified(), 7 * 4);
  r.read("experts.w1", 0, 7, out.data());
  r.read("experts.w1", 2, 4, out.data());
  EXPECT_EQ(r.bytes_verified(), 7 * 4) << "a verified chunk is not hashed again";
  r.read("experts.w1", 5, 13, out.data());  // chunks [0, 7) (verified), [7, 12) and [12, 24)
  EXPECT_EQ(r.bytes_verified(), 24 * 4);
  EXPECT_EQ(out[7], m.w1[12]);
  r.read_into("experts.w1", 0, 24, Tensor(out.data(), DType::F32, {24}, Device::CPU));
  EXPECT_EQ(r.bytes_verified(), 24 * 4);
  EXPECT_TRUE(same_bytes(out, m.w1));
}

TEST(CheckpointChecksum, FlippedByteInAnyChunkIsAnErrorNamingFileAndTensor) {
  TempDir tmp;
  Model m;
  const std::string dir = save_two_ranks(tmp / "run", 3, m);
  const json index = json::parse(read_bytes(dir + "/index.json"));
  int chunks_tried = 0;
  for (const auto& [key, t] : index["tensors"].items()) {
    for (const json& c : t["chunks"]) {
      const std::string file = c["file"], file_key = c["key"], path = dir + "/" + file;
      const std::string pristine = read_bytes(path);
      const auto [offset, nbytes] = stored_range(path, file_key);
      std::string flipped = pristine;
      flipped[offset + nbytes / 2] ^= 0x10;
      write_bytes(path, flipped);
      const std::string found = checksum_hex(checksum_bytes(flipped.data() + offset, nbytes));

      CheckpointReader r(dir);  // headers are intact: open succeeds, the data is checked on read
      std::vector<int64_t> out(24);
      const int64_t numel = t["shape"].size() == 2 ? 24 : 10;
      for (int attempt = 0; attempt < 2; ++attempt) {  // a failed chunk is not remembered as verified
        std::string msg = error_of([&] { r.read(key, 0, numel, out.data()); });
        SCOPED_TRACE(msg);
        EXPECT_NE(msg.find("checkpoint " + dir + ": rank file " + file + ", tensor '" + key + "' (in-file key '" +
                           file_key + "'"),
                  std::string::npos);
        EXPECT_NE(msg.find("xxh3-64 checksum mismatch: index.json has " + c["checksum"]["value"].get<std::string>() +
                           ", the stored bytes hash to " + found),
                  std::string::npos);
      }
      // The other tensor is intact and still reads bit-exactly.
      std::vector<float> w1(24);
      std::vector<int64_t> ids(10);
      if (key == "experts.w1") {
        r.read("embed.ids", 0, 10, ids.data());
        EXPECT_TRUE(same_bytes(ids, m.ids));
      } else {
        r.read("experts.w1", 0, 24, w1.data());
        EXPECT_TRUE(same_bytes(w1, m.w1));
      }
      write_bytes(path, pristine);
      ++chunks_tried;
    }
  }
  EXPECT_EQ(chunks_tried, 5);
}

TEST(CheckpointChecksum, ReadOutsideTheDamagedChunkStillSucceeds) {
  TempDir tmp;
  Model m;
  const std::string dir = save_two_ranks(tmp / "run", 3, m);
  const std::string path = dir + "/rank-00001.safetensors";
  const auto [offset, nbytes] = stored_range(path, "experts.w1@12");
  std::string bytes = read_bytes(path);
  bytes[offset + nbytes - 1] ^= 0x01;  // the last element of w1, [12, 24) in rank 1
  write_bytes(path, bytes);
  CheckpointReader r(dir);
  std::vector<float> out(24);
  r.read("experts.w1", 0, 12, out.data());  // rank 0's chunks only
  EXPECT_EQ(std::memcmp(out.data(), m.w1.data(), 12 * 4), 0);
  std::string msg = error_of([&] { r.read("experts.w1", 11, 13, out.data()); });
  EXPECT_NE(msg.find("rank file rank-00001.safetensors, tensor 'experts.w1' (in-file key 'experts.w1@12', elements "
                     "[12, 24))"),
            std::string::npos)
      << msg;
}

// The fixture was written by the code before checksums (tests/ckpt/fixtures/README.md).
TEST(CheckpointChecksum, VersionOneCheckpointWithoutChecksumsStillLoads) {
  TempDir tmp;
  const std::string dir = tmp / "step-000007";
  fs::copy(std::string(MOE_SOURCE_DIR) + "/tests/ckpt/fixtures/v1-step-000007", dir);
  ASSERT_EQ(json::parse(read_bytes(dir + "/index.json"))["version"], 1);
  CheckpointReader r(dir);
  EXPECT_FALSE(r.has_checksums());
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(r.train_state_int("step"), 7);
  EXPECT_EQ(r.train_state_int("skipped_steps", 0), 1);
  EXPECT_EQ(r.train_state_string("config"), "name = \"v1\"\n");
  std::vector<float> w1(24), want_w1(24);
  std::vector<int64_t> ids(10), want_ids(10);
  for (int i = 0; i < 24; ++i) want_w1[i] = 0.5f * i - 3.f;
  for (int i = 0; i < 10; ++i) want_ids[i] = (int64_t{1} << 40) + i * 7;
  r.read("experts.w1", DType::F32, 0, 24, w1.data());
  r.read("embed.ids", DType::I64, 0, 10, ids.data());
  EXPECT_TRUE(same_bytes(w1, want_w1));
  EXPECT_TRUE(same_bytes(ids, want_ids));
  EXPECT_EQ(r.bytes_verified(), 0) << "version-1 chunks have nothing to verify against";

  // A version-2 index that lost a chunk's checksum is refused, not read unverified.
  TempDir tmp2;
  const std::string v2 = save_two_ranks(tmp2 / "run", 3, Model());
  json index = json::parse(read_bytes(v2 + "/index.json"));
  index["tensors"]["embed.ids"]["chunks"][1].erase("checksum");
  write_bytes(v2 + "/index.json", index.dump());
  std::string msg = error_of([&] { CheckpointReader r2(v2); });
  EXPECT_NE(msg.find(v2 + "/index.json: missing field /tensors/embed.ids/chunks/1/checksum"), std::string::npos) << msg;
}

TEST(CheckpointChecksum, ChunkRecordsCarryTheChecksumToRankZero) {
  TempDir tmp;
  Model m;
  const std::string t = begin_checkpoint(tmp / "run", 1);
  const std::vector<CheckpointChunk> written = write_rank_file(t, 0, {m.w1_slice(2, 9)});
  ASSERT_EQ(written.size(), 1u);
  ASSERT_TRUE(written[0].checksum);
  EXPECT_EQ(*written[0].checksum, checksum_bytes(m.w1.data() + 2, 7 * 4));
  const std::vector<CheckpointChunk> back = chunks_from_json(json::parse(chunks_to_json(written).dump()));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].checksum, written[0].checksum);

  // Produced slices are hashed as produced.
  const std::vector<CheckpointSlice> lazy = {{"experts.w1", DType::F32, {4, 6}, 0, 24, nullptr}};
  const std::vector<CheckpointChunk> produced =
      write_rank_file(t, 1, lazy, [&](size_t, void* dst) { std::memcpy(dst, m.w1.data(), 24 * 4); });
  EXPECT_EQ(produced[0].checksum, checksum_bytes(m.w1.data(), 24 * 4));

  CheckpointChunk unchecked = written[0];
  unchecked.checksum.reset();
  std::string msg = error_of([&] { write_checkpoint_index(t, 1, {unchecked}, json::object()); });
  EXPECT_NE(msg.find("chunk 'experts.w1@2' of rank-00000.safetensors has no checksum"), std::string::npos) << msg;

  json records = chunks_to_json(written);
  records[0]["checksum"] = "12345";
  msg = error_of([&] { chunks_from_json(records, "chunks-1.json"); });
  EXPECT_NE(msg.find("chunks-1.json: field /0/checksum must be 16 hexadecimal digits, found \"12345\""),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace moe
