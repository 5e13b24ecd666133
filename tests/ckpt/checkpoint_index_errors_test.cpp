// Every malformed field of index.json and train_state.json is one moe::Error that names the file
// and the field (a JSON pointer) and says what was expected and what was found, never a bare
// nlohmann::json exception.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "moe/ckpt/checkpoint.h"
#include "temp_dir.h"
#include "two_rank_checkpoint.h"

namespace moe {
namespace {

using moe::testing::error_of;
using moe::testing::Model;
using moe::testing::read_bytes;
using moe::testing::save_two_ranks;
using moe::testing::TempDir;
using moe::testing::write_bytes;
using nlohmann::json;

struct MalformedField {
  const char* name;
  const char* file;                                  // "index.json" or "train_state.json"
  std::function<void(json&)> damage;                 // applied to that file's JSON
  std::function<void(const CheckpointReader&)> use;  // what the trainer would read; null: opening fails
  const char* expected;                              // follows "<dir>/<file>: "
};

// index.json's chunks of experts.w1 are [0, 7) and [7, 12) in rank 0 and [12, 24) in rank 1.
json& w1(json& index) { return index["tensors"]["experts.w1"]; }
json& chunk0(json& index) { return w1(index)["chunks"][0]; }

const MalformedField kCases[] = {
    {"StepIsAString", "index.json", [](json& j) { j["step"] = "abc"; }, nullptr,
     "field /step must be an integer >= 0, found \"abc\""},
    {"StepIsNegative", "index.json", [](json& j) { j["step"] = -3; }, nullptr,
     "field /step must be an integer >= 0, found -3"},
    {"StepIsMissing", "index.json", [](json& j) { j.erase("step"); }, nullptr, "missing field /step"},
    {"FormatIsMissing", "index.json", [](json& j) { j.erase("format"); }, nullptr,
     "not a moetrain checkpoint index (missing \"format\": \"moetrain-checkpoint\")"},
    {"TopLevelIsAnArray", "index.json",
     [](json& j) {
       j = json::array({1, 2});
     },
     nullptr, "not a moetrain checkpoint index"},
    {"VersionIsAString", "index.json", [](json& j) { j["version"] = "2"; }, nullptr,
     "field /version must be an integer >= 1, found \"2\""},
    {"VersionIsFromTheFuture", "index.json", [](json& j) { j["version"] = 3; }, nullptr,
     "checkpoint format version 3 is newer than this build reads (1 to 2)"},
    {"TensorsIsAnArray", "index.json", [](json& j) { j["tensors"] = json::array(); }, nullptr,
     "field /tensors must be an object, found []"},
    {"TensorIsANumber", "index.json", [](json& j) { w1(j) = 5; }, nullptr,
     "field /tensors/experts.w1 must be an object, found 5"},
    {"DtypeIsANumber", "index.json", [](json& j) { w1(j)["dtype"] = 7; }, nullptr,
     "field /tensors/experts.w1/dtype must be a string, found 7"},
    {"DtypeIsUnknown", "index.json", [](json& j) { w1(j)["dtype"] = "F99"; }, nullptr,
     "field /tensors/experts.w1/dtype: unknown dtype 'F99'"},
    {"ShapeIsAString", "index.json", [](json& j) { w1(j)["shape"] = "4x6"; }, nullptr,
     "field /tensors/experts.w1/shape must be an array of integers >= 0, found \"4x6\""},
    {"ShapeHasANegativeDim", "index.json",
     [](json& j) {
       w1(j)["shape"] = {4, -6};
     },
     nullptr, "field /tensors/experts.w1/shape/1 must be an integer >= 0, found -6"},
    {"ShapeHasAFloatDim", "index.json",
     [](json& j) {
       w1(j)["shape"] = {4, 6.5};
     },
     nullptr, "field /tensors/experts.w1/shape/1 must be an integer >= 0, found 6.5"},
    {"ShapeOverflows", "index.json",
     [](json& j) {
       w1(j)["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
     },
     nullptr, "field /tensors/experts.w1/shape must be a shape whose element count fits in 64 bits"},
    {"ChunksIsAnObject", "index.json", [](json& j) { w1(j)["chunks"] = json::object(); }, nullptr,
     "field /tensors/experts.w1/chunks must be an array, found {}"},
    {"ChunkIsANumber", "index.json", [](json& j) { chunk0(j) = 3; }, nullptr,
     "field /tensors/experts.w1/chunks/0 must be an object, found 3"},
    {"ChunkBeginIsNegative", "index.json", [](json& j) { chunk0(j)["begin"] = -1; }, nullptr,
     "field /tensors/experts.w1/chunks/0/begin must be an integer in [0, 24], found -1"},
    {"ChunkBeginIsAString", "index.json", [](json& j) { chunk0(j)["begin"] = "0"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/begin must be an integer in [0, 24], found \"0\""},
    {"ChunkBeginIsAFloat", "index.json", [](json& j) { chunk0(j)["begin"] = 0.5; }, nullptr,
     "field /tensors/experts.w1/chunks/0/begin must be an integer in [0, 24], found 0.5"},
    {"ChunkBeginIsMissing", "index.json", [](json& j) { chunk0(j).erase("begin"); }, nullptr,
     "missing field /tensors/experts.w1/chunks/0/begin"},
    {"ChunkEndIsBeforeBegin", "index.json", [](json& j) { w1(j)["chunks"][1]["end"] = 3; }, nullptr,
     "field /tensors/experts.w1/chunks/1/end must be an integer in [7, 24], found 3"},
    {"ChunkEndIsPastTheTensor", "index.json", [](json& j) { w1(j)["chunks"][2]["end"] = 25; }, nullptr,
     "field /tensors/experts.w1/chunks/2/end must be an integer in [12, 24], found 25"},
    {"ChunkEndIsBeyondInt64", "index.json", [](json& j) { chunk0(j)["end"] = uint64_t{1} << 63; }, nullptr,
     "field /tensors/experts.w1/chunks/0/end must be an integer in [0, 24], found 9223372036854775808"},
    {"ChunkEndIsNull", "index.json", [](json& j) { chunk0(j)["end"] = nullptr; }, nullptr,
     "field /tensors/experts.w1/chunks/0/end must be an integer in [0, 24], found null"},
    {"ChunkFileIsANumber", "index.json", [](json& j) { chunk0(j)["file"] = 0; }, nullptr,
     "field /tensors/experts.w1/chunks/0/file must be a string, found 0"},
    {"ChunkFileIsMissing", "index.json", [](json& j) { chunk0(j).erase("file"); }, nullptr,
     "missing field /tensors/experts.w1/chunks/0/file"},
    {"ChunkFileDoesNotExist", "index.json", [](json& j) { chunk0(j)["file"] = "rank-00009.safetensors"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/file: rank file "},
    {"ChunkFileLeavesTheDirectory", "index.json", [](json& j) { chunk0(j)["file"] = "../x.safetensors"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/file must be a plain file name inside the checkpoint directory"},
    {"ChunkKeyIsAnArray", "index.json", [](json& j) { chunk0(j)["key"] = json::array({"a"}); }, nullptr,
     "field /tensors/experts.w1/chunks/0/key must be a string, found [\"a\"]"},
    {"ChunkKeyIsNotInTheFile", "index.json", [](json& j) { chunk0(j)["key"] = "experts.w1@5"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/key: chunk tensor 'experts.w1@5' not found in "},
    {"ChecksumIsMissing", "index.json", [](json& j) { chunk0(j).erase("checksum"); }, nullptr,
     "missing field /tensors/experts.w1/chunks/0/checksum"},
    {"ChecksumIsAString", "index.json", [](json& j) { chunk0(j)["checksum"] = "00"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/checksum must be an object, found \"00\""},
    {"ChecksumAlgorithmIsUnknown", "index.json", [](json& j) { chunk0(j)["checksum"]["algorithm"] = "crc32"; }, nullptr,
     "field /tensors/experts.w1/chunks/0/checksum/algorithm: unsupported checksum algorithm 'crc32' (this build "
     "verifies xxh3-64)"},
    {"ChecksumValueIsNotHex", "index.json", [](json& j) { chunk0(j)["checksum"]["value"] = "not-hex-not-hex!"; },
     nullptr, "field /tensors/experts.w1/chunks/0/checksum/value must be 16 hexadecimal digits, found \"not-hex-"},
    {"ChecksumValueIsANumber", "index.json", [](json& j) { chunk0(j)["checksum"]["value"] = 12345; }, nullptr,
     "field /tensors/experts.w1/chunks/0/checksum/value must be a string, found 12345"},

    {"TrainStateIsAnArray", "train_state.json", [](json& j) { j = json::array({1}); }, nullptr,
     "the top level must be an object, found [1]"},
    {"TrainStateStepIsAString", "train_state.json", [](json& j) { j["step"] = "abc"; },
     [](const CheckpointReader& r) { r.train_state_int("step"); },
     "field /step must be an integer >= 0, found \"abc\""},
    {"TrainStateStepIsMissing", "train_state.json", [](json& j) { j.erase("step"); },
     [](const CheckpointReader& r) { r.train_state_int("step"); }, "missing field /step"},
    {"TrainStateSkippedStepsIsNegative", "train_state.json", [](json& j) { j["skipped_steps"] = -2; },
     [](const CheckpointReader& r) { r.train_state_int("skipped_steps", 0); },
     "field /skipped_steps must be an integer >= 0, found -2"},
    {"TrainStateSkippedStepsIsAFloat", "train_state.json", [](json& j) { j["skipped_steps"] = 1.5; },
     [](const CheckpointReader& r) { r.train_state_int("skipped_steps", 0); },
     "field /skipped_steps must be an integer >= 0, found 1.5"},
    {"TrainStateConfigIsMissing", "train_state.json", [](json& j) { j.erase("config"); },
     [](const CheckpointReader& r) { r.train_state_string("config"); }, "missing field /config"},
    {"TrainStateConfigIsAnObject", "train_state.json",
     [](json& j) {
       j["config"] = {{"a", 1}};
     },
     [](const CheckpointReader& r) { r.train_state_string("config"); },
     "field /config must be a string, found {\"a\":1}"},
};

class CheckpointMalformedField : public ::testing::TestWithParam<MalformedField> {};

TEST_P(CheckpointMalformedField, IsAnErrorNamingFileAndField) {
  const MalformedField& c = GetParam();
  TempDir tmp;
  const std::string dir = save_two_ranks(tmp / "run", 3, Model());
  const std::string path = dir + "/" + c.file;
  json j = json::parse(read_bytes(path));
  c.damage(j);
  write_bytes(path, j.dump(1));
  const std::string msg = error_of([&] {
    CheckpointReader r(dir);
    if (c.use) c.use(r);
  });
  EXPECT_NE(msg.find(path + ": " + c.expected), std::string::npos) << msg;
  EXPECT_EQ(msg.find("[json.exception"), std::string::npos) << "a bare library message: " << msg;
}

INSTANTIATE_TEST_SUITE_P(All, CheckpointMalformedField, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<MalformedField>& info) { return info.param.name; });

TEST(CheckpointTrainState, TypedAccessorsReadWellFormedFields) {
  TempDir tmp;
  CheckpointReader r(save_two_ranks(tmp / "run", 3, Model()));
  EXPECT_EQ(r.train_state_int("step"), 3);
  EXPECT_EQ(r.train_state_int("skipped_steps", 0), 2);
  EXPECT_EQ(r.train_state_int("no_such_count", 11), 11);
  EXPECT_EQ(r.train_state_string("config"), "name = \"t\"\n");
}

}  // namespace
}  // namespace moe
