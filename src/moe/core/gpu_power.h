// PowerMonitor: the GPU's energy, power limit and SM clock over a window of steps, so `moetrain
// bench` can say whether a run was held back by the board's power limit. On the H200 both BF16
// and FP8 steps run at the software power cap (bench/RESULTS.md, 2026-12-04): a step's time is
// then set by its energy, not by the sum of its kernels' unthrottled times, and the kernel table
// alone does not explain the throughput. This puts the energy per step beside it.
//
// Readings come from NVML (the driver's management library), loaded at run time with dlopen, so
// the binary needs no NVML to link or to run: where it is missing, available() is false and why()
// says what was tried. The energy is NVML's cumulative counter (exact over the window); the clock
// and the reasons it is held below its maximum are sampled every `interval` on a thread of their own.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moe {

// NVML's clock-event reasons (nvmlClocksEventReason*, bit values from nvml.h).
constexpr uint64_t kClockReasonPowerCap = 0x4;                   // software power cap (the board's limit)
constexpr uint64_t kClockReasonThermal = 0x20 | 0x40;            // software and hardware thermal slowdown
constexpr uint64_t kClockReasonHardwareSlowdown = 0x8 | 0x80;    // hardware slowdown, power brake

struct ClockSample {
  double sm_clock_mhz = 0;
  uint64_t reasons = 0;  // nvmlClocksEventReason* bits
};

struct PowerSummary {
  double seconds = 0;          // the window's wall time
  double energy_j = 0;         // GPU energy over the window (NVML's counter)
  double limit_w = 0;          // the enforced power limit
  double max_sm_clock_mhz = 0;
  double mean_sm_clock_mhz = 0;  // over the samples
  int64_t samples = 0;
  int64_t power_capped = 0;     // samples whose clock the power cap held back
  int64_t thermal = 0;          // samples with a thermal slowdown
  int64_t hardware_slowdown = 0;
  double mean_power_w() const { return seconds > 0 ? energy_j / seconds : 0; }
};

PowerSummary summarize_power(const std::vector<ClockSample>& samples, double seconds, double energy_j,
                             double limit_w, double max_sm_clock_mhz);

// One line for `bench`: energy per step and per token, mean power against the limit, the SM
// clock against its maximum, and how many samples each slowdown reason held back. `gpu` names
// whose GPU it is ("the GPU", "rank 0's GPU").
std::string format_power(const PowerSummary& s, int64_t steps, double tokens_per_step, const std::string& gpu);

class PowerMonitor {
 public:
  // Loads NVML and finds the current CUDA device; does not start sampling.
  explicit PowerMonitor(double interval_s = 0.02);
  ~PowerMonitor();  // stops sampling if started
  PowerMonitor(const PowerMonitor&) = delete;
  PowerMonitor& operator=(const PowerMonitor&) = delete;

  bool available() const { return available_; }
  // Why available() is false: no CUDA backend in this build, no GPU, or NVML not found.
  const std::string& why() const { return why_; }
  bool running() const { return running_; }

  // Reads the energy counter and starts sampling. Fails with moe::Error when not available or running.
  void start();
  // Stops sampling and reads the energy counter again; the caller waits for the GPU first, so the
  // window holds its work. Does nothing when not running.
  void stop();
  // The last window's summary (empty before the first stop).
  PowerSummary summary() const { return summary_; }

 private:
  void sample_loop();

  double interval_s_;
  bool available_ = false;
  bool running_ = false;
  std::string why_;
  void* device_ = nullptr;  // nvmlDevice_t
  double limit_w_ = 0, max_sm_clock_mhz_ = 0;
  uint64_t energy_start_mj_ = 0;
  double start_s_ = 0;
  std::thread sampler_;
  std::mutex mutex_;  // guards samples_ and stop_
  std::condition_variable wake_;  // stop() wakes the sampler at once
  bool stop_ = false;
  std::vector<ClockSample> samples_;
  PowerSummary summary_;
};

}  // namespace moe
