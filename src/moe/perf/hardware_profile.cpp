#include "moe/perf/hardware_profile.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "moe/ckpt/durable_file.h"
#include "moe/ckpt/json_field.h"
#include "moe/core/bounded_json.h"
#include "moe/core/error.h"
#include "moe/perf/builtin_hardware.h"

namespace moe {

namespace {

// The x each curve is keyed by (hardware_profile.h lists them).
const char* expected_x(const std::string& key) {
  if (key == "gemm_dense_bf16" || key == "gemm_dense_fp8") return "d_model";
  if (key == "gemm_grouped_bf16" || key == "gemm_grouped_fp8") return "rows_per_expert";
  if (key == "attention") return "seq_len";
  if (key == "elementwise" || key == "fp8_quantize" || key == "optimizer") return "bytes";
  return "message_bytes";
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

double positive_number(const JsonField& f, double max) {
  const nlohmann::json& v = f.value();
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0 || v.get<double>() > max)
    f.fail("a number above 0 and at most " + number_text(max));
  return v.get<double>();
}

// A rate or fraction in [min, max]: one near 0 is as wrong as one past the peak (hardware_profile.h).
double number_in(const JsonField& f, double min, double max) {
  const nlohmann::json& v = f.value();
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < min || v.get<double>() > max)
    f.fail("a number from " + number_text(min) + " to " + number_text(max));
  return v.get<double>();
}

// A profile file is a few KiB of JSON.
constexpr std::uintmax_t kMaxProfileBytes = std::uintmax_t{1} << 20;

// The text of a profile file: a regular file only (a FIFO would block the read until something
// wrote to it, /dev/zero would fill the memory, a folder reads as empty and was reported as
// invalid JSON), and one of a profile's size.
std::string read_profile_file(const std::string& path) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::exists(st)) {  // a missing or unreadable file: read_whole_file names why
    MOE_CHECK(std::filesystem::is_regular_file(st), "hardware profile '", path, "' is ",
              std::filesystem::is_directory(st) ? "a folder" : "not a regular file",
              "; give a profile's .json file (hardware/*.json, or one moetrain bench --calibrate wrote)");
    const std::uintmax_t bytes = std::filesystem::file_size(path, ec);
    MOE_CHECK(ec || bytes <= kMaxProfileBytes, "hardware profile '", path, "' is ", bytes,
              " bytes; a profile is a few KiB of JSON (at most ", kMaxProfileBytes, " bytes are read)");
  }
  return read_whole_file(path, "hardware profile");
}

// Every member of `obj` must be one of `known` (a misspelt key is an error, not a default).
void only_known_keys(const JsonField& obj, const std::set<std::string>& known) {
  for (const auto& [key, field] : obj.members())
    if (!known.count(key)) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw Error(field.name() + " is not a known key; expected one of: " + list);
    }
}

EfficiencyCurve parse_curve(const JsonField& f, const std::string& key) {
  only_known_keys(f, {"x", "points", "source", "in_step"});
  EfficiencyCurve c;
  c.x = f["x"].as_string();
  if (c.x != expected_x(key)) f["x"].fail(std::string("\"") + expected_x(key) + "\" (what this curve is keyed by)");
  c.source = f.has("source") ? f["source"].as_string() : "";
  const std::vector<JsonField> points = f["points"].elements();
  if (points.empty()) f["points"].fail("a non-empty array of [x, efficiency] pairs");
  for (const JsonField& p : points) {
    const std::vector<JsonField> xy = p.elements();
    if (xy.size() != 2) p.fail("an [x, efficiency] pair");
    const double x = positive_number(xy[0], 1e18), e = number_in(xy[1], kMinEfficiency, max_efficiency(key));
    if (!c.points.empty() && x <= c.points.back().first) xy[0].fail("larger than the previous point's x (increasing x)");
    c.points.emplace_back(x, e);
  }
  if (f.has("in_step")) {
    const JsonField in_step = f["in_step"];
    only_known_keys(in_step, {"factor", "source"});
    c.in_step = number_in(in_step["factor"], kMinInStepFactor, kMaxInStepFactor);
    c.in_step_source = in_step.has("source") ? in_step["source"].as_string() : "";
    for (const auto& [x, e] : c.points)
      if (e * c.in_step > max_efficiency(key))
        in_step["factor"].fail("a factor that keeps every point at most " + number_text(max_efficiency(key)) +
                               " of the peak (the point at x = " + number_text(x) + " is " + number_text(e) + ")");
  }
  return c;
}

nlohmann::ordered_json curve_json(const EfficiencyCurve& c) {
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const auto& [x, e] : c.points) points.push_back({x, e});
  nlohmann::ordered_json j = {{"x", c.x}, {"points", points}, {"source", c.source}};
  if (c.in_step != 1 || !c.in_step_source.empty()) j["in_step"] = {{"factor", c.in_step}, {"source", c.in_step_source}};
  return j;
}

}  // namespace

double max_efficiency(const std::string& key) {
  const std::string x = expected_x(key);
  return x == "seq_len" || x == "message_bytes" ? 1.5 : 1.0;
}

double EfficiencyCurve::points_at(double x_value) const {
  MOE_CHECK(!points.empty(), "efficiency curve keyed by ", x, " has no points");
  if (x_value <= points.front().first) return points.front().second;
  if (x_value >= points.back().first) return points.back().second;
  const auto hi = std::upper_bound(points.begin(), points.end(), x_value,
                                   [](double v, const std::pair<double, double>& p) { return v < p.first; });
  const auto lo = hi - 1;
  const double t = std::log(x_value / lo->first) / std::log(hi->first / lo->first);
  return lo->second + t * (hi->second - lo->second);
}

void EfficiencyCurve::set_points(std::vector<std::pair<double, double>> measured, std::string how) {
  points = std::move(measured);
  source = std::move(how);
  in_step = 1;
  in_step_source.clear();
}

std::vector<std::pair<const char*, EfficiencyCurve*>> HardwareProfile::curves() {
  return {{"gemm_dense_bf16", &gemm_dense_bf16}, {"gemm_grouped_bf16", &gemm_grouped_bf16},
          {"gemm_dense_fp8", &gemm_dense_fp8},   {"gemm_grouped_fp8", &gemm_grouped_fp8},
          {"attention", &attention},             {"elementwise", &elementwise},
          {"fp8_quantize", &fp8_quantize},       {"optimizer", &optimizer},
          {"collective_intra", &collective_intra}, {"collective_inter", &collective_inter},
          {"dispatch_intra", &dispatch_intra}};
}

std::vector<std::pair<const char*, const EfficiencyCurve*>> HardwareProfile::curves() const {
  std::vector<std::pair<const char*, const EfficiencyCurve*>> out;
  for (const auto& [key, c] : const_cast<HardwareProfile*>(this)->curves()) out.emplace_back(key, c);
  return out;
}

HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin) {
  nlohmann::json doc;
  try {
    doc = parse_bounded_json(json_text, "hardware profile " + origin, nullptr, /*allow_exceptions=*/true,
                             /*unique_keys=*/true);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number past a double (1e400)
    throw Error("hardware profile " + origin + " is not valid JSON: " + e.what());
  }
  const JsonField top(doc, "hardware profile " + origin);
  HardwareProfile p;
  std::set<std::string> known = {"name",        "measured",         "source",          "peak_bf16_tflops",
                                 "peak_fp8_tflops", "memory_tb_s",  "memory_gib",      "runtime_reserve_gib",
                                 "gpus_per_node", "intra_node_gb_s", "inter_node_gb_s", "efficiency"};
  only_known_keys(top, known);
  p.name = top["name"].as_string();
  // Printed at the head of every prediction: a line break in it would forge the lines after it.
  if (p.name.empty() || std::any_of(p.name.begin(), p.name.end(),
                                    [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    top["name"].fail("a non-empty name on one line (no control characters)");
  if (!top["measured"].value().is_boolean()) top["measured"].fail("true or false");
  p.measured = top["measured"].value().get<bool>();
  p.source = top["source"].as_string();
  p.peak_bf16_tflops = number_in(top["peak_bf16_tflops"], 1e-3, 1e5);
  p.peak_fp8_tflops = number_in(top["peak_fp8_tflops"], 1e-3, 1e5);
  p.memory_tb_s = number_in(top["memory_tb_s"], 1e-3, 1e3);
  p.memory_gib = number_in(top["memory_gib"], 1e-6, 1e5);  // as plan --gpu-memory
  const JsonField reserve = top["runtime_reserve_gib"];
  if (!reserve.value().is_number() || reserve.value().get<double>() < 0 || reserve.value().get<double>() >= p.memory_gib)
    reserve.fail("a number of GiB from 0 to below memory_gib");
  p.runtime_reserve_gib = reserve.value().get<double>() + 0.0;  // -0 printed as "-0.00 GiB": made +0
  p.gpus_per_node = static_cast<int>(top["gpus_per_node"].as_int(1, 1024));
  p.intra_node_gb_s = number_in(top["intra_node_gb_s"], 1e-3, 1e5);
  p.inter_node_gb_s = number_in(top["inter_node_gb_s"], 1e-3, 1e5);
  const JsonField eff = top["efficiency"];
  std::set<std::string> curve_keys;
  for (const auto& [key, c] : p.curves()) curve_keys.insert(key);
  only_known_keys(eff, curve_keys);
  for (const auto& [key, c] : p.curves()) *c = parse_curve(eff[key], key);
  return p;
}

std::string hardware_profile_json(const HardwareProfile& p) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["measured"] = p.measured;
  j["source"] = p.source;
  j["peak_bf16_tflops"] = p.peak_bf16_tflops;
  j["peak_fp8_tflops"] = p.peak_fp8_tflops;
  j["memory_tb_s"] = p.memory_tb_s;
  j["memory_gib"] = p.memory_gib;
  j["runtime_reserve_gib"] = p.runtime_reserve_gib;
  j["gpus_per_node"] = p.gpus_per_node;
  j["intra_node_gb_s"] = p.intra_node_gb_s;
  j["inter_node_gb_s"] = p.inter_node_gb_s;
  nlohmann::ordered_json eff;
  for (const auto& [key, c] : p.curves()) eff[key] = curve_json(*c);
  j["efficiency"] = eff;
  return j.dump(2) + "\n";
}

std::string profile_kind(const HardwareProfile& p) {
  return p.measured ? "measured profile" : "datasheet profile, efficiencies not measured on this GPU";
}

std::vector<std::string> builtin_hardware_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : builtin::kHardwareProfiles) names.emplace_back(name);
  return names;
}

HardwareProfile load_hardware_profile(const std::string& name_or_file) {
  const bool is_file = name_or_file.find('/') != std::string::npos ||
                       (name_or_file.size() > 5 && name_or_file.substr(name_or_file.size() - 5) == ".json");
  if (is_file) return parse_hardware_profile(read_profile_file(name_or_file), name_or_file);
  for (const auto& [name, text] : builtin::kHardwareProfiles)
    if (name_or_file == name) return parse_hardware_profile(text, std::string("built-in '") + name + "'");
  std::string list;
  for (const std::string& n : builtin_hardware_names()) list += (list.empty() ? "" : ", ") + n;
  throw Error("unknown hardware '" + name_or_file + "': use one of the built-in profiles (" + list +
              ") or a profile file (a path ending in .json, e.g. written by moetrain bench --calibrate)");
}

void save_hardware_profile(const HardwareProfile& p, const std::string& path) {
  MOE_CHECK(!std::filesystem::exists(std::filesystem::symlink_status(path)), "hardware profile ", path,
            " exists; choose a new file name (nothing is overwritten)");
  write_new_file_atomic(path, hardware_profile_json(p), "hardware profile");
}

}  // namespace moe
