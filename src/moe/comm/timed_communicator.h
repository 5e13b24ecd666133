// A Communicator that forwards to another and adds up the wall time spent inside collectives
// (for the "time in communication" metric). Groups split from it are timed into the same clock.
#pragma once

#include <chrono>
#include <memory>
#include <utility>

#include "moe/comm/communicator.h"

namespace moe {

class TimedCommunicator final : public Communicator {
 public:
  // inner is not owned unless given as owned_inner; seconds is the shared accumulator.
  TimedCommunicator(Communicator& inner, std::shared_ptr<double> seconds,
                    std::unique_ptr<Communicator> owned_inner = nullptr)
      : inner_(inner), seconds_(std::move(seconds)), owned_(std::move(owned_inner)) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  bool plans_only() const override { return inner_.plans_only(); }
  bool threads_may_call_concurrently() const override { return inner_.threads_may_call_concurrently(); }
  void all_reduce(Tensor buf, ReduceOp op, Stream s = {}) override { timed([&] { inner_.all_reduce(buf, op, s); }); }
  void reduce_scatter(Tensor out, Tensor in, ReduceOp op, Stream s = {}) override {
    timed([&] { inner_.reduce_scatter(out, in, op, s); });
  }
  void all_gather(Tensor out, Tensor in, Stream s = {}) override { timed([&] { inner_.all_gather(out, in, s); }); }
  void all_to_all_v(Tensor out, const std::vector<int64_t>& recv, Tensor in, const std::vector<int64_t>& send,
                    Stream s = {}) override {
    timed([&] { inner_.all_to_all_v(out, recv, in, send, s); });
  }
  void broadcast(Tensor buf, int root, Stream s = {}) override { timed([&] { inner_.broadcast(buf, root, s); }); }
  void barrier() override { timed([&] { inner_.barrier(); }); }
  void send(Tensor buf, int peer, int tag, Stream s = {}) override { timed([&] { inner_.send(buf, peer, tag, s); }); }
  void recv(Tensor buf, int peer, int tag, Stream s = {}) override { timed([&] { inner_.recv(buf, peer, tag, s); }); }
  void begin_group() override { inner_.begin_group(); }
  void end_group() override { timed([&] { inner_.end_group(); }); }
  bool sends_wait_for_receivers() const override { return inner_.sends_wait_for_receivers(); }
  void wait_sends() override { timed([&] { inner_.wait_sends(); }); }
  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> group = inner_.split(color, key);
    Communicator& ref = *group;
    return std::make_unique<TimedCommunicator>(ref, seconds_, std::move(group));
  }
  Communicator& inner() { return inner_; }
  double seconds() const { return *seconds_; }
  // The shared accumulator, for other channels that should count as communication time
  // (the symmetric heap's barriers).
  const std::shared_ptr<double>& clock() const { return seconds_; }

 private:
  template <typename Fn>
  void timed(Fn&& fn) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Communicator& inner_;
  std::shared_ptr<double> seconds_;
  std::unique_ptr<Communicator> owned_;
};

// The communicator under any layers of timing (for code that needs the concrete backend, such
// as a symmetric heap over NCCL windows).
inline Communicator& untimed(Communicator& c) {
  Communicator* inner = &c;
  while (auto* timed = dynamic_cast<TimedCommunicator*>(inner)) inner = &timed->inner();
  return *inner;
}

}  // namespace moe
