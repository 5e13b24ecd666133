#include "moe/core/kernel_profiler.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <sstream>
#include <string_view>
#include <vector>

#include "moe/core/error.h"

#if defined(MOE_HAVE_CUDA)
#include <cuda_runtime.h>
#include <cupti_activity.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <dlfcn.h>

#include "moe/core/device.h"
#endif

namespace moe {

#if defined(MOE_HAVE_CUDA)
namespace {

// NOTES: record layouts. CUPTI fills each activity record in the struct version of the library
// that runs (CUDA 13: CUpti_ActivityKernel10, CUpti_ActivityMemcpy6, CUpti_ActivityMemset4), and
// we read them through the structs of the header we compile against. We read only kind, start,
// end, name (kernels) and copyKind (copies); their offsets have not moved since
// CUpti_ActivityKernel4 / CUpti_ActivityMemcpy5 (name at byte 104), because new versions add
// fields at the end. A library older than this header's CUDA major is refused below: it would
// not match the CUDA 13 runtime anyway.
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
using MemsetRecord = CUpti_ActivityMemset4;

constexpr uint32_t kCuptiMajor = CUPTI_API_VERSION / 10000;  // 13 for 130001 ("xxyyzz" since CUDA 13)
constexpr int kCudartMajor = CUDART_VERSION / 1000;
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kRecordAlign = ACTIVITY_RECORD_ALIGNMENT;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

// The CUPTI functions this file calls, resolved with dlsym. Their types come from the headers, so
// a signature change there breaks the build instead of the call.
struct CuptiApi {
  bool loaded = false;
  std::string why;   // when not loaded
  std::string path;  // the library file loaded
  decltype(&cuptiActivityEnable) activity_enable = nullptr;
  decltype(&cuptiActivityDisable) activity_disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) activity_register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) activity_flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) activity_get_next_record = nullptr;
  decltype(&cuptiGetResultString) get_result_string = nullptr;
  decltype(&cuptiGetVersion) get_version = nullptr;
};

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlopen error";
}

// The folder holding the libcudart this process already uses ("" when none is loaded): the CUDA
// toolkit installs libcupti beside it.
std::string cudart_folder() {
  const std::string soname = "libcudart.so." + std::to_string(kCudartMajor);
  void* handle = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (handle == nullptr) return "";
  std::string folder;
  Dl_info info{};
  void* symbol = dlsym(handle, "cudaGetDeviceCount");
  if (symbol != nullptr && dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
    folder = info.dli_fname;
    const size_t slash = folder.rfind('/');
    folder = slash == std::string::npos ? "" : folder.substr(0, slash);
  }
  dlclose(handle);
  return folder;
}

template <typename Fn>
bool resolve(void* handle, const char* name, Fn* fn, CuptiApi* api) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) api->why = "libcupti at " + api->path + " has no " + name + ": " + dl_error();
  return *fn != nullptr;
}

CuptiApi load_cupti() {
  CuptiApi api;
  const std::string soname = "libcupti.so." + std::to_string(kCuptiMajor);
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("MOE_CUPTI_DIR"); dir != nullptr && *dir != '\0') {
    candidates.push_back(std::string(dir) + "/" + soname);
    candidates.push_back(std::string(dir) + "/libcupti.so");
  }
  candidates.push_back(soname);
  candidates.push_back("libcupti.so");
  if (const std::string folder = cudart_folder(); !folder.empty()) candidates.push_back(folder + "/" + soname);

  void* handle = nullptr;
  std::string tried;
  for (const std::string& candidate : candidates) {
    handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      api.path = candidate;
      break;
    }
    tried += "; " + dl_error();
  }
  if (handle == nullptr) {
    api.why = "CUPTI (" + soname + ") not found; set MOE_CUPTI_DIR to the folder that holds it (tried" +
              tried.substr(1) + ")";
    return api;
  }
  // Never dlclose a library CUPTI may have hooked into the driver; one handle for the process.
  const bool all = resolve(handle, "cuptiActivityEnable", &api.activity_enable, &api) &&
                   resolve(handle, "cuptiActivityDisable", &api.activity_disable, &api) &&
                   resolve(handle, "cuptiActivityRegisterCallbacks", &api.activity_register_callbacks, &api) &&
                   resolve(handle, "cuptiActivityFlushAll", &api.activity_flush_all, &api) &&
                   resolve(handle, "cuptiActivityGetNextRecord", &api.activity_get_next_record, &api) &&
                   resolve(handle, "cuptiGetResultString", &api.get_result_string, &api) &&
                   resolve(handle, "cuptiGetVersion", &api.get_version, &api);
  if (!all) return api;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(api.activity_enable), &info) != 0 && info.dli_fname != nullptr)
    api.path = info.dli_fname;  // the file actually loaded, for messages
  uint32_t version = 0;
  if (api.get_version(&version) != CUPTI_SUCCESS || version < kCuptiMajor * 10000) {
    api.why = "libcupti at " + api.path + " reports API version " + std::to_string(version) +
              "; this build reads CUPTI " + std::to_string(kCuptiMajor) + " records (version " +
              std::to_string(CUPTI_API_VERSION) + " or later); set MOE_CUPTI_DIR to a matching CUPTI";
    return api;
  }
  api.loaded = true;
  return api;
}

// Loaded on first use, once per process.
const CuptiApi& cupti() {
  static const CuptiApi api = load_cupti();
  return api;
}

std::string cupti_error(const char* call, CUptiResult rc) {
  const char* text = nullptr;
  if (cupti().get_result_string(rc, &text) != CUPTI_SUCCESS || text == nullptr) text = "unknown CUPTI error";
  return std::string(call) + " failed: " + text + " (CUPTI result " + std::to_string(static_cast<int>(rc)) + ")";
}

const char* memcpy_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[memcpy HtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[memcpy DtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return "[memcpy HtoA]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return "[memcpy AtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA: return "[memcpy AtoA]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD: return "[memcpy AtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA: return "[memcpy DtoA]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[memcpy DtoD]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "[memcpy HtoH]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "[memcpy PtoP]";
    default: return "[memcpy]";
  }
}

// Records with start = end = 0 carry no timestamps (CUPTI could not collect them): counted as
// calls with no time.
int64_t duration_ns(uint64_t start, uint64_t end) { return end > start ? static_cast<int64_t>(end - start) : 0; }

// The profiler CUPTI's callbacks deliver to (they are plain function pointers, one set per
// process). The mutex also keeps a profiler alive while a callback adds to it: stop() clears the
// pointer under it.
std::mutex g_active_mutex;
KernelProfiler* g_active = nullptr;
bool g_callbacks_registered = false;

}  // namespace

struct KernelProfiler::Recorder {
  static void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(kRecordAlign, kBufferBytes));
    *size = *buffer != nullptr ? kBufferBytes : 0;  // 0: CUPTI drops records rather than crash
    *max_records = 0;                              // as many as fit
  }

  static void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_size) {
    {
      std::lock_guard<std::mutex> active_lock(g_active_mutex);
      if (g_active != nullptr && valid_size > 0) g_active->add_records(buffer, valid_size);
    }
    std::free(buffer);
  }
};

void KernelProfiler::add_records(uint8_t* buffer, size_t valid_size) {
  std::lock_guard<std::mutex> lock(tallies_mutex_);
  auto add = [&](std::string_view name, int64_t ns) {
    auto it = tallies_.find(name);
    if (it == tallies_.end()) it = tallies_.emplace(std::string(name), Tally{}).first;
    it->second.calls += 1;
    it->second.ns += ns;
  };
  CUpti_Activity* record = nullptr;
  // Ends with CUPTI_ERROR_MAX_LIMIT_REACHED at the end of the buffer.
  while (cupti().activity_get_next_record(buffer, valid_size, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const KernelRecord*>(record);
        add(kernel->name != nullptr ? kernel->name : "[unnamed kernel]", duration_ns(kernel->start, kernel->end));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const MemcpyRecord*>(record);
        add(memcpy_name(copy->copyKind), duration_ns(copy->start, copy->end));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const MemsetRecord*>(record);
        add("[memset]", duration_ns(set->start, set->end));
        break;
      }
      default: break;
    }
  }
}
#endif

KernelProfiler::KernelProfiler() {
#if defined(MOE_HAVE_CUDA)
  if (!cuda_available(&why_)) return;
  const CuptiApi& api = cupti();
  if (!api.loaded) {
    why_ = api.why;
    return;
  }
  available_ = true;
#else
  why_ = "this binary was built without the CUDA backend";
#endif
}

KernelProfiler::~KernelProfiler() { finish(); }  // no throwing from a destructor

void KernelProfiler::start() {
  MOE_CHECK(available_, "KernelProfiler::start: kernel times are not available: ", why_);
  MOE_CHECK(!recording_, "KernelProfiler::start: already recording");
#if defined(MOE_HAVE_CUDA)
  const CuptiApi& api = cupti();
  {
    std::lock_guard<std::mutex> active_lock(g_active_mutex);
    MOE_CHECK(g_active == nullptr,
              "KernelProfiler::start: another KernelProfiler is recording (CUPTI has one set of activity "
              "buffers per process)");
    if (!g_callbacks_registered) {
      const CUptiResult rc =
          api.activity_register_callbacks(&Recorder::buffer_requested, &Recorder::buffer_completed);
      MOE_CHECK(rc == CUPTI_SUCCESS, "KernelProfiler::start: ", cupti_error("cuptiActivityRegisterCallbacks", rc));
      g_callbacks_registered = true;
    }
    g_active = this;
  }
  {
    std::lock_guard<std::mutex> lock(tallies_mutex_);
    tallies_.clear();
  }
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    const CUptiResult rc = api.activity_enable(kKinds[i]);
    if (rc == CUPTI_SUCCESS) continue;
    for (size_t j = 0; j < i; ++j) api.activity_disable(kKinds[j]);
    {
      std::lock_guard<std::mutex> active_lock(g_active_mutex);
      g_active = nullptr;
    }
    MOE_FAIL("KernelProfiler::start: ", cupti_error("cuptiActivityEnable", rc), " for activity kind ",
             static_cast<int>(kKinds[i]), " (CUPTI from ", api.path, ")");
  }
  recording_ = true;
#endif
}

void KernelProfiler::stop() {
  const std::string failure = finish();
  MOE_CHECK(failure.empty(), "KernelProfiler::stop: ", failure);
}

std::string KernelProfiler::finish() {
  if (!recording_) return "";
  recording_ = false;
  std::string failure;
#if defined(MOE_HAVE_CUDA)
  const CuptiApi& api = cupti();
  // NOTES: a whole-device synchronize, unlike library code elsewhere: a kernel's record is
  // complete only once the kernel has ended, on whichever stream it ran, and this runs between
  // steps where the wait costs nothing that is measured.
  const cudaError_t sync = cudaDeviceSynchronize();
  if (sync != cudaSuccess) failure = std::string("cudaDeviceSynchronize failed: ") + cudaGetErrorString(sync);
  for (CUpti_ActivityKind kind : kKinds) {
    const CUptiResult rc = api.activity_disable(kind);
    if (rc != CUPTI_SUCCESS && failure.empty()) failure = cupti_error("cuptiActivityDisable", rc);
  }
  // Forced: hands over partly filled buffers too. Blocking: the records are in tallies_ on return.
  const CUptiResult rc = api.activity_flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  if (rc != CUPTI_SUCCESS && failure.empty()) failure = cupti_error("cuptiActivityFlushAll", rc);
  std::lock_guard<std::mutex> active_lock(g_active_mutex);
  g_active = nullptr;
#endif
  return failure;
}

std::vector<KernelProfiler::Entry> KernelProfiler::top(size_t n) const {
  std::vector<Entry> entries;
  {
    std::lock_guard<std::mutex> lock(tallies_mutex_);
    entries.reserve(tallies_.size());
    for (const auto& [name, tally] : tallies_) entries.push_back({name, tally.calls, tally.ns * 1e-6});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
  });
  if (entries.size() > n) entries.resize(n);
  return entries;
}

double KernelProfiler::total_ms() const {
  std::lock_guard<std::mutex> lock(tallies_mutex_);
  int64_t ns = 0;
  for (const auto& [name, tally] : tallies_) ns += tally.ns;
  return ns * 1e-6;
}

namespace {

constexpr size_t kMaxNameChars = 100;

std::string demangle(const std::string& name) {
  if (name.rfind("_Z", 0) != 0) return name;  // extern "C" kernels (cuBLAS's) and "[memcpy ...]"
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> text(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status),
                                              &std::free);
  return status == 0 && text ? std::string(text.get()) : name;
}

// "void moe::cuda::(anonymous namespace)::swiglu_forward_kernel<float>(float*, float const*, long,
// long)" -> "moe::cuda::swiglu_forward_kernel<float>": the template arguments say which
// instantiation ran; the return type and parameters add only width.
std::string short_kernel_name(const std::string& mangled) {
  std::string name = demangle(mangled);
  if (!name.empty() && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') {
        ++depth;
      } else if (name[i] == '(' && --depth == 0) {
        if (i > 0) name.erase(i);
        break;
      }
    }
  }
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  const std::string anonymous = "(anonymous namespace)::";
  for (size_t at = name.find(anonymous); at != std::string::npos; at = name.find(anonymous, at))
    name.erase(at, anonymous.size());
  if (name.size() > kMaxNameChars) name = name.substr(0, kMaxNameChars - 3) + "...";
  return name;
}

}  // namespace

std::string format_kernel_table(const std::vector<KernelProfiler::Entry>& entries, double total_ms, int steps) {
  MOE_CHECK(steps >= 1, "format_kernel_table: steps must be at least 1, got ", steps);
  auto share = [&](double ms) { return total_ms > 0 ? 100.0 * ms / total_ms : 0.0; };
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof(line),
                "GPU time over %d step%s: %.3f ms, %.3f ms per step (kernels that overlap on different "
                "streams each count in full)\n",
                steps, steps == 1 ? "" : "s", total_ms, total_ms / steps);
  os << line;
  std::snprintf(line, sizeof(line), "%4s %7s %11s %10s %10s %9s  %s\n", "#", "share", "total ms", "ms/step",
                "ms/call", "calls", "kernel");
  os << line;
  double listed_ms = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const KernelProfiler::Entry& e = entries[i];
    listed_ms += e.total_ms;
    const double per_call = e.calls > 0 ? e.total_ms / static_cast<double>(e.calls) : 0.0;
    std::snprintf(line, sizeof(line), "%4zu %6.1f%% %11.3f %10.3f %10.4f %9lld  ", i + 1, share(e.total_ms),
                  e.total_ms, e.total_ms / steps, per_call, static_cast<long long>(e.calls));
    os << line << short_kernel_name(e.name) << "\n";
  }
  std::snprintf(line, sizeof(line), "listed: %.3f ms, %.1f%% of the total\n", listed_ms, share(listed_ms));
  os << line;
  return os.str();
}

}  // namespace moe
