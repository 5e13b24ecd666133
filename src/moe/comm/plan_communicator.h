// A stand-in communicator for memory planning (`moetrain plan`): it has a rank and a size, so the
// objects of a run can be built and their memory reserved exactly as on rank `rank` of `size`,
// but it moves nothing; any collective is an error (planning never communicates).
#pragma once

#include <memory>
#include <vector>

#include "moe/comm/communicator.h"

namespace moe {

class PlanCommunicator final : public Communicator {
 public:
  PlanCommunicator(int rank, int size);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor, ReduceOp, Stream = {}) override { refuse("all_reduce"); }
  void reduce_scatter(Tensor, Tensor, ReduceOp, Stream = {}) override { refuse("reduce_scatter"); }
  void all_gather(Tensor, Tensor, Stream = {}) override { refuse("all_gather"); }
  void all_to_all_v(Tensor, const std::vector<int64_t>&, Tensor, const std::vector<int64_t>&,
                    Stream = {}) override {
    refuse("all_to_all_v");
  }
  void broadcast(Tensor, int, Stream = {}) override { refuse("broadcast"); }
  void barrier() override { refuse("barrier"); }
  void send(Tensor, int, int, Stream = {}) override { refuse("send"); }
  void recv(Tensor, int, int, Stream = {}) override { refuse("recv"); }
  std::unique_ptr<Communicator> split(int, int) override { refuse("split"); }
  bool plans_only() const override { return true; }

 private:
  [[noreturn]] static void refuse(const char* what);
  int rank_, size_;
};

}  // namespace moe
