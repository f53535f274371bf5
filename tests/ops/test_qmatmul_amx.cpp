// The AMX int8 GEMM (kernels/qmatmul/x86/amx_gemm-inl.h) against the VNNI GEMM it replaces, bit for bit, and against
// the exact-integer reference (ref::qmatmul_int; bound as in test_qmatmul.cpp: 1e-5 * abs_terms), for
// both activation modes (one 8-bit part: qmatmul; two parts: qmatmul_split_act), odd shapes (m not a
// multiple of the 16-row tile, n not a multiple of the 16-column panel) and 1 or 2 threads. On a CPU without
// usable AMX these cases say "skipped: no AMX" and only the detection and switch checks run.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/amx.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "kiln/ops/qmatmul_ref.hpp"
#include "kiln/quant/interleave.hpp"
#include "amx_test_util.hpp"
#include "test_util.hpp"
#include "weights_util.hpp"

using namespace kiln;

namespace {

ThreadPool& amx_pool2() {
  static ThreadPool p(2);
  return p;
}

using AmxSwitchGuard = amx_test::SwitchGuard;

bool amx_or_skip() {
  if (amx_support().usable_int8()) return true;
  const AmxSupport& s = amx_support();
  MESSAGE("skipped: no AMX (cpuid tile ", s.tile, " int8 ", s.int8, ", OS tile state ", s.os_state, ", permission ",
          s.permitted, "): the VNNI GEMM runs instead");
  return false;
}

// Quantized random rows where quant_traits can quantize B; else random bytes with finite random scales.
template <class B>
std::vector<B> amx_weights(std::size_t n, std::size_t k, uint32_t seed) {
  constexpr std::size_t bs = block_size_v<B>;
  std::vector<B> w(n * (k / bs));
  std::mt19937 rng(seed);
  if constexpr (Quantizable<B>) {
    for (std::size_t r = 0; r < n; ++r) {
      auto f = test::random_floats(k, seed * 31 + uint32_t(r), -1.f, 1.f);
      for (auto& v : f) v *= 0.25f + float(r % 5);
      quantize_row(f.data(), w.data() + r * (k / bs), k);
    }
  } else {
    auto* bytes = reinterpret_cast<uint8_t*>(w.data());
    for (std::size_t i = 0; i < w.size() * sizeof(B); ++i) bytes[i] = uint8_t(rng());
    std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
    for (auto& b : w) {
      if constexpr (requires { b.e; }) {
        b.e = uint8_t(110 + rng() % 24);  // MXFP4: 2^-18 .. 2^5
      } else {
        b.d = f16(sc(rng));
        if constexpr (requires { b.dmin; }) b.dmin = f16(sc(rng) * 0.2f);
      }
    }
  }
  return w;
}

// y = x W^T with AMX on and off (1 and 2 threads); returns whether the AMX run used the tiles.
template <class B>
void check_amx_type() {
  constexpr std::size_t bs = block_size_v<B>;
  const std::vector<std::size_t> ks =
      bs == 32 ? std::vector<std::size_t>{32, 96, 512} : std::vector<std::size_t>{256, 512};
  struct Shape {
    std::size_t m, n;
  };
  uint32_t seed = 500;
  AmxSwitchGuard guard;
  for (const std::size_t k : ks) {
    for (const Shape sh : {Shape{16, 16}, Shape{18, 33}, Shape{50, 17}, Shape{40, 64}, Shape{128, 45}}) {
      const std::size_t m = sh.m, n = sh.n, nbk = k / bs;
      CAPTURE(dtype_name<B>);
      CAPTURE(m);
      CAPTURE(n);
      CAPTURE(k);
      const auto w = amx_weights<B>(n, k, ++seed);
      auto x = test::random_floats(m * k, ++seed, -1.f, 1.f);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t p = 0; p < k; ++p) x[i * k + p] *= (p / 32 + i) % 3 == 0 ? 20.f : 0.5f;
      std::vector<float> yi(m * n);
      std::vector<double> abs_terms(m * n);
      ref::qmatmul_int(x.data(), std::ptrdiff_t(k), w.data(), std::ptrdiff_t(nbk), yi.data(), std::ptrdiff_t(n), m, n,
                       k, abs_terms.data());
      const auto xt = make_tensor(x.data(), m, k);
      const auto wt = make_tensor(w.data(), n, nbk);
      for (const bool split : {false, true}) {
        for (const std::size_t threads : {1, 2}) {
          CAPTURE(split);
          CAPTURE(threads);
          ThreadPool* pool = threads == 2 ? &amx_pool2() : nullptr;
          auto run = [&](bool amx_on) {
            set_amx_enabled({.enabled = amx_on});
            std::vector<float> y(m * n, std::nanf(""));
            if (split)
              kernels::qmatmul_split_act(xt, dtype_traits<B>::ggml_type, w.data(), n, 0, make_tensor(y.data(), m, n),
                                         pool);
            else qmatmul(xt, wt, make_tensor(y.data(), m, n), pool);
            return y;
          };
          const unsigned long before = detail::amx_gemm_calls().load();
          const auto ya = run(true);
          const unsigned long used = detail::amx_gemm_calls().load() - before;
          const auto yv = run(false);
          CHECK(detail::amx_gemm_calls().load() - before == used);  // switched off: no tile call
          INFO("AMX GEMM calls: ", used);
          CHECK(used > 0);
          std::size_t diff = 0, first = 0;
          for (std::size_t i = 0; i < m * n; ++i)
            if (std::memcmp(&ya[i], &yv[i], sizeof(float)) != 0 && diff++ == 0) first = i;
          INFO("AMX and VNNI differ at ", diff, " outputs; first (", first / n, ", ", first % n, "): ", ya[first],
               " vs ", yv[first]);
          CHECK(diff == 0);
          if (!split) {  // the two-part product is checked against its own bound in test_qmatmul.cpp
            double worst = 0;
            for (std::size_t i = 0; i < m * n; ++i)
              worst = std::max(worst, std::fabs(double(ya[i]) - yi[i]) / (1e-5 * abs_terms[i] + 1e-30));
            INFO("worst |AMX - integer reference| / (1e-5 abs_terms): ", worst);
            CHECK(worst <= 1.0);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("AMX detection: CPUID, OS tile state and permission agree, and the switch falls back to VNNI") {
  AmxSwitchGuard guard;
  const AmxSupport& s = amx_support();
  CHECK(&s == &amx_support());  // probed once
  if (s.usable_int8()) CHECK((s.tile && s.int8 && s.os_state && s.permitted));
  if (std::getenv("KILN_AMX") == nullptr) CHECK(amx_options().enabled);  // on by default (where usable)
  set_amx_enabled({.enabled = true});
  CHECK(amx_active() == s.usable_int8());
  set_amx_enabled({.enabled = false});
  CHECK_FALSE(amx_active());
  set_amx_enabled({.enabled = true});
  CHECK(amx_active() == s.usable_int8());
  setenv("KILN_NO_AMX", "1", 1);
  CHECK_FALSE(amx_active());
  setenv("KILN_NO_AMX", "0", 1);
  CHECK(amx_active() == s.usable_int8());
  if (!amx_or_skip()) return;
  // KILN_NO_AMX=1 really keeps the tiles idle: a GEMM-sized product makes no AMX call.
  const std::size_t m = 32, n = 32, k = 64;
  const auto w = amx_weights<block_q8_0>(n, k, 3);
  const auto x = test::random_floats(m * k, 4);
  std::vector<float> y(m * n);
  set_amx_enabled({.enabled = true});
  setenv("KILN_NO_AMX", "1", 1);
  unsigned long before = detail::amx_gemm_calls().load();
  qmatmul(make_tensor(x.data(), m, k), make_tensor(w.data(), n, k / 32), make_tensor(y.data(), m, n));
  CHECK(detail::amx_gemm_calls().load() == before);
  unsetenv("KILN_NO_AMX");
  before = detail::amx_gemm_calls().load();
  qmatmul(make_tensor(x.data(), m, k), make_tensor(w.data(), n, k / 32), make_tensor(y.data(), m, n));
  CHECK(detail::amx_gemm_calls().load() > before);
}

TEST_CASE("AMX GEMM q8_0 equals the VNNI GEMM bit for bit and the integer reference") {
  if (amx_or_skip()) check_amx_type<block_q8_0>();
}
TEST_CASE("AMX GEMM q4_0 equals the VNNI GEMM bit for bit and the integer reference") {
  if (amx_or_skip()) check_amx_type<block_q4_0>();
}
TEST_CASE("AMX GEMM q4_1, q5_0, q5_1 equal the VNNI GEMM bit for bit and the integer reference") {
  if (!amx_or_skip()) return;
  check_amx_type<block_q4_1>();
  check_amx_type<block_q5_0>();
  check_amx_type<block_q5_1>();
}
TEST_CASE("AMX GEMM q4_K, q5_K, q6_K equal the VNNI GEMM bit for bit and the integer reference") {
  if (!amx_or_skip()) return;
  check_amx_type<block_q4_K>();
  check_amx_type<block_q5_K>();
  check_amx_type<block_q6_K>();
}
TEST_CASE("AMX GEMM mxfp4 equals the VNNI GEMM bit for bit and the integer reference") {
  if (amx_or_skip()) check_amx_type<block_mxfp4>();
}

namespace {

// qmatmul_multi repacks x into the tiles' form once for all its outputs and threads (dispatch::qmatmul_amx_repack,
// row ranges on 16-row blocks): each output must still equal the VNNI GEMM of its weight alone, bit for bit, for
// layouts that share x (q4_1 with q5_1, q4_K with q5_K) or not, interleaved and row-major weights, row counts
// around the block size and the threaded quantization (from 64 quantized rows), and 1 to 3 threads.
void check_amx_multi(std::size_t k, const std::vector<uint32_t>& types, const std::vector<std::size_t>& rows,
                     const std::vector<bool>& inter) {
  static ThreadPool pool3(3);
  const std::size_t nw = types.size();
  std::vector<std::vector<uint8_t>> w(nw);
  std::vector<kernels::QmmWeight> qw(nw);
  for (std::size_t i = 0; i < nw; ++i) {
    w[i] = test::random_weights(types[i], rows[i], k, uint32_t(900 + i));
    if (inter[i])
      visit_ggml_type(types[i], [&]<class B>(B*) {
        if constexpr (kernels::qmm_interleavable_v<B>) {
          std::vector<uint8_t> t(w[i].size());
          kernels::qmm_interleave_rows(reinterpret_cast<const B*>(w[i].data()), rows[i], k / block_size_v<B>,
                                       reinterpret_cast<B*>(t.data()));
          w[i] = std::move(t);
        }
      });
    qw[i] = kernels::QmmWeight{types[i], w[i].data(), rows[i], 0, bool(inter[i])};
  }
  for (const std::size_t m : {9u, 16u, 31u, 40u, 130u}) {
    auto x = test::random_floats(m * k, uint32_t(m), -1.f, 1.f);
    for (std::size_t i = 0; i < m * k; ++i) x[i] *= (i / 32) % 3 == 0 ? 20.f : 0.5f;
    const auto xt = make_tensor(x.data(), m, k);
    for (const kernels::ActParts parts : {kernels::ActParts::one, kernels::ActParts::two}) {
      auto run = [&](bool amx_on, ThreadPool* pool, bool multi) {
        set_amx_enabled({.enabled = amx_on});
        std::vector<std::vector<float>> y(nw);
        std::vector<DenseTensor<float, 2>> yt;
        for (std::size_t i = 0; i < nw; ++i) {
          y[i].assign(m * rows[i], std::nanf(""));
          yt.push_back(make_tensor(y[i].data(), m, rows[i]));
        }
        if (multi)
          kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(qw),
                                 std::span<const DenseTensor<float, 2>>(yt), pool, parts);
        else
          for (std::size_t i = 0; i < nw; ++i)
            kernels::qmatmul_multi(xt, std::span<const kernels::QmmWeight>(&qw[i], 1),
                                   std::span<const DenseTensor<float, 2>>(&yt[i], 1), pool, parts);
        return y;
      };
      const auto want = run(false, nullptr, false);  // VNNI, one weight at a time, 1 thread
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &amx_pool2(), &pool3}) {
        for (const bool multi : {true, false}) {
          CAPTURE(k);
          CAPTURE(m);
          CAPTURE(parts == kernels::ActParts::two);
          CAPTURE(pool ? pool->size() : 1);
          CAPTURE(multi);
          const unsigned long before = detail::amx_gemm_calls().load();
          const auto got = run(true, pool, multi);
          CHECK(detail::amx_gemm_calls().load() > before);
          for (std::size_t i = 0; i < nw; ++i) {
            CAPTURE(i);
            CHECK(std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("qmatmul_multi on AMX tiles (one repack of x for all outputs and threads) equals the VNNI GEMM per weight") {
  if (!amx_or_skip()) return;
  AmxSwitchGuard guard;
  using namespace ggml_type_id;
  check_amx_multi(576, {Q4_0, Q4_1, Q5_1, Q8_0, Q4_0}, {64, 40, 16, 33, 48}, {true, false, true, false, false});
  check_amx_multi(512, {Q4_K, Q5_K, Q6_K, Q4_0}, {48, 17, 32, 16}, {true, false, false, true});
  // Interleaved weights of every 32-value type go straight into the tiles' group order (amx::PackGroupedX16);
  // 56 rows: a pair of panels with one interleaved group and 8 row-major rows; k = 160: a partial run of
  // 4 blocks in x's physical order.
  check_amx_multi(160, {Q4_1, Q5_0, Q8_0, Q5_1, Q4_0}, {56, 48, 33, 16, 40}, {true, true, true, true, true});
}
