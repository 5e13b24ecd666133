#include "moe/core/gpu_power.h"

#include <chrono>
#include <cstdio>

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "moe/core/device.h"
#endif

namespace moe {

EnergyWindow energy_window(const std::vector<EnergyReading>& readings, EnergyReading stop) {
  EnergyWindow w;
  if (readings.empty()) return w;
  w.updates = static_cast<int64_t>(readings.size()) - 1;  // the first reading is the start's
  const EnergyReading& first = w.updates >= 2 ? readings[1] : readings.front();
  const EnergyReading& last = w.updates >= 2 ? readings.back() : stop;
  w.seconds = last.time_s - first.time_s;
  w.energy_j = last.energy_j - first.energy_j;
  if (w.updates >= 2) w.updates -= 1;  // updates strictly after the window's first
  return w;
}

PowerSummary summarize_power(const std::vector<ClockSample>& samples, const EnergyWindow& energy, double limit_w,
                             double max_sm_clock_mhz) {
  PowerSummary s;
  s.seconds = energy.seconds;
  s.energy_j = energy.energy_j;
  s.energy_updates = energy.updates;
  s.limit_w = limit_w;
  s.max_sm_clock_mhz = max_sm_clock_mhz;
  s.samples = static_cast<int64_t>(samples.size());
  double clock_sum = 0;
  for (const ClockSample& c : samples) {
    clock_sum += c.sm_clock_mhz;
    s.power_capped += (c.reasons & kClockReasonPowerCap) != 0 ? 1 : 0;
    s.thermal += (c.reasons & kClockReasonThermal) != 0 ? 1 : 0;
    s.hardware_slowdown += (c.reasons & kClockReasonHardwareSlowdown) != 0 ? 1 : 0;
  }
  s.mean_sm_clock_mhz = samples.empty() ? 0 : clock_sum / static_cast<double>(samples.size());
  return s;
}

std::string format_power(const PowerSummary& s, double step_s, double tokens_per_step, const std::string& gpu) {
  const double per_step = s.mean_power_w() * step_s;
  char line[640];
  std::snprintf(line, sizeof line,
                "  power (%s, NVML): %.1f J per step (%.0f tokens/J), %.0f W mean against a %.0f W limit; SM clock %.0f MHz mean of %.0f; held back by the "
                "power cap in %ld of %ld samples, thermal %ld, hardware slowdown %ld\n",
                gpu.c_str(), per_step, per_step > 0 ? tokens_per_step / per_step : 0.0, s.mean_power_w(), s.limit_w, s.mean_sm_clock_mhz, s.max_sm_clock_mhz,
                static_cast<long>(s.power_capped), static_cast<long>(s.samples), static_cast<long>(s.thermal),
                static_cast<long>(s.hardware_slowdown));
  return line;
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

#if defined(MOE_HAVE_CUDA)
namespace {

// NOTES: declared by hand. nvml.h ships with the driver's development package, not with the CUDA
// toolkit installed here, so the few calls used are declared from NVML's reference (all C, stable
// since NVML 5; the _v2 names are the current ones) and resolved with dlsym.
using NvmlReturn = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM

struct NvmlApi {
  bool loaded = false;
  std::string why;
  NvmlReturn (*init)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_pci_bus_id)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*total_energy)(NvmlDevice, unsigned long long*) = nullptr;  // mJ since the driver loaded
  NvmlReturn (*enforced_power_limit)(NvmlDevice, unsigned int*) = nullptr;  // mW
  NvmlReturn (*clock_info)(NvmlDevice, int, unsigned int*) = nullptr;      // MHz
  NvmlReturn (*max_clock_info)(NvmlDevice, int, unsigned int*) = nullptr;  // MHz
  NvmlReturn (*clock_reasons)(NvmlDevice, unsigned long long*) = nullptr;
};

template <typename Fn>
bool resolve(void* handle, const char* name, Fn* fn, NvmlApi* api) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) api->why = std::string("libnvidia-ml has no ") + name;
  return *fn != nullptr;
}

NvmlApi load_nvml() {
  NvmlApi api;
  void* handle = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    api.why = std::string("NVML (libnvidia-ml.so.1, installed with the NVIDIA driver) not found: ") +
              (e ? e : "dlopen failed");
    return api;
  }
  // nvmlDeviceGetCurrentClocksEventReasons replaced ...ThrottleReasons (same signature) in CUDA 12.2's NVML.
  const bool all = resolve(handle, "nvmlInit_v2", &api.init, &api) &&
                   resolve(handle, "nvmlErrorString", &api.error_string, &api) &&
                   resolve(handle, "nvmlDeviceGetHandleByPciBusId_v2", &api.handle_by_pci_bus_id, &api) &&
                   resolve(handle, "nvmlDeviceGetTotalEnergyConsumption", &api.total_energy, &api) &&
                   resolve(handle, "nvmlDeviceGetEnforcedPowerLimit", &api.enforced_power_limit, &api) &&
                   resolve(handle, "nvmlDeviceGetClockInfo", &api.clock_info, &api) &&
                   resolve(handle, "nvmlDeviceGetMaxClockInfo", &api.max_clock_info, &api) &&
                   (resolve(handle, "nvmlDeviceGetCurrentClocksEventReasons", &api.clock_reasons, &api) ||
                    resolve(handle, "nvmlDeviceGetCurrentClocksThrottleReasons", &api.clock_reasons, &api));
  if (!all) return api;
  if (const NvmlReturn rc = api.init(); rc != kNvmlSuccess) {
    api.why = std::string("nvmlInit failed: ") + api.error_string(rc);
    return api;
  }
  api.loaded = true;  // never shut down or unloaded: one handle for the process
  return api;
}

const NvmlApi& nvml() {
  static const NvmlApi api = load_nvml();
  return api;
}

void check_nvml(NvmlReturn rc, const char* call) {
  MOE_CHECK(rc == kNvmlSuccess, "PowerMonitor: ", call, " failed: ", nvml().error_string(rc));
}

}  // namespace
#endif

PowerMonitor::PowerMonitor(double interval_s) : interval_s_(interval_s) {
#if defined(MOE_HAVE_CUDA)
  if (!cuda_available(&why_)) return;
  const NvmlApi& api = nvml();
  if (!api.loaded) {
    why_ = api.why;
    return;
  }
  int device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    why_ = "the current CUDA device's PCI bus id could not be read";
    return;
  }
  NvmlDevice handle = nullptr;
  unsigned int limit_mw = 0, max_mhz = 0;
  if (const NvmlReturn rc = api.handle_by_pci_bus_id(bus_id, &handle); rc != kNvmlSuccess) {
    why_ = std::string("NVML does not know the GPU at ") + bus_id + ": " + api.error_string(rc);
    return;
  }
  unsigned long long energy = 0, reasons = 0;
  unsigned int clock = 0;
  // Every reading the window needs, tried once here: a GPU that lacks one is reported, not half-measured.
  for (const auto& [rc, call] : {std::pair{api.enforced_power_limit(handle, &limit_mw), "nvmlDeviceGetEnforcedPowerLimit"},
                                 std::pair{api.max_clock_info(handle, kNvmlClockSm, &max_mhz), "nvmlDeviceGetMaxClockInfo"},
                                 std::pair{api.total_energy(handle, &energy), "nvmlDeviceGetTotalEnergyConsumption"},
                                 std::pair{api.clock_info(handle, kNvmlClockSm, &clock), "nvmlDeviceGetClockInfo"},
                                 std::pair{api.clock_reasons(handle, &reasons), "nvmlDeviceGetCurrentClocksEventReasons"}}) {
    if (rc != kNvmlSuccess) {
      why_ = std::string(call) + " is not supported on the GPU at " + bus_id + ": " + api.error_string(rc);
      return;
    }
  }
  device_ = handle;
  limit_w_ = limit_mw / 1000.0;
  max_sm_clock_mhz_ = max_mhz;
  available_ = true;
#else
  why_ = "this binary was built without the CUDA backend";
#endif
}

PowerMonitor::~PowerMonitor() {
  if (!running_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  sampler_.join();
}

void PowerMonitor::start() {
  MOE_CHECK(available_, "PowerMonitor::start: GPU power readings are not available: ", why_);
  MOE_CHECK(!running_, "PowerMonitor::start: already running");
  samples_.clear();
  energy_.clear();
  energy_.push_back(read_energy());
  stop_ = false;
  running_ = true;
  sampler_ = std::thread([this] { sample_loop(); });
}

void PowerMonitor::stop() {
  if (!running_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  sampler_.join();
  running_ = false;
  summary_ = summarize_power(samples_, energy_window(energy_, read_energy()), limit_w_, max_sm_clock_mhz_);
}

EnergyReading PowerMonitor::read_energy() const {
  EnergyReading r;
  r.time_s = now_s();
#if defined(MOE_HAVE_CUDA)
  unsigned long long mj = 0;
  check_nvml(nvml().total_energy(static_cast<NvmlDevice>(device_), &mj), "nvmlDeviceGetTotalEnergyConsumption");
  r.energy_j = static_cast<double>(mj) / 1000.0;
#endif
  return r;
}

void PowerMonitor::sample_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
#if defined(MOE_HAVE_CUDA)
    const NvmlDevice device = static_cast<NvmlDevice>(device_);
    unsigned int clock = 0;
    unsigned long long reasons = 0, mj = 0;
    // A reading that fails mid-run (rare: each was tried at construction) is skipped, not guessed.
    if (nvml().clock_info(device, kNvmlClockSm, &clock) == kNvmlSuccess &&
        nvml().clock_reasons(device, &reasons) == kNvmlSuccess)
      samples_.push_back({static_cast<double>(clock), static_cast<uint64_t>(reasons)});
    const double before = now_s();
    const bool read = nvml().total_energy(device, &mj) == kNvmlSuccess;
    const double t = 0.5 * (before + now_s());  // the reading's time: the middle of the call
    if (read && static_cast<double>(mj) / 1000.0 > energy_.back().energy_j) energy_.push_back({t, mj / 1000.0});
#endif
    wake_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; });
  }
}

}  // namespace moe
