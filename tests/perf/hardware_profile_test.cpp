// Hardware profiles: the shipped ones load, a profile survives save and load unchanged (in-step
// factors included), a bad file is one error naming the file and the key, and efficiency curves
// interpolate in log x and scale by their in-step factor.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "moe/core/error.h"
#include "moe/perf/hardware_profile.h"

namespace moe {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The built-in H200 profile's text with one change made by `edit`.
std::string edited_h200(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(hardware_profile_json(load_hardware_profile("h200")));
  edit(j);
  return j.dump();
}

TEST(HardwareProfile, shipped_profiles_load_and_only_the_h200_and_h100_are_measured) {
  for (const std::string name : {"h200", "h100", "b200", "b300"}) {
    const HardwareProfile p = load_hardware_profile(name);
    EXPECT_EQ(p.measured, name == "h200" || name == "h100") << name;
    EXPECT_FALSE(p.source.empty()) << name;
    for (const auto& [key, curve] : p.curves()) EXPECT_FALSE(curve->points.empty()) << name << " " << key;
  }
  EXPECT_EQ(load_hardware_profile("b300").peak_bf16_tflops, 2250);
  EXPECT_EQ(load_hardware_profile("h200").peak_bf16_tflops, 989);
}

TEST(HardwareProfile, a_saved_profile_loads_back_unchanged) {
  HardwareProfile p = load_hardware_profile("b300");
  p.name = "test GPU";
  p.gemm_grouped_bf16.points = {{256, 0.31}, {1024, 0.52}, {16384, 0.66}};
  p.gemm_grouped_bf16.source = "made up for the test";
  p.elementwise.in_step = 0.757;
  p.elementwise.in_step_source = "fitted to a made-up step";
  const std::string path = testing::TempDir() + "/profile_round_trip.json";
  std::filesystem::remove(path);
  save_hardware_profile(p, path);
  const HardwareProfile q = load_hardware_profile(path);
  EXPECT_EQ(hardware_profile_json(q), hardware_profile_json(p));
  EXPECT_EQ(q.gemm_grouped_bf16.points, p.gemm_grouped_bf16.points);
  EXPECT_EQ(q.name, "test GPU");
  EXPECT_EQ(q.elementwise.in_step, 0.757);
  EXPECT_EQ(q.elementwise.in_step_source, "fitted to a made-up step");
  EXPECT_EQ(q.attention.in_step, 1);  // left out of the file: 1
  EXPECT_EQ(nlohmann::json::parse(hardware_profile_json(q))["efficiency"]["attention"].count("in_step"), 0u);
  // Never overwritten.
  const std::string again = error_of([&] { save_hardware_profile(p, path); });
  EXPECT_NE(again.find("exists"), std::string::npos) << again;
  std::filesystem::remove(path);
}

TEST(HardwareProfile, bad_files_are_one_error_naming_the_file_and_the_key) {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {"{ not json", "is not valid JSON"},
      {edited_h200([](nlohmann::json& j) { j.erase("memory_tb_s"); }), "memory_tb_s"},
      {edited_h200([](nlohmann::json& j) { j["peak_bf16_tfops"] = 1; }), "peak_bf16_tfops is not a known key"},
      {edited_h200([](nlohmann::json& j) { j["peak_bf16_tflops"] = -5; }), "peak_bf16_tflops"},
      {edited_h200([](nlohmann::json& j) { j["peak_bf16_tflops"] = "fast"; }), "peak_bf16_tflops"},
      {edited_h200([](nlohmann::json& j) { j["measured"] = "yes"; }), "measured"},
      {edited_h200([](nlohmann::json& j) { j["efficiency"]["attention"]["x"] = "d_model"; }), "seq_len"},
      {edited_h200([](nlohmann::json& j) { j["efficiency"]["attention"]["points"] = nlohmann::json::array(); }),
       "attention/points"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["gemm_grouped_bf16"]["points"] = {{4096, 0.6}, {1024, 0.5}};
       }),
       "increasing x"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["optimizer"]["points"] = {{1e9, 2.5}};
       }),
       "optimizer"},
      {edited_h200([](nlohmann::json& j) { j["efficiency"].erase("dispatch_intra"); }), "dispatch_intra"},
      {edited_h200([](nlohmann::json& j) { j["runtime_reserve_gib"] = 500; }), "runtime_reserve_gib"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["elementwise"]["in_step"] = {{"factor", 0}};
       }),
       "elementwise/in_step/factor"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["elementwise"]["in_step"] = {{"factor", 3}};
       }),
       "elementwise/in_step/factor"},
      // A factor may not lift a curve past the peak: 0.8 x 1.5 = 1.2 of the GEMM peak.
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["gemm_dense_bf16"]["points"] = {{2048, 0.8}};
         j["efficiency"]["gemm_dense_bf16"]["in_step"] = {{"factor", 1.5}};
       }),
       "gemm_dense_bf16/in_step/factor must be a factor that keeps every point at most 1 of the peak (the point at "
       "x = 2048 is 0.8)"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["gemm_grouped_fp8"]["points"] = {{4096, 1.2}};
       }),
       "gemm_grouped_fp8/points/0/1 must be a number from 1e-06 to 1"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["elementwise"]["in_step"] = {{"factr", 0.7}};
       }),
       "factr is not a known key"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { parse_hardware_profile(c.text, "my-gpu.json"); });
    EXPECT_NE(msg.find("my-gpu.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in: " << msg;
  }
  const std::string unknown = error_of([] { load_hardware_profile("a100"); });
  EXPECT_NE(unknown.find("unknown hardware 'a100'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("h200, h100, b200, b300"), std::string::npos) << unknown;
  const std::string missing = error_of([] { load_hardware_profile("/nonexistent/gpu.json"); });
  EXPECT_NE(missing.find("/nonexistent/gpu.json"), std::string::npos) << missing;
}

// A rate near zero passed "above 0" and predicted a step of 1e300 s (whose printout overran its
// line buffer: a heap corruption abort) or inf s at 0 tokens/s; a name with a line break forged the
// printout's next line. Each is refused, naming the key and the accepted range.
TEST(HardwareProfile, rates_near_zero_and_names_that_break_the_line_are_refused) {
  struct Case {
    std::string text, needle;
  };
  const std::vector<Case> cases = {
      {edited_h200([](nlohmann::json& j) { j["peak_bf16_tflops"] = 1e-300; }),
       "field /peak_bf16_tflops must be a number from 0.001 to 100000"},
      {edited_h200([](nlohmann::json& j) { j["peak_fp8_tflops"] = 1e-300; }), "peak_fp8_tflops"},
      {edited_h200([](nlohmann::json& j) { j["memory_tb_s"] = 1e-300; }),
       "field /memory_tb_s must be a number from 0.001 to 1000"},
      {edited_h200([](nlohmann::json& j) { j["intra_node_gb_s"] = 1e-300; }), "intra_node_gb_s"},
      {edited_h200([](nlohmann::json& j) { j["inter_node_gb_s"] = 1e-300; }), "inter_node_gb_s"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["elementwise"]["points"] = {{1e9, 5e-324}};
       }),
       "field /efficiency/elementwise/points/0/1 must be a number from 1e-06 to 1"},
      {edited_h200([](nlohmann::json& j) {
         j["efficiency"]["attention"]["in_step"] = {{"factor", 1e-300}};
       }),
       "field /efficiency/attention/in_step/factor must be a number from 0.001 to 2"},
      {edited_h200([](nlohmann::json& j) { j["name"] = ""; }), "field /name must be a non-empty name on one line"},
      {edited_h200([](nlohmann::json& j) { j["name"] = "H200\nfits: yes"; }), "field /name must be a non-empty name"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { parse_hardware_profile(c.text, "my-gpu.json"); });
    EXPECT_NE(msg.find("my-gpu.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << "expected '" << c.needle << "' in: " << msg;
  }
  // The floors are far below any GPU's: the shipped profiles and -0 (as 0) load.
  const HardwareProfile zero =
      parse_hardware_profile(edited_h200([](nlohmann::json& j) { j["runtime_reserve_gib"] = -0.0; }), "zero.json");
  EXPECT_EQ(zero.runtime_reserve_gib, 0);
  EXPECT_FALSE(std::signbit(zero.runtime_reserve_gib));  // printed "0.00 GiB", not "-0.00 GiB"
}

// A number past a double's range was nlohmann's out_of_range exception, not a moe::Error (the
// message named neither the file nor --hardware); a key given twice silently took the last value.
TEST(HardwareProfile, a_number_past_a_double_and_a_key_given_twice_name_the_file) {
  std::string text = hardware_profile_json(load_hardware_profile("h200"));
  const std::string key = "\"memory_tb_s\": 4.8";
  ASSERT_NE(text.find(key), std::string::npos);
  std::string overflow = text;
  overflow.replace(overflow.find(key), key.size(), "\"memory_tb_s\": 1e400");
  std::string msg = error_of([&] { parse_hardware_profile(overflow, "my-gpu.json"); });
  EXPECT_NE(msg.find("hardware profile my-gpu.json is not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1e400"), std::string::npos) << msg;
  std::string twice = text;
  twice.replace(twice.find(key), key.size(), "\"memory_tb_s\": 4.8, \"memory_tb_s\": 8.0");
  msg = error_of([&] { parse_hardware_profile(twice, "my-gpu.json"); });
  EXPECT_NE(msg.find("my-gpu.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key 'memory_tb_s' appears twice"), std::string::npos) << msg;
}

// Only a regular file of a profile's size is read: a folder read as empty ("not valid JSON"), a
// FIFO blocked the command until something wrote to it, /dev/zero (also not a regular file) filled
// the memory, and a large file was read whole.
TEST(HardwareProfile, a_profile_file_must_be_a_regular_file_of_a_profiles_size) {
  const std::string dir = testing::TempDir() + "/profile_kinds";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/folder.json");
  std::string msg = error_of([&] { load_hardware_profile(dir + "/folder.json"); });
  EXPECT_NE(msg.find("hardware profile '" + dir + "/folder.json' is a folder"), std::string::npos) << msg;
  // A device: /dev/null here, as /dev/zero would fill the memory if the check were lost.
  msg = error_of([&] { load_hardware_profile("/dev/null"); });
  EXPECT_NE(msg.find("'/dev/null' is not a regular file"), std::string::npos) << msg;

  // A FIFO: a writer that writes a profile-less "{}" as soon as a reader opens it, so that a
  // reader that does open it finishes (with another error) instead of blocking the test.
  const std::string fifo = dir + "/fifo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    while (!done) {
      const int fd = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // ENXIO until a reader has it open
      if (fd >= 0) {
        EXPECT_EQ(write(fd, "{}", 2), 2);
        close(fd);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  msg = error_of([&] { load_hardware_profile(fifo); });
  done = true;
  writer.join();
  EXPECT_NE(msg.find("'" + fifo + "' is not a regular file"), std::string::npos) << msg;

  const std::string big = dir + "/big.json";
  std::ofstream(big).close();
  std::filesystem::resize_file(big, (std::uintmax_t{1} << 20) + 1);  // 1 MiB + 1 of zeros, sparse
  msg = error_of([&] { load_hardware_profile(big); });
  EXPECT_NE(msg.find("is 1048577 bytes; a profile is a few KiB of JSON"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(EfficiencyCurve, the_in_step_factor_scales_the_points_until_new_points_are_measured) {
  EfficiencyCurve c;
  c.x = "bytes";
  c.points = {{1e6, 0.4}, {1e9, 0.8}};
  c.in_step = 0.75;
  c.in_step_source = "fitted";
  EXPECT_DOUBLE_EQ(c.points_at(1e9), 0.8);
  EXPECT_DOUBLE_EQ(c.at(1e9), 0.6);
  EXPECT_DOUBLE_EQ(c.at(1e6), 0.3);
  // Points measured now replace what the factor was fitted against.
  c.set_points({{1e9, 0.9}}, "measured alone");
  EXPECT_EQ(c.in_step, 1);
  EXPECT_EQ(c.in_step_source, "");
  EXPECT_EQ(c.source, "measured alone");
  EXPECT_DOUBLE_EQ(c.at(1e9), 0.9);
}

TEST(EfficiencyCurve, interpolates_linearly_in_log_x_and_holds_beyond_the_ends) {
  EfficiencyCurve c;
  c.x = "rows_per_expert";
  c.points = {{1000, 0.5}, {4000, 0.7}, {16000, 0.8}};
  EXPECT_DOUBLE_EQ(c.at(1000), 0.5);
  EXPECT_NEAR(c.at(2000), 0.6, 1e-12);  // halfway between 1000 and 4000 in log x
  EXPECT_NEAR(c.at(8000), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(c.at(10), 0.5);
  EXPECT_DOUBLE_EQ(c.at(1e9), 0.8);
  EfficiencyCurve empty;
  EXPECT_THROW(empty.at(1), Error);
}

}  // namespace
}  // namespace moe
