// kiln/core/parallel.hpp - a small fork-join thread pool.
//
// ThreadPool(n) runs parallel_for(n_tasks, fn) on n threads: the caller plus n - 1 workers. Tasks are
// claimed from an atomic counter; fn(task, thread) receives the task index and the index of the thread
// running it (0 = caller). A parallel_for issued from inside a task runs inline on that thread. The first
// exception a task throws is rethrown to the caller once all tasks have finished.
// Chosen over OpenMP: the run-time thread count is per pool (a host program may keep several), no
// runtime library to link, and the waiting policy is ours to tune.
//
// Waiting is bounded in time, not in pause counts (a pause costs ~10x more cycles on recent Intel cores
// than on AMD ones). A worker spins after each job, kIdleSpin long, then sleeps (std::atomic::wait, a
// futex on Linux). A KeepAwake scope (one forward pass: a few hundred back-to-back jobs) stretches that
// spin to kAwakeSpin, so the next job finds the worker running: woken from sleep, it often arrived after
// the caller had claimed every task. The caller, done with its own tasks, spins up to kJoinSpin for the
// workers, then sleeps until the last one finishes.
//
// Contention: when another process keeps one of the pool's CPUs busy, a worker the OS preempts holds up
// every join for its time slice (milliseconds, against jobs of microseconds); decode at 2 threads then ran
// at a third of its speed alone. So the caller watches its joins: a wait over kStraggle that is also
// longer than the caller's own share of the job counts as a straggle, and two within kStraggleWindow jobs
// make the pool run its jobs on the caller alone for a while (starting at kSoloMin, doubling up to kSoloMax
// while the straggles recur). The tasks and thread indices a job sees do not change, only which OS thread
// runs them, so results are the same bits either way. The guard is for pools of 2 threads: one thread of
// n alone does 1/n of the work, which past 2 loses more than the straggles cost (benching only the
// straggling worker would suit larger pools).
//
// Spinning threads must not share a CPU: a worker the OS runs on the submitting thread's CPU spins away the
// time slice that thread needs. Linux sometimes places a woken worker there (seen on a 2-core VM: ~300
// context switches and a 128-token stories260K prompt in ~26 ms instead of ~1.1 ms, for ~70 ms until the
// load balancer split them). So a worker that finds itself on the submitter's CPU moves off it once (its
// affinity mask without that CPU, then the original mask back), when the mask leaves room for every thread.
//
// KILN_POOL_STATS=1 prints each pool's counters to stderr when it is destroyed (jobs, tasks the workers
// ran, jobs where they ran none, sleeps, straggles, jobs run alone).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
    stats_on_ = [] {
      const char* s = std::getenv("KILN_POOL_STATS");
      return s && *s && *s != '0';
    }();
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
  ~ThreadPool() {
    shutdown();
    if (stats_on_) print_stats();
  }

  std::size_t size() const { return n_threads_; }

  /// Counters since construction, for tests and tuning; read them from the submitting thread between jobs.
  struct Stats {
    uint64_t jobs = 0;       ///< parallel_for calls that reached the workers' path (more than one task)
    uint64_t solo_jobs = 0;  ///< ... of those, run on the caller alone by the contention guard
    uint64_t straggles = 0;  ///< joins held up by a worker (see the top of this header)
  };
  Stats stats() const {
    std::lock_guard<std::mutex> lock(submit_mu_);
    return {jobs_, solo_jobs_, straggles_};
  }

  /// While one is alive, the pool's workers spin up to kAwakeSpin between jobs before sleeping, instead
  /// of kIdleSpin: for a burst of back-to-back jobs (one forward pass). Scopes may nest and overlap.
  class KeepAwake {
   public:
    explicit KeepAwake(ThreadPool& pool) : pool_(&pool) { pool.awake_.fetch_add(1, std::memory_order_relaxed); }
    KeepAwake(const KeepAwake&) = delete;
    KeepAwake& operator=(const KeepAwake&) = delete;
    ~KeepAwake() { pool_->awake_.fetch_sub(1, std::memory_order_relaxed); }

   private:
    ThreadPool* pool_;
  };

  /// Runs fn(task, thread) for task in [0, n_tasks); returns when all are done.
  template <class Fn>
  void parallel_for(std::size_t n_tasks, Fn&& fn) {
    if (n_tasks == 0) return;
    if (n_threads_ == 1 || n_tasks == 1 || in_task()) {
      run_inline(n_tasks, fn, in_task() ? current_thread() : 0);
      return;
    }
    std::lock_guard<std::mutex> lock(submit_mu_);  // one job at a time per pool
    const int64_t t0 = now_ns();
    ++jobs_;
    if (t0 < solo_until_) {  // contended CPUs (see the top of this header): the same tasks, on the caller
      ++solo_jobs_;
      tls_thread() = 0;  // a nested parallel_for runs inline (the lock is held)
      try {
        run_inline(n_tasks, fn, 0);
      } catch (...) {
        tls_thread() = SIZE_MAX;
        throw;
      }
      tls_thread() = SIZE_MAX;
      return;
    }
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
    const std::size_t own = run_tasks(0);
    if (stats_on_) {
      tasks_ += n_tasks;
      worker_idle_jobs_ += own == n_tasks;
    }
    join(t0);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  // The waiting bounds (see the top of this header), in nanoseconds.
  static constexpr int64_t kIdleSpin = 250'000;     // a worker after a job, outside a KeepAwake
  static constexpr int64_t kAwakeSpin = 2'000'000;  // ... inside one
  static constexpr int64_t kJoinSpin = 200'000;     // the caller waiting for the workers
  static constexpr int64_t kStraggle = 250'000;
  static constexpr uint64_t kStraggleWindow = 64;  // jobs
  static constexpr int64_t kSoloMin = 8'000'000, kSoloMax = 256'000'000;
  static constexpr uint64_t kCalmJobs = 4096;  // parallel jobs without a straggle reset the solo time

  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  template <class Fn>
  static void run_inline(std::size_t n_tasks, Fn& fn, std::size_t self) {
    std::exception_ptr first;  // same contract as the threaded path: all tasks run, first error rethrown
    for (std::size_t t = 0; t < n_tasks; ++t) {
      try {
        fn(t, self);
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
  }

  // Waits for the workers (spin, then sleep), then judges the wait: see the top of this header.
  void join(int64_t t0) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    const int64_t t1 = now_ns();
    bool slept = false;
    for (unsigned i = 1; pending_.load(std::memory_order_acquire) != 0; ++i) {
      pause();
      if ((i & 31) == 0 && now_ns() - t1 > kJoinSpin) {
        ++join_sleeps_;
        slept = true;
        for (std::size_t p; (p = pending_.load(std::memory_order_acquire)) != 0;)
          pending_.wait(p, std::memory_order_acquire);
        break;
      }
    }
    static_assert(kJoinSpin < kStraggle);  // so a wait that ends while spinning is no straggle
    if (!slept) return;
    const int64_t t2 = now_ns(), wait = t2 - t1, own = t1 - t0;
    if (wait <= kStraggle || wait <= own) return;
    ++straggles_;
    if (n_threads_ != 2) return;
    if (last_straggle_ != 0 && jobs_ - last_straggle_ <= kStraggleWindow) {
      ++solo_trips_;
      solo_ns_ = solo_ns_ == 0 ? kSoloMin : std::min(solo_ns_ * 2, kSoloMax);
      solo_until_ = t2 + solo_ns_;
      last_straggle_ = 0;
    } else {
      if (last_straggle_ != 0 && jobs_ - last_straggle_ > kCalmJobs) solo_ns_ = 0;
      last_straggle_ = jobs_;
    }
  }

  void shutdown() {
    stop_.store(true, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_acq_rel);
    epoch_.notify_all();
    for (auto& t : workers_) t.join();
  }

  void print_stats() const {
    std::fprintf(stderr,
                 "kiln::ThreadPool(%zu): %llu jobs (%llu on the caller alone after %llu straggles, %llu "
                 "trips), %llu tasks, %llu by workers, %llu jobs the workers had no task of, %llu worker "
                 "sleeps, %llu join sleeps\n",
                 n_threads_, (unsigned long long)jobs_, (unsigned long long)solo_jobs_, (unsigned long long)straggles_,
                 (unsigned long long)solo_trips_, (unsigned long long)tasks_, (unsigned long long)worker_tasks_.load(),
                 (unsigned long long)worker_idle_jobs_, (unsigned long long)worker_sleeps_.load(),
                 (unsigned long long)join_sleeps_);
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

  // Runs tasks until none is left; returns how many this thread ran.
  std::size_t run_tasks(std::size_t thread) {
    tls_thread() = thread;
    std::size_t ran = 0;
    for (;; ++ran) {
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
    return ran;
  }

  void worker_loop(std::size_t thread) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t e = epoch_.load(std::memory_order_acquire);
      if (e == seen) {  // spin, up to a time bound, then sleep on the epoch
        const int64_t start = now_ns();
        for (unsigned i = 1; e == seen; ++i) {
          pause();
          e = epoch_.load(std::memory_order_acquire);
          if ((i & 31) == 0 && e == seen &&
              now_ns() - start > (awake_.load(std::memory_order_relaxed) > 0 ? kAwakeSpin : kIdleSpin))
            break;
        }
        while (e == seen) {
          if (stats_on_) worker_sleeps_.fetch_add(1, std::memory_order_relaxed);
          epoch_.wait(seen, std::memory_order_acquire);
          e = epoch_.load(std::memory_order_acquire);
        }
      }
      seen = e;
      if (stop_.load(std::memory_order_acquire)) return;
      if (const int cpu = submit_cpu_; cpu >= 0 && cpu == current_cpu()) move_off(cpu);
      const std::size_t ran = run_tasks(thread);
      if (stats_on_) worker_tasks_.fetch_add(ran, std::memory_order_relaxed);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::size_t n_threads_ = 1;
  std::vector<std::thread> workers_;
  mutable std::mutex submit_mu_;  // one job at a time; stats() reads the counters under it
  std::mutex error_mu_;
  void* job_ctx_ = nullptr;
  void (*job_fn_)(void*, std::size_t, std::size_t) = nullptr;
  std::size_t n_tasks_ = 0;
  bool spread_ = false;  // keep workers off the submitter's CPU (Linux, enough CPUs in the affinity mask)
  bool stats_on_ = false;
  int submit_cpu_ = -1;  // the submitting thread's CPU for the current job, or -1
  std::exception_ptr error_;
  // The caller's side (under submit_mu_): the contention watch and the counters.
  uint64_t jobs_ = 0, last_straggle_ = 0, straggles_ = 0, solo_trips_ = 0, solo_jobs_ = 0;
  uint64_t tasks_ = 0, worker_idle_jobs_ = 0, join_sleeps_ = 0;
  int64_t solo_until_ = 0, solo_ns_ = 0;
  std::atomic<uint64_t> worker_tasks_{0}, worker_sleeps_{0};
  alignas(64) std::atomic<uint64_t> epoch_{0};
  alignas(64) std::atomic<std::size_t> next_task_{0};
  alignas(64) std::atomic<std::size_t> pending_{0};
  alignas(64) std::atomic<int> awake_{0};
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
