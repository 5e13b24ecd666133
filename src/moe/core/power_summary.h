// What `moetrain bench` reports about the GPU's power over its timed steps, and the arithmetic
// behind it, apart from the NVML sampling itself (core/gpu_power.h): the clock samples' tally,
// the energy between the counter's updates, and the printed line.
//
// NOTES: the energy counter advances in steps (on the H200 every ~100 ms: a plain start/stop
// difference gave a window's mean power +-4% apart between equal runs of 1.4 s), so the energy
// and time are taken between the first and the last moment the counter was seen to advance
// (energy_window): the energy between two updates is exact, and their times are known to within
// one poll. With fewer than two updates in the window there is no reading.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe {

// NVML's clock-event reasons (nvmlClocksEventReason*, bit values from nvml.h).
constexpr uint64_t kClockReasonPowerCap = 0x4;                 // software power cap (the board's limit)
constexpr uint64_t kClockReasonThermal = 0x20 | 0x40;          // software and hardware thermal slowdown
constexpr uint64_t kClockReasonHardwareSlowdown = 0x8 | 0x80;  // hardware slowdown, power brake

struct ClockSample {
  double sm_clock_mhz = 0;
  uint64_t reasons = 0;  // nvmlClocksEventReason* bits
};

// The clock samples of a window, counted as they come (a window may last hours).
struct ClockTally {
  int64_t samples = 0, power_capped = 0, thermal = 0, hardware_slowdown = 0;
  double clock_sum_mhz = 0;
  void add(const ClockSample& s);
};

// The energy counter as polled: the first reading at or after each update.
struct EnergyReading {
  double time_s = 0;
  double energy_j = 0;
};

struct EnergyWindow {
  bool measured = false;  // at least two counter updates fell inside the window
  double seconds = 0, energy_j = 0;
  int64_t updates = 0;  // counter updates seen after the window's start
};

// Energy and time between the first and last readings at which the counter had just advanced
// (`readings` in time order, the first being the window's start reading).
EnergyWindow energy_window(const std::vector<EnergyReading>& readings);

struct PowerSummary {
  std::string host;              // the machine (host name) and
  std::string gpu;               // the GPU's PCI bus id there: ranks sharing a GPU give the same pair
  bool energy_measured = false;  // energy_window found two updates; otherwise the energy fields are 0
  double seconds = 0;            // the energy window's time
  double energy_j = 0;           // GPU energy over it (NVML's counter)
  int64_t energy_updates = 0;
  double limit_w = 0;  // the enforced power limit
  double max_sm_clock_mhz = 0;
  double mean_sm_clock_mhz = 0;  // over the samples
  int64_t samples = 0;
  int64_t power_capped = 0;  // samples whose clock the power cap held back
  int64_t thermal = 0;       // samples with a thermal slowdown
  int64_t hardware_slowdown = 0;
  std::string note;  // why a reading is missing (a failed NVML call), "" when none is
  double mean_power_w() const { return energy_measured && seconds > 0 ? energy_j / seconds : 0; }
  // A step's energy: the mean power times the mean step time (the window and the timed steps
  // differ by up to one counter update at each end).
  double energy_per_step_j(double step_s) const { return mean_power_w() * step_s; }
};

PowerSummary summarize_power(const ClockTally& clocks, const EnergyWindow& energy, double limit_w,
                             double max_sm_clock_mhz);

// One line for `bench`: energy per step (the mean power times the mean step time) and per token,
// the mean power against the limit, the SM clock against its maximum, and how many samples each
// slowdown reason held back. `gpu` names whose GPU it is ("the GPU", "the GPU of all 2 ranks").
std::string format_power(const PowerSummary& s, double step_s, double tokens_per_step, const std::string& gpu);

// One window over a job's GPUs: each GPU (host and bus id: identical servers repeat bus ids) once,
// however many ranks share it, so the job's energy
// per step is the sum over its GPUs and its tokens per joule are the job's tokens over that sum.
struct RankPower {
  bool measured = false;  // the rank's monitor ran (summary holds its window)
  PowerSummary summary;
  std::string why;  // why it did not
};
struct JobPower {
  std::vector<PowerSummary> gpus;  // distinct GPUs, in the order of the first rank on each
  int ranks = 0;
  std::vector<std::string> unmeasured;  // "rank R: why" for each rank without a window
  // Summed over the GPUs; only when every rank's monitor ran and every GPU's counter gave a window.
  bool energy_measured() const;
  double energy_per_step_j(double step_s) const;
  double mean_power_per_gpu_w() const;
};
JobPower combine_power(const std::vector<RankPower>& per_rank);

// `bench`'s line for a job: format_power's for a job on one GPU (naming the ranks sharing it);
// for several, the energy summed over them with the power, clock and slowdown counts per GPU.
// tokens_per_step: the whole job's.
std::string format_job_power(const JobPower& job, double step_s, double tokens_per_step);

}  // namespace moe
