// bench/read_bandwidth.hpp - the STREAM-like memory read loop shared by kiln-bench (BM_memory_read, the
// roofline of its summary table) and kiln-bench-e2e (--read-bandwidth, the roofline of the side-by-side
// comparison with llama.cpp). Header-only, no Google Benchmark.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::bench {

// 64 bytes of integers; may_alias because it reads buffers of any type.
using U64x8 = uint64_t __attribute__((vector_size(64), may_alias));

// The read loop must not be the bottleneck: compiled for AVX-512 and AVX2 too (the baseline SSE2 build
// of this loop peaks near 17 GB/s even from L1), picked at load time.
#if defined(__x86_64__) && defined(__GNUC__)
#define KILN_BENCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_BENCH_CLONES
#endif

/// Sums `bytes` bytes (a multiple of 128 * S) from S streams that start bytes / S apart.
template <int S>
KILN_BENCH_CLONES uint64_t read_streams(const char* base, std::size_t bytes) {
  const std::size_t per = bytes / S;
  U64x8 a[S], b[S];
  for (int s = 0; s < S; ++s) a[s] = b[s] = U64x8{};
  for (std::size_t off = 0; off < per; off += 128) {
    for (int s = 0; s < S; ++s) {
      const auto* p = reinterpret_cast<const U64x8*>(base + static_cast<std::size_t>(s) * per + off);
      a[s] += p[0];
      b[s] += p[1];
    }
  }
  U64x8 t = a[0] + b[0];
  for (int s = 1; s < S; ++s) t += a[s] + b[s];
  uint64_t r = 0;
  for (int i = 0; i < 8; ++i) r ^= t[i];
  return r;
}

}  // namespace kiln::bench
