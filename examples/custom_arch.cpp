// custom_arch: an architecture kiln does not ship, run by kiln::load, Session and generate. The Config (a
// GPT-2-style block: learned positions, LayerNorm with bias, fused biased QKV, an ungated GELU MLP) and a
// tiny random GGUF of it are in custom_arch.hpp; Transformer<GPT2Like> is compiled in this translation unit
// while the built-in architectures come from the kiln library. tests/examples/test_custom_arch.cpp checks its
// logits against the same maths written as scalar loops in double.
#include <cstdio>
#include <filesystem>
#include <string>

#include "custom_arch.hpp"
#include "kiln/kiln.hpp"

int main(int argc, char** argv) {
  const std::filesystem::path path =
      argc > 1 ? std::filesystem::path(argv[1]) : std::filesystem::temp_directory_path() / "custom_arch.gguf";
  write_gpt2like_gguf(path, 1234);
  const kiln::Model model = kiln::load<GPT2Like>(path);  // GPT2Like tried before the built-ins
  kiln::Session s(model, {.ctx = 32, .threads = 2});
  std::printf("custom_arch: %s, %zu layers, dim %zu, vocab %zu (random weights, seed 1234)\n",
              model.hparams().arch.c_str(), model.hparams().n_layers, model.hparams().dim, model.hparams().vocab);
  std::string text;
  const auto r = kiln::generate(s, "kiln", {.max_tokens = 12, .sampling = {.temperature = 0}, .ignore_eos = true},
                                [&](std::string_view piece) { text += piece; });
  std::printf("custom_arch: prompt \"kiln\" -> greedy \"%s\" (%zu tokens)\n", text.c_str(), r.tokens.size());
  return r.tokens.size() == 12 ? 0 : 1;
}
