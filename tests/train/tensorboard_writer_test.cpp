// TensorBoard event files: the CRC and TFRecord framing against known bytes (the expected bytes are
// what TensorBoard 2.21's own RecordWriter and event_pb2 produce for the same events), the metrics
// record -> scalars mapping, whole-record writes under a full disk, reading back, and the set-aside
// of an abandoned line's events on a resume.
#include "moe/train/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

#include "moe/core/error.h"
#include "moe/train/trainer.h"
#include "train_test_util.h"

namespace moe {
namespace {

namespace fs = std::filesystem;

std::string hex(std::string_view bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The steps of the scalar events in an event file (the file_version event left out).
std::vector<int64_t> scalar_steps(const std::string& path) {
  const std::string bytes = read_bytes(path);
  std::vector<int64_t> steps;
  for (const EventRecord& e : read_event_records(path, bytes, nullptr))
    if (e.summary) steps.push_back(e.step);
  return steps;
}

// An event file as the writer lays it out: the file_version event, then one event per step.
std::string event_file(const std::vector<int64_t>& steps) {
  std::string bytes = tfrecord(file_version_event(1.0));
  for (int64_t s : steps) bytes += tfrecord(scalars_event(1.0 + static_cast<double>(s), s, {{"loss", 1.0f / s}}));
  return bytes;
}

TEST(TensorBoardCrc, crc32c_is_the_castagnoli_crc_and_masked_as_tfrecords_store_it) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);  // the standard check value of CRC-32C
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(100, 'a')), 0x5ea3ad99u);
  EXPECT_EQ(masked_crc32c("123456789"), 0xc78ab0e5u);
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);
}

TEST(TensorBoardEvents, file_version_record_is_the_bytes_tensorboard_writes) {
  EXPECT_EQ(hex(tfrecord(file_version_event(1700000000.25))),
            "1800000000000000a37f4b220900001040fc54d9411a0d627261696e2e4576656e743a32338d2fe9");
}

TEST(TensorBoardEvents, scalars_record_is_the_bytes_tensorboard_writes) {
  const Scalars scalars = {{"loss", 2.5f}, {"expert_load/layer_1", std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_EQ(hex(scalars_event(1700000000.25, 300, scalars)),
            "0900001040fc54d94110ac022a290a0b0a046c6f737315000020400a1a0a136578706572745f6c6f61642f6c617965725f3115"
            "0000c07f");
  EXPECT_EQ(hex(tfrecord(scalars_event(1700000000.25, 300, scalars))),
            "3700000000000000e7e8ca590900001040fc54d94110ac022a290a0b0a046c6f737315000020400a1a0a136578706572745f6c"
            "6f61642f6c617965725f31150000c07f353f83f5");
}

TEST(TensorBoardEvents, record_scalars_keeps_every_number_of_a_metrics_record) {
  const nlohmann::json record = {{"step", 7},
                                 {"loss", 2.5},
                                 {"eval_loss", "nan"},
                                 {"grad_norm", "inf"},
                                 {"z_loss", "-inf"},
                                 {"world_size", 4},
                                 {"skipped", true},
                                 {"expert_load_max_over_mean_per_layer", {1.25, "nan"}},
                                 {"eval_sets", {{"val", 3.5}, {"code", "inf"}}},
                                 {"time", "2026-01-01T00:00:00Z"},
                                 {"run_id", "abc"}};
  std::map<std::string, float> got;
  for (const auto& [tag, v] : record_scalars(record)) got[tag] = v;
  ASSERT_EQ(got.size(), 10u);  // not step, time or run_id
  EXPECT_EQ(got.at("loss"), 2.5f);
  EXPECT_TRUE(std::isnan(got.at("eval_loss")));
  EXPECT_EQ(got.at("grad_norm"), std::numeric_limits<float>::infinity());
  EXPECT_EQ(got.at("z_loss"), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(got.at("world_size"), 4.0f);
  EXPECT_EQ(got.at("skipped"), 1.0f);
  EXPECT_EQ(got.at("expert_load/layer_0"), 1.25f);
  EXPECT_TRUE(std::isnan(got.at("expert_load/layer_1")));
  EXPECT_EQ(got.at("eval_loss/val"), 3.5f);  // each validation set as its own curve, the names W&B gets
  EXPECT_EQ(got.at("eval_loss/code"), std::numeric_limits<float>::infinity());
}

TEST(TensorBoardWriter, writes_a_file_version_event_then_one_event_per_record_in_a_new_file) {
  testing::TempDir tmp;
  const std::string dir = tmp.path + "/tensorboard";
  TensorBoardWriter writer(dir);
  EXPECT_FALSE(fs::exists(dir)) << "nothing is created before the first record";
  for (int64_t step : {1, 2, 5}) writer.write({{"step", step}, {"loss", 1.0 / static_cast<double>(step)}});
  const std::vector<std::string> names = files_in(dir);
  ASSERT_EQ(names.size(), 1u);
  const std::string prefix = "events.out.tfevents.";
  EXPECT_EQ(names[0].rfind(prefix, 0), 0u) << names[0];
  EXPECT_NE(names[0].find("." + std::to_string(::getpid())), std::string::npos) << names[0];
  EXPECT_EQ(dir + "/" + names[0], writer.path());

  const std::string bytes = read_bytes(writer.path());
  size_t tail = 0;
  const std::vector<EventRecord> events = read_event_records(writer.path(), bytes, &tail);
  EXPECT_EQ(tail, bytes.size());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_FALSE(events[0].summary);
  EXPECT_EQ(bytes.substr(events[0].offset + 12, events[0].size - 16).find("brain.Event:2"), 11u);
  EXPECT_EQ(scalar_steps(writer.path()), (std::vector<int64_t>{1, 2, 5}));
}

TEST(TensorBoardWriter, a_failed_write_names_the_file_and_leaves_no_partial_record) {
  testing::TempDir tmp;
  TensorBoardWriter writer(tmp.path + "/tensorboard");
  writer.write({{"step", 1}, {"loss", 1.0}});
  const std::string before = read_bytes(writer.path());

  // A full disk, by way of RLIMIT_FSIZE: the next record does not fit. SIGXFSZ is ignored so the
  // write fails with EFBIG instead of killing the test.
  nlohmann::json big = {{"step", 2}};
  for (int i = 0; i < 50; ++i) big["metric_" + std::to_string(i)] = i;
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = before.size() + 100;
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    writer.write(big);
  } catch (const Error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(message.find("cannot write TensorBoard event file '" + writer.path() + "'"), std::string::npos) << message;
  EXPECT_EQ(read_bytes(writer.path()), before) << "a cut-off record was left in the file";

  writer.write({{"step", 3}, {"loss", 0.5}});  // with space again, the next record is whole
  EXPECT_EQ(scalar_steps(writer.path()), (std::vector<int64_t>{1, 3}));
}

TEST(TensorBoardEvents, reading_stops_at_a_cut_off_last_record_and_refuses_a_corrupt_one) {
  testing::TempDir tmp;
  const std::string path = tmp.path + "/events.out.tfevents.1.h.1";
  const std::string whole = event_file({1, 2});
  const std::string third = tfrecord(scalars_event(3.0, 3, {{"loss", 0.3f}}));
  const std::string cut = whole + third.substr(0, third.size() - 5);
  size_t tail = 0;
  const std::vector<EventRecord> events = read_event_records(path, cut, &tail);
  EXPECT_EQ(events.size(), 3u);
  EXPECT_EQ(tail, whole.size());

  std::string corrupt = whole;
  corrupt[corrupt.size() - 8] ^= 0x01;  // a byte of the last event's data
  try {
    read_event_records(path, corrupt, nullptr);
    ADD_FAILURE() << "a corrupt record was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fails its CRC"), std::string::npos) << e.what();
  }
}

TEST(TensorBoardEvents, moving_the_events_after_a_step_splits_files_keeps_every_event_and_is_idempotent) {
  testing::TempDir tmp;
  const std::string dir = tmp.path + "/tensorboard", dest = tmp.path + "/abandoned/x";
  fs::create_directories(dir);
  const std::string a = "events.out.tfevents.100.h.1", b = "events.out.tfevents.200.h.2";
  write_bytes(dir + "/" + a, event_file({1, 2, 3, 4}));
  write_bytes(dir + "/" + b, event_file({5, 6}));
  EXPECT_TRUE(tensorboard_events_after(dir, 2));
  EXPECT_FALSE(tensorboard_events_after(dir, 6));

  EXPECT_EQ(move_tensorboard_events_after(dir, 2, dest), 4);
  EXPECT_FALSE(tensorboard_events_after(dir, 2));
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{a}));  // b held only later steps: moved whole
  EXPECT_EQ(scalar_steps(dir + "/" + a), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(files_in(dest + "/tensorboard"), (std::vector<std::string>{a, b}));
  EXPECT_EQ(scalar_steps(dest + "/tensorboard/" + a), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(read_bytes(dest + "/tensorboard/" + b), event_file({5, 6}));
  // Each part still opens with the file_version event.
  for (const std::string& path : {dir + "/" + a, dest + "/tensorboard/" + a}) {
    const std::string bytes = read_bytes(path);
    EXPECT_EQ(bytes.rfind(tfrecord(file_version_event(1.0)), 0), 0u) << path;
  }

  EXPECT_EQ(move_tensorboard_events_after(dir, 2, dest), 0);  // done already: nothing moves again
  EXPECT_EQ(scalar_steps(dest + "/tensorboard/" + a), (std::vector<int64_t>{3, 4}));
}

// Event files that are links to files elsewhere (the user's choice of disk): a split file is
// rewritten through its link, a whole one moves as a link that still names it.
TEST(TensorBoardEvents, moving_the_events_after_a_step_keeps_links_working) {
  testing::TempDir tmp;
  const std::string dir = tmp.path + "/run/tensorboard", dest = tmp.path + "/run/abandoned/x";
  const std::string elsewhere = tmp.path + "/disk";
  fs::create_directories(dir);
  fs::create_directories(elsewhere);
  const std::string a = "events.out.tfevents.100.h.1", b = "events.out.tfevents.200.h.2";
  write_bytes(elsewhere + "/" + a, event_file({1, 2, 3, 4}));
  write_bytes(elsewhere + "/" + b, event_file({5, 6}));
  fs::create_symlink("../../disk/" + a, dir + "/" + a);
  fs::create_symlink("../../disk/" + b, dir + "/" + b);

  EXPECT_EQ(move_tensorboard_events_after(dir, 2, dest), 4);
  EXPECT_TRUE(fs::is_symlink(dir + "/" + a)) << "the split file's link stays";
  EXPECT_EQ(scalar_steps(elsewhere + "/" + a), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(scalar_steps(dest + "/tensorboard/" + a), (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir + "/" + b)));
  ASSERT_TRUE(fs::is_symlink(dest + "/tensorboard/" + b));
  EXPECT_EQ(read_bytes(dest + "/tensorboard/" + b), event_file({5, 6})) << "the moved link names the events";
}

TEST(TensorBoardRun, a_resume_from_an_older_step_sets_the_abandoned_events_aside_with_the_metrics) {
  testing::TempDir run;
  TrainOptions quiet;
  quiet.quiet = true;
  const std::vector<std::string> o = {"train.steps=6", "train.save_every=2", "run.tensorboard=true"};
  { Trainer t(testing::small_config(run.path, o), quiet, testing::local_world()); t.run(); }
  std::vector<std::string> first = files_in(run.path + "/tensorboard");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(scalar_steps(run.path + "/tensorboard/" + first[0]), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));

  TrainOptions resume = quiet;
  resume.resume = run.path + "/step-000002";
  std::vector<std::string> shorter = o;
  shorter.push_back("train.steps=4");
  { Trainer t(testing::small_config(run.path, shorter), resume, testing::local_world()); t.run(); }
  const std::vector<std::string> now = files_in(run.path + "/tensorboard");
  ASSERT_EQ(now.size(), 2u);  // the first start's file, cut back to step 2, and the resumed start's
  EXPECT_EQ(scalar_steps(run.path + "/tensorboard/" + now[0]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(scalar_steps(run.path + "/tensorboard/" + now[1]), (std::vector<int64_t>{3, 4}));
  const std::vector<std::string> aside = files_in(run.path + "/abandoned");
  ASSERT_EQ(aside.size(), 1u);
  const std::string aside_tb = run.path + "/abandoned/" + aside[0] + "/tensorboard/" + first[0];
  EXPECT_EQ(scalar_steps(aside_tb), (std::vector<int64_t>{3, 4, 5, 6}));
}

TEST(TensorBoardRun, overwrite_moves_the_previous_runs_events_aside_with_its_other_files) {
  testing::TempDir run;
  TrainOptions quiet;
  quiet.quiet = true;
  const std::vector<std::string> o = {"train.steps=2", "run.tensorboard=true"};
  { Trainer t(testing::small_config(run.path, o), quiet, testing::local_world()); t.run(); }
  const std::vector<std::string> first = files_in(run.path + "/tensorboard");
  ASSERT_EQ(first.size(), 1u);
  TrainOptions overwrite = quiet;
  overwrite.overwrite = true;
  { Trainer t(testing::small_config(run.path, o), overwrite, testing::local_world()); t.run(); }
  const std::vector<std::string> replaced = files_in(run.path + "/replaced");
  ASSERT_EQ(replaced.size(), 1u);
  const std::string old_tb = run.path + "/replaced/" + replaced[0] + "/tensorboard/";
  EXPECT_EQ(files_in(old_tb), first);
  EXPECT_EQ(scalar_steps(old_tb + first[0]), (std::vector<int64_t>{1, 2}));
  const std::vector<std::string> now = files_in(run.path + "/tensorboard");
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(scalar_steps(run.path + "/tensorboard/" + now[0]), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace moe
