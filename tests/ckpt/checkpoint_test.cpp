// Checkpoints: slices saved by several ranks load back as any range of the logical tensor;
// resolve/prune find the right step dirs; a crash mid-save leaves earlier checkpoints intact.
#include "moe/ckpt/checkpoint.h"
#include "moe/ckpt/run_checkpoints.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include "moe/ckpt/checksum.h"
#include "moe/core/error.h"
#include "../process_state.h"
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

TEST(Checkpoint, DirNamesArePaddedSteps) {
  EXPECT_EQ(checkpoint_dir_name(100), "step-000100");
  EXPECT_EQ(checkpoint_dir_name(0), "step-000000");
  EXPECT_EQ(checkpoint_dir_name(12345678), "step-12345678");
  EXPECT_EQ(rank_file_name(3), "rank-00003.safetensors");
}

TEST(Checkpoint, TwoRankSaveReadsBackAnyRangeAcrossChunks) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  std::string dir = save_two_ranks(run, 100, m);
  EXPECT_EQ(dir, run + "/step-000100");
  EXPECT_TRUE(fs::exists(dir + "/rank-00000.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(run + "/.tmp-step-000100"));

  CheckpointReader r(dir);
  EXPECT_EQ(r.step(), 100);
  EXPECT_EQ(r.train_state()["data_position"], 4096);
  EXPECT_EQ(r.keys(), (std::vector<std::string>{"embed.ids", "experts.w1"}));
  EXPECT_TRUE(r.has("experts.w1"));
  EXPECT_FALSE(r.has("experts.w2"));
  EXPECT_EQ(r.global_shape("experts.w1"), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(r.dtype("experts.w1"), DType::F32);
  EXPECT_EQ(r.dtype("embed.ids"), DType::I64);

  // Every sub-range of w1, including those that straddle 1 or 2 chunk boundaries.
  for (int64_t b = 0; b <= 24; ++b) {
    for (int64_t e = b; e <= 24; ++e) {
      std::vector<float> out(e - b + 1, -99.f);
      r.read("experts.w1", b, e, out.data());
      for (int64_t i = b; i < e; ++i) ASSERT_EQ(out[i - b], m.w1[i]) << "[" << b << ", " << e << ") at " << i;
      ASSERT_EQ(out[e - b], -99.f) << "wrote past the range";
    }
  }
  std::vector<int64_t> ids(10);
  r.read("embed.ids", DType::I64, 0, 10, ids.data());
  EXPECT_EQ(ids, m.ids);
  std::vector<int64_t> mid(4);
  r.read("embed.ids", 1, 5, mid.data());
  EXPECT_EQ(mid, std::vector<int64_t>(m.ids.begin() + 1, m.ids.begin() + 5));

  // index.json holds the section-8 layout.
  json index = json::parse(moe::testing::read_bytes(dir + "/index.json"));
  const json& w1 = index["tensors"]["experts.w1"];
  EXPECT_EQ(w1["dtype"], "F32");
  EXPECT_EQ(w1["shape"], json({4, 6}));
  ASSERT_EQ(w1["chunks"].size(), 3u);
  EXPECT_EQ(index["version"], 2);
  EXPECT_EQ(w1["chunks"][2],
            json({{"file", "rank-00001.safetensors"},
                  {"key", "experts.w1@12"},
                  {"begin", 12},
                  {"end", 24},
                  {"checksum",
                   {{"algorithm", "xxh3-64"}, {"value", checksum_hex(checksum_bytes(m.w1.data() + 12, 12 * 4))}}}}));
}

TEST(Checkpoint, ReadErrorsNameTheProblem) {
  TempDir tmp;
  Model m;
  std::string dir = save_two_ranks(tmp / "run", 1, m);
  CheckpointReader r(dir);
  std::vector<float> out(24);
  std::string msg = error_of([&] { r.read("experts.w1", 0, 25, out.data()); });
  EXPECT_NE(msg.find("outside its 24 elements"), std::string::npos) << msg;
  msg = error_of([&] { r.read("experts.w2", 0, 1, out.data()); });
  EXPECT_NE(msg.find("tensor 'experts.w2' not found in checkpoint " + dir), std::string::npos) << msg;
  msg = error_of([&] { r.read("embed.ids", DType::F32, 0, 1, out.data()); });
  EXPECT_NE(msg.find("stored as I64, caller expects F32"), std::string::npos) << msg;
}

// Every element of a tensor is in one chunk: a save whose ranks left a range out is refused
// before its index is written (nothing is committed), and an index edited to leave one out is
// refused when the checkpoint is opened, naming the index and the range, not later when (or if)
// a rank of the resuming layout reads that range.
TEST(Checkpoint, ElementsInNoChunkAreRefusedAtSaveAndAtOpen) {
  TempDir tmp;
  Model m;
  std::string msg = error_of([&] { save_two_ranks(tmp / "gap", 1, m, /*leave_gap=*/true); });
  EXPECT_NE(msg.find("elements [12, 24) of tensor 'experts.w1' are not stored in any chunk"), std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(tmp / "gap/step-000001"));

  const std::string dir = save_two_ranks(tmp / "run", 1, m);
  const std::string index_path = dir + "/index.json";
  const json index = json::parse(moe::testing::read_bytes(index_path));
  const auto open_with = [&](const std::function<void(json&)>& edit) {
    json edited = index;
    edit(edited);
    std::ofstream(index_path, std::ios::trunc) << edited.dump();
    return error_of([&] { CheckpointReader r(dir); });
  };
  // The middle chunk of experts.w1 ([7, 12)) dropped: a gap inside the tensor.
  msg = open_with([](json& j) {
    json& chunks = j["tensors"]["experts.w1"]["chunks"];
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i]["begin"] == 7) chunks.erase(i);
  });
  EXPECT_NE(msg.find(index_path), std::string::npos) << msg;
  EXPECT_NE(msg.find("elements [7, 12) of tensor 'experts.w1' are not stored in any chunk"), std::string::npos) << msg;
  // The last chunk of embed.ids ([3, 10)) dropped: a gap at the end.
  msg = open_with([](json& j) {
    json& chunks = j["tensors"]["embed.ids"]["chunks"];
    for (size_t i = 0; i < chunks.size(); ++i)
      if (chunks[i]["begin"] == 3) chunks.erase(i);
  });
  EXPECT_NE(msg.find("elements [3, 10) of tensor 'embed.ids' are not stored in any chunk"), std::string::npos) << msg;
  // No chunks at all.
  msg = open_with([](json& j) { j["tensors"]["embed.ids"]["chunks"] = json::array(); });
  EXPECT_NE(msg.find("elements [0, 10) of tensor 'embed.ids' are not stored in any chunk (the tensor lists none)"),
            std::string::npos)
      << msg;
  // The index as written opens and reads every element.
  std::ofstream(index_path, std::ios::trunc) << index.dump();
  std::vector<float> out(24);
  CheckpointReader(dir).read("experts.w1", 0, 24, out.data());
  EXPECT_EQ(out, m.w1);
}

// read_into converts between F32 and BF16 on the host (state whose storage dtype is a run setting,
// like the AdamW moments): F32 chunks read into BF16 round to nearest even, BF16 chunks read into
// F32 exactly, any range across chunk boundaries; equal dtypes copy; other dtypes and a wrong
// element count are refused naming the tensor.
TEST(Checkpoint, ReadIntoConvertsBetweenF32AndBf16) {
  TempDir tmp;
  Model m;
  // 1 + i 2^-8: BF16 values (even i) and midpoints between two (odd i), nudged up when i % 3 == 0.
  for (int i = 0; i < 24; ++i) m.w1[i] = 1.0f + static_cast<float>(i) * 0x1p-8f + (i % 3 == 0 ? 0x1p-12f : 0.0f);
  std::vector<uint16_t> h(24);
  for (int i = 0; i < 24; ++i) h[i] = f32_to_bf16(-3.0f * m.w1[i]);
  const std::string dir = save_two_ranks(tmp / "run", 1, m);
  // A second checkpoint with a BF16 tensor in two chunks.
  const std::string t = begin_checkpoint(tmp / "bf16run", 1);
  auto chunks = write_rank_file(t, 0, {{"m.exp_avg", DType::BF16, {4, 6}, 0, 10, h.data()}});
  for (const auto& c : write_rank_file(t, 1, {{"m.exp_avg", DType::BF16, {4, 6}, 10, 24, h.data() + 10}}))
    chunks.push_back(c);
  write_checkpoint_index(t, 1, chunks, json::object());
  const CheckpointReader f32_ckpt(dir), bf16_ckpt(commit_checkpoint(tmp / "bf16run", 1));

  for (const auto& [b, e] : {std::pair<int64_t, int64_t>{0, 24}, {5, 14}, {11, 12}, {3, 3}}) {
    SCOPED_TRACE(::testing::Message() << "[" << b << ", " << e << ")");
    std::vector<uint16_t> as_bf16(static_cast<size_t>(e - b + 1), 0xabcd);
    f32_ckpt.read_into("experts.w1", b, e, Tensor(as_bf16.data(), DType::BF16, {e - b}));
    std::vector<float> as_f32(static_cast<size_t>(e - b + 1), -99.f);
    bf16_ckpt.read_into("m.exp_avg", b, e, Tensor(as_f32.data(), DType::F32, {e - b}));
    std::vector<uint16_t> same(static_cast<size_t>(e - b));
    bf16_ckpt.read_into("m.exp_avg", b, e, Tensor(same.data(), DType::BF16, {e - b}));
    for (int64_t i = b; i < e; ++i) {
      ASSERT_EQ(as_bf16[i - b], f32_to_bf16(m.w1[i])) << i;
      ASSERT_EQ(as_f32[i - b], bf16_to_f32(h[i])) << i;
      ASSERT_EQ(same[i - b], h[i]) << i;
    }
    EXPECT_EQ(as_bf16[e - b], 0xabcd) << "wrote past the range";
    EXPECT_EQ(as_f32[e - b], -99.f) << "wrote past the range";
  }
  // Round to nearest, ties to even (BF16 1.0 is 0x3f80, one step is 2^-7): a tie at 1 + 2^-8 goes
  // down to the even 0x3f80, one at 1 + 5 2^-8 up to the even 0x3f82, and 1 + 3 2^-8 + 2^-12 (past
  // a midpoint) up to 0x3f82, where truncation would give 0x3f81.
  std::vector<uint16_t> rounded(5);
  f32_ckpt.read_into("experts.w1", 1, 6, Tensor(rounded.data(), DType::BF16, {5}));
  EXPECT_EQ(rounded[0], 0x3f80);
  EXPECT_EQ(rounded[2], 0x3f82);
  EXPECT_EQ(rounded[4], 0x3f82);

  std::vector<int64_t> ids(10);
  std::string msg = error_of([&] { f32_ckpt.read_into("embed.ids", 0, 10, Tensor(ids.data(), DType::F32, {10})); });
  EXPECT_NE(msg.find("'embed.ids' (stored as I64) into a F32 tensor"), std::string::npos) << msg;
  std::vector<float> out(24);
  msg = error_of([&] { f32_ckpt.read_into("experts.w1", 0, 5, Tensor(out.data(), DType::F32, {4})); });
  EXPECT_NE(msg.find("read of 'experts.w1' (stored as F32) into a F32 tensor of 4 elements, expected 5"),
            std::string::npos)
      << msg;
}

TEST(Checkpoint, OverlappingOrInconsistentSlicesAreRefused) {
  TempDir tmp;
  Model m;
  std::string run = tmp / "run";
  std::string t = begin_checkpoint(run, 1);
  auto c0 = write_rank_file(t, 0, {m.w1_slice(0, 10)});
  auto c1 = write_rank_file(t, 1, {m.w1_slice(8, 24)});
  c0.insert(c0.end(), c1.begin(), c1.end());
  std::string msg = error_of([&] { write_checkpoint_index(t, 1, c0, json::object()); });
  EXPECT_NE(msg.find("chunks of tensor 'experts.w1' overlap"), std::string::npos) << msg;

  CheckpointSlice wrong_shape = m.w1_slice(10, 24);
  wrong_shape.global_shape = {24};
  auto c2 = write_rank_file(t, 2, {m.w1_slice(0, 10)});
  auto c3 = write_rank_file(t, 3, {wrong_shape});
  c2.insert(c2.end(), c3.begin(), c3.end());
  msg = error_of([&] { write_checkpoint_index(t, 1, c2, json::object()); });
  EXPECT_NE(msg.find("tensor 'experts.w1' stored as F32 [4, 6]"), std::string::npos) << msg;

  msg = error_of([&] { write_rank_file(t, 4, {m.w1_slice(20, 25)}); });
  EXPECT_NE(msg.find("outside its 24 elements"), std::string::npos) << msg;
  msg = error_of([&] { commit_checkpoint(run, 1); });
  EXPECT_NE(msg.find("index.json was not written"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(run + "/step-000001"));
}

TEST(Checkpoint, ReaderRefusesIndexThatDisagreesWithFiles) {
  TempDir tmp;
  Model m;
  std::string dir = save_two_ranks(tmp / "run", 1, m);
  json index = json::parse(moe::testing::read_bytes(dir + "/index.json"));
  json good = index;
  index["tensors"]["experts.w1"]["chunks"][0]["key"] = "experts.w1@99";
  write_bytes(dir + "/index.json", index.dump());
  std::string msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("'experts.w1@99' not found in " + dir + "/rank-00000.safetensors"), std::string::npos) << msg;

  index = good;
  index["tensors"]["experts.w1"]["chunks"][0]["file"] = "../escape.safetensors";
  write_bytes(dir + "/index.json", index.dump());
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("field /tensors/experts.w1/chunks/0/file must be a plain file name"), std::string::npos) << msg;

  index = good;
  index["tensors"]["experts.w1"]["dtype"] = "I32";
  write_bytes(dir + "/index.json", index.dump());
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find("index says I32"), std::string::npos) << msg;

  write_bytes(dir + "/index.json", "{ not json");
  msg = error_of([&] { CheckpointReader r(dir); });
  EXPECT_NE(msg.find(dir + "/index.json is not valid JSON"), std::string::npos) << msg;
}

TEST(Checkpoint, SavingTheSameStepAgainReplacesItWhole) {
  TempDir tmp;
  std::string run = tmp / "run";
  save_checkpoint(run, 5, Model(0.f).all(), {{"v", 1}});
  Model second(100.f);
  std::string dir = save_checkpoint(run, 5, second.all(), {{"v", 2}});
  CheckpointReader r(dir);
  EXPECT_EQ(r.train_state()["v"], 2);
  std::vector<float> w(24);
  r.read("experts.w1", 0, 24, w.data());
  EXPECT_EQ(w, second.w1);
  EXPECT_FALSE(fs::exists(run + "/.tmp-step-000005"));
}

TEST(Checkpoint, ResolvePicksTheNewestCompleteStep) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  for (int64_t step : {1, 20, 3}) save_checkpoint(run, step, m.all(), {{"step", step}});
  fs::create_directories(run + "/.tmp-step-000099");  // an unfinished save
  fs::create_directories(run + "/step-000050-old");   // not a step dir name
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000020");
  EXPECT_EQ(resolve_checkpoint(run + "/"), run + "/step-000020");
  EXPECT_EQ(resolve_checkpoint(run + "/latest"), run + "/step-000020");
  EXPECT_EQ(resolve_checkpoint(run + "/step-000003"), run + "/step-000003");
  EXPECT_EQ(CheckpointReader(resolve_checkpoint(run)).train_state()["step"], 20);
  // A step-N folder without index.json: older than the newest complete one it is not "latest"'s
  // concern; newer, it is damage, and "latest" would silently be an older checkpoint.
  fs::create_directories(run + "/step-000007");
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000020");
  fs::create_directories(run + "/step-000030");
  for (const std::string& path : {run, run + "/latest"}) {
    const std::string damaged = error_of([&] { resolve_checkpoint(path); });
    EXPECT_NE(damaged.find(run + "/step-000030 is newer than every complete checkpoint there but has no index.json"),
              std::string::npos) << damaged;
    EXPECT_NE(damaged.find("e.g. " + run + "/step-000020"), std::string::npos) << damaged;
  }
  EXPECT_EQ(resolve_checkpoint(run + "/step-000020"), run + "/step-000020") << "named, it is used";
  // An interrupted set-aside from step 3 is moving everything after it away: not damage to refuse.
  std::ofstream(run + "/.set-aside.json") << R"({"after_step": 3, "dir": "20260101-000000-after-step-000003"})";
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000003");
  fs::remove(run + "/.set-aside.json");
  fs::remove(run + "/step-000030");

  fs::create_directories(tmp / "empty-run");
  std::string msg = error_of([&] { resolve_checkpoint(tmp / "empty-run"); });
  EXPECT_NE(msg.find("no complete checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty-run (at "), std::string::npos) << "nothing recognized, nothing guessed: " << msg;
  msg = error_of([&] { resolve_checkpoint(tmp / "no-such-run"); });
  EXPECT_NE(msg.find("no-such-run does not exist"), std::string::npos) << msg;
  // What the path is instead, where that is recognizable: an unfinished save, a Hugging Face folder.
  msg = error_of([&] { resolve_checkpoint(run + "/.tmp-step-000099"); });
  EXPECT_NE(msg.find(".tmp-step-000099 is a checkpoint still being written, or one whose save was cut short"),
            std::string::npos) << msg;
  fs::create_directories(tmp / "hf");
  std::ofstream(tmp / "hf/config.json") << "{}";
  std::ofstream(tmp / "hf/model.safetensors.index.json") << "{}";
  msg = error_of([&] { resolve_checkpoint(tmp / "hf"); });
  EXPECT_NE(msg.find("it is a Hugging Face model folder: `moetrain import-hf " + (tmp / "hf")), std::string::npos)
      << msg;
}

TEST(Checkpoint, PruneKeepsTheNewestK) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  for (int64_t step : {4, 1, 10, 2, 3}) save_checkpoint(run, step, m.all(), {{"run_id", "a"}});
  EXPECT_EQ(checkpoint_run_id(run + "/step-000004"), "a");
  EXPECT_TRUE(prune_checkpoints(run, 0, "a").others.empty());  // keep all
  EXPECT_TRUE(fs::exists(run + "/step-000001"));
  const PruneOutcome pruned = prune_checkpoints(run, 2, "a");
  EXPECT_TRUE(pruned.others.empty());
  EXPECT_TRUE(pruned.kept_for_the_user.empty());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(run)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-000004", "step-000010"}));
  prune_checkpoints(run, 5, "a");  // fewer than K: nothing to do
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000010");
  EXPECT_THROW(prune_checkpoints(run, 1, ""), Error);  // no line to prune
}

// Another run's checkpoints (and ones without a run id) in the same directory are never removed,
// whatever their steps; only this run's line is cut to K.
TEST(Checkpoint, PruneLeavesOtherRunsCheckpointsInPlace) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  save_checkpoint(run, 1, m.all(), {{"run_id", "other"}});
  save_checkpoint(run, 2, m.all(), json::object());
  for (int64_t step : {3, 4, 5}) save_checkpoint(run, step, m.all(), {{"run_id", "mine"}});
  EXPECT_EQ(checkpoint_run_id(run + "/step-000002"), "");
  EXPECT_EQ(checkpoint_run_id(run + "/step-000099"), "");  // no such checkpoint
  const std::vector<std::string> others = prune_checkpoints(run, 1, "mine").others;
  EXPECT_EQ(others, (std::vector<std::string>{"step-000001", "step-000002"}));
  for (const char* kept : {"step-000001", "step-000002", "step-000005"})
    EXPECT_TRUE(fs::exists(run + "/" + kept)) << kept;
  for (const char* gone : {"step-000003", "step-000004"}) EXPECT_FALSE(fs::exists(run + "/" + gone)) << gone;
}

// Pruning removes checkpoints, never a user's files: one of this line's checkpoints that holds
// anything besides what a save writes (a note, an evaluation's output folder, a link) is kept
// whole and reported; the rest of the line is pruned as usual.
TEST(Checkpoint, PruneKeepsACheckpointHoldingFilesNoSaveWrites) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  for (int64_t step : {1, 2, 3, 4, 5}) save_checkpoint(run, step, m.all(), {{"run_id", "a"}});
  EXPECT_TRUE(files_no_save_wrote(run + "/step-000001").empty());
  write_bytes(run + "/step-000001/notes.txt", "the loss spike is here");
  fs::create_directories(run + "/step-000002/eval");
  fs::create_symlink("/nonexistent", run + "/step-000003/rank-00007.safetensors");  // a link, not a save's file
  write_bytes(run + "/step-000004/index.json.tmp-123", "");                          // a save's own temp name
  EXPECT_EQ(files_no_save_wrote(run + "/step-000001"), std::vector<std::string>{"notes.txt"});
  EXPECT_EQ(files_no_save_wrote(run + "/step-000003"), std::vector<std::string>{"rank-00007.safetensors"});
  EXPECT_TRUE(files_no_save_wrote(run + "/step-000004").empty());
  write_bytes(run + "/step-000005/rank-7.safetensors", "");  // not a name a save gives (rank-00007)
  EXPECT_EQ(files_no_save_wrote(run + "/step-000005"), std::vector<std::string>{"rank-7.safetensors"});
  fs::remove(run + "/step-000005/rank-7.safetensors");

  const PruneOutcome pruned = prune_checkpoints(run, 1, "a");
  EXPECT_EQ(pruned.kept_for_the_user, (std::vector<std::string>{"step-000001 (it holds notes.txt)", "step-000002 (it holds eval)",
                                                                  "step-000003 (it holds rank-00007.safetensors)"}));
  EXPECT_EQ(read_bytes(run + "/step-000001/notes.txt"), "the loss spike is here");
  EXPECT_TRUE(fs::is_directory(run + "/step-000002/eval"));
  EXPECT_TRUE(fs::is_symlink(run + "/step-000003/rank-00007.safetensors"));
  EXPECT_FALSE(fs::exists(run + "/step-000004"));
  EXPECT_TRUE(fs::exists(run + "/step-000005"));

  // Many foreign files are named three at a time.
  for (const char* f : {"a", "b", "c", "d", "e"}) write_bytes(run + "/step-000002/" + f, "");
  EXPECT_EQ(prune_checkpoints(run, 1, "a").kept_for_the_user[1], "step-000002 (it holds a, b, c, and 3 more)");
}

// A checkpoint the user made read-only is kept whole and reported (for root too, who could remove
// it); a copy under a name no save gives ("step-2") is not a checkpoint of the run at all.
TEST(Checkpoint, PruneKeepsReadOnlyCheckpointsAndIgnoresNamesNoSaveGives) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  for (int64_t step : {0, 1, 2, 3}) save_checkpoint(run, step, m.all(), {{"run_id", "a"}});
  fs::copy(run + "/step-000002", run + "/step-2", fs::copy_options::recursive);
  // Its files made read-only, its folder not: kept as well.
  for (const auto& e : fs::directory_iterator(run + "/step-000000"))
    fs::permissions(e.path(), fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove);
  fs::permissions(run + "/step-000001", fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  EXPECT_EQ(list_checkpoints(run).size(), 4u);
  const PruneOutcome pruned = prune_checkpoints(run, 1, "a");
  fs::permissions(run + "/step-000001", fs::perms::owner_write, fs::perm_options::add);  // for TempDir's cleanup
  EXPECT_EQ(pruned.kept_for_the_user,
            (std::vector<std::string>{"step-000000 (it is read-only)", "step-000001 (it is read-only)"}));
  EXPECT_TRUE(fs::exists(run + "/step-000000/index.json"));
  EXPECT_TRUE(fs::exists(run + "/step-000001/index.json"));
  EXPECT_FALSE(fs::exists(run + "/step-000002"));
  EXPECT_TRUE(fs::exists(run + "/step-2/index.json"));
  EXPECT_TRUE(fs::exists(run + "/step-000003"));
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000003");
}

// Setting aside the steps after a resume moves their folders into abandoned/; one that cannot move
// (read-only, for a user other than root) is named before anything moves, and no intent is left.
TEST(Checkpoint, SetAsideRefusesAReadOnlyLaterCheckpointBeforeMovingAnything) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model m;
  for (int64_t step : {2, 4, 6}) save_checkpoint(run, step, m.all(), {{"run_id", "a"}});
  fs::permissions(run + "/step-000006", fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                  fs::perm_options::remove);
  // Root may move a read-only folder: run the call as an unprivileged user then.
  const bool root = ::geteuid() == 0;
  if (root) {
    // (A user-namespaced container may have no such user to hand files to.)
    if (::chown(tmp.path.c_str(), 65534, 65534) != 0) GTEST_SKIP() << "cannot hand files to uid 65534 here";
    for (const auto& e : fs::recursive_directory_iterator(tmp.path))
      ASSERT_EQ(::lchown(e.path().c_str(), 65534, 65534), 0);
  }
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (root && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(3);
    const std::string msg = error_of([&] { set_aside_after(run, 2, false, nullptr); });
    const bool named = msg.find(run + "/step-000006") != std::string::npos && msg.find("read-only") != std::string::npos;
    ::_exit(named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  fs::permissions(run + "/step-000006", fs::perms::owner_write, fs::perm_options::add);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the error did not name the read-only checkpoint";
  for (const char* kept : {"step-000002", "step-000004", "step-000006"}) EXPECT_TRUE(fs::exists(run + "/" + kept)) << kept;
  EXPECT_FALSE(fs::exists(run + "/.set-aside.json"));
  EXPECT_FALSE(fs::exists(run + "/abandoned"));
}

TEST(Checkpoint, CrashDuringSaveLeavesEarlierCheckpointAndNoNewStepDir) {
  TempDir tmp;
  std::string run = tmp / "run";
  Model first(1.f);
  save_checkpoint(run, 1, first.all(), {{"step", 1}});

  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("MOE_TEST_CRASH_DURING_SAVE", "1", 1);
    try {
      save_checkpoint(run, 2, Model(2.f).all(), {{"step", 2}});
    } catch (...) {
      std::_Exit(4);
    }
    std::_Exit(0);  // the hook did not fire
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3) << "the child should die in the crash hook";

  EXPECT_FALSE(fs::exists(run + "/step-000002"));
  EXPECT_TRUE(fs::exists(run + "/.tmp-step-000002/rank-00000.safetensors"));  // it did get that far
  EXPECT_FALSE(fs::exists(run + "/.tmp-step-000002/index.json"));
  std::string dir = resolve_checkpoint(run);
  EXPECT_EQ(dir, run + "/step-000001");
  CheckpointReader r(dir);
  std::vector<float> w(24);
  r.read("experts.w1", 0, 24, w.data());
  EXPECT_EQ(w, first.w1);

  // The next save of that step clears the leftover and commits.
  save_checkpoint(run, 2, Model(2.f).all(), {{"step", 2}});
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000002");
  EXPECT_FALSE(fs::exists(run + "/.tmp-step-000002"));
}

// A full disk, by way of RLIMIT_FSIZE (SIGXFSZ ignored, so a write fails with EFBIG): once in the
// rank file's tensors, once after it, in index.json (300 one-element tensors: the index is the larger
// file). Either way the error names the file, the earlier checkpoint stays the newest, and the temp
// directory is gone: it was left behind, in the second case holding the whole rank file.
TEST(Checkpoint, a_save_that_hits_a_full_disk_leaves_no_temp_directory_and_the_earlier_checkpoint) {
  TempDir tmp;
  const std::string run = tmp / "run";
  std::vector<float> values(300);
  std::iota(values.begin(), values.end(), 1.f);
  std::vector<CheckpointSlice> slices;
  for (size_t i = 0; i < values.size(); ++i) {
    std::string key = "t";
    key += std::to_string(i);  // (GCC 12's -Wrestrict misfires on "t" + std::to_string(i))
    slices.push_back({key, DType::F32, {1}, 0, 1, &values[i]});
  }
  save_checkpoint(run, 1, slices, {{"step", 1}});
  const std::string rank_file = run + "/step-000001/" + rank_file_name(0);
  const uintmax_t rank_bytes = fs::file_size(rank_file), index_bytes = fs::file_size(run + "/step-000001/index.json");
  ASSERT_GT(index_bytes, rank_bytes + 1000) << "the index must be the larger file for the second case";
  const std::string index_before = moe::testing::read_bytes(run + "/step-000001/index.json");

  struct Case {
    uintmax_t limit;
    std::string file;
  };
  for (const Case& c : {Case{rank_bytes / 2, rank_file_name(0)}, Case{(rank_bytes + index_bytes) / 2, "index.json"}}) {
    const std::string msg =
        moe::testing::error_under_file_size_limit(c.limit, [&] { save_checkpoint(run, 2, slices, {{"step", 2}}); });
    EXPECT_NE(msg.find(run + "/.tmp-step-000002/" + c.file), std::string::npos) << msg;
    EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
    EXPECT_FALSE(fs::exists(run + "/.tmp-step-000002"))
        << "the failed save's temp directory was left (" << c.file << ")";
    EXPECT_FALSE(fs::exists(run + "/step-000002"));
    EXPECT_EQ(resolve_checkpoint(run), run + "/step-000001");
    EXPECT_EQ(moe::testing::read_bytes(run + "/step-000001/index.json"), index_before);
  }
  // With space again the same save commits.
  save_checkpoint(run, 2, slices, {{"step", 2}});
  EXPECT_EQ(resolve_checkpoint(run), run + "/step-000002");
}

TEST(Checkpoint, UnwritableRunDirGivesClearError) {
  TempDir tmp;
  write_bytes(tmp / "file", "x");
  std::string run = tmp / "file/run";  // a path below a regular file can never be created
  std::string msg = error_of([&] { save_checkpoint(run, 1, Model().all(), json::object()); });
  EXPECT_NE(msg.find("cannot create checkpoint directory " + run + ": Not a directory"), std::string::npos) << msg;

  if (::geteuid() != 0) {  // root ignores permission bits
    std::string ro = tmp / "readonly";
    fs::create_directories(ro);
    ::chmod(ro.c_str(), 0555);
    msg = error_of([&] { save_checkpoint(ro, 1, Model().all(), json::object()); });
    EXPECT_NE(msg.find("cannot create checkpoint directory " + ro + "/.tmp-step-000001: Permission denied"),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace moe
