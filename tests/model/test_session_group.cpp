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
      ref.emplace_back(
          model, SessionOptions{.ctx = 32, .threads = threads, .batch = 4, .precision = precision, .kv_type = kv});
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

// Mixed batches (batch()): prompt chunks and decode tokens of several sequences in one pass give each
// sequence what a Session fed the same tokens one at a time gives. The tolerance is the step tests' (1e-5
// of the logits' range): a pass of more than kGemvMaxRows rows takes the GEMM, which sums K in another
// order than the one-row GEMV (f32 rounding of sums of a few hundred terms; measured ~1e-6 here). Two
// paths are left out because they amplify those last bits by design: f16 KV caches (a value that differs
// in its last bit can round to the neighbouring f16, 2^-11 relative) and the fast quantized path (8-bit
// activations: a last-bit difference can move an element to the next of 255 levels). Both are covered
// end to end by tests/serve/test_scheduler.cpp (greedy ids equal to a Session's).
void check_mixed(const Model& model, Precision precision) {
  const std::size_t vocab = model.hparams().vocab;
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 403, 261, 50}, {1, 77, 12, 99, 300, 7, 8}, {1, 300, 301, 302, 303, 304, 305, 306, 307}};
  for (std::size_t threads : {1, 2}) {
    CAPTURE(threads);
    SessionGroup g(model, 3,
                   {.ctx = 48, .threads = threads, .batch = 16, .precision = precision, .kv_type = KVType::f32});
    std::vector<Session> ref;
    for (std::size_t s = 0; s < 3; ++s)
      ref.emplace_back(
          model,
          SessionOptions{.ctx = 48, .threads = threads, .batch = 16, .precision = precision, .kv_type = KVType::f32});
    auto same = [&](std::span<const float> got, std::span<const float> want, const char* what) {
      INFO(what);
      CHECK(max_rel_diff(got, want) <= 1e-5);
    };
    // The reference runs every token alone (the one-token kernels).
    auto feed = [&](Session& r, std::span<const int32_t> t) {
      for (std::size_t i = 0; i + 1 < t.size(); ++i) r.eval(t[i]);
      return r.eval(t.back());
    };
    // Pass 1: sequence 0's whole prompt (logits of its last row), sequence 1's first 3 prompt tokens (the
    // logits of its second row too: any rows may ask), nothing of sequence 2.
    std::vector<BatchRow> rows;
    for (std::size_t i = 0; i < 4; ++i) rows.push_back({.seq = 0, .token = prompts[0][i], .logits = i == 3});
    for (std::size_t i = 0; i < 3; ++i) rows.push_back({.seq = 1, .token = prompts[1][i], .logits = i == 1});
    auto out = g.batch(rows);
    REQUIRE(out.extent(0) == 2);
    REQUIRE(out.extent(1) == vocab);
    same({&out(0, 0), vocab}, feed(ref[0], prompts[0]), "sequence 0's prompt");
    std::vector<float> s1_row1(&out(1, 0), &out(1, 0) + vocab);
    same(s1_row1, feed(ref[1], std::span<const int32_t>(prompts[1]).first(2)), "sequence 1's second prompt row");
    ref[1].eval(prompts[1][2]);
    CHECK(g.n_past(0) == 4);
    CHECK(g.n_past(1) == 3);
    CHECK(g.n_past(2) == 0);
    // Passes 2-4: sequence 0 decodes (its greedy token), sequence 2's prompt goes in chunks of 4 (logits at
    // its end), sequence 1 finishes its prompt in pass 2 and decodes after.
    std::vector<int32_t> last(3, -1);
    last[0] = int32_t(std::max_element(&out(0, 0), &out(0, 0) + vocab) - &out(0, 0));
    std::size_t s2 = 0;
    for (std::size_t pass = 0; pass < 3; ++pass) {
      CAPTURE(pass);
      rows.clear();
      std::vector<std::size_t> who;  // the sequence of each logits row
      rows.push_back({.seq = 0, .token = last[0], .logits = true});
      who.push_back(0);
      const std::size_t n2 = std::min<std::size_t>(4, prompts[2].size() - s2);
      for (std::size_t i = 0; i < n2; ++i)
        rows.push_back({.seq = 2, .token = prompts[2][s2 + i], .logits = s2 + i + 1 == prompts[2].size()});
      if (s2 + n2 == prompts[2].size() && n2 > 0) who.push_back(2);
      if (pass == 0) {
        for (std::size_t i = 3; i < prompts[1].size(); ++i)
          rows.push_back({.seq = 1, .token = prompts[1][i], .logits = i + 1 == prompts[1].size()});
      } else {
        rows.push_back({.seq = 1, .token = last[1], .logits = true});
      }
      who.push_back(1);
      out = g.batch(rows);
      REQUIRE(out.extent(0) == who.size());
      for (std::size_t r = 0; r < who.size(); ++r) {
        const std::size_t s = who[r];
        std::span<const float> want;
        if (s == 0) want = ref[0].eval(last[0]);
        else if (s == 2) want = feed(ref[2], prompts[2]);
        else if (pass == 0) want = feed(ref[1], std::span<const int32_t>(prompts[1]).subspan(3));
        else want = ref[1].eval(last[1]);
        const std::span<const float> got(&out(r, 0), vocab);
        INFO("sequence ", s);
        same(got, want, "mixed pass");
        last[s] = sampling::argmax(got);
      }
      s2 += n2;
      CHECK(g.n_past(0) == ref[0].n_past());
      CHECK(g.n_past(1) == ref[1].n_past());
      CHECK(g.n_past(2) == s2);
    }
    // rewind: sequence 0 drops its decoded tokens and runs another; the Session rewound the same agrees.
    g.rewind(0, 4);
    ref[0].rewind(4);
    const std::vector<BatchRow> again = {{.seq = 0, .token = 42, .logits = true}};
    out = g.batch(again);
    same({&out(0, 0), vocab}, ref[0].eval(42), "after rewind");
    // A pass of one sequence's rows only (a prompt chunk with nothing else running) takes the prompt path.
    const std::vector<int32_t> more = {5, 6, 7, 8, 9};
    std::vector<BatchRow> chunk;
    for (std::size_t i = 0; i < more.size(); ++i)
      chunk.push_back({.seq = 1, .token = more[i], .logits = i + 1 == more.size()});
    out = g.batch(chunk);
    REQUIRE(out.extent(0) == 1);
    same({&out(0, 0), vocab}, feed(ref[1], more), "one sequence's chunk");
    CHECK(g.n_past(1) == ref[1].n_past());
  }
}

TEST_CASE("session group: mixed batches of prompt chunks and decode tokens match separate sessions") {
  check_mixed(load(shared_model("stories260K.gguf")), Precision::fast);
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-group-mixed-q8");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::Q8_0, {"output.weight"});
  check_mixed(load(tmp.path), Precision::exact);
}

TEST_CASE("session group: batch() errors name what is wrong and change nothing") {
  const Model model = load(shared_model("stories260K.gguf"));
  SessionGroup g(model, 2, {.ctx = 4, .batch = 4});
  using R = std::vector<BatchRow>;
  CHECK_THROWS_WITH_AS(g.batch(R{}), doctest::Contains("no rows"), Error);
  CHECK_THROWS_WITH_AS(g.batch(R{{0, 1, false}, {1, 2, false}, {0, 3, false}}), doctest::Contains("not consecutive"),
                       Error);
  CHECK_THROWS_WITH_AS(g.batch(R{{2, 1, true}}), doctest::Contains("sequence 2"), Error);
  CHECK_THROWS_WITH_AS(g.batch(R{{0, 600, true}}), doctest::Contains("outside the vocabulary"), Error);
  CHECK_THROWS_WITH_AS(g.batch(R{{0, 1, true}, {0, 2, true}, {0, 3, true}}), doctest::Contains("at most 2"), Error);
  CHECK_THROWS_WITH_AS(g.batch(R(5, BatchRow{0, 1, false})), doctest::Contains("exceed the batch size 4"), Error);
  CHECK(g.n_past(0) == 0);
  g.batch(R{{0, 1, false}, {0, 2, false}, {0, 3, true}});
  CHECK_THROWS_WITH_AS(g.batch(R{{1, 1, false}, {0, 2, false}, {0, 3, true}}), doctest::Contains("is full"), Error);
  CHECK(g.n_past(0) == 3);
  CHECK(g.n_past(1) == 0);
  CHECK_THROWS_WITH_AS(g.rewind(0, 4), doctest::Contains("cannot keep 4 positions of sequence 0, it holds 3"), Error);
  g.rewind(0, 1);
  CHECK(g.n_past(0) == 1);
  CHECK(g.batch(R{{1, 1, false}, {0, 2, false}, {0, 3, true}}).extent(0) == 1);
  CHECK(g.n_past(0) == 3);
  CHECK(g.n_past(1) == 1);
}

}  // namespace
}  // namespace kiln::test
