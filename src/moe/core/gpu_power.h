// PowerMonitor: the GPU's energy, power limit and SM clock over a window of steps, so `moetrain
// bench` can say whether a run was held back by the board's power limit. On the H200 both BF16
// and FP8 steps run at the software power cap (bench/RESULTS.md, 2026-12-04): a step's time is
// then set by its energy, not by the sum of its kernels' unthrottled times, and the kernel table
// alone does not explain the throughput. This puts the energy per step beside it.
//
// Readings come from NVML (the driver's management library), loaded at run time with dlopen, so
// the binary needs no NVML to link or to run: where it is missing, available() is false and why()
// says what was tried. A thread of its own polls every `interval`: the SM clock, the reasons it is
// held below its maximum, and the cumulative energy counter. NVML's power reading (what nvidia-smi
// shows) is not used: it is averaged by the driver over about a second and lags the steps (on the
// H200 its mean over a 1.7 s window read 540-590 W where the energy counter gave 687-705 W).
//
// NOTES: the energy counter advances in steps (on the H200 the window's mean power from a plain
// start/stop difference moved by +-4% between equal runs of 1.4 s), so the window's energy and
// time are taken between the first and the last moment the counter was seen to advance
// (energy_window): the energy between two updates is exact, and their times are known to within
// one poll (on the H200 it advanced every ~100 ms: 17 updates in 1.7 s).
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

// The energy counter as polled: the first reading at or after each update.
struct EnergyReading {
  double time_s = 0;
  double energy_j = 0;
};

struct EnergyWindow {
  double seconds = 0, energy_j = 0;
  int64_t updates = 0;  // counter updates inside the window
};

// Energy and time between the first and last polled readings where the counter had just advanced
// (`readings` in time order, the first being the window's start). With fewer than two updates,
// the whole span from the first reading to `stop` (time, energy).
EnergyWindow energy_window(const std::vector<EnergyReading>& readings, EnergyReading stop);

struct PowerSummary {
  double seconds = 0;          // the energy window's time (energy_window)
  double energy_j = 0;         // GPU energy over it (NVML's counter)
  int64_t energy_updates = 0;  // counter updates it spans
  double limit_w = 0;          // the enforced power limit
  double max_sm_clock_mhz = 0;
  double mean_sm_clock_mhz = 0;  // over the samples
  int64_t samples = 0;
  int64_t power_capped = 0;     // samples whose clock the power cap held back
  int64_t thermal = 0;          // samples with a thermal slowdown
  int64_t hardware_slowdown = 0;
  double mean_power_w() const { return seconds > 0 ? energy_j / seconds : 0; }
};

PowerSummary summarize_power(const std::vector<ClockSample>& samples, const EnergyWindow& energy, double limit_w,
                             double max_sm_clock_mhz);

// One line for `bench`: energy per step (the mean power times the mean step time) and per token,
// the mean power against the limit, the SM clock against its maximum, and how many samples each
// slowdown reason held back. `gpu` names whose GPU it is ("the GPU", "rank 0's GPU").
std::string format_power(const PowerSummary& s, double step_s, double tokens_per_step, const std::string& gpu);

class PowerMonitor {
 public:
  // Loads NVML and finds the current CUDA device; does not start sampling.
  explicit PowerMonitor(double interval_s = 0.005);
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
  EnergyReading read_energy() const;  // the counter now (zero energy without the CUDA backend)

  double interval_s_;
  bool available_ = false;
  bool running_ = false;
  std::string why_;
  void* device_ = nullptr;  // nvmlDevice_t
  double limit_w_ = 0, max_sm_clock_mhz_ = 0;
  std::thread sampler_;
  std::mutex mutex_;  // guards samples_ and stop_
  std::condition_variable wake_;  // stop() wakes the sampler at once
  bool stop_ = false;
  std::vector<ClockSample> samples_;
  std::vector<EnergyReading> energy_;  // the start's reading, then one per counter update
  PowerSummary summary_;
};

}  // namespace moe
