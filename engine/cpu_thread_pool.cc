#include "engine/cpu_thread_pool.h"

namespace dattn {
namespace cpu {

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunItems(int thread) {
  for (;;) {
    const int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
    if (item >= count_) return;
    (*body_)(item, thread);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
    }
    RunItems(thread);
    {
      absl::MutexLock lock(&mu_);
      if (--active_ == 0) done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t item, int thread)>& body) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    body_ = &body;
    count_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.SignalAll();
  RunItems(0);
  absl::MutexLock lock(&mu_);
  while (active_ != 0) done_cv_.Wait(&mu_);
  body_ = nullptr;
}

}  // namespace cpu
}  // namespace dattn
