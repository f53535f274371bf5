// custom_arch.hpp - a user's own architecture for kiln::load: a GPT-2-style Config and a tiny random GGUF of it
// (examples/custom_arch.cpp runs it; tests/examples/test_custom_arch.cpp checks it against scalar double code).
//
//   x     = wte[ids] + wpe[positions]                       learned absolute positions, no RoPE
//   block:  h = LayerNorm(x) ; q, k, v = h Wqkv^T + bqkv    LayerNorm with a bias; one fused projection, biased
//           x = x + (softmax(q k^T / sqrt(head_dim), causal) v) Wo^T + bo
//           x = x + gelu(LayerNorm(x) W1^T + b1) W2^T + b2   GELU MLP (tanh form), no gate
//   logits = LayerNorm(x) wte^T                             tied embeddings
#pragma once

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/io/gguf_writer.hpp"
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

/// Sizes of the tiny model. Vocabulary: <unk> <s> </s>, then "▁" (space) and the printable ASCII '!'..'~'.
struct TinySizes {
  uint32_t vocab = 98, ctx = 32, dim = 64, heads = 4, layers = 2, ffn = 256;
};

/// Writes a GGUF of GPT2Like with random weights drawn from `seed`, its tensors named by `names` (a Config's
/// gguf_names: llama.cpp's by default).
inline void write_gpt2like_gguf(const std::filesystem::path& path, uint32_t seed, TinySizes z = {},
                                const kiln::TensorNames& names = GPT2Like::gguf_names) {
  kiln::io::GGUFWriter w;
  const std::string a(GPT2Like::name);
  w.add("general.architecture", a);
  w.add(a + ".embedding_length", z.dim);
  w.add(a + ".block_count", z.layers);
  w.add(a + ".attention.head_count", z.heads);
  w.add(a + ".feed_forward_length", z.ffn);
  w.add(a + ".context_length", z.ctx);
  w.add(a + ".attention.layer_norm_epsilon", 1e-5f);
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
  put(weight("", n.pos_embd), z.ctx, z.dim, 0, 0.1f);
  for (uint32_t l = 0; l < z.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    put(weight(p, n.attn_norm), 1, z.dim, 1, 0.1f), put(bias(p, n.attn_norm), 1, z.dim, 0, 0.1f);
    put(weight(p, n.wqkv), 3 * z.dim, z.dim, 0, 0.15f), put(bias(p, n.wqkv), 1, 3 * z.dim, 0, 0.1f);
    put(weight(p, n.wo), z.dim, z.dim, 0, 0.3f), put(bias(p, n.wo), 1, z.dim, 0, 0.1f);
    put(weight(p, n.ffn_norm), 1, z.dim, 1, 0.1f), put(bias(p, n.ffn_norm), 1, z.dim, 0, 0.1f);
    put(weight(p, n.w_up), z.ffn, z.dim, 0, 0.15f), put(bias(p, n.w_up), 1, z.ffn, 0, 0.1f);
    put(weight(p, n.w_down), z.dim, z.ffn, 0, 0.2f), put(bias(p, n.w_down), 1, z.dim, 0, 0.1f);
  }
  put(weight("", n.output_norm), 1, z.dim, 1, 0.1f), put(bias("", n.output_norm), 1, z.dim, 0, 0.1f);
  w.write(path);
}
