// bench/bench_attention.cpp - one prompt attention task (32 query rows of one head, head_dim 64, an f16
// cache of kv_len positions, causal, the chunk's rows at the last positions) as the transformer runs it:
//   tiled: kiln::attention (ops/attention.hpp: tiles of 64 positions, online softmax);
//   twopass: what it replaced: S = q K^T (kiln::matmul), causal softmax in place, out = S V (matmul with
//            V viewed column-major), with a (32, kv_len) score buffer;
//   BM_attention_amx: the tiled kernel with its two products on AMX bf16 tiles (AttentionOptions::amx_bf16;
//            every operand in two bf16 parts: 3 tile products per 16 x 16 x 32, to read against
//            BM_matmul_amx_bf16_peak / 3), the transformer's task there: `heads` query heads of one KV head
//            (SmolLM2: 3) at attn_amx_rows(64) / heads positions each; skipped where AMX-BF16 is not usable.
// GFLOP/s counts 4 * rows * head_dim * kv_len (scores and values, an FMA as 2), to read against
// BM_matmul_fma_peak. One thread: the transformer runs one task per thread.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "bench_util.hpp"
#include "kiln/kiln.hpp"

namespace {

namespace kb = kiln::bench;

void attention_task(benchmark::State& state, bool tiled, bool amx, std::size_t kv_len, std::size_t heads = 1) {
  const std::size_t hd = 64, rows = amx ? kiln::detail::attn_amx_rows(hd) / heads : 32;
  uint32_t s = 7;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(s)) * (1.0f / 2147483648.0f);
  };
  std::vector<float> q(rows * heads * hd), out(rows * heads * hd), scores(rows * kv_len),
      scratch(kiln::attention_scratch_floats(hd));
  std::vector<kiln::f16> k(kv_len * hd), v(kv_len * hd);
  for (auto& x : q) x = next();
  for (auto& x : k) x = kiln::f16::from_bits(kiln::f32_to_f16_bits(next()));
  for (auto& x : v) x = kiln::f16::from_bits(kiln::f32_to_f16_bits(next()));
  const auto Q = kiln::make_tensor(q.data(), rows, heads * hd);
  const auto O = kiln::make_tensor(out.data(), rows, heads * hd);
  const auto K = kiln::make_tensor<const kiln::f16>(k.data(), kv_len, hd);
  const auto V = kiln::make_tensor<const kiln::f16>(v.data(), kv_len, hd);
  const auto Vt = kiln::make_strided<const kiln::f16, 2>(v.data(), {hd, kv_len}, {1, std::ptrdiff_t(hd)});
  const auto S = kiln::make_tensor(scores.data(), rows, kv_len);
  const std::size_t pos0 = kv_len - rows;
  for (auto _ : state) {
    if (tiled) {
      kiln::attention(
          Q, K, V, O,
          {.scale = 0.125f, .causal = true, .pos0 = pos0, .scratch = scratch, .amx_bf16 = amx, .heads = heads});
    } else {
      kiln::matmul(Q, K, S);
      kiln::softmax(S, S, {.scale = 0.125f, .causal = true, .causal_offset = std::ptrdiff_t(pos0)});
      kiln::matmul(S, Vt, O);
    }
    benchmark::DoNotOptimize(out.data());
  }
  kb::set_flops(state, 4.0 * double(rows * heads) * double(hd) * double(kv_len));
}

void BM_attention(benchmark::State& state) {
  attention_task(state, state.range(0) == 0, false, static_cast<std::size_t>(state.range(1)));
}
void BM_attention_amx(benchmark::State& state) {
  if (!kiln::amx_bf16_active()) {
    state.SkipWithError("no AMX-BF16 usable (or switched off): nothing to measure");
    return;
  }
  attention_task(state, true, true, static_cast<std::size_t>(state.range(0)), static_cast<std::size_t>(state.range(1)));
}
BENCHMARK(BM_attention_amx)
    ->ArgNames({"kv_len", "heads"})
    ->ArgsProduct({{512, 2048, 8192}, {1, 3}})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_attention)
    ->ArgNames({"twopass", "kv_len"})
    ->ArgsProduct({{0, 1}, {512, 2048, 8192}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
