// custom_arch: architectures kiln does not ship, run by kiln::load, Session and generate. custom_arch.hpp
// holds two Configs and tiny random GGUFs of them: GPT2Like (GPT-2's block from traits alone) and
// ParallelArch, whose `block` hook builds a parallel attention + MLP block (GPT-J, Phi-2) from kiln's pieces:
//
//   static void block(const kiln::BlockArgs& b) {
//     b.norm(b.x, b.w.attn_norm, b.w.attn_norm_b, b.h);  // h = LayerNorm(x)
//     b.attention(b.h, b.o);                             // qkv, RoPE, KV cache, attention, Wo + bo
//     b.residual(b.o);                                   // x += attention(h)
//     b.mlp(b.h, b.o);                                   // the traits' MLP of the same h
//     b.residual(b.o);                                   // x += mlp(h)
//   }
//
// Transformer<ParallelArch> and Transformer<GPT2Like> are compiled in this translation unit while the
// built-in architectures come from the kiln library. tests/examples/test_custom_arch.cpp checks both
// Configs' logits against the same maths written as scalar loops in double.
#include <cstdio>
#include <filesystem>
#include <string>

#include "custom_arch.hpp"
#include "kiln/kiln.hpp"

namespace {
// Loads `path` with the user Configs tried first, and decodes 12 tokens greedily after "kiln".
template <class... Configs>
bool run(const std::filesystem::path& path) {
  const kiln::Model model = kiln::load<Configs...>(path);
  kiln::Session s(model, {.ctx = 32, .threads = 2});
  std::string text;
  const auto r = kiln::generate(s, "kiln", {.max_tokens = 12, .sampling = {.temperature = 0}, .ignore_eos = true},
                                [&](std::string_view piece) { text += piece; });
  std::printf("custom_arch: %s (%zu layers, dim %zu, vocab %zu, random weights): \"kiln\" -> greedy \"%s\"\n",
              model.hparams().arch.c_str(), model.hparams().n_layers, model.hparams().dim, model.hparams().vocab,
              text.c_str());
  return r.tokens.size() == 12;
}
}  // namespace

int main(int argc, char** argv) {
  const std::filesystem::path dir = argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path();
  write_tiny_gguf<ParallelArch>(dir / "custom_arch_parallel.gguf", 1234);
  write_tiny_gguf<GPT2Like>(dir / "custom_arch_gpt2like.gguf", 1234);
  const bool ok = run<ParallelArch, GPT2Like>(dir / "custom_arch_parallel.gguf") &&
                  run<ParallelArch, GPT2Like>(dir / "custom_arch_gpt2like.gguf");
  return ok ? 0 : 1;
}
