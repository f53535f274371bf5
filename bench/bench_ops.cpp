// bench/bench_ops.cpp - the memory-bound row ops (rms_norm, softmax, rope, swiglu) on 4096-wide rows.
//
// Each iteration works in place on the next 128 MiB slice (swiglu: out of place, see there) of bench_util's 512 MiB buffer, so a slice is
// touched again only after 384 MiB of other traffic (more than the L3 of the machines kiln targets) and
// its data comes from memory. Bytes counted: every element read once and written once (swiglu: two
// inputs read, one output written). The target is >= 70% of BM_memory_read at the same thread count.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"

namespace {

namespace kb = kiln::bench;

constexpr int64_t kRows = 8192, kWidth = 4096;  // 128 MiB of f32 per iteration

void BM_rms_norm(benchmark::State& state) {
  const std::size_t rows = std::size_t(state.range(1)), n = std::size_t(state.range(2));
  kb::RotatingSlices slices(rows * n);
  const std::vector<float> w(n, 1.0f);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    auto x = kiln::make_tensor(slices.next(), rows, n);
    kiln::rms_norm(x, kiln::make_tensor(w.data(), n), x, 1e-6f, kiln::NormWeight::plain, pool);
    benchmark::ClobberMemory();
  }
  kb::set_bytes(state, 2.0 * double(rows * n) * sizeof(float));
}
BENCHMARK(BM_rms_norm)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"rows", "n"}, {{kRows, kWidth}});
  b->Unit(benchmark::kMillisecond);
});

// range(3): 0 = plain, 1 = scale + soft-cap + causal mask (Gemma 2 attention scores).
void BM_softmax(benchmark::State& state) {
  const std::size_t rows = std::size_t(state.range(1)), n = std::size_t(state.range(2));
  kiln::SoftmaxOptions opt;
  if (state.range(3)) {
    opt.scale = 0.0625f;
    opt.softcap = 50.0f;
    opt.causal = true;
    opt.causal_offset = std::ptrdiff_t(n) - 64;  // 64-row query blocks: nearly every column kept
  }
  kb::RotatingSlices slices(rows * n);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    auto x = kiln::make_tensor(slices.next(), rows / 64, std::size_t(64), n);
    kiln::softmax(x, x, opt, pool);
    benchmark::ClobberMemory();
  }
  kb::set_bytes(state, 2.0 * double(rows * n) * sizeof(float));
}
BENCHMARK(BM_softmax)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"rows", "n", "capped"}, {{kRows, kWidth, 0}, {kRows, kWidth, 1}});
  b->Unit(benchmark::kMillisecond);
});

// rows = tokens, each (32 heads, 128 head_dim); range(3): 0 = neox, 1 = gptj.
void BM_rope(benchmark::State& state) {
  const std::size_t tokens = std::size_t(state.range(1)), n = std::size_t(state.range(2));
  const std::size_t head_dim = 128, heads = n / head_dim;
  kiln::RopeConfig cfg;
  cfg.theta = 500000.0f;
  cfg.style = state.range(3) ? kiln::RopeStyle::gptj : kiln::RopeStyle::neox;
  std::vector<std::int32_t> pos(tokens);
  for (std::size_t t = 0; t < tokens; ++t) pos[t] = std::int32_t(t);
  kb::RotatingSlices slices(tokens * n);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    auto x = kiln::make_tensor(slices.next(), tokens, heads, head_dim);
    kiln::rope(x, kiln::make_tensor(pos.data(), tokens), cfg, pool);
    benchmark::ClobberMemory();
  }
  kb::set_bytes(state, 2.0 * double(tokens * n) * sizeof(float));
}
BENCHMARK(BM_rope)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"tokens", "n", "gptj"}, {{kRows, kWidth, 0}, {kRows, kWidth, 1}});
  b->Unit(benchmark::kMillisecond);
});

// out = silu(gate) * up with gate, up and out the three parts of a (rows, 3n) buffer. Not in place: the
// product would shrink the data towards subnormals over the iterations. Bytes: two reads and one write
// (the write's read-for-ownership is not counted, so ~75% of the read bandwidth is the ceiling).
void BM_swiglu(benchmark::State& state) {
  const std::size_t rows = std::size_t(state.range(1)), n = std::size_t(state.range(2));
  kb::RotatingSlices slices(rows * 3 * n);
  kiln::ThreadPool* pool = kb::pool(state);
  for (auto _ : state) {
    auto buf = kiln::make_tensor(slices.next(), rows, 3 * n);
    kiln::swiglu(kiln::as_const(kiln::slice<1>(buf, 0, n)), kiln::as_const(kiln::slice<1>(buf, n, 2 * n)),
                 kiln::slice<1>(buf, 2 * n, 3 * n), pool);
    benchmark::ClobberMemory();
  }
  kb::set_bytes(state, 3.0 * double(rows * n) * sizeof(float));
}
BENCHMARK(BM_swiglu)->Apply([](benchmark::internal::Benchmark* b) {
  kb::threaded(b, {"rows", "n"}, {{kRows / 3, kWidth}});
  b->Unit(benchmark::kMillisecond);
});

}  // namespace
