// kiln/core/parallel.hpp: ThreadPool runs every task exactly once on a valid thread index, nests inline,
// propagates exceptions, survives many back-to-back small jobs, KeepAwake scopes and being destroyed while
// its workers spin, and its contention guard keeps that contract (run under ASan/UBSan by scripts/test.sh).
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "test_util.hpp"

using namespace kiln;

TEST_CASE("ThreadPool: every task runs exactly once, on a thread index below size()") {
  for (std::size_t threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t n : {0, 1, 2, 3, 4, 7, 64, 1000}) {
      CAPTURE(threads);
      CAPTURE(n);
      std::vector<std::atomic<int>> runs(n);
      std::atomic<bool> bad_thread{false};
      pool.parallel_for(n, [&](std::size_t task, std::size_t thread) {
        runs[task].fetch_add(1, std::memory_order_relaxed);
        if (thread >= threads) bad_thread = true;
      });
      std::size_t once = 0;
      for (auto& r : runs) once += r.load() == 1;
      CHECK(once == n);
      CHECK_FALSE(bad_thread.load());
    }
  }
}

TEST_CASE("ThreadPool: workers really run tasks, each thread index on one OS thread") {
  ThreadPool pool(4);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::vector<std::set<std::thread::id>> per_index(4);
  // Until a worker took part or 10 s passed: on a loaded machine the pool may run jobs on the caller alone
  // for a while (its contention guard), which is right, so the loop waits that out.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ids.size() < 2 && std::chrono::steady_clock::now() < until) {
    pool.parallel_for(64, [&](std::size_t, std::size_t thread) {
      std::lock_guard<std::mutex> g(mu);
      ids.insert(std::this_thread::get_id());
      per_index[thread].insert(std::this_thread::get_id());
      std::this_thread::yield();
    });
  }
  CHECK(ids.size() >= 2);                                                       // more than the caller took part
  for (const auto& id : per_index[0]) CHECK(id == std::this_thread::get_id());  // index 0 is the caller
  for (auto& s : per_index) CHECK(s.size() <= 1);
}

TEST_CASE("ThreadPool: a parallel_for inside a task runs inline on the same thread") {
  for (std::size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> inner_runs(8 * 16);
    std::atomic<bool> moved{false};
    pool.parallel_for(8, [&](std::size_t outer, std::size_t thread) {
      const auto me = std::this_thread::get_id();
      pool.parallel_for(16, [&](std::size_t inner, std::size_t inner_thread) {
        if (inner_thread != thread || std::this_thread::get_id() != me) moved = true;
        inner_runs[outer * 16 + inner].fetch_add(1);
      });
    });
    CHECK_FALSE(moved.load());
    std::size_t once = 0;
    for (auto& r : inner_runs) once += r.load() == 1;
    CHECK(once == inner_runs.size());
  }
}

TEST_CASE("ThreadPool: an exception in a task reaches the caller after all tasks finish, and the pool stays usable") {
  for (std::size_t threads : {1, 2, 4}) {
    CAPTURE(threads);
    ThreadPool pool(threads);
    std::atomic<int> ran{0};
    CHECK_THROWS_WITH_AS(pool.parallel_for(100,
                                           [&](std::size_t t, std::size_t) {
                                             ran.fetch_add(1);
                                             if (t == 37) throw std::runtime_error("task 37 failed");
                                           }),
                         "task 37 failed", std::runtime_error);
    CHECK(ran.load() == 100);  // the other tasks still ran
    // Several failing tasks: exactly one exception comes out.
    CHECK_THROWS_AS(pool.parallel_for(50,
                                      [](std::size_t t, std::size_t) {
                                        if (t % 5 == 0) throw kiln::Error("bad");
                                      }),
                    kiln::Error);
    std::atomic<int> after{0};
    pool.parallel_for(10, [&](std::size_t, std::size_t) { after.fetch_add(1); });
    CHECK(after.load() == 10);
  }
}

TEST_CASE("ThreadPool: many small jobs back to back give exact sums (races would lose updates)") {
  for (std::size_t threads : {2, 4}) {
    CAPTURE(threads);
    ThreadPool pool(threads);
    std::vector<std::size_t> slots(threads * 8);
    std::size_t total = 0, want = 0;
    for (std::size_t job = 0; job < 3000; ++job) {
      const std::size_t n = 1 + job % slots.size();
      // Each task writes only its own slot (plain stores: ASan/TSan see any overlap), then the caller reads.
      pool.parallel_for(n, [&](std::size_t t, std::size_t) { slots[t] = job * 1000 + t; });
      for (std::size_t t = 0; t < n; ++t) {
        total += slots[t];
        want += job * 1000 + t;
      }
    }
    CHECK(total == want);
  }
}

TEST_CASE("ThreadPool: jobs submitted from several threads at once are serialised correctly") {
  ThreadPool pool(3);
  std::atomic<std::size_t> sum{0};
  std::vector<std::thread> submitters;
  for (int s = 0; s < 3; ++s)
    submitters.emplace_back([&] {
      for (int j = 0; j < 200; ++j) pool.parallel_for(5, [&](std::size_t t, std::size_t) { sum.fetch_add(t + 1); });
    });
  for (auto& t : submitters) t.join();
  CHECK(sum.load() == 3u * 200u * 15u);
}

TEST_CASE("ThreadPool: KeepAwake scopes nest, overlap and outlive no job; results as without them") {
  for (std::size_t threads : {1, 2, 3}) {
    CAPTURE(threads);
    ThreadPool pool(threads);
    std::vector<std::size_t> out(97);
    auto fill = [&](std::size_t salt) {
      pool.parallel_for(out.size(), [&](std::size_t t, std::size_t) { out[t] = t * 31 + salt; });
      for (std::size_t t = 0; t < out.size(); ++t) REQUIRE(out[t] == t * 31 + salt);
    };
    fill(1);
    {
      const ThreadPool::KeepAwake a(pool);
      fill(2);
      {
        const ThreadPool::KeepAwake b(pool);
        fill(3);
      }
      fill(4);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin bound: workers sleep
      fill(5);
    }
    fill(6);
  }
}

TEST_CASE("ThreadPool: destroyed while its workers spin (in and out of a KeepAwake), several pools at once") {
  for (int rep = 0; rep < 50; ++rep) {
    auto a = std::make_unique<ThreadPool>(2);
    auto b = std::make_unique<ThreadPool>(3);
    std::atomic<int> sum{0};
    {
      const ThreadPool::KeepAwake awake(*a);
      a->parallel_for(8, [&](std::size_t, std::size_t) { sum.fetch_add(1); });
      b->parallel_for(8, [&](std::size_t, std::size_t) { sum.fetch_add(1); });
      // A task of one pool submitting to the other: a job of its own there, not inline.
      a->parallel_for(4, [&](std::size_t, std::size_t) {
        b->parallel_for(4, [&](std::size_t, std::size_t) { sum.fetch_add(1); });
      });
    }
    CHECK(sum.load() == 32);
    if (rep % 2) a.reset();  // right after the jobs: both pools' workers still spinning
    b.reset();
  }
}

// Makes the pool see joins held up by a worker (its task sleeps, as if the OS had preempted it), until a job
// runs on the caller alone (the pool's own count says so); returns whether that happened.
static bool provoke_solo(ThreadPool& pool) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    pool.parallel_for(2, [](std::size_t, std::size_t thread) {
      if (thread != 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    });
    const uint64_t solo = pool.stats().solo_jobs;
    pool.parallel_for(2, [](std::size_t, std::size_t) {});
    if (pool.stats().solo_jobs > solo) return true;
  }
  return false;
}

TEST_CASE("ThreadPool: straggling workers make jobs run on the caller alone for a while, same contract") {
  ThreadPool pool(2);
  // While alone: every task once, thread index 0 on the calling thread, nested jobs inline. The solo time is
  // bounded (milliseconds), so a loaded machine may end it before the checked job starts: then provoke again.
  const auto me = std::this_thread::get_id();
  bool checked = false;
  for (int attempt = 0; attempt < 20 && !checked; ++attempt) {
    REQUIRE(provoke_solo(pool));
    std::vector<std::atomic<int>> runs(16 * 4);
    std::atomic<bool> elsewhere{false};
    const uint64_t solo = pool.stats().solo_jobs;
    pool.parallel_for(16, [&](std::size_t outer, std::size_t thread) {
      if (thread != 0 || std::this_thread::get_id() != me) elsewhere = true;
      pool.parallel_for(4, [&](std::size_t inner, std::size_t) { runs[outer * 4 + inner].fetch_add(1); });
    });
    for (auto& r : runs) CHECK(r.load() == 1);
    if (pool.stats().solo_jobs == solo) continue;  // the workers ran it: the solo time had ended
    CHECK_FALSE(elsewhere.load());
    checked = true;
  }
  CHECK(checked);
  // Errors reach the caller after all tasks ran (alone or not: the same contract).
  REQUIRE(provoke_solo(pool));
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(pool.parallel_for(10,
                                         [&](std::size_t t, std::size_t) {
                                           ran.fetch_add(1);
                                           if (t == 3) throw std::runtime_error("task 3 failed");
                                         }),
                       "task 3 failed", std::runtime_error);
  CHECK(ran.load() == 10);
  // Then the workers come back (the solo time is bounded; a calm machine gets there within seconds).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool worker = false;
  while (!worker && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pool.parallel_for(64, [&](std::size_t, std::size_t thread) {
      if (thread != 0) worker = true;  // a plain store from one thread only: thread 1 is one OS thread
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  }
  CHECK(worker);
}

TEST_CASE("split_range: disjoint cover of 0..n in grain multiples, balanced") {
  for (std::size_t n : {0, 1, 5, 16, 17, 100, 1023}) {
    for (std::size_t parts : {1, 2, 3, 4, 7}) {
      for (std::size_t grain : {1, 4, 16}) {
        CAPTURE(n);
        CAPTURE(parts);
        CAPTURE(grain);
        std::size_t expect_begin = 0, min_units = SIZE_MAX, max_units = 0;
        for (std::size_t i = 0; i < parts; ++i) {
          auto [b, e] = split_range(n, parts, i, grain);
          CHECK(b == expect_begin);
          CHECK(e >= b);
          if (e != n) CHECK(e % grain == 0);
          expect_begin = e;
          const std::size_t units = (e - b + grain - 1) / grain;
          min_units = std::min(min_units, units);
          max_units = std::max(max_units, units);
        }
        CHECK(expect_begin == n);
        CHECK(max_units - min_units <= 1);
      }
    }
  }
}

TEST_CASE("default_pool: one shared pool") {
  CHECK(&default_pool() == &default_pool());
  CHECK(default_pool().size() >= 1);
}
