// A GPU's hardware profile for the performance model (step_model.h): its peak rates, memory and
// link bandwidths (datasheet numbers), and the efficiencies moetrain's own kernels and collectives
// reach on it, as fractions of those peaks (measured by `moetrain bench --calibrate`, or carried
// over from a measured GPU and marked so). Profiles are JSON files (hardware/*.json, compiled into
// the binary under their names: h200, h100, b200, b300).
//
// An efficiency is a curve: points (x, fraction) measured at a few sizes, interpolated linearly in
// log x between them and held constant beyond the first and last. Each curve names its x, so a
// file written for another model version is refused rather than misread:
//   gemm_dense_bf16, gemm_dense_fp8      x = d_model (token-major products of d_model-wide rows)
//   gemm_grouped_bf16, gemm_grouped_fp8  x = rows_per_expert (forward, data and weight gradient)
//   attention                            x = seq_len (fraction of peak at the full-square FLOP count)
//   elementwise, fp8_quantize, optimizer x = bytes (fraction of the memory bandwidth)
//   collective_intra, collective_inter   x = message_bytes (bus bandwidth over the link bandwidth)
//   dispatch_intra                       x = message_bytes (rowwise dispatch/combine: bytes that cross
//                                        to other GPUs over the time, per rank, over the link bandwidth)
// A curve may also carry an in-step factor that its points are multiplied by: kernels timed alone
// run faster than inside a training step, so `bench --calibrate` keeps what it measured alone as
// the points and fits the factor to a whole step (step_fit.h); 1 where the points themselves come
// from whole steps (JSON: "in_step": {"factor": f, "source": "..."}, left out when f is 1).
//
// Every rate is bounded below as well as above (a file's key out of range is an error naming it):
// a rate near 0 would predict a step of 1e300 s or infinity, printed as "inf s, 0 tokens/s"
// instead of an error. The floors are far below any real GPU: 1 GFLOP/s, 1 GB/s of memory,
// 1 MB/s of link, an efficiency of 1e-6 and an in-step factor of 1e-3.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace moe {

// The bounds a profile file's efficiencies must keep (the parser's, and `bench --calibrate`'s fit
// checks against the same ones, so it never writes a profile the parser refuses).
constexpr double kMinEfficiency = 1e-6;  // a point's fraction of the peak
constexpr double kMinInStepFactor = 1e-3, kMaxInStepFactor = 2;
// The largest fraction of the peak the curve `key` may reach, alone or inside a step (points x
// in_step): 1 for products and memory-bound kernels; 1.5 for attention (its full-square FLOP count
// is about twice what a causal kernel does) and the link curves (bytes over a nominal link rate).
double max_efficiency(const std::string& key);

struct EfficiencyCurve {
  std::string x;                                   // what x is (the list above)
  std::vector<std::pair<double, double>> points;   // (x, fraction of the peak), x increasing
  std::string source;                              // how the points were obtained
  double in_step = 1;                              // the factor inside a training step
  std::string in_step_source;                      // how it was obtained ("" when 1)
  // The fraction of the peak inside a step: the points at x_value, times in_step.
  double at(double x_value) const { return points_at(x_value) * in_step; }
  // The points alone, interpolated in log x.
  double points_at(double x_value) const;
  // New points (measured now): the factor fitted to other points no longer applies.
  void set_points(std::vector<std::pair<double, double>> measured, std::string how);
};

struct HardwareProfile {
  std::string name;
  bool measured = false;       // efficiencies measured on this GPU (false: carried over from another)
  std::string source;          // datasheet and measurement references
  double peak_bf16_tflops = 0;  // dense, per GPU
  double peak_fp8_tflops = 0;
  double memory_tb_s = 0;       // HBM bandwidth
  double memory_gib = 0;        // device memory a run can use (free at start)
  double runtime_reserve_gib = 0;  // device memory in use beyond the arenas' plan (CUDA context, cuBLASLt/cuDNN
                                   // workspaces, NCCL): high-water = plan + this
  int gpus_per_node = 8;
  double intra_node_gb_s = 0;  // per GPU and direction (NVLink)
  double inter_node_gb_s = 0;  // per GPU and direction (its network adapter)
  EfficiencyCurve gemm_dense_bf16, gemm_grouped_bf16, gemm_dense_fp8, gemm_grouped_fp8, attention, elementwise,
      fp8_quantize, optimizer, collective_intra, collective_inter, dispatch_intra;

  // The curves with their JSON keys, in file order.
  std::vector<std::pair<const char*, EfficiencyCurve*>> curves();
  std::vector<std::pair<const char*, const EfficiencyCurve*>> curves() const;
};

// Parses a profile; `origin` (a file name) is named in every error, with the key and what is wrong
// (a key given twice in one object is refused, not the last one taken).
HardwareProfile parse_hardware_profile(const std::string& json_text, const std::string& origin);
std::string hardware_profile_json(const HardwareProfile& p);
// A built-in profile by name (h200, h100, b200, b300), or a JSON file (a path: contains '/' or ends
// in .json). Throws naming the built-in names for an unknown one; a file must be a regular file of
// at most 1 MiB (a FIFO or a device such as /dev/zero would block or never end).
HardwareProfile load_hardware_profile(const std::string& name_or_file);
// Writes `p` to `path` (temp name, then rename); refuses an existing file.
void save_hardware_profile(const HardwareProfile& p, const std::string& path);
std::vector<std::string> builtin_hardware_names();
// "measured profile" or "datasheet profile, efficiencies not measured on this GPU": printed beside a
// prediction, to say how far its numbers are measured.
std::string profile_kind(const HardwareProfile& p);

}  // namespace moe
