// bench/read_bandwidth.hpp - the STREAM-like memory read loop shared by kiln-bench (BM_memory_read, the
// roofline of its summary table) and kiln-bench-e2e (--read-bandwidth, the roofline of the side-by-side
// comparison with llama.cpp). Header-only, no Google Benchmark.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::bench {

// 32 bytes of integers; may_alias because it reads buffers of any type. (A 64-byte vector type made GCC 12's
// AVX2 clone keep the sums on the stack and move them through general registers: 9 GB/s on a Zen 3 core that
// reads 20 GB/s, so every roofline figure on AVX2 machines before session 20 understated the bandwidth.)
using U64x4 = uint64_t __attribute__((vector_size(32), may_alias));

// The read loop must not be the bottleneck: compiled for AVX-512 and AVX2 too (the baseline SSE2 build
// of this loop peaks near 17 GB/s even from L1), picked at load time.
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_BENCH_CLONES
#endif

/// Sums `bytes` bytes (a multiple of 128 * S) from S streams that start bytes / S apart: per stream and
/// 128 bytes, four loads into four independent sums (registers: 4 S of them).
template <int S>
KILN_BENCH_CLONES uint64_t read_streams(const char* base, std::size_t bytes) {
  const std::size_t per = bytes / S;
  U64x4 a[S][4];
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < 4; ++j) a[s][j] = U64x4{};
  for (std::size_t off = 0; off < per; off += 128) {
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s) {
      const auto* p = reinterpret_cast<const U64x4*>(base + static_cast<std::size_t>(s) * per + off);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) a[s][j] += p[j];
    }
  }
  U64x4 t = U64x4{};
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < 4; ++j) t += a[s][j];
  uint64_t r = 0;
  for (int i = 0; i < 4; ++i) r ^= t[i];
  return r;
}

}  // namespace kiln::bench
