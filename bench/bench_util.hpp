// bench/bench_util.hpp - conventions and helpers shared by every kiln-bench benchmark.
//
// Conventions (the summary table printed by bench_main.cpp relies on them):
//  - Every benchmark's FIRST argument is named `threads`: register with kiln::bench::threaded(), e.g.
//      BENCHMARK(BM_softmax)->Apply([](benchmark::internal::Benchmark* b) {
//        kiln::bench::threaded(b, {"rows", "n"}, {{16384, 4096}});
//      });
//    which adds one instance per thread count in kiln::bench::thread_counts() (1 and 2; override with
//    KILN_BENCH_THREADS=1,2,4), names the arguments and measures wall-clock time (UseRealTime).
//    Inside the benchmark: kiln::bench::threads(state) and kiln::bench::pool(state).
//  - Thread pools are created once per thread count and reused (pool(1) is nullptr: the op runs on the
//    calling thread, which is what kiln ops do when handed no pool).
//  - Throughput: set_bytes(state, bytes_per_iter) (bytes read + written from/to memory per iteration;
//    shown as bytes_per_second) and set_flops(state, flops_per_iter) (counter "GFLOP/s", a rate).
//  - big_buffer() is one 512 MiB buffer (more than this machine's L3) shared by the read-bandwidth
//    benchmark and any benchmark that wants its data to come from memory; rotating_slice() hands out
//    successive slices of it so consecutive iterations touch different memory.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/core/storage.hpp"

#include "kiln/core/parallel.hpp"

namespace kiln::bench {

/// The counter name set_flops() uses (the summary table reads it).
inline constexpr const char* kFlopsCounter = "GFLOP/s";
/// The function name of the read-bandwidth roofline benchmark (bench_main.cpp).
inline constexpr const char* kReadBandwidthName = "BM_memory_read";

/// Thread counts every benchmark runs at: KILN_BENCH_THREADS (comma-separated) or {1, 2}.
inline const std::vector<int64_t>& thread_counts() {
  static const std::vector<int64_t> counts = [] {
    std::vector<int64_t> v;
    if (const char* s = std::getenv("KILN_BENCH_THREADS")) {
      for (const char* p = s; *p;) {
        char* end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p) break;
        if (t >= 1 && t <= 1024) v.push_back(t);
        p = (*end == ',') ? end + 1 : end;
      }
    }
    if (v.empty()) v = {1, 2};
    return v;
  }();
  return counts;
}

/// Registers one instance per (argument set, thread count); `threads` is argument 0, then `names`.
inline void threaded(benchmark::internal::Benchmark* b, std::initializer_list<const char*> names = {},
                     std::initializer_list<std::vector<int64_t>> arg_sets = {{}}) {
  std::vector<std::string> all{"threads"};
  for (const char* n : names) all.emplace_back(n);
  b->ArgNames(all);
  for (const auto& args : arg_sets) {
    for (int64_t t : thread_counts()) {
      std::vector<int64_t> a{t};
      a.insert(a.end(), args.begin(), args.end());
      b->Args(a);
    }
  }
  b->UseRealTime();
}

inline std::size_t threads(const benchmark::State& state) { return static_cast<std::size_t>(state.range(0)); }

/// The pool for a thread count, created on first use and kept for the whole run; nullptr for 1.
inline ThreadPool* pool(std::size_t n_threads) {
  static std::mutex mu;
  static std::map<std::size_t, std::unique_ptr<ThreadPool>> pools;
  if (n_threads <= 1) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  auto& p = pools[n_threads];
  if (!p) p = std::make_unique<ThreadPool>(n_threads);
  return p.get();
}
inline ThreadPool* pool(const benchmark::State& state) { return pool(threads(state)); }

/// Bytes moved to or from memory per iteration (reads + writes), reported as bytes_per_second.
inline void set_bytes(benchmark::State& state, double bytes_per_iter) {
  state.SetBytesProcessed(static_cast<int64_t>(bytes_per_iter * static_cast<double>(state.iterations())));
}

/// Floating-point operations per iteration (an FMA counts 2), reported as the rate "GFLOP/s".
inline void set_flops(benchmark::State& state, double flops_per_iter) {
  state.counters[kFlopsCounter] =
      benchmark::Counter(flops_per_iter * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

/// 512 MiB of 64-byte-aligned floats in [-1, 1), allocated and written once (so it is paged in), on
/// transparent huge pages as kiln's own weight buffers are (kiln::detail::aligned_alloc_bytes).
inline constexpr std::size_t kBigBufferBytes = std::size_t(512) << 20;
inline float* big_buffer() {
  struct Free {
    void operator()(float* p) const { kiln::detail::aligned_free(p); }
  };
  static std::unique_ptr<float, Free> buf = [] {
    const std::size_t n = kBigBufferBytes / sizeof(float);
    auto* p = static_cast<float*>(kiln::detail::aligned_alloc_bytes(kBigBufferBytes));
    uint32_t s = 12345;
    for (std::size_t i = 0; i < n; ++i) {
      s = s * 1664525u + 1013904223u;  // LCG: cheap, deterministic
      p[i] = static_cast<float>(static_cast<int32_t>(s)) * (1.0f / 2147483648.0f);
    }
    return std::unique_ptr<float, Free>(p);
  }();
  return buf.get();
}

/// Successive, non-overlapping slices of `floats` floats from big_buffer() (wrapping around): a slice
/// is touched again only after (slots() - 1) * floats * 4 bytes of other traffic, so when that exceeds
/// the L3 (128 MiB slices: 384 MiB) each iteration's data comes from memory. One cursor per object.
class RotatingSlices {
 public:
  explicit RotatingSlices(std::size_t floats) : floats_(floats) {
    if (floats_ > kBigBufferBytes / sizeof(float)) std::abort();
    slots_ = (kBigBufferBytes / sizeof(float)) / floats_;
  }
  float* next() { return big_buffer() + (next_++ % slots_) * floats_; }
  std::size_t slots() const { return slots_; }

 private:
  std::size_t floats_, slots_ = 1, next_ = 0;
};

}  // namespace kiln::bench
