// PowerMonitor: the GPU's energy, power limit and SM clock over a window of steps, so `moetrain
// bench` can say whether a run was held back by the board's power limit. On the H200 both BF16
// and FP8 steps run at the power limit (bench/RESULTS.md, 2026-12-04): a step's time is then set
// by its energy, not by the sum of its kernels' unthrottled times, and the kernel table alone does
// not explain the throughput. This puts the energy per step beside it (core/power_summary.h).
//
// Readings come from NVML (the driver's management library), loaded at run time with dlopen, so
// the binary needs no NVML to link or to run: where it is missing, available() is false and why()
// says what was tried. A thread of its own polls every `interval`: the SM clock, the reasons it is
// held below its maximum, and the cumulative energy counter. NVML's power reading (what nvidia-smi
// shows) is not used: the driver averages it over about a second, so it lags the steps (on the
// H200 its mean over 1.7 s windows read 540-590 W where the energy counter gave 687-705 W).
// A failed NVML call during a window never ends the run: the summary says what is missing.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "moe/core/power_summary.h"

namespace moe {

class PowerMonitor {
 public:
  // Loads NVML; the GPU is the one current when start() is called (a rank picks its GPU later).
  explicit PowerMonitor(double interval_s = 0.005);
  ~PowerMonitor();  // stops sampling if started
  PowerMonitor(const PowerMonitor&) = delete;
  PowerMonitor& operator=(const PowerMonitor&) = delete;

  bool available() const { return available_; }
  // Why available() is false (no CUDA backend in this build, no GPU, NVML not found), or why the
  // last start() failed (NVML does not know or cannot read the current GPU).
  const std::string& why() const { return why_; }
  bool running() const { return running_; }

  // Finds the current CUDA device, reads its limit and energy counter and starts sampling;
  // false (why() says why) when a reading fails. Throws moe::Error when already running.
  bool start();
  // Stops sampling and summarizes the window; the caller waits for the GPU first, so the window
  // holds its work. Never throws. Does nothing when not running.
  void stop();
  // The last window's summary (empty before the first stop).
  PowerSummary summary() const { return summary_; }

 private:
  void sample_loop();

  double interval_s_;
  bool available_ = false;
  bool running_ = false;
  std::string why_;
  void* device_ = nullptr;  // nvmlDevice_t of the window's GPU
  std::string bus_id_;  // the window's GPU, as CUDA names it
  double limit_w_ = 0, max_sm_clock_mhz_ = 0;
  std::thread sampler_;
  std::mutex mutex_;              // guards stop_, clocks_, energy_ and read_error_ against the sampler
  std::condition_variable wake_;  // stop() wakes the sampler at once
  bool stop_ = false;
  ClockTally clocks_;
  std::vector<EnergyReading> energy_;  // the start's reading, then one per counter update (~10 a second)
  std::string read_error_;             // the first NVML call that failed during the window
  PowerSummary summary_;
};

}  // namespace moe
