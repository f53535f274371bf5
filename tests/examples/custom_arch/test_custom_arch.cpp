// examples/custom_arch.hpp's user architecture (GPT2Like) through kiln::load<GPT2Like>, Session and the KV
// cache, against the same maths written as scalar loops in double over the GGUF's tensors (read with
// io::GGUFFile, not kiln's model loader): a prompt pass (the tiled attention kernel) then decode steps.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "custom_arch.hpp"
#include "kiln/kiln.hpp"

namespace {

std::filesystem::path scratch(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("kiln_custom_arch_" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d / name;
}

// logits (n, vocab) of tokens ids at positions 0..n-1, in double: the models of custom_arch.hpp's comment,
// GPT2Like or (parallel) ParallelArch: no position table, RoPE on each head's first hd / 2 elements (pairs
// (i, i + hd / 4), angle t / 10000^(4i / hd)), one LayerNorm whose output both sublayers read.
std::vector<double> reference_logits(const kiln::io::GGUFFile& f, const TinySizes& z, const std::vector<int32_t>& ids,
                                     bool parallel = false) {
  const std::size_t n = ids.size(), d = z.dim, hd = z.dim / z.heads;
  auto T = [&](const std::string& name) {
    const auto* t = f.find_tensor(name);
    REQUIRE_MESSAGE(t, name);
    REQUIRE(t->type == kiln::io::GGMLType::F32);
    return reinterpret_cast<const float*>(t->data.data());
  };
  auto linear = [](const std::vector<double>& in, std::size_t rows, std::size_t k, const float* W, std::size_t m,
                   const float* b) {
    std::vector<double> out(rows * m);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < m; ++j) {
        double s = b ? b[j] : 0.0;
        for (std::size_t i = 0; i < k; ++i) s += in[r * k + i] * W[j * k + i];
        out[r * m + j] = s;
      }
    return out;
  };
  auto layer_norm = [&](const std::vector<double>& in, const float* g, const float* b) {
    std::vector<double> out(in.size());
    for (std::size_t r = 0; r < n; ++r) {
      double mean = 0, var = 0;
      for (std::size_t i = 0; i < d; ++i) mean += in[r * d + i] / double(d);
      for (std::size_t i = 0; i < d; ++i) var += (in[r * d + i] - mean) * (in[r * d + i] - mean) / double(d);
      for (std::size_t i = 0; i < d; ++i) out[r * d + i] = (in[r * d + i] - mean) / std::sqrt(var + 1e-5) * g[i] + b[i];
    }
    return out;
  };
  const float *wte = T("token_embd.weight"), *wpe = parallel ? nullptr : T("position_embd.weight");
  std::vector<double> x(n * d);
  for (std::size_t t = 0; t < n; ++t)
    for (std::size_t i = 0; i < d; ++i)
      x[t * d + i] = double(wte[std::size_t(ids[t]) * d + i]) + (wpe ? wpe[t * d + i] : 0.0);
  for (uint32_t l = 0; l < z.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto h = layer_norm(x, T(p + "attn_norm.weight"), T(p + "attn_norm.bias"));
    auto qkv = linear(h, n, d, T(p + "attn_qkv.weight"), 3 * d, T(p + "attn_qkv.bias"));  // (n, 3d)
    if (parallel) {  // RoPE of q and k (the first 2d columns), each head's first hd / 2 elements
      const std::size_t half = hd / 4;
      for (std::size_t t = 0; t < n; ++t)
        for (std::size_t c = 0; c < 2 * d; c += hd)
          for (std::size_t i = 0; i < half; ++i) {
            const double a = double(t) / std::pow(10000.0, double(2 * i) / double(2 * half));
            double& x0 = qkv[t * 3 * d + c + i];
            double& x1 = qkv[t * 3 * d + c + i + half];
            const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x1 * std::cos(a) + x0 * std::sin(a);
            x0 = r0, x1 = r1;
          }
    }
    std::vector<double> att(n * d, 0.0);
    for (std::size_t hh = 0; hh < z.heads; ++hh)
      for (std::size_t t = 0; t < n; ++t) {
        std::vector<double> s(t + 1);  // causal: positions 0..t
        double mx = -1e300, sum = 0;
        for (std::size_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (std::size_t i = 0; i < hd; ++i) dot += qkv[t * 3 * d + hh * hd + i] * qkv[u * 3 * d + d + hh * hd + i];
          mx = std::max(mx, s[u] = dot / std::sqrt(double(hd)));
        }
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (std::size_t u = 0; u <= t; ++u)
          for (std::size_t i = 0; i < hd; ++i)
            att[t * d + hh * hd + i] += s[u] / sum * qkv[u * 3 * d + 2 * d + hh * hd + i];
      }
    const auto o = linear(att, n, d, T(p + "attn_output.weight"), d, T(p + "attn_output.bias"));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    auto hidden = linear(parallel ? h : layer_norm(x, T(p + "ffn_norm.weight"), T(p + "ffn_norm.bias")), n, d,
                         T(p + "ffn_up.weight"), z.ffn, T(p + "ffn_up.bias"));
    for (auto& v : hidden) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    const auto m = linear(hidden, n, z.ffn, T(p + "ffn_down.weight"), d, T(p + "ffn_down.bias"));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += m[i];
  }
  return linear(layer_norm(x, T("output_norm.weight"), T("output_norm.bias")), n, d, wte, z.vocab, nullptr);
}

// GPT2Like with its MLP written by the user (the Config's mlp hook) from public pieces; counts its calls.
struct GPT2LikeOwnMlp : GPT2Like {
  static inline int calls = 0;
  static void mlp(const kiln::MlpArgs& a) {
    ++calls;
    kiln::linear(a.h, a.w.w_up, a.up, a.pool, a.precision);
    kiln::add_bias(a.up, a.w.b_up);
    kiln::gelu_tanh(a.up, a.up, a.pool);
    kiln::linear(a.up, a.w.w_down, a.out, a.pool, a.precision);
    kiln::add_bias(a.out, a.w.b_down);
  }
};

}  // namespace

TEST_CASE("custom_arch: a Config's mlp hook replaces the traits' MLP") {
  const TinySizes z;
  const auto path = scratch("gpt2like_hook.gguf");
  write_gpt2like_gguf(path, 99, z);
  std::vector<int32_t> ids = {5, 17, 40, 3, 90, 12};
  kiln::Session traits(kiln::load<GPT2Like>(path), {.ctx = z.ctx, .threads = 2});
  kiln::Session hooked(kiln::load<GPT2LikeOwnMlp>(path), {.ctx = z.ctx, .threads = 2});
  const auto a = traits.eval(ids);
  GPT2LikeOwnMlp::calls = 0;
  const auto b = hooked.eval(ids);
  CHECK(GPT2LikeOwnMlp::calls == int(z.layers));  // one prompt pass: once per layer
  // The same ops in the same order as Transformer's own ungated MLP: the same bits.
  CHECK(std::equal(a.begin(), a.end(), b.begin(), b.end()));
}

namespace {
// ParallelArch's traits without its block hook.
struct Sequential : GPT2Like {
  static constexpr std::string_view name = "parallelarch";
  static constexpr bool rope = true, learned_positions = false;
};

// kiln::load<C> of a random file of C against reference_logits: a prompt pass (the tiled attention kernel)
// then decode steps through the KV cache.
template <class C>
void check_against_reference(const std::string& file, bool parallel) {
  const TinySizes z;
  const auto path = scratch(file);
  write_tiny_gguf<C>(path, 1234, z);
  const kiln::Model model = kiln::load<C>(path);
  CHECK(dynamic_cast<const kiln::Transformer<C>*>(&model.impl()) != nullptr);
  std::mt19937 rng(7);
  std::vector<int32_t> ids(z.ctx);
  for (auto& t : ids) t = int32_t(3 + rng() % (z.vocab - 3));
  const kiln::io::GGUFFile f(path);
  const auto ref = reference_logits(f, z, ids, parallel);  // (ctx, vocab)
  // Tolerance: each f32 dot product of K terms is within K 2^-24 of its terms' magnitude (the largest K here:
  // ffn); each of the layers and the classifier adds one such error to the residual stream, which the
  // LayerNorms keep at unit scale. RoPE's cos/sin (rounded to f32, 2^-24 relative) and its two products per
  // element add a few 2^-24 to q and k, far below that. Compared as |logit - reference| /
  // max(1, max |reference|) per row.
  const double tol = double(z.ffn) * std::ldexp(1.0, -24) * double(z.layers + 1);
  kiln::Session s(model, {.ctx = z.ctx, .threads = 2, .kv_type = kiln::KVType::f32});
  const std::size_t prompt = 9;
  double worst = 0;
  for (std::size_t t = prompt - 1; t < ids.size(); ++t) {
    const auto logits = t == prompt - 1 ? s.eval(std::span(ids).first(prompt)) : s.eval(ids[t]);
    double err = 0, scale = 1;
    for (std::size_t v = 0; v < z.vocab; ++v) {
      err = std::max(err, std::fabs(double(logits[v]) - ref[t * z.vocab + v]));
      scale = std::max(scale, std::fabs(ref[t * z.vocab + v]));
    }
    INFO("position ", t, ": error ", err / scale, ", tolerance ", tol);
    CHECK(err / scale <= tol);
    worst = std::max(worst, err / scale);
  }
  MESSAGE(C::name, ": largest relative error ", worst, " (tolerance ", tol, ")");
}
}  // namespace

TEST_CASE("custom_arch: kiln::load<GPT2Like> runs a user Config's GGUF as a scalar double reference does") {
  check_against_reference<GPT2Like>("gpt2like.gguf", false);
}

TEST_CASE("custom_arch: ParallelArch's block hook (parallel attention + MLP, partial RoPE) as the reference does") {
  check_against_reference<ParallelArch>("parallel.gguf", true);
  // Without its hook the same traits run the sequential block, which needs the ffn_norm its file lacks.
  CHECK_THROWS_WITH_AS(kiln::load<Sequential>(scratch("parallel.gguf")), doctest::Contains("blk.0.ffn_norm.weight"),
                       kiln::FormatError);
}

namespace {
// Configs whose block hook is the default block: the built-in layer's bits, through the hook.
struct GPT2LikeDefaultBlock : GPT2Like {
  static inline int calls = 0;
  static void block(const kiln::BlockArgs& b) {
    ++calls;
    kiln::default_block<GPT2Like>(b);
  }
};
struct LlamaDefaultBlock : kiln::Llama {
  static constexpr std::string_view name = "llamadefaultblock";
  static void block(const kiln::BlockArgs& b) { kiln::default_block<kiln::Llama>(b); }
};
// The same as pieces written out: qkv, rope, attend, linear, residual (the sequential block of a Llama).
struct LlamaOwnBlock : kiln::Llama {
  static constexpr std::string_view name = "llamaownblock";
  static void block(const kiln::BlockArgs& b) {
    b.norm(b.x, b.w.attn_norm, {}, b.h);
    b.qkv(b.h);
    b.rope();
    b.attend();
    b.linear(b.att, b.w.wo, b.o);
    b.residual(b.o);
    b.norm(b.x, b.w.ffn_norm, {}, b.h);
    b.mlp(b.h, b.o);
    b.residual(b.o);
  }
};
}  // namespace

TEST_CASE("custom_arch: a block hook calling default_block or the pieces gives the built-in layer's bits") {
  const TinySizes z;
  const auto path = scratch("gpt2like_block.gguf");
  write_gpt2like_gguf(path, 77, z);
  const std::vector<int32_t> ids = {5, 17, 40, 3, 90, 12, 8, 61};
  kiln::Session a(kiln::load<GPT2Like>(path), {.ctx = z.ctx, .threads = 2});
  kiln::Session b(kiln::load<GPT2LikeDefaultBlock>(path), {.ctx = z.ctx, .threads = 2});
  GPT2LikeDefaultBlock::calls = 0;
  for (std::size_t i = 0; i < ids.size(); i = i == 0 ? 4 : i + 1) {  // a prompt pass, then decode steps
    const auto la = i == 0 ? a.eval(std::span(ids).first(4)) : a.eval(ids[i]);
    const auto lb = i == 0 ? b.eval(std::span(ids).first(4)) : b.eval(ids[i]);
    CHECK(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));
  }
  CHECK(GPT2LikeDefaultBlock::calls == int(5 * z.layers));  // once per layer and pass
  // A Llama (RMSNorm, RoPE, grouped heads, gated MLP) from a Hugging Face fixture, f16 cache at fast.
  const auto dir = std::filesystem::path(KILN_SOURCE_DIR) / "tests/fixtures/models/llama";
  REQUIRE_MESSAGE(std::filesystem::exists(dir / "config.json"), "missing test fixture ", dir.string());
  const std::vector<int32_t> toks = {1, 7, 3, 9, 4, 11, 2, 5};
  kiln::Session base(kiln::load(dir), {.ctx = 16, .threads = 2});
  kiln::Session dflt(kiln::load<LlamaDefaultBlock>(dir), {.ctx = 16, .threads = 2});
  kiln::Session own(kiln::load<LlamaOwnBlock>(dir), {.ctx = 16, .threads = 2});
  for (std::size_t i = 0; i < toks.size(); i = i == 0 ? 5 : i + 1) {
    auto run = [&](kiln::Session& s) {
      const auto l = i == 0 ? s.eval(std::span(toks).first(5)) : s.eval(toks[i]);
      return std::vector<float>(l.begin(), l.end());
    };
    const auto want = run(base);
    CHECK(run(dflt) == want);
    CHECK(run(own) == want);
  }
}

TEST_CASE("custom_arch: kiln::load<GPT2Like> errors name what was wrong and leave other files to the built-ins") {
  const auto path = scratch("gpt2like_errors.gguf");
  write_gpt2like_gguf(path, 1, {});
  // Without the Config kiln::load does not know the architecture, and says which it knows.
  CHECK_THROWS_WITH_AS(kiln::load(path), doctest::Contains("'gpt2like'"), kiln::FormatError);
  // Learned positions: a position beyond the table is refused, naming the table.
  kiln::Session s(kiln::load<GPT2Like>(path), {.ctx = 40, .threads = 1});
  std::vector<int32_t> ids(33, 5);
  CHECK_THROWS_WITH(s.eval(ids), doctest::Contains("position_embd.weight"));
  // A file of a built-in architecture loads as the built-in does.
  const auto stories = std::filesystem::path(KILN_SHARED_DIR) / "models" / "stories260K.gguf";
  REQUIRE_MESSAGE(std::filesystem::exists(stories), "missing test fixture ", stories.string());
  const kiln::Model m = kiln::load<GPT2Like>(stories);
  CHECK(m.hparams().arch == "llama");
  CHECK(dynamic_cast<const kiln::Transformer<kiln::Llama>*>(&m.impl()) != nullptr);
  // A file of neither: the error names the given Configs and the built-ins.
  kiln::io::GGUFWriter w;
  w.add("general.architecture", "nosuch");
  w.write(scratch("nosuch.gguf"));
  CHECK_THROWS_WITH_AS(kiln::load<GPT2Like>(scratch("nosuch.gguf")),
                       doctest::Contains("'nosuch', which is none of the given Configs (gpt2like)"), kiln::FormatError);
}

namespace {
// GPT2Like's traits with the tensor names of OpenAI's GPT-2 checkpoints (wte, wpe, blocks' ln_1, attn.c_attn, ...).
struct GPT2Renamed : GPT2Like {
  static constexpr kiln::TensorNames gguf_names = [] {
    kiln::TensorNames n = kiln::kGgufTensorNames;
    n.tok_embd = "wte", n.pos_embd = "wpe", n.output_norm = "ln_f";
    n.attn_norm = "ln_1", n.wqkv = "attn.c_attn", n.wo = "attn.c_proj";
    n.ffn_norm = "ln_2", n.w_up = "mlp.c_fc", n.w_down = "mlp.c_proj";
    return n;
  }();
};
}  // namespace

TEST_CASE("custom_arch: a Config's gguf_names read a file whose tensors have other names") {
  const TinySizes z;
  const auto plain = scratch("gpt2like_names.gguf"), renamed = scratch("gpt2like_renamed.gguf");
  write_gpt2like_gguf(plain, 5, z);
  write_gpt2like_gguf(renamed, 5, z, GPT2Renamed::gguf_names);  // the same values under GPT-2's names
  REQUIRE(kiln::io::GGUFFile(renamed).find_tensor("blk.1.attn.c_attn.weight") != nullptr);
  const std::vector<int32_t> ids = {4, 60, 22, 9, 31};
  kiln::Session a(kiln::load<GPT2Like>(plain), {.ctx = z.ctx, .threads = 1});
  kiln::Session b(kiln::load<GPT2Renamed>(renamed), {.ctx = z.ctx, .threads = 1});
  const auto la = a.eval(ids), lb = b.eval(ids);
  CHECK(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));  // the same tensors: the same bits
  // Each Config looks for its own names, and the error says which.
  CHECK_THROWS_WITH_AS(kiln::load<GPT2Like>(renamed), doctest::Contains("'token_embd.weight' not found"),
                       kiln::FormatError);
  CHECK_THROWS_WITH_AS(kiln::load<GPT2Renamed>(plain), doctest::Contains("'wte.weight' not found"), kiln::FormatError);
}

namespace {
// A user Config read from Hugging Face checkpoints of model_type "llama" (Llama's traits under another name).
struct MyLlama : kiln::Llama {
  static constexpr std::string_view name = "myllama";
};
// GPT2Like claiming a model_type: its GPT-2-style traits are read from GGUF files only.
struct GPT2LikeHF : GPT2Like {
  static constexpr std::string_view hf_model_types[] = {"llama"};
};
}  // namespace

TEST_CASE("custom_arch: kiln::load<MyArch> of a Hugging Face checkpoint tries the user Config's model types first") {
  const auto dir = std::filesystem::path(KILN_SOURCE_DIR) / "tests/fixtures/models/llama";
  REQUIRE_MESSAGE(std::filesystem::exists(dir / "config.json"), "missing test fixture ", dir.string());
  const kiln::Model mine = kiln::load<MyLlama>(dir), builtin = kiln::load(dir);
  CHECK(dynamic_cast<const kiln::Transformer<MyLlama>*>(&mine.impl()) != nullptr);
  CHECK(dynamic_cast<const kiln::Transformer<kiln::Llama>*>(&builtin.impl()) != nullptr);
  const std::vector<int32_t> ids = {1, 7, 3, 9, 4};
  kiln::Session a(mine, {.ctx = 16, .threads = 1}), b(builtin, {.ctx = 16, .threads = 1});
  const auto la = a.eval(ids), lb = b.eval(ids);
  CHECK(std::equal(la.begin(), la.end(), lb.begin(), lb.end()));  // the same traits: the same bits
  CHECK_THROWS_WITH_AS(kiln::load<GPT2LikeHF>(dir), doctest::Contains("reads from GGUF files only"), kiln::FormatError);
}
