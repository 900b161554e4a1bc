// SPDX-License-Identifier: MIT
#include "backends/cpu/thread_pool.h"

#include <algorithm>
#include <utility>

namespace nf4::cpu {

ThreadPool::ThreadPool(unsigned size) {
  try {
    for (unsigned i = 1; i < size; ++i) workers_.emplace_back([this, i] { worker_loop(i - 1); });
  } catch (...) {
    // Thread creation failed part way: stop and join the ones that started, then report.
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::drain() {
  for (;;) {
    std::size_t i;
    const std::function<void(std::size_t)>* job;
    {
      std::lock_guard lock(mutex_);
      if (next_ >= count_) return;
      i = next_++;
      job = job_;
    }
    try {
      (*job)(i);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(unsigned index) {
  std::uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= participants_) continue;  // this call needs fewer threads
    lock.unlock();
    drain();
    lock.lock();
    if (--busy_ == 0) done_.notify_one();
  }
}

void ThreadPool::run(std::size_t count, const std::function<void(std::size_t)>& job) {
  std::lock_guard serial(run_mutex_);
  const unsigned helpers = static_cast<unsigned>(std::min<std::size_t>(workers_.size(), count ? count - 1 : 0));
  if (helpers == 0) {  // nothing to share: no wake-up
    std::exception_ptr error;
    for (std::size_t i = 0; i < count; ++i) try {
        job(i);
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    if (error) std::rethrow_exception(error);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &job;
    count_ = count;
    next_ = 0;
    error_ = nullptr;
    participants_ = helpers;
    busy_ = helpers;
    ++generation_;
  }
  wake_.notify_all();
  drain();
  std::exception_ptr error;
  {
    // Every participant must have finished before `job` goes out of scope.
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    job_ = nullptr;
    count_ = next_ = 0;
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace nf4::cpu
