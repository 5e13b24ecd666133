#include "moe/core/gpu_power.h"

#include <chrono>
#include <cstdio>
#include <system_error>

#include "moe/core/error.h"
#include "moe/core/host_name.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include "moe/core/device.h"
#endif

namespace moe {

namespace {

[[maybe_unused]] double now_s() {
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
  else api->why.clear();  // a fallback name found after a missing one
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
  if (!all) {
    dlclose(handle);
    return api;
  }
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

// "" when rc is success, else "<call> failed: <NVML's text>".
std::string nvml_failure(NvmlReturn rc, const char* call) {
  return rc == kNvmlSuccess ? "" : std::string(call) + " failed: " + nvml().error_string(rc);
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
  available_ = true;
#else
  why_ = "this binary was built without the CUDA backend";
#endif
}

PowerMonitor::~PowerMonitor() { stop(); }

bool PowerMonitor::start() {
  MOE_CHECK(!running_, "PowerMonitor::start: already running");
  if (!available_) return false;
#if defined(MOE_HAVE_CUDA)
  const NvmlApi& api = nvml();
  int device = 0;
  char bus_id[32] = {};
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) != cudaSuccess) {
    why_ = "the current CUDA device's PCI bus id could not be read";
    return false;
  }
  NvmlDevice handle = nullptr;
  if (const NvmlReturn rc = api.handle_by_pci_bus_id(bus_id, &handle); rc != kNvmlSuccess) {
    why_ = std::string("NVML does not know the GPU at ") + bus_id + ": " + api.error_string(rc);
    return false;
  }
  unsigned int limit_mw = 0, max_mhz = 0;
  unsigned long long mj = 0;
  // The readings the window needs before it starts: a GPU that lacks one is reported, not half-measured.
  for (const std::string& failure :
       {nvml_failure(api.enforced_power_limit(handle, &limit_mw), "nvmlDeviceGetEnforcedPowerLimit"),
        nvml_failure(api.max_clock_info(handle, kNvmlClockSm, &max_mhz), "nvmlDeviceGetMaxClockInfo"),
        nvml_failure(api.total_energy(handle, &mj), "nvmlDeviceGetTotalEnergyConsumption")}) {
    if (!failure.empty()) {
      why_ = failure + " (the GPU at " + bus_id + ")";
      return false;
    }
  }
  device_ = handle;
  bus_id_ = bus_id;
  limit_w_ = limit_mw / 1000.0;
  max_sm_clock_mhz_ = max_mhz;
  clocks_ = ClockTally{};
  energy_.assign(1, EnergyReading{now_s(), static_cast<double>(mj) / 1000.0});
  read_error_.clear();
  stop_ = false;
  try {
    sampler_ = std::thread([this] { sample_loop(); });
  } catch (const std::system_error& e) {
    why_ = std::string("no thread for the power samples: ") + e.what();
    return false;
  }
  running_ = true;
  return true;
#else
  return false;
#endif
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
  summary_ = summarize_power(clocks_, energy_window(energy_), limit_w_, max_sm_clock_mhz_);
  summary_.note = read_error_;
  summary_.gpu = bus_id_;
  summary_.host = host_name();
}

void PowerMonitor::sample_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
#if defined(MOE_HAVE_CUDA)
    const NvmlApi& api = nvml();
    const NvmlDevice device = static_cast<NvmlDevice>(device_);
    unsigned int clock = 0;
    unsigned long long reasons = 0, mj = 0;
    // A reading that fails mid-window is skipped (and named in the summary), never guessed.
    std::string failure = nvml_failure(api.clock_info(device, kNvmlClockSm, &clock), "nvmlDeviceGetClockInfo");
    if (failure.empty())
      failure = nvml_failure(api.clock_reasons(device, &reasons), "nvmlDeviceGetCurrentClocksEventReasons");
    if (failure.empty()) clocks_.add({static_cast<double>(clock), static_cast<uint64_t>(reasons)});
    const double before = now_s();
    const std::string energy_failure =
        nvml_failure(api.total_energy(device, &mj), "nvmlDeviceGetTotalEnergyConsumption");
    const double t = 0.5 * (before + now_s());  // the reading's time: the middle of the call
    if (energy_failure.empty() && static_cast<double>(mj) / 1000.0 > energy_.back().energy_j)
      energy_.push_back({t, static_cast<double>(mj) / 1000.0});
    if (read_error_.empty()) read_error_ = !failure.empty() ? failure : energy_failure;
#endif
    wake_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stop_; });
  }
}

}  // namespace moe
