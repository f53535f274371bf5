// 16-row interleaved Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / MXFP4 weights (quant/interleave.hpp):
//   - the layout against its description, written out independently here, byte by byte; in place equals
//     out of place; every row reads back (qmm_interleaved_row);
//   - qmatmul over interleaved weights (qmatmul_multi with QmmWeight::interleaved, one and two activation
//     parts) against the same row-major weights, on every target, 1 and 2 threads, N around whole groups
//     of 16 (and below 16), K tails around groups of 4 blocks:
//       GEMM row counts: bit-identical to row-major on every target but AVX2/AVX3;
//       GEMV row counts: bit-identical to row-major on targets without interleaved kernels; on AVX3_DL, the
//       interleaved GEMV computes each output as the GEMM does, so it is checked bit-identical to the
//       row-major GEMM of the same rows of x (rows past the last whole group: to the row-major GEMV);
//       Q4_K's, exact in integers per super-block like the row-major GEMV, is checked within 2e-5 of it;
//       AVX2/AVX3's kernels (every type; GEMV and GEMM) sum blocks (Q4_K: super-blocks' integer sums and
//       mins) in another f32 order: within 2e-5 of the row-major result, and its GEMV bit-identical to its
//       GEMM of the same rows; with two parts (all but Q4_K) bit-identical to AVX3_DL's, where the CPU runs
//       both;
//     every row-major result is itself checked against the scalar references by test_qmatmul.cpp, so the
//     bit-identities carry that check over;
//   - dequant_matmul (the exact path) over interleaved weights bit-identical to row-major;
//   - linear() / linear_multi() on a packed WeightRef; errors for types or strides without the layout.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/ops/linear.hpp"
#include "kiln/ops/dequant_matmul.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "test_util.hpp"
#include "weights_util.hpp"

using namespace kiln;

namespace {

ThreadPool& pool2() {
  static ThreadPool p(2);
  return p;
}

constexpr uint32_t kTypes[] = {ggml_type_id::Q4_0, ggml_type_id::Q4_1, ggml_type_id::Q5_0, ggml_type_id::Q5_1,
                               ggml_type_id::Q8_0, ggml_type_id::Q4_K, ggml_type_id::MXFP4};

std::size_t block_of(uint32_t t) { return t == ggml_type_id::Q4_K ? 256 : 32; }

std::string type_name(uint32_t t) { return std::string(io::ggml_type_name(io::GGMLType(t))); }

// The layout as the header describes it, from the row-major bytes: per group of 16 rows and block column
// b, the 16 rows' d (sb = 2 bytes each; MXFP4's e: 1), Q4_1/Q5_1's 16 m or Q4_K's dmin, then `extra` runs
// of a dword per row (Q5's qh: 1, Q4_K's 12 scale bytes: 3), then steps of 4 quant bytes per row; the
// remaining rows as they were. bpb: bytes a block; mins: whether there is an m; the quants are the rest.
std::vector<uint8_t> interleave_by_description(const std::vector<uint8_t>& w, std::size_t n, std::size_t nb,
                                               std::size_t bpb, bool mins, std::size_t extra, std::size_t sb) {
  const std::size_t oqh = mins ? 2 * sb : sb, qs = oqh + 4 * extra;
  std::vector<uint8_t> out;
  auto blk = [&](std::size_t row, std::size_t b) { return &w[(row * nb + b) * bpb]; };
  for (std::size_t g = 0; g + 16 <= n; g += 16) {
    for (std::size_t b = 0; b < nb; ++b) {
      for (std::size_t r = 0; r < 16; ++r) out.insert(out.end(), blk(g + r, b), blk(g + r, b) + sb);
      if (mins)
        for (std::size_t r = 0; r < 16; ++r) out.insert(out.end(), blk(g + r, b) + sb, blk(g + r, b) + 2 * sb);
      for (std::size_t e = 0; e < extra; ++e)
        for (std::size_t r = 0; r < 16; ++r)
          out.insert(out.end(), blk(g + r, b) + oqh + 4 * e, blk(g + r, b) + oqh + 4 * e + 4);
      for (std::size_t s = 0; s < (bpb - qs) / 4; ++s)
        for (std::size_t r = 0; r < 16; ++r)
          out.insert(out.end(), blk(g + r, b) + qs + 4 * s, blk(g + r, b) + qs + 4 * s + 4);
    }
  }
  for (std::size_t j = n / 16 * 16; j < n; ++j) out.insert(out.end(), blk(j, 0), blk(j, 0) + nb * bpb);
  return out;
}

std::vector<uint8_t> interleaved(uint32_t type, const std::vector<uint8_t>& w, std::size_t n, std::size_t k) {
  std::vector<uint8_t> out(w.size());
  visit_ggml_type(type, [&]<class T>(T*) {
    if constexpr (kernels::qmm_interleavable_v<T>)
      kernels::qmm_interleave_rows(reinterpret_cast<const T*>(w.data()), n, k / block_size_v<T>,
                                   reinterpret_cast<T*>(out.data()));
  });
  return out;
}

bool has_avx3_dl() {
  const auto t = test::targets();
  return std::find(t.begin(), t.end(), "AVX3_DL") != t.end();
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// y (m, n) = x (m, k) * W^T through qmatmul_multi, W row-major or interleaved.
std::vector<float> product(const std::vector<float>& x, std::size_t m, std::size_t k, uint32_t type,
                           const std::vector<uint8_t>& w, std::size_t n, bool inter, kernels::ActParts parts,
                           ThreadPool* pool) {
  std::vector<float> y(m * n, -7.0f);
  const kernels::QmmWeight wt{type, w.data(), n, 0, inter};
  const auto yv = make_tensor(y.data(), m, n);
  kernels::qmatmul_multi(make_tensor(x.data(), m, k), std::span<const kernels::QmmWeight>(&wt, 1),
                         std::span<const decltype(yv)>(&yv, 1), pool, parts);
  return y;
}

}  // namespace

TEST_CASE("qmm_interleave_rows writes the layout its header describes; in place and row reads agree") {
  for (const uint32_t type : kTypes) {
    const bool kq = type == ggml_type_id::Q4_K;
    const bool mins = type == ggml_type_id::Q4_1 || type == ggml_type_id::Q5_1 || kq;
    const bool qh = type == ggml_type_id::Q5_0 || type == ggml_type_id::Q5_1;
    const std::size_t extra = qh ? 1 : kq ? 3 : 0;
    const bool mx = type == ggml_type_id::MXFP4;
    const std::size_t bpb = kq   ? 144
                            : mx ? 17
                                 : 18 + (mins ? 2 : 0) + (qh ? 4 : 0) + (type == ggml_type_id::Q8_0 ? 16 : 0);
    for (const std::size_t n : {1u, 15u, 16u, 17u, 32u, 45u}) {
      for (const std::size_t k : {32u, 96u, 256u, 512u}) {
        if (k % block_of(type) != 0) continue;
        INFO(type_name(type), " n ", n, " k ", k);
        const auto w = test::random_weights(type, n, k, uint32_t(n * 31 + k));
        const auto want = interleave_by_description(w, n, k / block_of(type), bpb, mins, extra, mx ? 1 : 2);
        REQUIRE(want.size() == w.size());
        const auto got = interleaved(type, w, n, k);
        CHECK(got == want);
        visit_ggml_type(type, [&]<class T>(T*) {
          if constexpr (kernels::qmm_interleavable_v<T>) {
            auto in_place = w;
            kernels::qmm_interleave_rows_in_place(reinterpret_cast<T*>(in_place.data()), n, k / block_size_v<T>);
            CHECK(in_place == want);
            std::vector<T> row(k / block_size_v<T>);
            for (std::size_t j = 0; j < n; ++j) {
              kernels::qmm_interleaved_row(reinterpret_cast<const T*>(got.data()), n, k / block_size_v<T>, j,
                                           row.data());
              CHECK(std::memcmp(row.data(), w.data() + j * row.size() * sizeof(T), row.size() * sizeof(T)) == 0);
            }
          }
        });
      }
    }
  }
}

TEST_CASE("qmatmul over interleaved weights matches row-major on every target (AVX3_DL GEMV: the GEMM's bits)") {
  constexpr std::size_t kGemmRows = detail::kQmmGemvMaxRowsX16 + 1;  // x padded to this many rows: the GEMM path
  std::size_t gemv_vs_gemm = 0, gemv_vs_gemm2 = 0, cases = 0, avx2_x16 = 0, avx2_x16_k = 0;
  for (const uint32_t type : kTypes) {
    for (const std::size_t n : {7u, 16u, 37u, 64u}) {
      for (const std::size_t k : {32u, 64u, 160u, 256u, 512u}) {
        if (k % block_of(type) != 0) continue;
        const auto w = test::random_weights(type, n, k, uint32_t(n * 7 + k + type));
        const auto wi = interleaved(type, w, n, k);
        test::for_each_target([&](const std::string& target) {
          for (const kernels::ActParts parts : {kernels::ActParts::one, kernels::ActParts::two}) {
            for (const std::size_t m : {1u, 2u, 3u, 4u, 5u, 7u, 8u, 13u}) {  // GEMV: 1..8 quantized rows
              for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2()}) {
                INFO(type_name(type), " n ", n, " k ", k, " m ", m, " parts ", parts == kernels::ActParts::two ? 2 : 1,
                     " threads ", pool ? 2 : 1);
                const auto x = test::random_floats(m * k, uint32_t(m * 131 + k + n), -2.f, 2.f);
                const auto got = product(x, m, k, type, wi, n, true, parts, pool);
                const auto row_major = product(x, m, k, type, w, n, false, parts, pool);
                const std::size_t rows = parts == kernels::ActParts::two ? 2 * m : m;  // quantized rows
                ++cases;
                if (target == "AVX2" || target == "AVX3") {
                  // The AVX2 interleaved kernel (GEMV and GEMM alike) sums each output's blocks in f32 in
                  // another order than the row-major kernels: close to them; and a GEMV row is bit-identical
                  // to the same row in a GEMM (x padded to kGemmRows rows).
                  float scale = 0;
                  for (const float v : row_major) scale = std::max(scale, std::fabs(v));
                  test::check_close(got.data(), row_major.data(), got.size(), 2e-5f, 2e-5f * scale);
                  if (rows <= detail::kQmmGemvMaxRows) {
                    std::vector<float> xg(kGemmRows * k, 0.5f);
                    std::copy(x.begin(), x.end(), xg.begin());
                    const auto gemm = product(xg, kGemmRows, k, type, wi, n, true, parts, pool);
                    CHECK(std::memcmp(got.data(), gemm.data(), got.size() * sizeof(float)) == 0);
                  }
                  ++avx2_x16;
                  avx2_x16_k += type == ggml_type_id::Q4_K && n >= 16;
                  continue;
                }
                // AVX3_DL runs interleaved W through its GEMV up to kQmmGemvMaxRowsX16 rows (row-major W: up to
                // kQmmGemvMaxRows).
                if (rows > detail::kQmmGemvMaxRowsX16 || target != "AVX3_DL") {
                  CHECK(same_floats(got, row_major));
                  continue;
                }
                if (type == ggml_type_id::Q4_K) {
                  // Q4_K's interleaved GEMV sums sc_j * I_j in integers per super-block, as the row-major
                  // GEMV does (not per sub-block in f32 as the GEMM), one activation part at a time: the two
                  // differ only in f32 rounding.
                  float scale = 0;
                  for (const float v : row_major) scale = std::max(scale, std::fabs(v));
                  test::check_close(got.data(), row_major.data(), got.size(), 2e-5f, 2e-5f * scale);
                  continue;
                }
                // AVX3_DL GEMV: rows in whole groups as the row-major GEMM computes them (x padded to
                // kGemmRows rows takes the GEMM path; each row of y depends on its own row of x only), with
                // two parts too (both add 2^s X + R per block, then convert); the rows past the last group
                // as the row-major GEMV (one row of x at a time where row_major took the GEMM).
                std::vector<float> xg(kGemmRows * k, 0.5f);
                std::copy(x.begin(), x.end(), xg.begin());
                const auto gemm = product(xg, kGemmRows, k, type, w, n, false, parts, pool);
                const std::size_t full = n / 16 * 16;
                std::vector<float> tail = row_major;
                if (rows > detail::kQmmGemvMaxRows && full < n)
                  for (std::size_t i = 0; i < m; ++i) {
                    const auto xi = x.begin() + std::ptrdiff_t(i * k);
                    const auto yi =
                        product(std::vector<float>(xi, xi + std::ptrdiff_t(k)), 1, k, type, w, n, false, parts, pool);
                    std::copy(yi.begin(), yi.end(), tail.begin() + std::ptrdiff_t(i * n));
                  }
                for (std::size_t i = 0; i < m; ++i)
                  for (std::size_t j = 0; j < n; ++j) {
                    const float want = j < full ? gemm[i * n + j] : tail[i * n + j];
                    if (std::memcmp(&got[i * n + j], &want, 4) != 0) {
                      FAIL_CHECK("row ", i, " column ", j, ": ", got[i * n + j], " want ", want);
                      return;
                    }
                  }
                gemv_vs_gemm += full > 0;
                gemv_vs_gemm2 += full > 0 && parts == kernels::ActParts::two;
              }
            }
          }
        });
      }
    }
  }
  CHECK(cases > 0);
  if (has_avx3_dl()) {  // the AVX3_DL kernel ran, with two parts too
    CHECK(gemv_vs_gemm > 0);
    CHECK(gemv_vs_gemm2 > 0);
  }
  const auto t = test::targets();
  if (std::find(t.begin(), t.end(), "AVX2") != t.end()) {  // the AVX2 kernels ran, Q4_K's too
    CHECK(avx2_x16 > 0);
    CHECK(avx2_x16_k > 0);
  }
}

TEST_CASE("two activation parts over interleaved groups: AVX2/AVX3's kernel gives AVX3_DL's bits, GEMV and GEMM") {
  // Both kernels add the parts per block as the integer 2^s X + R, convert it once and accumulate
  // f += c * (d * dx_r) block after block, so the outputs of whole groups are the same floats on both
  // targets (Q4_K, which keeps the parts apart, excepted); rows past the last group are row-major and are
  // left out. Runs where the CPU has both targets.
  const auto t = test::targets();
  const auto has = [&](const char* n) { return std::find(t.begin(), t.end(), n) != t.end(); };
  std::size_t compared = 0;
  for (const uint32_t type : kTypes) {
    if (type == ggml_type_id::Q4_K) continue;
    const std::size_t n = 37, k = 320, full = n / 16 * 16;
    const auto w = interleaved(type, test::random_weights(type, n, k, 7 + type), n, k);
    for (const std::size_t m : {1u, 2u, 5u, 9u}) {  // GEMV (2, 4 quantized rows) and GEMM (10, 18)
      const auto x = test::random_floats(m * k, uint32_t(m * 29 + type), -3.f, 3.f);
      std::vector<float> want;
      for (const char* target : {"AVX3_DL", "AVX2", "AVX3"}) {
        if (!has(target) || !has("AVX3_DL")) continue;
        INFO(type_name(type), " m ", m, " target ", target);
        simd::ScopedTarget scope(target);
        const auto got = product(x, m, k, type, w, n, true, kernels::ActParts::two, nullptr);
        if (want.empty()) {
          want = got;
          continue;
        }
        for (std::size_t i = 0; i < m; ++i) CHECK(std::memcmp(&got[i * n], &want[i * n], full * sizeof(float)) == 0);
        ++compared;
      }
    }
  }
  if (has("AVX3_DL") && has("AVX2")) CHECK(compared >= 5 * 4);
}

TEST_CASE("dequant_matmul and linear over interleaved weights match row-major bit for bit") {
  for (const uint32_t type : kTypes) {
    const std::size_t n = 40, k = type == ggml_type_id::Q4_K ? 256 : 96;
    const auto w = test::random_weights(type, n, k, 99 + type);
    const auto wi = interleaved(type, w, n, k);
    for (const std::size_t m : {1u, 6u}) {
      INFO(type_name(type), " m ", m);
      const auto x = test::random_floats(m * k, uint32_t(m + type));
      std::vector<float> a(m * n), b(m * n);
      kernels::dequant_matmul(make_tensor(x.data(), m, k), type, w.data(), n, 0, make_tensor(a.data(), m, n), &pool2());
      kernels::dequant_matmul(make_tensor(x.data(), m, k), type, wi.data(), n, 0, make_tensor(b.data(), m, n), &pool2(),
                              {.interleaved = true});
      CHECK(same_floats(a, b));
      WeightRef r{reinterpret_cast<const std::byte*>(w.data()), io::GGMLType(type), n, k, ggml_row_bytes(type, k), "w"};
      WeightRef ri = r;
      ri.data = reinterpret_cast<const std::byte*>(wi.data());
      ri.packed = true;
      for (const Precision p : {Precision::fast, Precision::fast8, Precision::exact}) {
        INFO("precision ", int(p));
        std::vector<float> ya(m * n), yb(m * n), yc(m * n), yd(m * n);
        linear(make_tensor(x.data(), m, k), r, make_tensor(ya.data(), m, n), &pool2(), p);
        linear(make_tensor(x.data(), m, k), ri, make_tensor(yb.data(), m, n), &pool2(), p);
        const WeightRef* both[] = {&ri, &ri};
        const auto yc_v = make_tensor(yc.data(), m, n), yd_v = make_tensor(yd.data(), m, n);
        const decltype(yc_v) outs[] = {yc_v, yd_v};
        linear_multi(make_tensor(x.data(), m, k), std::span<const WeightRef* const>(both),
                     std::span<const decltype(yc_v)>(outs), &pool2(), p);
        // The integer paths' interleaved kernels: AVX3_DL's GEMV computes as the GEMM (another f32 order
        // than the row-major GEMV); AVX2's another order than the row-major kernels.
        const bool other_order =
            p != Precision::exact && dispatch::qmatmul_interleaved_native(type) &&
            (simd::current_target() != "AVX3_DL" || m * (p == Precision::fast ? 2 : 1) <= detail::kQmmGemvMaxRowsX16);
        if (other_order) test::check_close(yb.data(), ya.data(), ya.size(), 1e-4f, 1e-4f);
        else CHECK(same_floats(ya, yb));
        CHECK(same_floats(yb, yc));
        CHECK(same_floats(yb, yd));
      }
    }
  }
}

TEST_CASE("interleaved weights: types and strides without the layout are refused with a message") {
  const std::size_t n = 32, k = 256;
  const auto x = test::random_floats(k, 5);
  std::vector<float> y(n);
  const auto yv = make_tensor(y.data(), 1, n);
  const auto xv = make_tensor(x.data(), 1, k);
  auto run = [&](uint32_t type, const void* data, std::size_t row_bytes) {
    const kernels::QmmWeight wt{type, data, n, row_bytes, true};
    kernels::qmatmul_multi(xv, std::span<const kernels::QmmWeight>(&wt, 1), std::span<const decltype(yv)>(&yv, 1));
  };
  const auto wk = test::random_weights(ggml_type_id::Q4_0, 2 * n, k, 3);  // room for doubled strides
  CHECK_THROWS_WITH_AS(run(ggml_type_id::Q6_K, wk.data(), 0),
                       doctest::Contains("only q4_0, q4_1, q5_0, q5_1, q8_0, q4_K and mxfp4"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ggml_type_id::F16, wk.data(), 0), doctest::Contains("marked interleaved"), ShapeError);
  CHECK_THROWS_WITH_AS(run(ggml_type_id::Q4_0, wk.data(), 2 * ggml_row_bytes(ggml_type_id::Q4_0, k)),
                       doctest::Contains("contiguous rows"), ShapeError);
  CHECK_THROWS_WITH_AS(
      kernels::dequant_matmul(xv, ggml_type_id::Q6_K, wk.data(), n, 0, yv, nullptr, {.interleaved = true}),
      doctest::Contains("interleaved weight must be q4_0"), ShapeError);
}

TEST_CASE("qmatmul_multi's threaded GEMV (each thread quantizes x itself) is bit-identical for 1 to 4 threads") {
  // Three weights sharing x, two activation layouts (Q4_0; Q4_K and Q6_K), W interleaved where it can be
  // and row-major; sizes large enough that the GEMV runs as several tasks (2 rows N K >= 2^19 each).
  struct W {
    uint32_t type;
    std::size_t n;
  };
  const W ws[] = {{ggml_type_id::Q4_0, 200}, {ggml_type_id::Q4_K, 130}, {ggml_type_id::Q6_K, 90}};
  const std::size_t k = 1024;
  static ThreadPool pool3(3), pool4(4);
  std::vector<std::vector<uint8_t>> row_major, packed;
  for (const W& w : ws) {
    row_major.push_back(test::random_weights(w.type, w.n, k, uint32_t(w.n + w.type)));
    packed.push_back(w.type == ggml_type_id::Q6_K ? row_major.back() : interleaved(w.type, row_major.back(), w.n, k));
  }
  std::size_t checked = 0;
  test::for_each_target([&](const std::string& target) {
    for (const bool inter : {false, true})
      for (const kernels::ActParts parts : {kernels::ActParts::one, kernels::ActParts::two})
        for (const std::size_t m : {1u, 2u, 3u, 4u}) {
          const auto x = test::random_floats(m * k, uint32_t(m * 17 + 3), -2.f, 2.f);
          std::vector<float> first;
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2(), &pool3, &pool4}) {
            INFO(target, " interleaved ", inter, " parts ", parts == kernels::ActParts::two ? 2 : 1, " m ", m,
                 " threads ", pool ? pool->size() : 1);
            std::vector<float> y[3];
            std::vector<kernels::QmmWeight> wt;
            std::vector<decltype(make_tensor(y[0].data(), m, 1))> yv;
            for (std::size_t i = 0; i < 3; ++i) {
              y[i].assign(m * ws[i].n, -7.0f);
              const bool pk = inter && ws[i].type != ggml_type_id::Q6_K;
              wt.push_back(kernels::QmmWeight{ws[i].type, (pk ? packed[i] : row_major[i]).data(), ws[i].n, 0, pk});
              yv.push_back(make_tensor(y[i].data(), m, ws[i].n));
            }
            kernels::qmatmul_multi(make_tensor(x.data(), m, k), std::span<const kernels::QmmWeight>(wt),
                                   std::span<const decltype(yv)::value_type>(yv), pool, parts);
            std::vector<float> all;
            for (const auto& v : y) all.insert(all.end(), v.begin(), v.end());
            CHECK(std::count(all.begin(), all.end(), -7.0f) == 0);  // every output written over the fill
            if (!pool) {
              first = all;
              // Each output against its own product on one thread (qmatmul_multi's contract).
              for (std::size_t i = 0; i < 3; ++i) {
                const bool pk = inter && ws[i].type != ggml_type_id::Q6_K;
                CHECK(same_floats(
                    y[i], product(x, m, k, ws[i].type, pk ? packed[i] : row_major[i], ws[i].n, pk, parts, nullptr)));
              }
            } else {
              CHECK(same_floats(all, first));
              ++checked;
            }
          }
        }
  });
  CHECK(checked >= 3 * 16);
}
