// Argument checks shared by the CPU communicators (MpiCommunicator, LocalCommunicator), so a
// call that is wrong fails the same way on one rank as under mpirun, before any data moves.
// Every check is local (no communication): all ranks given the same shapes throw together.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "moe/core/tensor.h"

namespace moe::comm_detail {

// CPU tensors of F32, I32 or I64 only: the element types the collectives are defined for.
// any_device: the communicator also moves GPU buffers (LocalCommunicator).
inline void check_cpu_tensor(const char* op, const char* name, const Tensor& t, int rank, bool any_device = false) {
  MOE_CHECK(any_device || t.device == Device::CPU, op, " (rank ", rank, "): ", name, " is a ",
            device_name(t.device), " tensor; this communicator moves CPU buffers only");
  MOE_CHECK(t.dtype == DType::F32 || t.dtype == DType::I32 || t.dtype == DType::I64, op,
            " (rank ", rank, "): ", name, " has dtype ", dtype_name(t.dtype),
            "; supported are F32, I32 and I64");
  MOE_CHECK(t.numel() == 0 || t.data != nullptr, op, " (rank ", rank, "): ", name, " has ",
            t.numel(), " elements but no data pointer");
}

inline void check_same_dtype(const char* op, const Tensor& out, const Tensor& in, int rank) {
  MOE_CHECK(out.dtype == in.dtype, op, " (rank ", rank, "): out has dtype ",
            dtype_name(out.dtype), " but in has ", dtype_name(in.dtype));
}

// MPI counts are int: a larger buffer must be split by the caller.
inline int checked_count(const char* op, int64_t n, int rank) {
  MOE_CHECK(n >= 0 && n <= std::numeric_limits<int>::max(), op, " (rank ", rank, "): ", n,
            " elements do not fit an MPI count (int)");
  return static_cast<int>(n);
}

// reduce_scatter and all_gather move between a whole buffer and this rank's piece of it: both
// tensors of one supported dtype on one device, and the whole size times the piece.
inline void check_whole_and_piece(const char* op, const Tensor& out, const Tensor& in, const char* whole_name,
                                  const Tensor& whole, const char* piece_name, const Tensor& piece, int size, int rank,
                                  bool any_device) {
  check_cpu_tensor(op, "out", out, rank, any_device);
  check_cpu_tensor(op, "in", in, rank, any_device);
  check_same_dtype(op, out, in, rank);
  MOE_CHECK(out.device == in.device, op, " (rank ", rank, "): out and in are on different devices");
  MOE_CHECK(whole.numel() == static_cast<int64_t>(size) * piece.numel(), op, " (rank ", rank, "): ", whole_name,
            " has ", whole.numel(), " elements, expected size ", size, " x ", piece_name, "'s ", piece.numel(), " = ",
            static_cast<int64_t>(size) * piece.numel());
}

// reduce_scatter: in = size * out.
inline void check_reduce_scatter(const Tensor& out, const Tensor& in, int size, int rank, bool any_device = false) {
  check_whole_and_piece("reduce_scatter", out, in, "in", in, "out", out, size, rank, any_device);
}

// all_gather: out = size * in.
inline void check_all_gather(const Tensor& out, const Tensor& in, int size, int rank, bool any_device = false) {
  check_whole_and_piece("all_gather", out, in, "out", out, "in", in, size, rank, any_device);
}

// all_to_all_v: one non-negative count per rank; counts sum to the tensor's element count.
inline void check_counts(const char* which, const std::vector<int64_t>& counts,
                         const Tensor& t, const char* tensor_name, int size, int rank) {
  MOE_CHECK(static_cast<int>(counts.size()) == size, "all_to_all_v (rank ", rank, "): ", which,
            " has ", counts.size(), " entries, expected one per rank (", size, ")");
  int64_t total = 0;
  for (int r = 0; r < size; ++r) {
    MOE_CHECK(counts[r] >= 0, "all_to_all_v (rank ", rank, "): ", which, "[", r, "] = ",
              counts[r], " is negative");
    total += counts[r];
  }
  MOE_CHECK(total == t.numel(), "all_to_all_v (rank ", rank, "): ", which, " sum to ", total,
            " elements but ", tensor_name, " has ", t.numel());
}

inline void check_all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts,
                               const Tensor& in, const std::vector<int64_t>& send_counts,
                               int size, int rank, bool any_device = false) {
  check_cpu_tensor("all_to_all_v", "out", out, rank, any_device);
  check_cpu_tensor("all_to_all_v", "in", in, rank, any_device);
  check_same_dtype("all_to_all_v", out, in, rank);
  check_counts("send_counts", send_counts, in, "in", size, rank);
  check_counts("recv_counts", recv_counts, out, "out", size, rank);
}

inline void check_root(int root, int size, int rank) {
  MOE_CHECK(root >= 0 && root < size, "broadcast (rank ", rank, "): root ", root,
            " is not a rank of this group of ", size);
}

}  // namespace moe::comm_detail
