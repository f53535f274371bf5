// bench/bench_qmatmul.cpp - quantized GEMV (1 x 4096 x 4096) and GEMM (128 x 4096 x 4096) for Q8_0, Q4_0,
// Q4_1, Q4_K, Q6_K and MXFP4 weights, at 1 and 2 threads.
//
// GEMV is memory-bound: its bytes are the weight bytes per call (set_bytes), so the summary's 'of read'
// column is the fraction of BM_memory_read's bandwidth. The weights rotate through 512 MiB of copies (more
// than the last-level cache), so every call reads them from memory, like a decode step (KILN_BENCH_HOT=1: the
// same copy every call, from cache: what the kernel's instructions cost without the memory stream).
// GEMM is compute-bound: its GFLOP/s column counts 2 M N K integer operations per call (GOPS), and the
// counter 'of_vnni' is that rate over the vpdpbusd peak measured in this binary (BM_qmatmul_vnni_peak: a
// tight loop of independent 512-bit vpdpbusd, 128 ops each, on every thread); where AMX is on, 'of_amx' is
// the rate over the tile peak (BM_qmatmul_amx_peak: independent full-tile tdpbusd, 32768 ops each). --amx
// (bench_main.cpp) runs the GEMMs on the tiles for the A/B comparison.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.hpp"
#include "kiln/core/amx.hpp"
#include "kiln/kiln.hpp"
#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/ops/qmatmul.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

constexpr std::size_t kN = 4096, kK = 4096;
constexpr std::size_t kPoolBytes = std::size_t(512) << 20;

// ---- The vpdpbusd peak ----

#if defined(__x86_64__) && defined(__GNUC__)
// 16 independent accumulators hide the latency (5 cycles) at up to 2 per cycle; the loop body is inline asm
// so the accumulators stay in registers (as C++ the compiler may spill the array). Returns a checksum.
__attribute__((target("avx512vnni,avx512bw,avx512vl,avx512f"))) int64_t vnni_loop(std::size_t iters, int seed) {
  __m512i c0 = _mm512_set1_epi32(seed), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0,
          c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
  const __m512i a = _mm512_set1_epi32(0x03030303), b = _mm512_set1_epi32(seed | 1);
  for (std::size_t it = 0; it < iters; ++it) {
    __asm__ volatile(  // two statements: an asm takes at most 30 operands ("+v" counts twice)
        "vpdpbusd %[b], %[a], %[c0]\n\tvpdpbusd %[b], %[a], %[c1]\n\tvpdpbusd %[b], %[a], %[c2]\n\t"
        "vpdpbusd %[b], %[a], %[c3]\n\tvpdpbusd %[b], %[a], %[c4]\n\tvpdpbusd %[b], %[a], %[c5]\n\t"
        "vpdpbusd %[b], %[a], %[c6]\n\tvpdpbusd %[b], %[a], %[c7]"
        : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3), [c4] "+v"(c4), [c5] "+v"(c5), [c6] "+v"(c6),
          [c7] "+v"(c7)
        : [a] "v"(a), [b] "v"(b));
    __asm__ volatile(
        "vpdpbusd %[b], %[a], %[c8]\n\tvpdpbusd %[b], %[a], %[c9]\n\tvpdpbusd %[b], %[a], %[c10]\n\t"
        "vpdpbusd %[b], %[a], %[c11]\n\tvpdpbusd %[b], %[a], %[c12]\n\tvpdpbusd %[b], %[a], %[c13]\n\t"
        "vpdpbusd %[b], %[a], %[c14]\n\tvpdpbusd %[b], %[a], %[c15]"
        : [c8] "+v"(c8), [c9] "+v"(c9), [c10] "+v"(c10), [c11] "+v"(c11), [c12] "+v"(c12), [c13] "+v"(c13),
          [c14] "+v"(c14), [c15] "+v"(c15)
        : [a] "v"(a), [b] "v"(b));
  }
  const __m512i s =
      _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                                        _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7))),
                       _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)),
                                        _mm512_add_epi32(_mm512_add_epi32(c12, c13), _mm512_add_epi32(c14, c15))));
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, s);
  int64_t sum = 0;
  for (int32_t v : lanes) sum += v;
  return sum;
}
bool have_vnni() { return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"); }
#else
int64_t vnni_loop(std::size_t, int) { return 0; }
bool have_vnni() { return false; }
#endif

constexpr std::size_t kPeakIters = std::size_t(1) << 18;  // x 16 x 128 ops per thread (~1 ms)

// Ops per second of `iters` iterations of loop(iters, thread) (each `ops_per_iter` operations) run on every
// thread of the pool.
template <class Loop>
double peak_once(std::size_t threads, std::size_t iters, double ops_per_iter, Loop loop) {
  kiln::ThreadPool* pool = kiln::bench::pool(threads);
  std::vector<int64_t> sink(threads);
  const auto t0 = std::chrono::steady_clock::now();
  if (pool) pool->parallel_for(threads, [&](std::size_t t, std::size_t) { sink[t] = loop(iters, int(t)); });
  else sink[0] = loop(iters, 0);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink.data());
  return double(threads) * double(iters) * ops_per_iter / s;
}

// The best of 30 short measurements per thread count (a short run is rarely preempted on a shared
// machine), cached per `cache` (one map per unit): the peak benchmarks report it and the GEMM benchmarks'
// 'of_vnni' / 'of_amx' divide by it.
template <class Once>
double best_peak(std::map<std::size_t, double>& cache, std::size_t threads, Once once) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(threads);
  if (it != cache.end()) return it->second;
  double best = 0;
  for (int r = 0; r < 30; ++r) best = std::max(best, once(threads));
  return cache[threads] = best;
}

double vnni_peak_once(std::size_t threads) { return peak_once(threads, kPeakIters, 16.0 * 128.0, vnni_loop); }
double vnni_peak(std::size_t threads) {
  static std::map<std::size_t, double> peaks;
  return best_peak(peaks, threads, vnni_peak_once);
}

void BM_qmatmul_vnni_peak(benchmark::State& state) {
  if (!have_vnni()) {
    state.SkipWithError("no AVX512-VNNI on this CPU");
    return;
  }
  const std::size_t threads = kiln::bench::threads(state);
  for (auto _ : state) benchmark::DoNotOptimize(vnni_peak_once(threads));
  // The rate shown (GFLOP/s column: integer ops) is the best of vnni_peak's short runs.
  state.counters[kiln::bench::kFlopsCounter] = benchmark::Counter(vnni_peak(threads));
}
BENCHMARK(BM_qmatmul_vnni_peak)->Apply([](benchmark::internal::Benchmark* b) {
  kiln::bench::threaded(b);
  b->Unit(benchmark::kMillisecond)->Iterations(10);
});

// ---- The AMX int8 peak ----

#if defined(__x86_64__) && defined(__GNUC__)
// Full tiles (16 rows x 64 bytes, 16 x 16 int32 sums: 32768 ops per tdpbusd) into 4 independent
// accumulator tiles from 2 A and 2 B tiles loaded once. The 64-byte configuration is written by hand.
__attribute__((target("amx-tile,amx-int8"))) int64_t amx_loop(std::size_t iters, int seed) {
  struct alignas(64) Cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));  // GCC 12's _tile_loadconfig lets the stores above be dropped
  alignas(64) uint8_t a[16 * 64];
  alignas(64) int32_t c[16 * 16];
  std::memset(a, seed | 1, sizeof(a));
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, a, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::size_t it = 0; it < iters; ++it) {
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  int64_t sum = 0;
  _tile_stored(0, c, 64);
  for (int32_t v : c) sum += v;
  _tile_stored(3, c, 64);
  for (int32_t v : c) sum += v;
  _tile_release();
  return sum;
}
#else
int64_t amx_loop(std::size_t, int) { return 0; }
#endif

constexpr std::size_t kAmxIters = std::size_t(1) << 12;  // x 4 x 32768 ops per thread (~1 ms)

double amx_peak_once(std::size_t threads) { return peak_once(threads, kAmxIters, 4.0 * 32768.0, amx_loop); }
double amx_peak(std::size_t threads) {
  static std::map<std::size_t, double> peaks;
  return best_peak(peaks, threads, amx_peak_once);
}

void BM_qmatmul_amx_peak(benchmark::State& state) {
  if (!kiln::amx_support().usable_int8()) {
    state.SkipWithError("no usable AMX int8 on this CPU (or the OS refused the tile state)");
    return;
  }
  const std::size_t threads = kiln::bench::threads(state);
  for (auto _ : state) benchmark::DoNotOptimize(amx_peak_once(threads));
  state.counters[kiln::bench::kFlopsCounter] = benchmark::Counter(amx_peak(threads));
}
BENCHMARK(BM_qmatmul_amx_peak)->Apply([](benchmark::internal::Benchmark* b) {
  kiln::bench::threaded(b);
  b->Unit(benchmark::kMillisecond)->Iterations(10);
});

// ---- What a tile store, load or product takes from the vector ports ----
// The prompt GEMM's tile sums reach its f32 epilogue through tilestored and vector loads. This loop runs 96
// independent vpermd per iteration (port 5 only: one per cycle), alone or beside one 1 KiB tilestored, one
// tileloadd or one full-tile tdpbusd of tiles nothing else uses. The extra time in vpermd-cycles
// ('p5_cycles_per_store', '_load', '_tdp') is what the tile instruction takes from port 5.
#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 reports a false (-W)uninitialized inside the AVX-512 intrinsics (GCC bug 105593, fixed in 13).
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <int kTile>  // 0: vpermd only, 1: + tilestored, 2: + tileloadd, 3: + tdpbusd
__attribute__((target("avx512f,amx-tile,amx-int8"))) int64_t amx_port_loop(std::size_t iters, int seed) {
  struct alignas(64) Cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette = 1;
  for (int t = 0; t < 4; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
  alignas(64) int32_t buf[256];
  for (int i = 0; i < 256; ++i) buf[i] = seed + i;
  _tile_loadd(0, buf, 64);  // (GCC's tile macros paste the tile number: no loop)
  _tile_loadd(1, buf, 64);
  _tile_loadd(2, buf, 64);
  _tile_loadd(3, buf, 64);
  __m512i a[24];
  for (int i = 0; i < 24; ++i) a[i] = _mm512_set1_epi32(seed + i);
  const __m512i idx = _mm512_set1_epi32(seed & 15);
  for (std::size_t it = 0; it < iters; ++it) {
    if constexpr (kTile == 1) _tile_stored(0, buf, 64);
    if constexpr (kTile == 2) _tile_loadd(0, buf, 64);
    if constexpr (kTile == 3) _tile_dpbusd(1, 2, 3);
#pragma GCC unroll 96
    for (int k = 0; k < 96; ++k) a[k % 24] = _mm512_permutexvar_epi32(idx, a[k % 24]);
    __asm__ volatile("" : : : "memory");
  }
  _tile_release();
  int64_t sum = buf[seed & 255];
  for (const __m512i& v : a) sum += _mm512_reduce_add_epi32(v);
  return sum;
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#else
template <int kTile>
int64_t amx_port_loop(std::size_t, int) {
  return 0;
}
#endif

void BM_qmatmul_amx_tile_ports(benchmark::State& state) {
  if (!kiln::amx_support().usable_int8()) {
    state.SkipWithError("no usable AMX int8 on this CPU (or the OS refused the tile state)");
    return;
  }
  constexpr std::size_t kIters = std::size_t(1) << 14;
  auto best_ns = [](auto loop) {  // ns per iteration, the best of 30 short runs (rarely preempted)
    double best = 1e30;
    for (int r = 0; r < 30; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(loop(kIters, r));
      best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    return best / double(kIters);
  };
  double none = 0, store = 0, load = 0, tdp = 0;
  for (auto _ : state) {
    none = best_ns(amx_port_loop<0>);
    store = best_ns(amx_port_loop<1>);
    load = best_ns(amx_port_loop<2>);
    tdp = best_ns(amx_port_loop<3>);
  }
  const double cycle = none / 96.0;  // one vpermd per cycle
  state.counters["vpermd_ns"] = cycle;
  state.counters["p5_cycles_per_store"] = (store - none) / cycle;
  state.counters["p5_cycles_per_load"] = (load - none) / cycle;
  state.counters["p5_cycles_per_tdp"] = (tdp - none) / cycle;
}
BENCHMARK(BM_qmatmul_amx_tile_ports)->Unit(benchmark::kMillisecond)->Iterations(1);

// ---- Weights ----

// One 512 MiB buffer holding copies of a (kN, kK) weight matrix of the type last asked for. Each iteration
// reads the next copy (from memory, as a decode step does); with KILN_BENCH_HOT=1 in the environment always the
// first (cache-resident after the first iteration: the kernel's compute alone).
struct WeightPool {
  kiln::Buffer<std::byte> buf{kPoolBytes};
  uint32_t type = ~0u;
  bool interleaved = false;  // the copies in 16-row interleaved groups (quant/interleave.hpp)
  std::size_t bytes = 0, copies = 0, next = 0;
  const std::byte* rotate() {
    static const bool hot = std::getenv("KILN_BENCH_HOT") != nullptr;
    return buf.data() + (hot ? 0 : (next++ % copies) * bytes);
  }
};

WeightPool& shared_pool() {
  static WeightPool pool;
  return pool;
}

template <class B>
WeightPool& weights(bool interleaved = false) {
  WeightPool& pool = shared_pool();  // one buffer for all types, refilled when the type or layout changes
  constexpr uint32_t type = kiln::dtype_traits<B>::ggml_type;
  if (pool.type != type || pool.interleaved != interleaved) {
    const std::size_t row = kK / kiln::block_size_v<B> * sizeof(B);
    pool.bytes = kiln::detail::align_up(kN * row);
    pool.copies = kPoolBytes / pool.bytes;
    // Random floats with a spread of magnitudes, quantized once (Q6_K has no quantizer in kiln: random
    // quants with sane f16 scales), then copied.
    std::vector<float> f(kK);
    uint32_t s = 1234;
    auto* w = reinterpret_cast<B*>(pool.buf.data());
    for (std::size_t j = 0; j < kN; ++j) {
      for (auto& v : f) {
        s = s * 1664525u + 1013904223u;
        v = float(int32_t(s)) * (1.0f / 2147483648.0f) * (1.0f + float(j % 7));
      }
      if constexpr (kiln::Quantizable<B>) {
        kiln::quantize_row(f.data(), w + j * (kK / kiln::block_size_v<B>), kK);
      } else {
        auto* bytes = reinterpret_cast<uint8_t*>(w + j * (kK / kiln::block_size_v<B>));
        for (std::size_t i = 0; i < row; ++i) bytes[i] = uint8_t(int32_t(f[i % kK] * 127.f));
        for (std::size_t b = 0; b < kK / kiln::block_size_v<B>; ++b)
          w[j * (kK / kiln::block_size_v<B>)+b].d = kiln::f16(0.01f);
      }
    }
    if constexpr (kiln::kernels::qmm_interleavable_v<B>) {
      if (interleaved) kiln::kernels::qmm_interleave_rows_in_place(w, kN, kK / kiln::block_size_v<B>);
    }
    for (std::size_t c = 1; c < pool.copies; ++c)
      std::memcpy(pool.buf.data() + c * pool.bytes, pool.buf.data(), kN * row);
    pool.type = type;
    pool.interleaved = interleaved;
  }
  return pool;
}

// m rows of x through kiln::qmatmul (one activation part, row-major W), or through qmatmul_multi with
// `parts` and W row-major or interleaved.
template <class B>
void run_qmatmul(benchmark::State& state, std::size_t m, kiln::kernels::ActParts parts = kiln::kernels::ActParts::one,
                 bool interleaved = false, bool multi = false, bool exact = false, bool i16 = false) {
  WeightPool& wp = weights<B>(interleaved);
  const std::size_t nb = kK / kiln::block_size_v<B>;
  static std::vector<float> x = [] {
    std::vector<float> v(128 * kK);
    uint32_t s = 99;
    for (auto& e : v) {
      s = s * 1664525u + 1013904223u;
      e = float(int32_t(s)) * (1.0f / 2147483648.0f);
    }
    return v;
  }();
  std::vector<float> y(m * kN);
  kiln::ThreadPool* pool = kiln::bench::pool(state);
  const auto xt = kiln::make_tensor<const float>(x.data(), m, kK);
  const auto yt = kiln::make_tensor(y.data(), m, kN);
  for (auto _ : state) {
    const auto* w = reinterpret_cast<const B*>(wp.rotate());
    if (i16) {  // x in 16-bit integers (Precision::fast's prompts on AVX2)
      kiln::kernels::qmatmul_i16(xt, kiln::dtype_traits<B>::ggml_type, w, kN, 0, yt, pool,
                                 {.interleaved = interleaved});
    } else if (exact) {  // Precision::exact: f32 products with the dequantized weights
      kiln::kernels::dequant_matmul(xt, kiln::dtype_traits<B>::ggml_type, w, kN, 0, yt, pool,
                                    {.interleaved = interleaved});
    } else if (multi) {
      const kiln::kernels::QmmWeight wt{kiln::dtype_traits<B>::ggml_type, w, kN, 0, interleaved};
      kiln::kernels::qmatmul_multi(xt, std::span<const kiln::kernels::QmmWeight>(&wt, 1),
                                   std::span<const decltype(yt)>(&yt, 1), pool, parts);
    } else {
      kiln::qmatmul(xt, kiln::make_tensor(w, kN, nb), yt, pool);
    }
    benchmark::ClobberMemory();
  }
  const double wbytes = double(kN * nb * sizeof(B));
  const double ops = 2.0 * double(m) * double(kN) * double(kK);
  kiln::bench::set_bytes(state, wbytes);
  kiln::bench::set_flops(state, ops);
  if (m > 1 && have_vnni())
    state.counters["of_vnni"] = benchmark::Counter(
        ops * double(state.iterations()) / vnni_peak(kiln::bench::threads(state)), benchmark::Counter::kIsRate);
  if (m > 1 && kiln::amx_active())
    state.counters["of_amx"] = benchmark::Counter(
        ops * double(state.iterations()) / amx_peak(kiln::bench::threads(state)), benchmark::Counter::kIsRate);
}

template <class B>
void register_type(const char* name) {
  benchmark::RegisterBenchmark((std::string("BM_qmatmul_gemv_") + name).c_str(), [](benchmark::State& s) {
    run_qmatmul<B>(s, 1);
  })->Apply([](benchmark::internal::Benchmark* b) {
    kiln::bench::threaded(b, {"m", "n", "k"}, {{1, int64_t(kN), int64_t(kK)}});
    b->Unit(benchmark::kMicrosecond);
  });
  benchmark::RegisterBenchmark((std::string("BM_qmatmul_gemm_") + name).c_str(), [](benchmark::State& s) {
    run_qmatmul<B>(s, 128);
  })->Apply([](benchmark::internal::Benchmark* b) {
    kiln::bench::threaded(b, {"m", "n", "k"}, {{128, int64_t(kN), int64_t(kK)}});
    b->Unit(benchmark::kMillisecond);
  });
}

// Variants through qmatmul_multi: _x16 interleaved W, 2 two activation parts (the model's default); exact_:
// dequant_matmul (Precision::exact's f32 products), W row-major or interleaved; gemv4: 4 rows of x (a
// SessionGroup step of 4 sequences); i16_: qmatmul_i16 (x in 16-bit integers: AVX2's prompts, and its Q8_0
// decode GEMV, Q8_0 only: i16_gemv_x16_q8_0 against gemv2_x16_q8_0, i16_gemv4_x16_q8_0 against
// gemv2_m4_x16_q8_0). gemm2_ against exact_gemm_ is the choice behind dispatch::qmatmul_split_f32_min_rows
// (Precision::fast's prompts through the f32 GEMM on AVX2).
template <class B>
void register_multi(const char* name) {
  struct V {
    const char* tag;
    std::size_t m;
    kiln::kernels::ActParts parts;
    bool x16;
    bool exact = false;
    bool i16 = false;
  };
  for (const V v :
       {V{"gemv_x16_", 1, kiln::kernels::ActParts::one, true}, V{"gemv2_", 1, kiln::kernels::ActParts::two, false},
        V{"gemv2_x16_", 1, kiln::kernels::ActParts::two, true},
        V{"gemv2_m4_x16_", 4, kiln::kernels::ActParts::two, true},
        V{"gemm_x16_", 128, kiln::kernels::ActParts::one, true}, V{"gemm2_", 128, kiln::kernels::ActParts::two, false},
        V{"gemm2_x16_", 128, kiln::kernels::ActParts::two, true},
        V{"exact_gemv_", 1, kiln::kernels::ActParts::one, false, true},
        V{"exact_gemv_x16_", 1, kiln::kernels::ActParts::one, true, true},
        V{"exact_gemv4_x16_", 4, kiln::kernels::ActParts::one, true, true},
        V{"exact_gemm_", 128, kiln::kernels::ActParts::one, false, true},
        V{"exact_gemm_x16_", 128, kiln::kernels::ActParts::one, true, true},
        V{"i16_gemv_x16_", 1, kiln::kernels::ActParts::one, true, false, true},
        V{"i16_gemv4_x16_", 4, kiln::kernels::ActParts::one, true, false, true},
        V{"i16_gemm_", 128, kiln::kernels::ActParts::one, false, false, true},
        V{"i16_gemm_x16_", 128, kiln::kernels::ActParts::one, true, false, true}}) {
    if (v.x16 && !kiln::kernels::qmm_interleavable_v<B>) continue;
    if (v.i16 && !kiln::detail::qmm_i16_supported(kiln::dtype_traits<B>::ggml_type)) continue;
    if (v.i16 && v.m < 128 && !std::is_same_v<B, kiln::block_q8_0>) continue;  // the GEMV: Q8_0's
    auto* b = benchmark::RegisterBenchmark(
        (std::string("BM_qmatmul_") + v.tag + name).c_str(),
        [v](benchmark::State& s) { run_qmatmul<B>(s, v.m, v.parts, v.x16, true, v.exact, v.i16); });
    kiln::bench::threaded(b, {"m", "n", "k"}, {{int64_t(v.m), int64_t(kN), int64_t(kK)}});
    b->Unit(v.m > 1 ? benchmark::kMillisecond : benchmark::kMicrosecond);
  }
}

const bool registered = [] {
  register_multi<kiln::block_q8_0>("q8_0");
  register_multi<kiln::block_q4_0>("q4_0");
  register_multi<kiln::block_q4_1>("q4_1");
  register_multi<kiln::block_q5_0>("q5_0");
  register_multi<kiln::block_q4_K>("q4_K");
  register_multi<kiln::block_q6_K>("q6_K");
  register_multi<kiln::block_mxfp4>("mxfp4");
  register_type<kiln::block_q8_0>("q8_0");
  register_type<kiln::block_q4_0>("q4_0");
  register_type<kiln::block_q4_1>("q4_1");
  register_type<kiln::block_q4_K>("q4_K");
  register_type<kiln::block_q5_K>("q5_K");
  register_type<kiln::block_q6_K>("q6_K");
  register_type<kiln::block_mxfp4>("mxfp4");
  return true;
}();

}  // namespace
