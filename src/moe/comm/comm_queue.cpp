#include "moe/comm/comm_queue.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "moe/core/error.h"

namespace moe {

struct CommQueue::Worker {
  std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<Task> tasks;
  bool running = false, stop = false;
  std::exception_ptr error;
  std::thread thread;

  void loop() {
    std::unique_lock lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return stop || !tasks.empty(); });
      if (tasks.empty()) return;  // stop, nothing left
      Task task = std::move(tasks.front());
      tasks.pop_front();
      running = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        task(Stream{});
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      running = false;
      if (failed && !error) {
        error = failed;
        tasks.clear();  // later collectives would wait for a partner that has given up
      }
      if (tasks.empty()) idle.notify_all();
    }
  }
};

CommQueue::CommQueue(Device device, bool threaded, std::shared_ptr<double> clock)
    : clock_(std::move(clock)) {
  if (device == Device::CUDA) {
    side_ = std::make_unique<SideStream>(device);
    return;
  }
  if (!threaded) return;
  worker_ = std::make_shared<Worker>();
  worker_->thread = std::thread([w = worker_] { w->loop(); });
}

CommQueue::~CommQueue() {
  if (worker_) {
    {
      std::lock_guard lock(worker_->mu);
      worker_->stop = true;
    }
    worker_->wake.notify_all();
    // While an error unwinds, a running collective may wait forever for ranks that have failed:
    // the thread keeps its state alive and is left to the job's abort instead of joined.
    if (std::uncaught_exceptions() > 0)
      worker_->thread.detach();
    else
      worker_->thread.join();
  }
}

bool CommQueue::overlaps() const { return worker_ != nullptr || side_ != nullptr; }

void CommQueue::submit(Task task) {
  if (side_) {
    side_->follow_compute();
    return task(side_->stream());
  }
  if (!worker_) return task(Stream{});
  {
    std::lock_guard lock(worker_->mu);
    // After a failure the queue accepts nothing more: join() reports the error.
    if (worker_->error) return;
    worker_->tasks.push_back(std::move(task));
  }
  worker_->wake.notify_one();
}

void CommQueue::join() {
  if (side_) return side_->join();
  if (!worker_) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::exception_ptr error;
  {
    std::unique_lock lock(worker_->mu);
    worker_->idle.wait(lock, [&] { return worker_->tasks.empty() && !worker_->running; });
    error = std::exchange(worker_->error, nullptr);
  }
  if (clock_) *clock_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error) std::rethrow_exception(error);
}

}  // namespace moe
