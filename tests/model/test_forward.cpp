// Transformer<Config>::forward against the naive double-precision reference (ref_model.hpp): on
// stories260K (f32, f16 and bf16 weights) and on small random models that switch on every trait, with an
// f32 KV cache and with an f16 one (against the reference that rounds keys and values to f16).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "kiln/model/model.hpp"
#include "model_test_util.hpp"
#include "ref_model.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

// Tolerances. kiln runs the same maths in f32 (SIMD sums in a different order, f32 cos/sin tables,
// float inverse frequencies); the reference runs it in double. The per-op f32 error is ~1e-6 relative;
// through 3-5 layers with logits of magnitude ~1, the measured worst error is ~4e-6 (2e-7 + 1e-7 |x|
// exceeded 17x at most), so 2e-5 + 2e-5 |x| leaves a 5-10x margin and still catches any real mistake
// (a wrong RoPE pair, mask or norm moves logits by > 1e-2).
constexpr double kRtol = 2e-5, kAtol = 2e-5;
// An f16 KV cache (.kv_type = KVType::f16) is checked against both references, the one whose keys and
// values are rounded to f16 (ref_forward(..., true)) and the f32 one, in units of the tolerance above:
// its logits must be at least kF16Closer times closer to the rounded one. (An absolute tolerance does
// not fit: where the f32 and the double value of a key or value fall on either side of an f16 rounding
// boundary, about 1 element in 10^3 to 10^4 (a 1e-7 to 1e-6 difference over the 2^-11 step), kiln's
// element is one f16 step from the reference's; that moves the logits by a fraction of the whole
// rounding effect that grows as the model shrinks. Measured (error / tolerance, rounded vs f32
// reference): llama 0.04 vs 28, qwen 3.3 vs 30, gemma 4.9 vs 38, layernorm 1.9 vs 13.7, stories260K
// 8.3 vs 145: at most 0.14 of the way (bound 0.25); a cache that did not round, rounded the wrong way
// or read the wrong element is not closer to the rounded reference.)
constexpr double kF16Closer = 4;

/// The KV type a test session uses: automatic (the sessions' default, f16 unless Precision::exact) means
/// f32 here, since kRtol / kAtol are f32 tolerances; tests ask for KVType::f16 explicitly.
KVType test_kv_type(const SessionOptions& so) { return so.kv_type == KVType::automatic ? KVType::f32 : so.kv_type; }

template <class C>
Model make_model(const RefModel& m) {
  return Model(std::make_shared<Transformer<C>>(m.hp, weights_of(m), dummy_tokenizer(m.hp.vocab)));
}

/// max over i of |got - want| / (atol + rtol |want|) (NaN: NaN).
double worst_ratio(std::span<const float> got, const std::vector<double>& want, double rtol, double atol) {
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(double(got[i]) - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (!(r <= w)) w = r;
  }
  return w;
}

/// Runs `tokens` through a session: the first n_prompt as one eval (split by the session's batch), the
/// rest one by one, comparing logits with the reference after the prompt and after every later token.
/// The KV cache is f32 unless so.kv_type is KVType::f16 (then compared as kF16Closer says).
void check_against_ref(const Model& model, const RefModel& ref, const std::vector<int32_t>& tokens,
                       std::size_t n_prompt, SessionOptions so, const std::string& what) {
  so.kv_type = test_kv_type(so);
  const bool f16 = so.kv_type != KVType::f32;  // f16 or q8_0: compared as kF16Closer says
  const auto want = ref_forward(ref, tokens, so.kv_type);
  const auto want32 = f16 ? ref_forward(ref, tokens) : std::vector<std::vector<double>>{};
  Session s(model, so);
  REQUIRE(s.kv_type() == so.kv_type);
  INFO(what, " ctx ", so.ctx, " batch ", so.batch, " threads ", so.threads, " KV ",
       std::string(kv_type_name(so.kv_type)));
  double near = 0, far = 0;
  auto check = [&](std::span<const float> got, std::size_t i, const std::string& where) {
    if (!f16) {
      check_logits(got, want[i], kRtol, kAtol, where);
      return;
    }
    const double a = worst_ratio(got, want[i], kRtol, kAtol), b = worst_ratio(got, want32[i], kRtol, kAtol);
    if (!(a <= near)) near = a;
    if (!(b <= far)) far = b;
  };
  check(s.eval(std::span(tokens).first(n_prompt)), n_prompt - 1, "after the prompt");
  for (std::size_t i = n_prompt; i < tokens.size(); ++i)
    check(s.eval(tokens[i]), i, "decode step " + std::to_string(i));
  if (f16) {
    MESSAGE(what, " batch ", so.batch, " threads ", so.threads, ", ", std::string(kv_type_name(so.kv_type)),
            " KV cache: worst error / tolerance ", near, " against the reference that rounds as it does, ", far,
            " against the f32 one");
    CHECK(near * kF16Closer <= far);
  }
}

std::vector<int32_t> random_tokens(std::size_t n, std::size_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = int32_t(rng() % vocab);
  return t;
}

// ---- trait combinations (names are arbitrary: these are built directly, not loaded) ----
struct QwenLike : ArchDefaults {  // Qwen2's biases + Qwen3's qk-norm, neox RoPE, tied embeddings
  static constexpr std::string_view name = "test-qwen";
  static constexpr bool qkv_bias = true, qk_norm = true;
};
struct OlmoeLike : ArchDefaults {  // OLMoE's q/k norms over the whole projections
  static constexpr std::string_view name = "test-olmoe";
  static constexpr bool qk_norm = true, qk_norm_whole = true;
};
struct GemmaLike : ArchDefaults {  // Gemma 2/3's extras
  static constexpr std::string_view name = "test-gemma";
  static constexpr NormWeight norm_weight = NormWeight::one_plus;
  static constexpr Activation activation = Activation::gelu_tanh;
  static constexpr bool qk_norm = true, post_attn_norm = true, post_ffw_norm = true;
  static constexpr EmbedScale embed_scale = EmbedScale::sqrt_dim;
  static constexpr std::size_t sliding_window_pattern = 2;
  static constexpr bool attn_softcap = true, final_softcap = true;
};
struct LayerNormLike : ArchDefaults {  // GPT-style LayerNorm with every bias, partial rotary, interleaved pairs
  static constexpr std::string_view name = "test-layernorm";
  static constexpr NormKind norm_kind = NormKind::layer;
  static constexpr Activation activation = Activation::gelu_erf;
  static constexpr RopeStyle rope_style = RopeStyle::gptj;
  static constexpr bool o_bias = true, mlp_bias = true;
};

HParams small_hparams(const std::string& arch) {
  HParams hp;
  hp.arch = arch;
  hp.dim = 16;
  hp.n_layers = 3;
  hp.n_heads = 4;
  hp.n_kv_heads = 2;
  hp.head_dim = 6;  // q_dim 24 != dim: wo is (dim, q_dim)
  hp.ffn_dim = 24;
  hp.vocab = 40;
  hp.ctx_train = 64;
  hp.rope_dim = 6;
  hp.rope_theta = 100.0f;  // fast rotation, so a wrong position shows
  hp.norm_eps = 1e-5f;
  hp.attn_scale = float(1.0 / std::sqrt(6.0));
  return hp;
}

template <class C>
void check_config(const RefTraits& t, HParams hp, uint32_t seed) {
  const RefModel ref = random_model(t, hp, seed);
  const Model model = make_model<C>(ref);
  const auto tokens = random_tokens(44, hp.vocab, seed + 1);
  // 40 prompt tokens in one batch: two attention query chunks (32 + 8); then 4 decode steps.
  check_against_ref(model, ref, tokens, 40, {.ctx = 64, .threads = 1, .batch = 64}, std::string(C::name));
  // The same split into batches of 7 (the KV cache carries the earlier chunks), on 2 threads.
  check_against_ref(model, ref, tokens, 40, {.ctx = 48, .threads = 2, .batch = 7}, std::string(C::name));
  // An f16 KV cache, prefill (GEMM) and decode (GEMV) against f16 keys and values.
  check_against_ref(model, ref, tokens, 40, {.ctx = 64, .threads = 1, .batch = 64, .kv_type = KVType::f16},
                    std::string(C::name));
  check_against_ref(model, ref, tokens, 40, {.ctx = 48, .threads = 2, .batch = 7, .kv_type = KVType::f16},
                    std::string(C::name));
}

TEST_CASE("forward: Llama traits on a random model match the reference") {
  RefTraits t;  // rms, silu, gptj pairs
  check_config<Llama>(t, small_hparams("llama"), 11);
}

TEST_CASE("forward: Qwen-like traits (neox RoPE, qkv bias, qk-norm, tied) match the reference") {
  RefTraits t;
  t.neox = true;
  t.qkv_bias = true;
  t.qk_norm = true;
  check_config<QwenLike>(t, small_hparams("test-qwen"), 21);
}

TEST_CASE("forward: q/k norms over the whole projections (OLMoE) match the reference") {
  RefTraits t;
  t.neox = true;
  t.qk_norm = true;
  t.qk_norm_whole = true;
  check_config<OlmoeLike>(t, small_hparams("test-olmoe"), 23);
}

// The reference's traits and the hyper-parameters of a small Gemma-like model.
std::pair<RefTraits, HParams> gemma_like() {
  RefTraits t;
  t.one_plus = true;
  t.act = Activation::gelu_tanh;
  t.neox = true;
  t.qk_norm = true;
  t.post_attn_norm = true;
  t.post_ffw_norm = true;
  t.embed_scale = true;
  t.swa_pattern = 2;
  HParams hp = small_hparams("test-gemma");
  hp.sliding_window = 5;   // layers 0 and 2 see the last 5 positions, layer 1 all of them
  hp.attn_softcap = 2.0f;  // small caps so that they bite
  hp.final_softcap = 3.0f;
  hp.attn_scale = 0.3f;
  return {t, hp};
}

TEST_CASE("forward: Gemma-like traits (1+w norms, gelu, post norms, sliding window, soft-caps) match the reference") {
  const auto [t, hp] = gemma_like();
  check_config<GemmaLike>(t, hp, 31);
}

// A q8_0 KV cache (head_dim 32: one Q8_0 block per head row) against the reference that rounds keys and values
// through Q8_0 (ref_round_q8_0), prompt chunks (the tiled kernel) and decode steps (the GEMV kernels) alike.
template <class C>
void check_q8_0_cache(const RefTraits& t, HParams hp, uint32_t seed) {
  hp.head_dim = 32;
  hp.rope_dim = 32;
  hp.attn_scale = float(1.0 / std::sqrt(32.0));
  const RefModel ref = random_model(t, hp, seed);
  const Model model = make_model<C>(ref);
  const auto tokens = random_tokens(44, hp.vocab, seed + 1);
  check_against_ref(model, ref, tokens, 40, {.ctx = 64, .threads = 1, .batch = 64, .kv_type = KVType::q8_0},
                    std::string(C::name));
  check_against_ref(model, ref, tokens, 40, {.ctx = 48, .threads = 2, .batch = 7, .kv_type = KVType::q8_0},
                    std::string(C::name));
}

TEST_CASE("forward: a q8_0 KV cache matches the reference that rounds keys and values through Q8_0") {
  check_q8_0_cache<Llama>(RefTraits{}, small_hparams("llama"), 41);
  const auto [t, hp] = gemma_like();
  check_q8_0_cache<GemmaLike>(t, hp, 43);
}

TEST_CASE(
    "forward: one KV head (decode splits a group's query heads over the threads) matches the reference, "
    "bit for bit on 1 to 3 threads") {
  auto [t, hp] = gemma_like();
  hp.n_kv_heads = 1;  // Gemma 3 270M / 1B: 4 query heads on one KV head
  check_config<GemmaLike>(t, hp, 51);
  const RefModel ref = random_model(t, hp, 51);
  const Model model = make_model<GemmaLike>(ref);
  const auto tokens = random_tokens(30, hp.vocab, 52);
  std::vector<std::vector<float>> first;
  for (const std::size_t threads : {1u, 2u, 3u}) {
    INFO("threads ", threads);
    Session s(model, {.ctx = 32, .threads = threads, .batch = 32});
    std::vector<std::vector<float>> got;
    const auto p = s.eval(std::span(tokens).first(20));
    got.emplace_back(p.begin(), p.end());
    for (std::size_t i = 20; i < tokens.size(); ++i) {  // decode steps past the sliding window of 5
      const auto l = s.eval(tokens[i]);
      got.emplace_back(l.begin(), l.end());
    }
    if (first.empty()) first = got;
    else CHECK(got == first);
  }
}

TEST_CASE(
    "forward: a long context (prompt tiles of 64 positions, decode split into parts of 1024) matches the reference, "
    "bit for bit on 1 and 2 threads") {
  // 2045 prompt tokens (chunks of 32 query rows over 32 tiles), then decode steps whose caches cross the
  // parts' boundary at 2048: one part, then two and three merged. Gemma-like: a sliding window of 5 leaves
  // the earlier parts of a decode step empty.
  for (const bool gemma : {false, true}) {
    CAPTURE(gemma);
    auto [t, hp] = gemma ? gemma_like() : std::pair{RefTraits{}, small_hparams("llama")};
    hp.ctx_train = 4096;
    const RefModel ref = random_model(t, hp, 61);
    const Model model = gemma ? make_model<GemmaLike>(ref) : make_model<Llama>(ref);
    const auto tokens = random_tokens(2053, hp.vocab, 62);
    check_against_ref(model, ref, tokens, 2045, {.ctx = 2056, .threads = 2, .batch = 512}, "long context");
    std::vector<std::vector<float>> first;
    for (const std::size_t threads : {1u, 2u}) {
      INFO("threads ", threads);
      Session s(model, {.ctx = 2056, .threads = threads, .batch = 512, .kv_type = KVType::f16});
      std::vector<std::vector<float>> got;
      const auto p = s.eval(std::span(tokens).first(2045));
      got.emplace_back(p.begin(), p.end());
      for (std::size_t i = 2045; i < tokens.size(); ++i) {
        const auto l = s.eval(tokens[i]);
        got.emplace_back(l.begin(), l.end());
      }
      if (first.empty()) first = got;
      else CHECK(got == first);
    }
  }
}

TEST_CASE("forward: LayerNorm traits (biases everywhere, gelu erf, partial rotary) match the reference") {
  RefTraits t;
  t.layer_norm = true;
  t.act = Activation::gelu_erf;
  t.o_bias = true;
  t.mlp_bias = true;
  HParams hp = small_hparams("test-layernorm");
  hp.rope_dim = 4;  // rotate 4 of each head's 6 elements
  check_config<LayerNormLike>(t, hp, 41);
}

TEST_CASE("forward: stories260K (GGUF, f32) matches the reference") {
  const std::string path = shared_model("stories260K.gguf");
  const io::GGUFFile f(path);
  const RefModel ref = ref_from_gguf(f);
  const Model model = load(path);
  const auto tokens = random_tokens(24, ref.hp.vocab, 5);
  check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 1}, "stories260K");
  check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 2, .batch = 6}, "stories260K");
  check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 1, .kv_type = KVType::f16}, "stories260K");
  check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 2, .batch = 6, .kv_type = KVType::f16},
                    "stories260K");
}

/// The reference for a rewritten stories260K: f's model with every matrix replaced by g's, dequantized.
RefModel ref_with_matrices_of(const io::GGUFFile& f, const io::GGUFFile& g) {
  RefModel ref = ref_from_gguf(f);
  auto widen = [&](const std::string& name, Vec& dst) {
    const auto& t = g.tensor(name);
    dequantize_row(t.type, t.data.data(), dst.data(), dst.size());
  };
  widen("token_embd.weight", ref.emb);
  if (g.find_tensor("output.weight")) widen("output.weight", ref.output);
  else ref.output = ref.emb;
  for (std::size_t l = 0; l < ref.hp.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto& L = ref.layers[l];
    widen(p + "attn_q.weight", L.wq);
    widen(p + "attn_k.weight", L.wk);
    widen(p + "attn_v.weight", L.wv);
    widen(p + "attn_output.weight", L.wo);
    widen(p + "ffn_gate.weight", L.gate);
    widen(p + "ffn_up.weight", L.up);
    widen(p + "ffn_down.weight", L.down);
  }
  return ref;
}

TEST_CASE("forward: f16 and bf16 weights match the reference built from the same rounded weights") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  for (auto type : {io::GGMLType::F16, io::GGMLType::BF16}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-half");
    rewrite_gguf(f, tmp.path, "llama", type);
    const Model model = load(tmp.path);
    CHECK(model.impl().weights().layers[0].wq.type == type);
    // The reference: the rewritten file's matrices widened back to f32 (exactly).
    const io::GGUFFile g(tmp.path);
    const RefModel ref = ref_with_matrices_of(f, g);
    const auto tokens = random_tokens(12, ref.hp.vocab, 9);
    // exact: f32 products, the f32 tolerance.
    check_against_ref(model, ref, tokens, 8, {.ctx = 16, .threads = 1, .precision = Precision::exact},
                      "stories260K half");
    // fast: the prompt's products on AMX bf16 tiles where usable (x and f16 weights in two bf16 parts: per
    // product <= 3 * 2^-16 = 4.6e-5 of sum |x w| besides the f32 sums' error, docs/kernels.md), of the order
    // of the two-part 8-bit activations' 1/32000 of a block's largest value: their bound, 1e-3 of the range
    // (f32 KV cache), applies. Elsewhere fast is exact's f32 GEMM.
    const auto want = ref_forward(ref, tokens);
    Session s(model, {.ctx = 16, .threads = 1, .precision = Precision::fast, .kv_type = KVType::f32});
    const unsigned long before = detail::amx_gemm_calls().load();
    double worst_ratio = 0;
    for (std::size_t i = 7; i < tokens.size(); ++i) {
      const auto got = i == 7 ? s.eval(std::span(tokens).first(8)) : s.eval(tokens[i]);
      const auto [lo, hi] = std::minmax_element(want[i].begin(), want[i].end());
      double worst = 0;
      for (std::size_t v = 0; v < got.size(); ++v) worst = std::max(worst, std::fabs(double(got[v]) - want[i][v]));
      worst_ratio = std::max(worst_ratio, worst / (*hi - *lo));
    }
    CHECK(worst_ratio <= 1e-3);
    if (amx_bf16_active()) CHECK(detail::amx_gemm_calls().load() > before);
    MESSAGE(io::ggml_type_name(type), " fast (AMX bf16 tiles: ", amx_bf16_active(),
            "): worst max |delta logit| / range ", worst_ratio);
  }
}

TEST_CASE("forward: quantized weights, exact path: f32 products with the dequantized weights match the reference") {
  // Precision::exact multiplies by the dequantized weights in f32, so the tolerance of the f32 tests
  // applies unchanged (the reference uses the same dequantized values, in double).
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  for (auto type : {io::GGMLType::Q8_0, io::GGMLType::Q4_0, io::GGMLType::Q4_1, io::GGMLType::Q5_0}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-q");
    rewrite_gguf(f, tmp.path, "llama", type, {"output.weight"});  // tied: the classifier is quantized too
    const Model model = load(tmp.path);
    REQUIRE(model.impl().weights().layers[0].wq.type == type);
    REQUIRE(model.impl().weights().output.type == type);
    const io::GGUFFile g(tmp.path);
    const RefModel ref = ref_with_matrices_of(f, g);
    const auto tokens = random_tokens(24, ref.hp.vocab, 6);
    check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 1, .precision = Precision::exact}, "exact");
    check_against_ref(model, ref, tokens, 20, {.ctx = 32, .threads = 2, .batch = 7, .precision = Precision::exact},
                      "exact");
  }
}

TEST_CASE(
    "forward: quantized weights, fast and fast8 paths: integer products stay within the activation-rounding error") {
  // fast8 rounds each 32-value block of activations to 8 bits (a step of 1/127 of the block's largest
  // value) before every weight product. stories260K is a worst case for that: K = 64 is two blocks, so
  // one large activation coarsens half a row, and 5 layers compound it. Measured worst max |delta logit| /
  // logit range over 24 positions, 1 and 2 threads: Q8_0 0.90%, Q4_0 1.13%, Q4_1 0.96%, Q5_0 0.82%; bound
  // 3% (2.6x margin). fast carries the activations in two 8-bit parts (~250x finer): measured 3.4e-5 to 4.1e-5
  // of the range; bound 0.1% (24x margin). Both far below what a wrong block decoding (offset, scale or nibble order) does: that
  // scrambles the logits (> 30% of the range).
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  for (auto type : {io::GGMLType::Q8_0, io::GGMLType::Q4_0, io::GGMLType::Q4_1, io::GGMLType::Q5_0}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-q");
    rewrite_gguf(f, tmp.path, "llama", type, {"output.weight"});
    const Model model = load(tmp.path);
    const io::GGUFFile g(tmp.path);
    const RefModel ref = ref_with_matrices_of(f, g);
    const auto tokens = random_tokens(24, ref.hp.vocab, 6);
    const auto want = ref_forward(ref, tokens);
    for (const auto& [precision, bound] : {std::pair{Precision::fast, 1e-3}, std::pair{Precision::fast8, 3e-2}}) {
      double worst_ratio = 0;
      for (std::size_t threads : {1, 2}) {
        // (f32 KV cache: these bounds are the integer products'; an f16 cache adds its own ~4e-4 of the
        // range, tests/model/test_kv_cache.cpp)
        Session s(model, {.ctx = 32, .threads = threads, .batch = 8, .precision = precision, .kv_type = KVType::f32});
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          const auto got = s.eval(tokens[i]);
          const auto lo_hi = std::minmax_element(want[i].begin(), want[i].end());
          const auto lo = lo_hi.first, hi = lo_hi.second;  // (clang 14 cannot capture a structured binding)
          double worst = 0;
          for (std::size_t v = 0; v < got.size(); ++v) worst = std::max(worst, std::fabs(double(got[v]) - want[i][v]));
          INFO("threads ", threads, " position ", i, ": max |delta logit| ", worst, " of a range ", *hi - *lo);
          CHECK(worst <= bound * (*hi - *lo));
          worst_ratio = std::max(worst_ratio, worst / (*hi - *lo));
        }
      }
      const std::string tag =
          std::string(io::ggml_type_name(type)) + (precision == Precision::fast ? " fast" : " fast8");
      MESSAGE(tag, ": worst max |delta logit| / range ", worst_ratio);
    }
  }
}

TEST_CASE(
    "forward: a quantized (Q8_0) token embedding is dequantized row by row, and the tied classifier multiplies by it") {
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  TempFile tmp("kiln-test-q8-embd");
  rewrite_gguf(f, tmp.path, "llama", io::GGMLType::F32, {}, /*q8_embedding=*/true);
  const Model model = load(tmp.path);
  REQUIRE(model.impl().weights().tok_embd.type == io::GGMLType::Q8_0);
  const io::GGUFFile g(tmp.path);
  RefModel ref = ref_from_gguf(f);  // output.weight stays f32; the embedding as the file stores it
  const auto& e = g.tensor("token_embd.weight");
  dequantize_row(e.type, e.data.data(), ref.emb.data(), ref.emb.size());
  check_against_ref(model, ref, random_tokens(10, ref.hp.vocab, 4), 6, {.ctx = 16}, "q8_0 embedding");
  // Tied to the Q8_0 embedding: the classifier is a Q8_0 product (exact path: same tolerance).
  TempFile tied("kiln-test-q8-tied");
  rewrite_gguf(f, tied.path, "llama", io::GGMLType::F32, {"output.weight"}, true);
  const Model tm = load(tied.path);
  REQUIRE(tm.impl().weights().output.type == io::GGMLType::Q8_0);
  ref.output = ref.emb;
  check_against_ref(tm, ref, random_tokens(10, ref.hp.vocab, 4), 6, {.ctx = 16, .precision = Precision::exact},
                    "tied q8_0 classifier");
}

TEST_CASE("forward: f16/bf16 weights packed at load (read or mapped) give bit-identical logits") {
  // LoadOptions::pack (default) repacks f16/bf16 matrices (ops/matmul.hpp's packed rows): in place when the
  // file is read into memory, into owned memory when it is mapped; the GEMV and GEMM do the same arithmetic
  // in either layout. stories260K:
  // 64-wide rows (two 32-element chunks) and 172-wide ones (5 chunks + a 12-element tail), 172 rows (21
  // groups of 8 + 4 row-major rows). Prompt (GEMM), decode (GEMV), 1 and 2 threads.
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  for (auto type : {io::GGMLType::F16, io::GGMLType::BF16}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-packed");
    rewrite_gguf(f, tmp.path, "llama", type);
    const Model packed = load(tmp.path, {.mode = io::LoadMode::read});
    const Model plain = load(tmp.path, {.mode = io::LoadMode::read, .pack = false});
    const Model mapped = load(tmp.path);  // packed into owned memory
    const auto& w = packed.impl().weights();
    CHECK(w.layers[0].wq.packed);
    CHECK(w.layers[4].w_down.packed);
    CHECK(w.output.packed == (w.output.data != w.tok_embd.data));
    CHECK_FALSE(w.tok_embd.packed);  // the embedding is read by rows: never packed
    CHECK(w.owned_packed.empty());   // in place
    CHECK_FALSE(plain.impl().weights().layers[0].wq.packed);
    const auto& wm = mapped.impl().weights();
    CHECK(wm.layers[0].wq.packed);
    REQUIRE(wm.owned_packed.size() == 1);  // one buffer holds every packed matrix, each in its own bytes
    const std::byte* lo = wm.owned_packed[0].data();
    const std::byte* hi = lo + wm.owned_packed[0].size();
    for (const auto& L : wm.layers)
      for (const WeightRef* r : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
        CHECK(r->packed);
        CHECK((r->data >= lo && r->data + r->rows * r->row_bytes <= hi));
      }
    {  // the mapped file's bytes are untouched: its tensor still holds the row-major matrix
      const io::GGUFFile g(tmp.path);
      const auto* t = g.find_tensor("blk.0.attn_q.weight");
      REQUIRE(t != nullptr);
      std::vector<std::byte> bytes(t->data.begin(), t->data.end());
      const io::GGUFFile g2(tmp.path, io::LoadMode::read);
      const auto* t2 = g2.find_tensor("blk.0.attn_q.weight");
      CHECK(std::memcmp(bytes.data(), t2->data.data(), bytes.size()) == 0);
    }
    if (type == io::GGMLType::F16)
      CHECK_THROWS_WITH(w.layers[0].wq.view<f16>(), doctest::Contains("is stored in packed rows"));
    const auto tokens = random_tokens(20, 512, 5);
    for (std::size_t threads : {1, 2}) {
      CAPTURE(threads);
      Session sp(packed, {.ctx = 32, .threads = threads}), sr(plain, {.ctx = 32, .threads = threads}),
          sm(mapped, {.ctx = 32, .threads = threads});
      auto same = [](std::span<const float> x, std::span<const float> y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
      };
      const auto prompt = std::span(tokens).first(12);
      {  // each session's logits stay valid until its next eval
        const auto a = sp.eval(prompt), b = sr.eval(prompt), c = sm.eval(prompt);
        CHECK(same(a, b));
        CHECK(same(a, c));
      }
      for (std::size_t i = 12; i < tokens.size(); ++i) {
        const auto a = sp.eval(tokens[i]), b = sr.eval(tokens[i]), c = sm.eval(tokens[i]);
        CHECK(same(a, b));
        CHECK(same(a, c));
      }
    }
  }
}

TEST_CASE(
    "forward: q4_0/q4_1/q5_0/q5_1/q8_0 weights interleaved at load: exact logits bit-identical, integer paths close") {
  // LoadOptions::pack (default) also repacks q4_0/q4_1/q5_0/q5_1/q8_0 matrices into 16-row interleaved blocks
  // (quant/interleave.hpp). stories260K quantized: Q/K/V/O, gate/up (64 wide) and the classifier
  // interleaved (64 or 32 rows: whole groups; 172-wide down stays f32, as llama-quantize leaves it); a
  // tied classifier is the embedding table, which embed_rows then reads back out of the groups.
  // The exact path gives bit-identical logits in either layout. The integer paths' GEMV (every decode
  // step, and a prompt's last-token classifier) computes on AVX3_DL each output as the GEMM does, which
  // test_qmatmul_interleave.cpp checks bit for bit; its f32 sums are ordered differently from the row-major
  // GEMV's (outputs ~1e-7 apart). With two activation parts that difference flips an occasional rounding
  // of a residual, so logits may move by about the integer path's own error from the exact logits, in either
  // layout: fast (two parts) within 2e-3 of their range (seen up to 9e-4; 1.3e-3 from exact), fast8 (one
  // part: its own error from exact reaches 3e-2 of the range on this 64-wide model) within 5e-2 (seen up to
  // 2.3e-2 on AVX2, where Q5's GEMV sums in another f32 order than the row-major one); both also within
  // that of the exact logits; read and mapped loads identical.
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  std::size_t interleaved_types = 0;
  for (auto type :
       {io::GGMLType::Q4_0, io::GGMLType::Q4_1, io::GGMLType::Q5_0, io::GGMLType::Q5_1, io::GGMLType::Q8_0}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-interleaved");
    rewrite_gguf(f, tmp.path, "llama", type);
    const Model packed = load(tmp.path, {.mode = io::LoadMode::read});
    const Model plain = load(tmp.path, {.mode = io::LoadMode::read, .pack = false});
    const Model mapped = load(tmp.path);
    const auto& w = packed.impl().weights();
    REQUIRE(w.layers[0].wq.type == type);
    // The groups only where the dispatched kernels read them: AVX3_DL and AVX2 all five types, lower
    // targets none (the next test checks every target, this CPU's included, either way).
    if (!dispatch::qmatmul_interleaved_native(uint32_t(type))) {
      MESSAGE(io::ggml_type_name(type), " stays row-major on ", simd::current_target());
      CHECK_FALSE(w.layers[0].wq.packed);
      continue;
    }
    ++interleaved_types;
    CHECK(w.layers[0].wq.packed);
    CHECK(w.layers[0].wk.packed);
    CHECK(w.layers[3].w_up.packed);
    CHECK_FALSE(w.layers[0].w_down.packed);  // f32
    CHECK(w.output.packed);
    // A tied classifier is interleaved too (the embedding lookup reads rows back out of the groups).
    CHECK(w.tok_embd.packed == (w.output.data == w.tok_embd.data));
    CHECK(w.owned_packed.empty());
    CHECK_FALSE(plain.impl().weights().layers[0].wq.packed);
    CHECK(mapped.impl().weights().layers[0].wq.packed);
    CHECK_FALSE(mapped.impl().weights().owned_packed.empty());
    const std::string is_type = "is " + std::string(io::ggml_type_name(type));
    CHECK_THROWS_WITH(w.layers[0].wq.view<float>(), doctest::Contains(is_type.c_str()));
    const auto tokens = random_tokens(20, 512, 6);
    auto same = [](std::span<const float> x, std::span<const float> y) {
      return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
    };
    for (const Precision p : {Precision::fast, Precision::fast8, Precision::exact}) {
      for (std::size_t threads : {1, 2}) {
        CAPTURE(int(p));
        CAPTURE(threads);
        const SessionOptions o{.ctx = 32, .threads = threads, .precision = p};
        Session sp(packed, o), sr(plain, o), sm(mapped, o);
        Session se(plain, {.ctx = 32, .threads = threads, .precision = Precision::exact});
        const float tol = p == Precision::fast8 ? 5e-2f : 2e-3f;
        const auto prompt = std::span(tokens).first(12);
        // a: packed, b: plain, c: mapped, e: exact (plain) logits of the same step.
        auto check = [&](std::span<const float> a, std::span<const float> b, std::span<const float> c,
                         std::span<const float> e) {
          CHECK(same(a, c));
          float range = 0, diff = 0, from_exact = 0;
          for (std::size_t j = 0; j < a.size(); ++j) {
            range = std::max(range, std::fabs(b[j]));
            diff = std::max(diff, std::fabs(a[j] - b[j]));
            from_exact = std::max(from_exact, std::fabs(a[j] - e[j]));
          }
          CHECK(diff <= tol * range);
          CHECK(from_exact <= 1.5f * tol * range);
          if (p == Precision::exact) CHECK(same(a, b));
        };
        // Each span is valid until its session's next eval.
        check(sp.eval(prompt), sr.eval(prompt), sm.eval(prompt), se.eval(prompt));
        for (std::size_t i = 12; i < tokens.size(); ++i)
          check(sp.eval(tokens[i]), sr.eval(tokens[i]), sm.eval(tokens[i]), se.eval(tokens[i]));
      }
    }
  }
  const std::string t = simd::current_target();
  MESSAGE("types interleaved on ", t, ": ", interleaved_types);
  if (t == "AVX3_DL") CHECK(interleaved_types == 5);
  if (t == "AVX2" || t == "AVX3") CHECK(interleaved_types == 5);
}

TEST_CASE("forward: each target interleaves at load only the weight types its kernels read") {
  // pack_weights interleaves a quantized type only for a target whose kernels read its 16-row groups as
  // they are (AVX3_DL, AVX2 and AVX3: all six types): any other would copy each group back
  // to row-major rows on every product (5x slower decode). Otherwise the packed load equals the plain one:
  // same layout, bit-identical logits. Interleaved, the AVX2 kernel sums in another f32 order (close to the
  // plain load's logits, identical for read and mapped loads). A model loaded under the best target and
  // run under another must compute what that target's own load computes.
  const io::GGUFFile f(shared_model("stories260K.gguf"));
  for (auto type : {io::GGMLType::Q4_0, io::GGMLType::Q4_1, io::GGMLType::Q8_0, io::GGMLType::Q5_0}) {
    INFO("weights ", io::ggml_type_name(type));
    TempFile tmp("kiln-test-stories-target-pack");
    rewrite_gguf(f, tmp.path, "llama", type);
    const Model native = load(tmp.path, {.mode = io::LoadMode::read});  // under the best target
    const auto tokens = random_tokens(16, 512, 11);
    std::size_t interleaved = 0, row_major = 0;
    for_each_target([&](const std::string& t) {
      const bool avx2 = t == "AVX2" || t == "AVX3";
      const bool expect = t == "AVX3_DL" || avx2;  // (q4_K needs K % 256: not stories260K)
      CHECK(dispatch::qmatmul_interleaved_native(uint32_t(type)) == expect);
      ++(expect ? interleaved : row_major);
      const Model packed = load(tmp.path, {.mode = io::LoadMode::read});
      const Model mapped = load(tmp.path);
      const Model plain = load(tmp.path, {.mode = io::LoadMode::read, .pack = false});
      for (const Model* m : {&packed, &mapped}) {
        const auto& w = m->impl().weights();
        REQUIRE(w.layers[0].wq.type == type);
        CHECK(w.layers[0].wq.packed == expect);
        CHECK(w.layers[3].w_up.packed == expect);
        CHECK(w.output.packed == expect);
        CHECK(w.owned_packed.empty() == (m == &packed || !expect));
      }
      const SessionOptions o{.ctx = 32, .threads = 2};
      Session sp(packed, o), sm(mapped, o), sr(plain, o), sn(native, o);
      const auto prompt = std::span(tokens).first(10);
      auto same = [](std::span<const float> a, std::span<const float> b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      auto check = [&](std::span<const float> p, std::span<const float> mp, std::span<const float> r,
                       std::span<const float> n) {
        CHECK(same(p, mp));
        if (!expect) CHECK(same(p, r));
        // The best target's layout under this target: the same kernels as this target's own layout when
        // both interleave; otherwise each group copied back to rows first, then the row-major kernels.
        if (expect || !native.impl().weights().layers[0].wq.packed) CHECK(same(p, n));
        else CHECK(same(r, n));
        float range = 0, diff = 0;
        for (std::size_t j = 0; j < p.size(); ++j) {
          range = std::max(range, std::fabs(r[j]));
          diff = std::max(diff, std::fabs(p[j] - r[j]));
        }
        CHECK(diff <= 2e-3f * range);
      };
      check(sp.eval(prompt), sm.eval(prompt), sr.eval(prompt), sn.eval(prompt));
      for (std::size_t i = 10; i < tokens.size(); ++i)
        check(sp.eval(tokens[i]), sm.eval(tokens[i]), sr.eval(tokens[i]), sn.eval(tokens[i]));
    });
    MESSAGE(io::ggml_type_name(type), ": targets interleaving ", interleaved, ", row-major ", row_major);
    CHECK(row_major > 0);  // an x86 build compiles SSE4 too
  }
}

TEST_CASE("forward: the GGUF and the llama2.c checkpoint of stories260K give identical logits") {
  const Model g = load(shared_model("stories260K.gguf"));
  const Model b = load_llama2c(shared_model("stories260K.bin"), shared_model("tok512.bin"));
  Session sg(g, {.ctx = 64}), sb(b, {.ctx = 64});
  const auto tokens = random_tokens(30, 512, 3);
  // Same f32 weights, same code: bit-identical, which checks the two loaders map the same tensors.
  const auto lg = sg.eval(tokens);
  const auto lb = sb.eval(tokens);
  REQUIRE(lg.size() == lb.size());
  CHECK(std::equal(lg.begin(), lg.end(), lb.begin()));
}

}  // namespace
}  // namespace kiln::test
