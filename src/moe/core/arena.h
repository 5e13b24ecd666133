// Arena: every buffer a run needs (parameters, gradients, optimizer state, activations,
// scratch) is reserved by name while the run is planned from the config, then carved out of
// one allocation by commit(). Nothing is allocated inside a step. A plan that does not fit
// the memory limit fails at commit() naming the largest buffers, before any work starts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe/core/tensor.h"

namespace moe {

class Arena {
 public:
  struct Slot {
    int index = -1;
  };

  explicit Arena(std::string name, Device device = Device::CPU) : name_(std::move(name)), device_(device) {}
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Plans a buffer; valid only before commit().
  Slot reserve(const std::string& buffer_name, DType dtype, Shape shape);
  // Allocates all planned buffers at once (zero-filled). Fails with a message naming the
  // arena, the total and the largest buffers when the total exceeds limit_bytes (0 = no limit).
  void commit(size_t limit_bytes = 0);
  bool committed() const { return committed_flag_; }

  Tensor get(Slot slot) const;
  size_t total_bytes() const { return total_; }
  const std::string& name() const { return name_; }
  Device device() const { return device_; }
  // Bytes of the buffers whose names start with `prefix` (memory reports by role).
  size_t bytes_with_prefix(const std::string& prefix) const;
  // "name: bytes" lines for the largest n buffers, for memory reports.
  std::string largest(int n) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    size_t offset;
    size_t bytes;
  };
  static constexpr size_t kAlign = 256;
  std::string name_;
  Device device_;
  std::vector<Entry> entries_;
  size_t total_ = 0;
  char* base_ = nullptr;
  bool committed_flag_ = false;
};

// Physical memory of this machine, and this process's peak resident set so far.
size_t physical_memory_bytes();
// Memory a new allocation can take without swapping or meeting a limit: /proc/meminfo MemAvailable
// (free memory plus reclaimable caches; the free pages where that file is missing), and at most
// the room left under this process's memory cgroup limit where it has one (Slurm --mem, a container).
size_t available_memory_bytes();
size_t peak_rss_bytes();
std::string format_bytes(double bytes);

}  // namespace moe
