// SessionGroup: several sequences decoded in one forward pass give each sequence exactly what a Session
// fed the same tokens gives (up to the f32 summation order of a batched product: the GEMM path sums K in
// a different order than the GEMV path, ~1e-6 relative).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/model/session_group.hpp"
#include "model_test_util.hpp"

namespace kiln::test {
namespace {

double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(double(a[i]) - double(b[i])));
  return w / std::max(1e-30, double(*hi - *lo));
}

void check_group(const Model& model, Precision precision, double tol, KVType kv = KVType::automatic) {
  const std::size_t vocab = model.hparams().vocab;
  // Three sequences with prompts of different lengths (so different positions in one step).
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 261, 50}, {1, 77}, {1, 300, 301, 302, 303, 304, 305}};
  const std::size_t steps = 6;
  for (std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    SessionGroup g(model, 3, {.ctx = 32, .threads = threads, .batch = 4, .precision = precision, .kv_type = kv});
    REQUIRE(g.kv_type() == resolve_kv_type({.precision = precision, .kv_type = kv}));
    std::vector<Session> ref;
    std::vector<std::vector<float>> ref_logits(3);
    for (std::size_t s = 0; s < 3; ++s) {
      ref.emplace_back(model, SessionOptions{.ctx = 32, .threads = threads, .batch = 4, .precision = precision,
                                             .kv_type = kv});
      const auto a = ref[s].eval(prompts[s]);
      const auto b = g.eval(s, prompts[s]);
      CHECK(max_rel_diff(b, a) <= tol);
      ref_logits[s].assign(a.begin(), a.end());
    }
    for (std::size_t t = 0; t < steps; ++t) {
      // Every sequence steps, except sequence 1 on odd steps (a subset, in another order).
      std::vector<std::size_t> seqs = t % 2 ? std::vector<std::size_t>{2, 0} : std::vector<std::size_t>{0, 1, 2};
      std::vector<int32_t> next;
      for (std::size_t s : seqs) {
        const auto& l = ref_logits[s];
        next.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
      }
      const auto out = g.step(seqs, next);
      REQUIRE(out.extent(0) == seqs.size());
      REQUIRE(out.extent(1) == vocab);
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        const auto a = ref[seqs[i]].eval(next[i]);
        INFO("step ", t, " sequence ", seqs[i], " at position ", g.n_past(seqs[i]) - 1);
        CHECK(max_rel_diff(std::span<const float>(&out(i, 0), vocab), a) <= tol);
        ref_logits[seqs[i]].assign(a.begin(), a.end());
        CHECK(g.n_past(seqs[i]) == ref[seqs[i]].n_past());
      }
    }
  }
}

TEST_CASE("session group: stories260K sequences decoded together match separate sessions") {
  check_group(load(shared_model("stories260K.gguf")), Precision::fast, 1e-5);
}

TEST_CASE("session group: f16 and f32 KV caches, decoded together, match separate sessions with the same cache type") {
  // (The group's keys and values come from a batched product, the sessions' from one row at a time: an f32
  // value that differs in its last bits can round to the neighbouring f16 value, 2^-11 relative, in about
  // 1 element in 10^4; the tolerance stays that of the f32 tests.)
  const Model model = load(shared_model("stories260K.gguf"));
  check_group(model, Precision::fast, 1e-5, KVType::f16);
  check_group(model, Precision::fast, 1e-5, KVType::f32);
}

TEST_CASE("session group: quantized weights (fast path, packed) decoded together match separate sessions") {
  // Steps of 2-3 sequences: 4-6 activation rows (two parts each), the interleaved GEMV on AVX3_DL (up to 8 rows),
  // the GEMM elsewhere past 4 rows.
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-group-q8-fast");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::Q8_0, {"output.weight"});
  check_group(load(tmp.path), Precision::fast, 1e-5);
}

TEST_CASE("session group: quantized weights (exact path) decoded together match separate sessions") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-group-q8");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::Q8_0, {"output.weight"});
  check_group(load(tmp.path), Precision::exact, 1e-5);
}

TEST_CASE("session group: errors name what is wrong and change nothing") {
  const Model model = load(shared_model("stories260K.gguf"));
  SessionGroup g(model, 2, {.ctx = 4});
  CHECK_THROWS_WITH_AS(g.step(std::vector<std::size_t>{0, 0}, std::vector<int32_t>{1, 2}),
                       doctest::Contains("listed twice"), Error);
  CHECK_THROWS_WITH_AS(g.step(std::vector<std::size_t>{2}, std::vector<int32_t>{1}), doctest::Contains("sequence 2"),
                       Error);
  CHECK_THROWS_WITH_AS(g.step(std::vector<std::size_t>{0}, std::vector<int32_t>{600}),
                       doctest::Contains("outside the vocabulary"), Error);
  CHECK_THROWS_WITH_AS(g.step(std::vector<std::size_t>{0, 1}, std::vector<int32_t>{1}),
                       doctest::Contains("one token per sequence"), Error);
  g.eval(0, std::vector<int32_t>{1, 2, 3, 4});
  CHECK_THROWS_WITH_AS(g.step(std::vector<std::size_t>{1, 0}, std::vector<int32_t>{1, 2}), doctest::Contains("is full"),
                       Error);
  CHECK(g.n_past(0) == 4);
  CHECK(g.n_past(1) == 0);  // nothing ran
  g.reset(0);
  CHECK(g.n_past(0) == 0);
  CHECK(g.step(std::vector<std::size_t>{1, 0}, std::vector<int32_t>{1, 2}).extent(0) == 2);
}

}  // namespace
}  // namespace kiln::test
