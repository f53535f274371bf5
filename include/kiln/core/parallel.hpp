// kiln/core/parallel.hpp - a small fork-join thread pool.
//
// ThreadPool(n) runs parallel_for(n_tasks, fn) on n threads: the caller plus n - 1 workers. Workers
// spin briefly after each job before sleeping (std::atomic::wait, a futex on Linux), so the
// back-to-back small jobs of a decode step do not pay a wake-up each. Tasks are claimed from an atomic
// counter; fn(task, thread) receives the task index and the index of the thread running it (0 = caller).
// A parallel_for issued from inside a task runs inline on that thread. The first exception a task
// throws is rethrown to the caller once all tasks have finished.
// Chosen over OpenMP: the run-time thread count is per pool (a host program may keep several), no
// runtime library to link, and the spin-then-sleep policy is ours to tune.
// Spinning threads must not share a CPU: a worker the OS runs on the submitting thread's CPU spins away the
// time slice that thread needs. Linux sometimes places a woken worker there (seen on a 2-core VM: ~300
// context switches and a 128-token stories260K prompt in ~26 ms instead of ~1.1 ms, for ~70 ms until the
// load balancer split them). So a worker that finds itself on the submitter's CPU moves off it once (its
// affinity mask without that CPU, then the original mask back), when the mask leaves room for every thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace kiln {

class ThreadPool {
 public:
  /// n_threads >= 1 counts the calling thread; 0 means std::thread::hardware_concurrency().
  explicit ThreadPool(std::size_t n_threads = 0) {
    if (n_threads == 0) n_threads = std::max(1u, std::thread::hardware_concurrency());
    KILN_CHECK(n_threads <= 1024, "kiln::ThreadPool: ", n_threads, " threads is not a sensible count");
    n_threads_ = n_threads;
#if defined(__linux__)
    cpu_set_t mask;
    spread_ = n_threads > 1 && pthread_getaffinity_np(pthread_self(), sizeof mask, &mask) == 0 &&
              std::size_t(CPU_COUNT(&mask)) >= n_threads;
#endif
    workers_.reserve(n_threads - 1);
    try {
      for (std::size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (...) {  // a thread could not start: stop the ones that did (else their destructors terminate)
      shutdown();
      throw;
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool() { shutdown(); }

  std::size_t size() const { return n_threads_; }

  /// Runs fn(task, thread) for task in [0, n_tasks); returns when all are done.
  template <class Fn>
  void parallel_for(std::size_t n_tasks, Fn&& fn) {
    if (n_tasks == 0) return;
    if (n_threads_ == 1 || n_tasks == 1 || in_task()) {
      const std::size_t self = in_task() ? current_thread() : 0;
      std::exception_ptr first;  // same contract as the threaded path: all tasks run, first error rethrown
      for (std::size_t t = 0; t < n_tasks; ++t) {
        try {
          fn(t, self);
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (first) std::rethrow_exception(first);
      return;
    }
    std::lock_guard<std::mutex> lock(submit_mu_);  // one job at a time per pool
    using F = std::remove_reference_t<Fn>;
    job_ctx_ = const_cast<void*>(static_cast<const void*>(&fn));
    job_fn_ = [](void* ctx, std::size_t task, std::size_t thread) { (*static_cast<F*>(ctx))(task, thread); };
    n_tasks_ = n_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    error_ = nullptr;
    pending_.store(workers_.size(), std::memory_order_relaxed);
    submit_cpu_ = spread_ ? current_cpu() : -1;
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    run_tasks(0);
    // Wait for the workers: spin first (jobs are short), then yield.
    for (std::size_t spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins > 4096) std::this_thread::yield();
      else pause();
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void shutdown() {
    stop_.store(true, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    for (auto& t : workers_) t.join();
  }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  static std::size_t& tls_thread() {
    static thread_local std::size_t t = SIZE_MAX;
    return t;
  }
  static bool in_task() { return tls_thread() != SIZE_MAX; }
  static int current_cpu() {
#if defined(__linux__)
    return sched_getcpu();
#else
    return -1;
#endif
  }
  // Moves the calling thread off `cpu` (see the top of this header).
  static void move_off(int cpu) {
#if defined(__linux__)
    cpu_set_t mask;
    if (pthread_getaffinity_np(pthread_self(), sizeof mask, &mask) != 0 || !CPU_ISSET(cpu, &mask) ||
        CPU_COUNT(&mask) < 2)
      return;
    cpu_set_t other = mask;
    CPU_CLR(cpu, &other);
    if (pthread_setaffinity_np(pthread_self(), sizeof other, &other) == 0)
      pthread_setaffinity_np(pthread_self(), sizeof mask, &mask);
#else
    (void)cpu;
#endif
  }
  static std::size_t current_thread() { return tls_thread(); }

  void run_tasks(std::size_t thread) {
    tls_thread() = thread;
    for (;;) {
      const std::size_t t = next_task_.fetch_add(1, std::memory_order_relaxed);
      if (t >= n_tasks_) break;
      try {
        job_fn_(job_ctx_, t, thread);
      } catch (...) {
        std::lock_guard<std::mutex> g(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    tls_thread() = SIZE_MAX;
  }

  void worker_loop(std::size_t thread) {
    uint64_t seen = 0;
    for (;;) {
      // Spin for a while (about 50-100 us) before sleeping on the epoch.
      uint64_t e = epoch_.load(std::memory_order_acquire);
      for (int spins = 0; e == seen && spins < 20000; ++spins) {
        pause();
        e = epoch_.load(std::memory_order_acquire);
      }
      while (e == seen) {
        epoch_.wait(seen, std::memory_order_acquire);
        e = epoch_.load(std::memory_order_acquire);
      }
      seen = e;
      if (stop_.load(std::memory_order_acquire)) return;
      if (const int cpu = submit_cpu_; cpu >= 0 && cpu == current_cpu()) move_off(cpu);
      run_tasks(thread);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }

  std::size_t n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex submit_mu_, error_mu_;
  void* job_ctx_ = nullptr;
  void (*job_fn_)(void*, std::size_t, std::size_t) = nullptr;
  std::size_t n_tasks_ = 0;
  bool spread_ = false;  // keep workers off the submitter's CPU (Linux, enough CPUs in the affinity mask)
  int submit_cpu_ = -1;  // the submitting thread's CPU for the current job, or -1
  std::exception_ptr error_;
  alignas(64) std::atomic<uint64_t> epoch_{0};
  alignas(64) std::atomic<std::size_t> next_task_{0};
  alignas(64) std::atomic<std::size_t> pending_{0};
  std::atomic<bool> stop_{false};
};

/// Splits [0, n) into `parts` contiguous ranges, each a multiple of `grain` except the last; returns
/// range i as {begin, end}.
inline std::pair<std::size_t, std::size_t> split_range(std::size_t n, std::size_t parts, std::size_t i,
                                                       std::size_t grain = 1) {
  const std::size_t units = (n + grain - 1) / grain;
  const std::size_t base = units / parts, extra = units % parts;
  const std::size_t b = i * base + std::min(i, extra);
  const std::size_t e = b + base + (i < extra ? 1 : 0);
  return {std::min(n, b * grain), std::min(n, e * grain)};
}

namespace detail {
/// Runs f(row_begin, row_end) over [0, rows), split across the pool when there is enough work: at
/// least min_work_per_task elements (rows * n in all) per task; below that, threading costs more.
template <class F>
void for_rows(std::size_t rows, std::size_t n, ThreadPool* pool, F&& f, std::size_t min_work_per_task = 1 << 14) {
  if (!pool || pool->size() == 1 || rows < 2 || rows * n < 2 * min_work_per_task) {
    f(std::size_t(0), rows);
    return;
  }
  const std::size_t tasks = std::min(rows, pool->size());
  pool->parallel_for(tasks, [&](std::size_t t, std::size_t) {
    auto [b, e] = split_range(rows, tasks, t);
    if (b < e) f(b, e);
  });
}
}  // namespace detail

namespace detail {
/// Runs fn(task) for task in [0, n_tasks) on a temporary ThreadPool of up to max_threads threads (the
/// caller included; no more than the CPUs or the tasks), or on the calling thread alone when one thread
/// suffices or none can be started. For one-off work outside a Session: the load steps (reading a file,
/// zero-filling a large buffer, repacking weights), where the first touch of fresh memory dominates and
/// spreads over the cores. The first exception a task throws is rethrown once all tasks have run.
template <class Fn>
void run_once_parallel(std::size_t n_tasks, std::size_t max_threads, Fn&& fn) {
  const std::size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t n = std::min({max_threads, n_tasks, hw});
  if (n > 1) {
    std::unique_ptr<ThreadPool> pool;
    try {
      pool = std::make_unique<ThreadPool>(n);
    } catch (const std::system_error&) {  // no threads: the loop below
    }
    if (pool) {
      pool->parallel_for(n_tasks, [&](std::size_t t, std::size_t) { fn(t); });
      return;
    }
  }
  for (std::size_t t = 0; t < n_tasks; ++t) fn(t);
}
}  // namespace detail

/// The process-wide pool used when an op is not handed one: KILN_NUM_THREADS threads if set, else
/// hardware_concurrency(). Created on first use.
inline ThreadPool& default_pool() {
  static ThreadPool pool([] {
    if (const char* s = std::getenv("KILN_NUM_THREADS")) {
      const long n = std::strtol(s, nullptr, 10);
      if (n >= 1 && n <= 1024) return static_cast<std::size_t>(n);
    }
    return std::size_t(0);
  }());
  return pool;
}

}  // namespace kiln
