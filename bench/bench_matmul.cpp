// bench/bench_matmul.cpp - kiln::matmul (C = A * B^T) side by side with Eigen and OpenBLAS.
//
// GEMV (M = 1, the decode step): B comes from memory, a different slice of a buffer larger than L3 each
//   iteration, so GB/s (weight bytes per second) compares with BM_memory_read in the summary table.
//   Shapes: 4096 x 4096 (a 7B-class projection) and SmolLM2-135M's MLP, K = 576 -> N = 1536 and back.
// GEMM (prefill): 128 x 4096 x 4096 and 512 x 512 x 512, operands reused (compute-bound), GFLOP/s; the
//   ceiling to read them against is BM_matmul_fma_peak (independent 512-bit FMAs in registers).
// Baselines: Eigen 3.4 (f32 only; its GEMM threads through OpenMP when the binary has it, its GEMV
//   never threads, so it runs at 1 thread), OpenBLAS cblas_sgemm / cblas_sgemv when found. OpenBLAS
//   0.3.21 does not recognise this Sapphire Rapids VM's CPU (it falls back to the SSE3 'Prescott' kernels):
//   run with OPENBLAS_CORETYPE=SkylakeX for its AVX-512 kernels.
// Kernels: kiln f32 / f16 / bf16 (Bf16Mode::exact) / bf16fast (Bf16Mode::fast) weights; f16packed /
// bf16packed: the same weights as PackedRows (ops/matmul.hpp; bit-identical results, other addresses).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// Eigen picks its SIMD width at compile time: bench/CMakeLists.txt builds this file with -march=native so
// that it uses AVX-512 here (kiln's kernels dispatch at run time as always). GCC 12 then reports a false
// -Wmaybe-uninitialized inside the AVX-512 intrinsics Eigen inlines (GCC bug 105593, fixed in 13).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#if KILN_BENCH_HAVE_OPENBLAS
#include <cblas.h>
#endif

#include "bench_util.hpp"
#include "kiln/core/amx.hpp"
#include "kiln/kiln.hpp"

namespace {

namespace kb = kiln::bench;

// ---- The f32 FMA peak: 16 independent 512-bit vfmadd231ps chains (latency 4, up to 2 per cycle) in inline
// asm, so that they stay in registers; 32 flops each. What a compute-bound f32 GEMM can reach at most.
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx512f"))) float fma_loop(std::size_t iters, float seed) {
  // Named variables, not an array: an array element bound to "+v" may be reloaded and stored around each
  // asm statement, which then measures store forwarding instead of the FMA units.
  __m512 c0 = _mm512_set1_ps(seed), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0, c9 = c0,
         c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
  for (std::size_t it = 0; it < iters; ++it) {
    __asm__ volatile(
        "vfmadd231ps %[b], %[a], %[c0]\n\tvfmadd231ps %[b], %[a], %[c1]\n\tvfmadd231ps %[b], %[a], %[c2]\n\t"
        "vfmadd231ps %[b], %[a], %[c3]\n\tvfmadd231ps %[b], %[a], %[c4]\n\tvfmadd231ps %[b], %[a], %[c5]\n\t"
        "vfmadd231ps %[b], %[a], %[c6]\n\tvfmadd231ps %[b], %[a], %[c7]"
        : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3), [c4] "+v"(c4), [c5] "+v"(c5), [c6] "+v"(c6),
          [c7] "+v"(c7)
        : [a] "v"(a), [b] "v"(b));
    __asm__ volatile(
        "vfmadd231ps %[b], %[a], %[c8]\n\tvfmadd231ps %[b], %[a], %[c9]\n\tvfmadd231ps %[b], %[a], %[c10]\n\t"
        "vfmadd231ps %[b], %[a], %[c11]\n\tvfmadd231ps %[b], %[a], %[c12]\n\tvfmadd231ps %[b], %[a], %[c13]\n\t"
        "vfmadd231ps %[b], %[a], %[c14]\n\tvfmadd231ps %[b], %[a], %[c15]"
        : [c8] "+v"(c8), [c9] "+v"(c9), [c10] "+v"(c10), [c11] "+v"(c11), [c12] "+v"(c12), [c13] "+v"(c13),
          [c14] "+v"(c14), [c15] "+v"(c15)
        : [a] "v"(a), [b] "v"(b));
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                               _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
                                 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                               _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
  alignas(64) float lanes[16];  // (not _mm512_reduce_add_ps: GCC 12's false -Wuninitialized, bug 105593)
  _mm512_store_ps(lanes, s);
  float sum = 0;
  for (float v : lanes) sum += v;
  return sum;
}
bool have_avx512f() { return __builtin_cpu_supports("avx512f"); }
#else
float fma_loop(std::size_t, float) { return 0; }
bool have_avx512f() { return false; }
#endif

// Flops per second of 2^18 iterations of fma_loop on every thread of the pool (~1 ms).
double fma_peak_once(std::size_t threads) {
  constexpr std::size_t kIters = std::size_t(1) << 18;
  kiln::ThreadPool* pool = kb::pool(threads);
  std::vector<float> sink(threads);
  const auto t0 = std::chrono::steady_clock::now();
  if (pool) pool->parallel_for(threads, [&](std::size_t t, std::size_t) { sink[t] = fma_loop(kIters, float(t)); });
  else sink[0] = fma_loop(kIters, 0.f);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink.data());
  return double(threads) * double(kIters) * 16.0 * 32.0 / sec;
}

// The best of 30 short runs per thread count (a short run is rarely preempted on a shared machine).
void BM_matmul_fma_peak(benchmark::State& state) {
  if (!have_avx512f()) {
    state.SkipWithError("no AVX-512 on this CPU");
    return;
  }
  const std::size_t threads = kb::threads(state);
  double best = 0;
  for (auto _ : state) best = std::max(best, fma_peak_once(threads));
  for (int r = 0; r < 30; ++r) best = std::max(best, fma_peak_once(threads));
  state.counters[kb::kFlopsCounter] = benchmark::Counter(best);
}
BENCHMARK(BM_matmul_fma_peak)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b);
  b->Unit(benchmark::kMillisecond)->Iterations(10);
});
// ---- The AMX bf16 peak: full tiles (16 x 16 f32 sums of 32 bf16 products each: 16384 flops per tdpbf16ps)
// into 4 independent accumulator tiles from 2 A and 2 B tiles loaded once (as bench_qmatmul.cpp's int8 peak).
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("amx-tile,amx-bf16"))) float amx_bf16_loop(std::size_t iters, float) {
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
  alignas(64) uint16_t a[16 * 32];
  alignas(64) float c[16 * 16];
  for (auto& v : a) v = 0x3c00;  // bf16 2^-7: sums stay finite
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, a, 64);
  _tile_loadd(7, a, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (std::size_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float sum = 0;
  _tile_stored(0, c, 64);
  for (float v : c) sum += v;
  _tile_stored(3, c, 64);
  for (float v : c) sum += v;
  _tile_release();
  return sum;
}
#else
float amx_bf16_loop(std::size_t, float) { return 0; }
#endif

// Flops per second of 2^12 x 4 tdpbf16ps on every thread of the pool (~1 ms).
double amx_bf16_peak_once(std::size_t threads) {
  constexpr std::size_t kIters = std::size_t(1) << 12;
  kiln::ThreadPool* pool = kb::pool(threads);
  std::vector<float> sink(threads);
  const auto t0 = std::chrono::steady_clock::now();
  if (pool) pool->parallel_for(threads, [&](std::size_t t, std::size_t) { sink[t] = amx_bf16_loop(kIters, 0.f); });
  else sink[0] = amx_bf16_loop(kIters, 0.f);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink.data());
  return double(threads) * double(kIters) * 4.0 * 16384.0 / sec;
}

// The best of 30 short runs per thread count.
void BM_matmul_amx_bf16_peak(benchmark::State& state) {
  if (!kiln::amx_support().usable_bf16()) {
    state.SkipWithError("no usable AMX-BF16 on this CPU (or the OS refused the tile state)");
    return;
  }
  const std::size_t threads = kb::threads(state);
  double best = 0;
  for (auto _ : state) best = std::max(best, amx_bf16_peak_once(threads));
  for (int r = 0; r < 30; ++r) best = std::max(best, amx_bf16_peak_once(threads));
  state.counters[kb::kFlopsCounter] = benchmark::Counter(best);
}
BENCHMARK(BM_matmul_amx_bf16_peak)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b);
  b->Unit(benchmark::kMillisecond)->Iterations(10);
});

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class W { f32, f16, bf16, bf16fast, f16packed, bf16packed, f16amx, bf16amx };

// B as packed rows (ops/matmul.hpp) for the *packed and *amx variants (any bytes are a valid packed matrix).
constexpr bool is_packed(W w) { return w == W::f16packed || w == W::bf16packed || w == W::f16amx || w == W::bf16amx; }

// 512 MiB of 16-bit weights, each a normal number both as f16 and as bf16 (f16 exponents 13..15,
// i.e. |x| in [2^-2, 2)): the f16 and bf16 GEMVs read it as their weights without denormal slow paths.
constexpr std::size_t kBig16Bytes = std::size_t(512) << 20;
uint16_t* big_buffer16() {
  struct Free {
    void operator()(uint16_t* p) const { std::free(p); }
  };
  static std::unique_ptr<uint16_t, Free> buf = [] {
    const std::size_t n = kBig16Bytes / 2;
    auto* p = static_cast<uint16_t*>(std::aligned_alloc(64, kBig16Bytes));
    if (!p) std::abort();
    uint32_t s = 777;
    for (std::size_t i = 0; i < n; ++i) {
      s = s * 1664525u + 1013904223u;
      const uint32_t r = s >> 8;
      p[i] = uint16_t(((r & 1u) << 15) | ((13u + (r >> 1) % 3u) << 10) | ((r >> 3) & 0x3ffu));
    }
    return std::unique_ptr<uint16_t, Free>(p);
  }();
  return buf.get();
}

// Successive slices of `elems` weights of type T, so each iteration reads B from memory: f32 through
// bench::RotatingSlices (bench::big_buffer()), f16 / bf16 from big_buffer16() the same way.
template <class T>
class WeightSlices {
 public:
  explicit WeightSlices(std::size_t elems) : elems_((elems + 31) / 32 * 32), f32_(sizeof(T) == 4 ? elems_ : 1) {
    slots_ = kBig16Bytes / 2 / elems_;
    if (slots_ == 0) std::abort();
    // Fill the buffers now, outside the timed loop.
    if constexpr (sizeof(T) == 4) benchmark::DoNotOptimize(kb::big_buffer());
    else benchmark::DoNotOptimize(big_buffer16());
  }
  const T* next() {
    if constexpr (sizeof(T) == 4) return f32_.next();
    else return reinterpret_cast<const T*>(big_buffer16() + (next_++ % slots_) * elems_);
  }

 private:
  std::size_t elems_, slots_ = 1, next_ = 0;
  kb::RotatingSlices f32_;
};

std::vector<float> random_vector(std::size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(seed)) * (1.0f / 2147483648.0f);
  }
  return v;
}

template <class T>
std::vector<T> random_weights(std::size_t n, uint32_t seed) {
  const auto f = random_vector(n, seed);
  std::vector<T> w(n);
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, float>) w[i] = f[i];
    else w[i] = T(f[i]);
  }
  return w;
}

template <W kW>
using WeightT = std::conditional_t<
    kW == W::f32, float,
    std::conditional_t<kW == W::f16 || kW == W::f16packed || kW == W::f16amx, kiln::f16, kiln::bf16>>;

template <W kW>
kiln::MatmulOptions options() {
  return {.accumulate = false,
          .bf16 = kW == W::bf16fast ? kiln::Bf16Mode::fast : kiln::Bf16Mode::exact,
          .amx_bf16 = kW == W::f16amx || kW == W::bf16amx};
}

// ---- GEMV: y (1, n) = x (1, k) * W^T, W (n, k) streamed from memory.

template <W kW>
void BM_matmul_gemv(benchmark::State& state) {
  using T = WeightT<kW>;
  const std::size_t n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
  const auto x = random_vector(k, 1);
  std::vector<float> y(n);
  WeightSlices<T> slices(n * k);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    if constexpr (is_packed(kW))
      kiln::matmul(kiln::make_tensor(x.data(), 1, k), kiln::PackedRows<const T>{slices.next(), n, k},
                   kiln::make_tensor(y.data(), 1, n), options<kW>(), pool);
    else
      kiln::matmul(kiln::make_tensor(x.data(), 1, k), kiln::make_tensor(slices.next(), n, k),
                   kiln::make_tensor(y.data(), 1, n), options<kW>(), pool);
    benchmark::DoNotOptimize(y.data());
  }
  kb::set_bytes(state, double(n * k * sizeof(T)));
  kb::set_flops(state, 2.0 * double(n * k));
}

#if KILN_BENCH_HAVE_OPENBLAS
void BM_openblas_gemv(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
  openblas_set_num_threads(int(kb::threads(state)));
  const auto x = random_vector(k, 1);
  std::vector<float> y(n);
  WeightSlices<float> slices(n * k);
  for (auto _ : state) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n), int(k), 1.0f, slices.next(), int(k), x.data(), 1, 0.0f, y.data(),
                1);
    benchmark::DoNotOptimize(y.data());
  }
  kb::set_bytes(state, double(n * k * sizeof(float)));
  kb::set_flops(state, 2.0 * double(n * k));
}
#endif

// (n, k): 4096 x 4096, SmolLM2-135M up/gate (576 -> 1536) and down (1536 -> 576) projections, the
// synthetic 1B llama's gate/up (2048 -> 5632) and down (5632 -> 2048).
void gemv_args(benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"n", "k"}, {{4096, 4096}, {1536, 576}, {576, 1536}, {5632, 2048}, {2048, 5632}});
  b->Unit(benchmark::kMicrosecond);
}
void gemv_args_1thread(benchmark::internal::Benchmark* b) {  // Eigen's GEMV does not thread
  b->ArgNames({"threads", "n", "k"});
  for (auto nk : {std::pair{4096, 4096}, {1536, 576}, {576, 1536}}) b->Args({1, nk.first, nk.second});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_matmul_gemv<W::f32>)->Name("BM_matmul_gemv_f32")->Apply(gemv_args);
BENCHMARK(BM_matmul_gemv<W::f16>)->Name("BM_matmul_gemv_f16")->Apply(gemv_args);
BENCHMARK(BM_matmul_gemv<W::bf16>)->Name("BM_matmul_gemv_bf16")->Apply(gemv_args);
BENCHMARK(BM_matmul_gemv<W::bf16fast>)->Name("BM_matmul_gemv_bf16fast")->Apply(gemv_args);
BENCHMARK(BM_matmul_gemv<W::f16packed>)->Name("BM_matmul_gemv_f16packed")->Apply(gemv_args);
BENCHMARK(BM_matmul_gemv<W::bf16packed>)->Name("BM_matmul_gemv_bf16packed")->Apply(gemv_args);
#if KILN_BENCH_HAVE_OPENBLAS
BENCHMARK(BM_openblas_gemv)->Apply(gemv_args);
#endif

// ---- Decoding attention's scores: s (group, n) = q (group, head_dim) * K^T, K (n, head_dim) f16 as in the
// KV cache (one layer's KV head; reused across iterations, so from cache), on the calling thread.
void BM_matmul_attn_scores(benchmark::State& state) {
  const std::size_t group = std::size_t(state.range(0)), n = std::size_t(state.range(1)),
                    hd = std::size_t(state.range(2));
  const auto q = random_vector(group * hd, 1);
  std::vector<kiln::f16> keys(n * hd);
  const auto kf = random_vector(n * hd, 2);
  for (std::size_t i = 0; i < keys.size(); ++i) keys[i] = kiln::f16(kf[i]);
  std::vector<float> s(group * n);
  for (auto _ : state) {
    kiln::matmul(kiln::make_tensor(q.data(), group, hd),
                 kiln::make_tensor(static_cast<const kiln::f16*>(keys.data()), n, hd),
                 kiln::make_tensor(s.data(), group, n));
    benchmark::DoNotOptimize(s.data());
  }
  kb::set_flops(state, 2.0 * double(group * n * hd));
}
// (group, n, head_dim): SmolLM2-135M (3 query heads per KV head, 64), Gemma 3 270M (4, 256), the 1B llama
// (1, 64), stories260K (2, 8), at 512 and 2048 cached positions.
BENCHMARK(BM_matmul_attn_scores)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"group", "n", "hd"});
  for (int64_t n : {512, 2048})
    for (auto gh : {std::pair<int64_t, int64_t>{3, 64},
                    {4, 256},
                    {1, 64},
                    {4, 128},
                    {2, 128},
                    {1, 128},
                    {2, 64},
                    {4, 64},
                    {1, 256},
                    {2, 8}})
      b->Args({gh.first, n, gh.second});
  b->Unit(benchmark::kMicrosecond);
});

// The same with K from memory, as in a decode step at depth (K of every head and layer streams through the
// caches once per token): each iteration takes the next of the KV heads' keys in a 256 MiB pool, n = 1024
// (the transformer's positions per decode task).
// 256 MiB of f16 cache values in KV heads of `head` elements (so that a benchmark taking the next head each
// iteration reads it from memory); `heads` is set to their count.
kiln::Buffer<kiln::f16> kv_pool(std::size_t head, std::size_t& heads) {
  heads = (std::size_t{256} << 20) / (head * sizeof(kiln::f16));
  kiln::Buffer<kiln::f16> pool(heads * head);
  for (std::size_t i = 0; i < pool.size(); ++i) pool.data()[i] = kiln::f16(float(int(i % 251) - 125) * (1.0f / 128));
  return pool;
}

void BM_matmul_attn_scores_mem(benchmark::State& state) {
  const std::size_t group = std::size_t(state.range(0)), n = std::size_t(state.range(1)),
                    hd = std::size_t(state.range(2));
  std::size_t heads = 0;
  const auto pool = kv_pool(n * hd, heads);
  const auto q = random_vector(group * hd, 1);
  std::vector<float> s(group * n);
  std::size_t next = 0;
  for (auto _ : state) {
    const kiln::f16* k = pool.data() + (next++ % heads) * n * hd;
    kiln::matmul(kiln::make_tensor(q.data(), group, hd), kiln::make_tensor(k, n, hd),
                 kiln::make_tensor(s.data(), group, n));
    benchmark::DoNotOptimize(s.data());
  }
  kb::set_bytes(state, double(n * hd * sizeof(kiln::f16)));
  kb::set_flops(state, 2.0 * double(group * n * hd));
}
BENCHMARK(BM_matmul_attn_scores_mem)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"group", "n", "hd"});
  for (auto gh : {std::pair<int64_t, int64_t>{3, 64}, {1, 64}, {4, 64}, {2, 128}, {4, 256}})
    b->Args({gh.first, 1024, gh.second});
  b->Unit(benchmark::kMicrosecond);
});

// ---- Decoding attention's values: out (group, head_dim) = s (group, n) * V, V f16 as the KV cache holds it:
// position-major (n, head_dim), matmul's column-major B (layout 0, since session 23), or transposed (head_dim,
// n) with rows 2048 positions apart (layout 1, the cache before session 23). Each iteration takes the next of
// the heads in a 256 MiB pool, so V comes from memory, as in a decode step (the weights stream through the
// caches between two tokens); KILN_BENCH_HOT=1 in the environment: always the first head, from cache.
void BM_matmul_attn_values(benchmark::State& state) {
  const std::size_t group = std::size_t(state.range(0)), n = std::size_t(state.range(1)),
                    hd = std::size_t(state.range(2));
  const bool transposed = state.range(3) != 0;
  constexpr std::size_t kCtx = 2048;
  const std::size_t head = (transposed ? kCtx : n) * hd;
  std::size_t heads = 0;
  const auto pool = kv_pool(head, heads);
  const auto sv = random_vector(group * n, 3);
  std::vector<float> out(group * hd);
  std::size_t next = 0;
  for (auto _ : state) {
    static const bool hot = std::getenv("KILN_BENCH_HOT") != nullptr;
    const kiln::f16* v = pool.data() + (hot ? 0 : next++ % heads) * head;
    const auto b = transposed ? kiln::make_strided<const kiln::f16, 2>(v, {hd, n}, {std::ptrdiff_t(kCtx), 1})
                              : kiln::make_strided<const kiln::f16, 2>(v, {hd, n}, {1, std::ptrdiff_t(hd)});
    kiln::matmul(kiln::make_tensor(sv.data(), group, n), b, kiln::make_tensor(out.data(), group, hd));
    benchmark::DoNotOptimize(out.data());
  }
  kb::set_bytes(state, double(n * hd * sizeof(kiln::f16)));
  kb::set_flops(state, 2.0 * double(group * n * hd));
}
// (group, n, head_dim, layout): the 1B llama (1, 64), SmolLM2-135M (3, 64), Gemma 3 270M (4, 256), at 256 and
// 2048 cached positions.
BENCHMARK(BM_matmul_attn_values)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"group", "n", "hd", "vt"});
  for (int64_t n : {256, 2048})
    for (auto gh : {std::pair<int64_t, int64_t>{1, 64}, {3, 64}, {4, 256}})
      for (int64_t vt : {0, 1}) b->Args({gh.first, n, gh.second, vt});
  b->Unit(benchmark::kMicrosecond);
});

// ---- The same two products over a q8_0 KV cache (dispatch::matmul_q8_0: rows of GGUF Q8_0 blocks, 34 bytes per
// 32 values, widened to f32 in registers; dispatch::matmul_q8_0_int: the scores as integer dot products), K and
// V from a 256 MiB pool as in BM_matmul_attn_scores_mem and BM_matmul_attn_values (vt 0): bytes are the blocks
// read, so GB/s compare with the f16 cache's at 0.53x the bytes.
kiln::Buffer<kiln::block_q8_0> kv_pool_q8(std::size_t head_blocks, std::size_t& heads) {
  heads = (std::size_t{256} << 20) / (head_blocks * sizeof(kiln::block_q8_0));
  kiln::Buffer<kiln::block_q8_0> pool(heads * head_blocks);
  for (std::size_t i = 0; i < pool.size(); ++i) {
    kiln::block_q8_0& b = pool.data()[i];
    b.d = kiln::f16(float(1 + i % 7) * (1.0f / 1024));
    for (std::size_t j = 0; j < kiln::QK8_0; ++j) b.qs[j] = int8_t(int((i * 31 + j * 7) % 255) - 127);
  }
  return pool;
}
void BM_attn_q8_0_mem(benchmark::State& state) {
  const std::size_t group = std::size_t(state.range(0)), n = std::size_t(state.range(1)),
                    hd = std::size_t(state.range(2));
  const int op = int(state.range(3));
  const bool scattered = state.range(4) != 0;
  const std::size_t bpr = hd / kiln::QK8_0;  // blocks per position
  std::size_t heads = 0;
  const auto pool = kv_pool_q8(n * bpr, heads);
  const auto a = random_vector(group * std::max(n, hd), 1);
  std::vector<float> c(group * std::max(n, hd));
  std::size_t next = 0;
  for (auto _ : state) {
    // Consecutive heads (one stream through the pool) or scattered ones (a new stream each call, as a decode
    // step's calls are: each reads another layer's or KV head's part).
    static const bool hot = std::getenv("KILN_BENCH_HOT") != nullptr;  // one head, cached: the kernels alone
    const std::size_t h = hot ? 0 : scattered ? (next++ * 7919) % heads : next++ % heads;
    const kiln::block_q8_0* b = pool.data() + h * n * bpr;
    if (op == 1)  // out (group, hd) = s (group, n) V
      kiln::dispatch::matmul_q8_0(a.data(), std::ptrdiff_t(n), b, std::ptrdiff_t(bpr), c.data(), std::ptrdiff_t(hd),
                                  group, hd, n, kiln::detail::kMatmulColMajorB);
    else if (op == 4)  // the same with the weights in int16 (the integer kernel on AVX3_DL)
      kiln::dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(n), b, std::ptrdiff_t(bpr), c.data(), std::ptrdiff_t(hd),
                                      group, hd, n, 2, kiln::detail::kMatmulColMajorB);
    else  // s (group, n) = q (group, hd) K^T: q in f32 (op 0), in two 8-bit parts (2) or one (3)
      kiln::dispatch::matmul_q8_0_int(a.data(), std::ptrdiff_t(hd), b, std::ptrdiff_t(bpr), c.data(), std::ptrdiff_t(n),
                                      group, n, hd, op == 0 ? 0u : 4u - unsigned(op), 0);
    benchmark::DoNotOptimize(c.data());
  }
  kb::set_bytes(state, double(n * bpr * sizeof(kiln::block_q8_0)));
  kb::set_flops(state, 2.0 * double(group * n * hd));
}
// (group, n, head_dim, op, scattered): op 0, 2, 3 the scores (f32 q, fast's two parts, fast8's one: the integer
// kernel on AVX3_DL) at the shapes of BM_matmul_attn_scores_mem, op 1 and 4 the values (f32 weights, int16
// weights: the integer kernel on AVX3_DL) at n = 1024 (a decode task's positions) and 2048.
BENCHMARK(BM_attn_q8_0_mem)->Apply([](benchmark::internal::Benchmark* b) {
  b->ArgNames({"group", "n", "hd", "op", "scattered"});
  for (int64_t sc : {0, 1})
    for (auto gh : {std::pair<int64_t, int64_t>{3, 64}, {1, 64}, {4, 64}, {2, 128}, {4, 256}})
      for (int64_t op : {0, 2, 3}) b->Args({gh.first, 1024, gh.second, op, sc});
  for (int64_t sc : {0, 1})
    for (auto gh : {std::pair<int64_t, int64_t>{3, 64}, {1, 64}, {4, 64}, {2, 128}, {4, 256}})
      for (int64_t op : {1, 4}) b->Args({gh.first, 1024, gh.second, op, sc});
  for (auto gh : {std::pair<int64_t, int64_t>{1, 64}, {3, 64}, {4, 256}})
    for (int64_t op : {1, 4}) b->Args({gh.first, 2048, gh.second, op, 0});
  b->Unit(benchmark::kMicrosecond);
});

// ---- GEMM: C (m, n) = A (m, k) * B^T, B (n, k); operands reused across iterations.

template <W kW>
void BM_matmul_gemm(benchmark::State& state) {
  using T = WeightT<kW>;
  const std::size_t m = std::size_t(state.range(1)), n = std::size_t(state.range(2)), k = std::size_t(state.range(3));
  const auto a = random_vector(m * k, 1);
  const auto b = random_weights<T>(n * k, 2);
  std::vector<float> c(m * n);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    if constexpr (is_packed(kW))
      kiln::matmul(kiln::make_tensor(a.data(), m, k), kiln::PackedRows<const T>{b.data(), n, k},
                   kiln::make_tensor(c.data(), m, n), options<kW>(), pool);
    else
      kiln::matmul(kiln::make_tensor(a.data(), m, k), kiln::make_tensor(b.data(), n, k),
                   kiln::make_tensor(c.data(), m, n), options<kW>(), pool);
    benchmark::DoNotOptimize(c.data());
  }
  kb::set_flops(state, 2.0 * double(m) * double(n) * double(k));
}

#if KILN_BENCH_HAVE_OPENBLAS
void BM_openblas_gemm(benchmark::State& state) {
  const std::size_t m = std::size_t(state.range(1)), n = std::size_t(state.range(2)), k = std::size_t(state.range(3));
  openblas_set_num_threads(int(kb::threads(state)));
  const auto a = random_vector(m * k, 1), b = random_vector(n * k, 2);
  std::vector<float> c(m * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, a.data(), int(k), b.data(),
                int(k), 0.0f, c.data(), int(n));
    benchmark::DoNotOptimize(c.data());
  }
  kb::set_flops(state, 2.0 * double(m) * double(n) * double(k));
}
#endif

void gemm_args(benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"m", "n", "k"}, {{128, 4096, 4096}, {512, 512, 512}});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_matmul_gemm<W::f32>)->Name("BM_matmul_gemm_f32")->Apply(gemm_args);
BENCHMARK(BM_matmul_gemm<W::f16>)->Name("BM_matmul_gemm_f16")->Apply(gemm_args);
BENCHMARK(BM_matmul_gemm<W::bf16>)->Name("BM_matmul_gemm_bf16")->Apply(gemm_args);
BENCHMARK(BM_matmul_gemm<W::bf16fast>)->Name("BM_matmul_gemm_bf16fast")->Apply(gemm_args);
BENCHMARK(BM_matmul_gemm<W::f16packed>)->Name("BM_matmul_gemm_f16packed")->Apply(gemm_args);
BENCHMARK(BM_matmul_gemm<W::bf16packed>)->Name("BM_matmul_gemm_bf16packed")->Apply(gemm_args);

// The AMX bf16 GEMM (MatmulOptions::amx_bf16; kernels/matmul/amx_bf16-inl.h) against the f32 GEMM on the same
// packed weights, at the 1B models' shape (N = K = 2048) for prompts of 128 and 512 rows. 'of_peak' is the
// rate over the bf16 tile peak (BM_matmul_amx_bf16_peak), counting 2 M N K flops; f16 weights take three tile
// products per output block and K step, bf16 two (docs/kernels.md).
void amx_gemm_args(benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"m", "n", "k"}, {{128, 2048, 2048}, {512, 2048, 2048}});
  b->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_matmul_gemm<W::f16packed>)->Name("BM_matmul_gemm_f16packed")->Apply(amx_gemm_args);
BENCHMARK(BM_matmul_gemm<W::f16amx>)->Name("BM_matmul_gemm_f16amx")->Apply(amx_gemm_args);
BENCHMARK(BM_matmul_gemm<W::bf16packed>)->Name("BM_matmul_gemm_bf16packed")->Apply(amx_gemm_args);
BENCHMARK(BM_matmul_gemm<W::bf16amx>)->Name("BM_matmul_gemm_bf16amx")->Apply(amx_gemm_args);
#if KILN_BENCH_HAVE_OPENBLAS
BENCHMARK(BM_openblas_gemm)->Apply(gemm_args);
#endif

// ---- Eigen (f32).

void BM_eigen_gemv(benchmark::State& state) {
  const std::size_t n = std::size_t(state.range(1)), k = std::size_t(state.range(2));
  const auto x = random_vector(k, 1);
  std::vector<float> y(n);
  WeightSlices<float> slices(n * k);
  Eigen::Map<const Eigen::VectorXf> ex(x.data(), Eigen::Index(k));
  Eigen::Map<Eigen::VectorXf> ey(y.data(), Eigen::Index(n));
  for (auto _ : state) {
    Eigen::Map<const RowMat> ew(slices.next(), Eigen::Index(n), Eigen::Index(k));
    ey.noalias() = ew * ex;
    benchmark::DoNotOptimize(y.data());
  }
  kb::set_bytes(state, double(n * k * sizeof(float)));
  kb::set_flops(state, 2.0 * double(n * k));
}

void BM_eigen_gemm(benchmark::State& state) {
  const std::size_t m = std::size_t(state.range(1)), n = std::size_t(state.range(2)), k = std::size_t(state.range(3));
#ifdef _OPENMP
  Eigen::setNbThreads(int(kb::threads(state)));
#else
  if (kb::threads(state) > 1) {
    state.SkipWithError("Eigen threads need OpenMP (this binary is built without it)");
    return;
  }
#endif
  const auto a = random_vector(m * k, 1), b = random_vector(n * k, 2);
  std::vector<float> c(m * n);
  Eigen::Map<const RowMat> ea(a.data(), Eigen::Index(m), Eigen::Index(k)),
      eb(b.data(), Eigen::Index(n), Eigen::Index(k));
  Eigen::Map<RowMat> ec(c.data(), Eigen::Index(m), Eigen::Index(n));
  for (auto _ : state) {
    ec.noalias() = ea * eb.transpose();
    benchmark::DoNotOptimize(c.data());
  }
  kb::set_flops(state, 2.0 * double(m) * double(n) * double(k));
#ifdef _OPENMP
  Eigen::setNbThreads(1);
#endif
}

BENCHMARK(BM_eigen_gemv)->Apply(gemv_args_1thread);
BENCHMARK(BM_eigen_gemm)->Apply(gemm_args);

}  // namespace
