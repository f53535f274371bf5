// custom_arch.hpp - a user's own architectures for kiln::load, and tiny random GGUFs of them
// (examples/custom_arch.cpp runs one; tests/examples/test_custom_arch.cpp checks both against scalar double code).
//
// GPT2Like: GPT-2's block, from the traits alone
//   x     = wte[ids] + wpe[positions]                       learned absolute positions, no RoPE
//   block:  h = LayerNorm(x) ; q, k, v = h Wqkv^T + bqkv    LayerNorm with a bias; one fused projection, biased
//           x = x + (softmax(q k^T / sqrt(head_dim), causal) v) Wo^T + bo
//           x = x + gelu(LayerNorm(x) W1^T + b1) W2^T + b2   GELU MLP (tanh form), no gate
//   logits = LayerNorm(x) wte^T                             tied embeddings
// ParallelArch: a parallel block (GPT-J, Phi-2), written as a block hook from kiln's pieces
//   x     = wte[ids]                                        RoPE on the first half of each head instead
//   block:  h = LayerNorm(x) ; x = x + attention(h) + mlp(h)  one norm, both sublayers read it
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/io/gguf_writer.hpp"
#include "kiln/model/block.hpp"
#include "kiln/model/config.hpp"

/// The architecture: traits over kiln's defaults. Its tensors take llama.cpp's GPT-2 names (ArchDefaults'
/// gguf_names); a file that names them otherwise needs a gguf_names table of its own (tests/examples/custom_arch).
struct GPT2Like : kiln::ArchDefaults {
  static constexpr std::string_view name = "gpt2like";  // GGUF general.architecture
  static constexpr kiln::NormKind norm_kind = kiln::NormKind::layer;
  static constexpr kiln::Activation activation = kiln::Activation::gelu_tanh;
  static constexpr bool qkv_bias = true, o_bias = true, mlp_bias = true;
  static constexpr bool fused_qkv = true;  // blk.N.attn_qkv.weight / .bias
  static constexpr bool rope = false, gated_mlp = false, learned_positions = true;
};

/// GPT2Like's pieces (LayerNorm, biased fused QKV and output, GELU MLP) in a parallel block with partial
/// rotary positions. Its files have no ffn_norm: a Config with a block hook loads the norms it finds.
struct ParallelArch : GPT2Like {
  static constexpr std::string_view name = "parallelarch";
  static constexpr bool rope = true, learned_positions = false;  // rope.dimension_count: head_dim / 2
  static constexpr kiln::RopeStyle rope_style = kiln::RopeStyle::neox;

  static void block(const kiln::BlockArgs& b) {
    b.norm(b.x, b.w.attn_norm, b.w.attn_norm_b, b.h);  // h = LayerNorm(x)
    b.attention(b.h, b.o);                             // qkv, RoPE, KV cache, attention, Wo + bo
    b.residual(b.o);                                   // x += attention(h); h stays as it was
    b.mlp(b.h, b.o);                                   // the traits' GELU MLP of the same h
    b.residual(b.o);                                   // x += mlp(h)
  }
};

/// Sizes of the tiny model. Vocabulary: <unk> <s> </s>, then "▁" (space) and the printable ASCII '!'..'~'.
struct TinySizes {
  uint32_t vocab = 98, ctx = 32, dim = 64, heads = 4, layers = 2, ffn = 256;
};

/// Writes a GGUF of Config C (GPT2Like or ParallelArch) with random weights drawn from `seed`, its tensors
/// named by `names` (a Config's gguf_names: llama.cpp's by default).
template <class C = GPT2Like>
void write_tiny_gguf(const std::filesystem::path& path, uint32_t seed, TinySizes z = {},
                     const kiln::TensorNames& names = C::gguf_names) {
  constexpr bool parallel = std::is_same_v<C, ParallelArch>;
  kiln::io::GGUFWriter w;
  const std::string a(C::name);
  w.add("general.architecture", a);
  w.add(a + ".embedding_length", z.dim);
  w.add(a + ".block_count", z.layers);
  w.add(a + ".attention.head_count", z.heads);
  w.add(a + ".feed_forward_length", z.ffn);
  w.add(a + ".context_length", z.ctx);
  w.add(a + ".attention.layer_norm_epsilon", 1e-5f);
  if (parallel) w.add(a + ".rope.dimension_count", z.dim / z.heads / 2);
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "\u2581"};
  for (char c = '!'; c <= '~'; ++c) tokens.emplace_back(1, c);
  std::vector<int32_t> types(tokens.size(), 1);  // normal; the first three: unknown, control, control
  types[0] = 2, types[1] = types[2] = 3;
  w.add("tokenizer.ggml.model", "llama");
  w.add("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
  w.add("tokenizer.ggml.token_type", types);
  w.add("tokenizer.ggml.add_bos_token", false);
  std::mt19937 rng(seed);
  auto put = [&](const std::string& name, std::size_t rows, std::size_t cols, float mean, float sd) {
    std::vector<float> v(rows * cols);
    std::normal_distribution<float> d(mean, sd);
    for (float& x : v) x = d(rng);
    if (rows == 1) w.add_tensor(name, kiln::make_tensor(v.data(), cols));
    else w.add_tensor(name, kiln::make_tensor(v.data(), rows, cols));
  };
  auto weight = [](const std::string& p, std::string_view role) { return p + std::string(role) + ".weight"; };
  auto bias = [](const std::string& p, std::string_view role) { return p + std::string(role) + ".bias"; };
  const kiln::TensorNames& n = names;
  put(weight("", n.tok_embd), z.vocab, z.dim, 0, 0.1f);
  if (!parallel) put(weight("", n.pos_embd), z.ctx, z.dim, 0, 0.1f);
  for (uint32_t l = 0; l < z.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    put(weight(p, n.attn_norm), 1, z.dim, 1, 0.1f), put(bias(p, n.attn_norm), 1, z.dim, 0, 0.1f);
    put(weight(p, n.wqkv), 3 * z.dim, z.dim, 0, 0.15f), put(bias(p, n.wqkv), 1, 3 * z.dim, 0, 0.1f);
    put(weight(p, n.wo), z.dim, z.dim, 0, 0.3f), put(bias(p, n.wo), 1, z.dim, 0, 0.1f);
    if (!parallel) put(weight(p, n.ffn_norm), 1, z.dim, 1, 0.1f), put(bias(p, n.ffn_norm), 1, z.dim, 0, 0.1f);
    put(weight(p, n.w_up), z.ffn, z.dim, 0, 0.15f), put(bias(p, n.w_up), 1, z.ffn, 0, 0.1f);
    put(weight(p, n.w_down), z.dim, z.ffn, 0, 0.2f), put(bias(p, n.w_down), 1, z.dim, 0, 0.1f);
  }
  put(weight("", n.output_norm), 1, z.dim, 1, 0.1f), put(bias("", n.output_norm), 1, z.dim, 0, 0.1f);
  w.write(path);
}

/// GPT2Like's file (the name the tests have used).
inline void write_gpt2like_gguf(const std::filesystem::path& path, uint32_t seed, TinySizes z = {},
                                const kiln::TensorNames& names = GPT2Like::gguf_names) {
  write_tiny_gguf<GPT2Like>(path, seed, z, names);
}
