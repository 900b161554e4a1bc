// SPDX-License-Identifier: MIT
// A fixed set of worker threads owned by one cpu backend (one per context): started once, asleep
// on a condition variable between calls, joined when the backend is destroyed. A call runs on the
// calling thread plus the workers, so a pool of size N starts N - 1 threads and a pool of size 1
// starts none.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nf4::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(unsigned size);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that run a call, the caller included.
  unsigned size() const { return static_cast<unsigned>(workers_.size()) + 1; }

  // Runs job(i) once for every i in [0, count), spread over the caller and the workers, and
  // returns when all are done. The first exception a job throws is rethrown here (the remaining
  // items still run). Calls from several threads are serialized.
  void run(std::size_t count, const std::function<void(std::size_t)>& job);

 private:
  void worker_loop(unsigned index);
  // Takes items until none are left; records the first exception.
  void drain();

  std::mutex run_mutex_;  // one call at a time
  std::mutex mutex_;      // guards everything below
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;  // bumped per call: a worker runs each generation once
  bool stop_ = false;
  unsigned participants_ = 0;  // workers with index < participants_ join the current call
  unsigned busy_ = 0;          // of those, how many have not finished yet
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t count_ = 0, next_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> workers_;
};

}  // namespace nf4::cpu
