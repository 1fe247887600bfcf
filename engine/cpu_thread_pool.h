// A fixed set of worker threads that runs one parallel loop at a time: the CPU backend's only
// source of parallelism (OpenBLAS is kept single-threaded inside it).
//
// Thread-safety: ParallelFor may be called by one thread at a time (the owner); the pool's workers
// only run the loop body. The destructor joins every worker; no loop may be running then.
#ifndef DATTN_ENGINE_CPU_THREAD_POOL_H_
#define DATTN_ENGINE_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dattn {
namespace cpu {

class ThreadPool {
 public:
  // num_threads >= 1 threads take part in each loop: the calling thread and num_threads - 1
  // workers.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs body(item, thread) for every item in [0, n) and returns when all have finished. Items are
  // handed out one at a time in increasing order (dynamic scheduling: costly items first balance
  // best); `thread` in [0, num_threads()) names the thread running the item, so a body can use
  // per-thread scratch without locking. The body must not throw and must not call ParallelFor.
  void ParallelFor(int64_t n, const std::function<void(int64_t item, int thread)>& body);

 private:
  void WorkerLoop(int thread);
  void RunItems(int thread);

  const int num_threads_;
  std::vector<std::thread> workers_;

  absl::Mutex mu_;
  absl::CondVar work_cv_;                         // Workers wait here for a new loop (or shutdown).
  absl::CondVar done_cv_;                         // The owner waits here for workers to leave it.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped once per loop.
  int active_ ABSL_GUARDED_BY(mu_) = 0;           // Workers still inside the current loop.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The current loop; written by the owner before generation_ is bumped, read by workers after.
  const std::function<void(int64_t, int)>* body_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
};

}  // namespace cpu
}  // namespace dattn

#endif  // DATTN_ENGINE_CPU_THREAD_POOL_H_
