// A small checkpoint with known contents, saved as two ranks would save it, and helpers the
// checkpoint tests share.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "moe/ckpt/checkpoint.h"
#include "moe/core/error.h"

namespace moe::testing {

// The message of the moe::Error that f throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected moe::Error";
  return "";
}

// Two logical tensors with known contents: "experts.w1" F32 [4, 6] and "embed.ids" I64 [10].
struct Model {
  std::vector<float> w1 = std::vector<float>(24);
  std::vector<int64_t> ids = std::vector<int64_t>(10);
  explicit Model(float seed = 0.f) {
    for (int i = 0; i < 24; ++i) w1[i] = seed + 0.5f * i - 3.f;
    for (int i = 0; i < 10; ++i) ids[i] = (int64_t{1} << 40) + i * 7 + static_cast<int64_t>(seed);
  }
  CheckpointSlice w1_slice(int64_t b, int64_t e) const {
    return {"experts.w1", DType::F32, {4, 6}, b, e, w1.data() + b};
  }
  CheckpointSlice ids_slice(int64_t b, int64_t e) const {
    return {"embed.ids", DType::I64, {10}, b, e, ids.data() + b};
  }
  std::vector<CheckpointSlice> all() const { return {w1_slice(0, 24), ids_slice(0, 10)}; }
};

// Saves `m` as two ranks would: rank 0 owns w1 [0,7) [7,12) and ids [0,3); rank 1 owns
// w1 [12,24) (unless `leave_gap`) and ids [3,10). Chunk records travel to rank 0 as JSON.
inline std::string save_two_ranks(const std::string& run, int64_t step, const Model& m, bool leave_gap = false) {
  using nlohmann::json;
  std::string tmp = begin_checkpoint(run, step);
  std::vector<CheckpointSlice> rank0 = {m.w1_slice(0, 7), m.ids_slice(0, 3), m.w1_slice(7, 12)};
  std::vector<CheckpointSlice> rank1 = {m.ids_slice(3, 10)};
  if (!leave_gap) rank1.push_back(m.w1_slice(12, 24));
  json from0 = chunks_to_json(write_rank_file(tmp, 0, rank0));
  json from1 = chunks_to_json(write_rank_file(tmp, 1, rank1));
  std::vector<CheckpointChunk> all = chunks_from_json(from0);
  for (auto& c : chunks_from_json(json::parse(from1.dump()))) all.push_back(c);
  write_checkpoint_index(tmp, step, all,
                         {{"step", step}, {"data_position", 4096}, {"skipped_steps", 2}, {"config", "name = \"t\"\n"}});
  return commit_checkpoint(run, step);
}

}  // namespace moe::testing
