#include "moe/core/arena.h"

#include "moe/core/cuda_check.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>
#include <sstream>

namespace moe {

Arena::~Arena() {
#if defined(MOE_HAVE_CUDA)
  if (device_ == Device::CUDA) {
    if (base_) cudaFree(base_);  // no throwing from a destructor
    return;
  }
#endif
  std::free(base_);
}

Arena::Slot Arena::reserve(const std::string& buffer_name, DType dtype, Shape shape) {
  MOE_CHECK(!committed(), "arena '", name_, "': buffer '", buffer_name, "' reserved after commit");
#if !defined(MOE_HAVE_CUDA)
  MOE_CHECK(device_ == Device::CPU, "arena '", name_, "': CUDA arenas need a build with the CUDA backend");
#endif
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  entries_.push_back({buffer_name, dtype, shape, total_, bytes});
  total_ += (bytes + kAlign - 1) / kAlign * kAlign;
  return Slot{static_cast<int>(entries_.size()) - 1};
}

size_t Arena::bytes_with_prefix(const std::string& prefix) const {
  size_t n = 0;
  for (const Entry& e : entries_)
    if (e.name.compare(0, prefix.size(), prefix) == 0) n += e.bytes;
  return n;
}

std::string Arena::largest(int n) const {
  std::vector<const Entry*> sorted;
  for (const auto& e : entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->bytes > b->bytes; });
  std::ostringstream os;
  for (int i = 0; i < n && i < static_cast<int>(sorted.size()); ++i)
    os << "  " << sorted[i]->name << " " << sorted[i]->shape.str() << ": " << format_bytes(sorted[i]->bytes)
       << "\n";
  return os.str();
}

void Arena::commit(size_t limit_bytes) {
  MOE_CHECK(!committed(), "arena '", name_, "' committed twice");
  if (limit_bytes != 0 && total_ > limit_bytes) {
    MOE_FAIL("arena '", name_, "' needs ", format_bytes(total_), " but only ", format_bytes(limit_bytes),
             " is available; largest buffers:\n", largest(5),
             "reduce train.micro_batch_size, train.seq_len or the model size");
  }
  committed_flag_ = true;
  if (total_ == 0) return;
#if defined(MOE_HAVE_CUDA)
  if (device_ == Device::CUDA) {
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, total_);
    MOE_CHECK(rc == cudaSuccess, "arena '", name_, "': device allocation of ", format_bytes(total_), " failed (",
              cudaGetErrorString(rc), "); largest buffers:\n", largest(5));
    base_ = static_cast<char*>(p);
    CUDA_CHECK(cudaMemset(base_, 0, total_));
    return;
  }
#endif
  base_ = static_cast<char*>(std::aligned_alloc(kAlign, total_));
  MOE_CHECK(base_ != nullptr, "arena '", name_, "': allocation of ", format_bytes(total_), " failed");
  std::memset(base_, 0, total_);
}

Tensor Arena::get(Slot slot) const {
  MOE_CHECK(committed(), "arena '", name_, "' used before commit");
  MOE_CHECK(slot.index >= 0 && slot.index < static_cast<int>(entries_.size()), "arena '", name_,
            "': bad slot ", slot.index);
  const Entry& e = entries_[slot.index];
  return Tensor(base_ + e.offset, e.dtype, e.shape, device_);
}

size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
}

namespace {

// The first unsigned number in `path`, if it holds one ("max" and missing files do not).
std::optional<unsigned long long> number_in_file(const char* path) {
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long v = 0;
  const bool ok = std::fscanf(f, "%llu", &v) == 1;
  std::fclose(f);
  return ok ? std::optional<unsigned long long>(v) : std::nullopt;
}

// This process's memory cgroup directories, from /proc/self/cgroup: cgroup v2's ("0::<path>"
// under /sys/fs/cgroup) and v1's ("N:memory:<path>" under /sys/fs/cgroup/memory). Inside a
// container's cgroup namespace the path is "/", its own root.
std::pair<std::string, std::string> memory_cgroup_dirs() {
  std::string v2 = "/sys/fs/cgroup", v1 = "/sys/fs/cgroup/memory";
  if (FILE* f = std::fopen("/proc/self/cgroup", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      std::string entry(line);
      while (!entry.empty() && (entry.back() == '\n' || entry.back() == '/')) entry.pop_back();
      const size_t colon = entry.find(':'), second = entry.find(':', colon + 1);
      if (colon == std::string::npos || second == std::string::npos) continue;
      const std::string controllers = entry.substr(colon + 1, second - colon - 1), path = entry.substr(second + 1);
      if (entry.compare(0, colon, "0") == 0 && controllers.empty()) v2 += path;
      if (controllers == "memory" || controllers.find("memory,") == 0 || controllers.find(",memory") != std::string::npos)
        v1 += path;
    }
    std::fclose(f);
  }
  return {v2, v1};
}

// Room left under this process's memory cgroup limit (a Slurm --mem job, a container), if it has
// one: cgroup v2's memory.max - memory.current, else v1's limit_in_bytes - usage_in_bytes (v1 says
// "no limit" with a number near 2^63, which then never binds).
std::optional<size_t> cgroup_headroom_bytes() {
  const auto [v2, v1] = memory_cgroup_dirs();
  const std::pair<std::string, std::string> files[] = {{v2 + "/memory.max", v2 + "/memory.current"},
                                                       {v1 + "/memory.limit_in_bytes", v1 + "/memory.usage_in_bytes"}};
  for (const auto& [limit_file, usage_file] : files) {
    const auto limit = number_in_file(limit_file.c_str()), usage = number_in_file(usage_file.c_str());
    if (!limit || !usage) continue;
    return static_cast<size_t>(*limit > *usage ? *limit - *usage : 0);
  }
  return std::nullopt;
}

}  // namespace

size_t available_memory_bytes() {
  size_t available = 0;
  bool found = false;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    std::fclose(f);
    available = static_cast<size_t>(kib) * 1024;
  }
  if (!found) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGE_SIZE);
    available = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  }
  if (const auto headroom = cgroup_headroom_bytes()) available = std::min(available, *headroom);
  return available;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace moe
