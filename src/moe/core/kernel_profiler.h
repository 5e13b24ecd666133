// KernelProfiler: GPU time per kernel name over a window of steps, so `moetrain bench` can name
// the kernels that take the step's time. Records come from CUPTI's activity API: every kernel
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which keeps kernels concurrent), plus memory copies and
// sets, reported under names like "[memcpy DtoD]" and "[memset]".
//
// libcupti is loaded at run time with dlopen, so the binary needs no CUPTI to link or to run:
// where it is missing, available() is false and why() says what was tried. Search order: the
// folder $MOE_CUPTI_DIR (when set), then "libcupti.so.13" and "libcupti.so" on the loader's path,
// then the folder libcudart was loaded from (where the CUDA toolkit keeps CUPTI).
//
// One profiler records at a time per process (CUPTI's activity buffers are per process).
// Recording costs a little per launch; it is meant for a bench window, not for every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moe {

class KernelProfiler {
 public:
  struct Entry {
    std::string name;  // the kernel's mangled name as CUPTI reports it, or "[memcpy HtoD]" etc.
    int64_t calls = 0;
    double total_ms = 0;
  };

  KernelProfiler();  // loads CUPTI if needed; does not start recording
  ~KernelProfiler();  // stops recording if started
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  bool available() const { return available_; }
  // Why available() is false: no CUDA backend in this build, no GPU, or libcupti not found.
  const std::string& why() const { return why_; }
  bool recording() const { return recording_; }

  // Clears earlier results and begins recording. Fails with moe::Error when not available, or
  // when another profiler is recording.
  void start();
  // Waits for the GPU (cudaDeviceSynchronize: work on every stream), delivers all records and
  // stops recording. Does nothing when not recording.
  void stop();

  // The n entries with the largest total time, largest first (ties by name).
  std::vector<Entry> top(size_t n) const;
  // All recorded GPU time: the sum over entries. Kernels on different streams may overlap, so
  // this can exceed the wall-clock time of the window.
  double total_ms() const;

 private:
  struct Tally {
    int64_t calls = 0;
    int64_t ns = 0;
  };
  struct Recorder;  // CUPTI's buffer callbacks (kernel_profiler.cpp)
  friend struct Recorder;

  // Adds the records of one CUPTI buffer (CUDA builds; called from the buffer callback).
  void add_records(uint8_t* buffer, size_t valid_size);

  // Stops recording; returns the first failure's message ("" when none), so the destructor can
  // stop without throwing.
  std::string finish();

  bool available_ = false;
  bool recording_ = false;
  std::string why_;
  mutable std::mutex tallies_mutex_;  // CUPTI delivers buffers on its own thread
  std::map<std::string, Tally, std::less<>> tallies_;  // by name; std::less<>: found by string_view
};

// A printable table of entries (e.g. top(20)), one line each: rank, share of total_ms, total ms,
// ms per step (over `steps` >= 1 steps), ms per call, calls, and the name demangled and shortened
// (return type, parameter list and "(anonymous namespace)::" dropped, capped at 100 characters).
// A header line gives the total; a footer the share of the total the listed entries cover.
std::string format_kernel_table(const std::vector<KernelProfiler::Entry>& entries, double total_ms, int steps);

}  // namespace moe
