// kiln-generate: generate text from a prompt with a GGUF (or llama2.c) model, streamed to stdout.
// Timings (prompt and generation tok/s, time to first token) and peak RSS go to stderr.
//
//   kiln-generate -m stories260K.gguf -p "Once upon a time" -n 64 --temp 0
//   kiln-generate -m stories260K.bin --tokenizer tok512.bin -p "Once upon a time"
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <random>
#include <string>
#include <string_view>

#include "kiln/kiln.hpp"

namespace {

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m MODEL [options]\n"
      "  -m, --model PATH        GGUF model (or llama2.c .bin with --tokenizer)\n"
      "      --tokenizer PATH    llama2.c tokenizer .bin (for a llama2.c checkpoint)\n"
      "  -p, --prompt TEXT       prompt (default: empty, just BOS)\n"
      "  -n, --n-predict N       tokens to generate (default 128)\n"
      "  -t, --threads N         threads (default 1; 0 = all cores)\n"
      "  -c, --ctx-size N        context size (default: the model's; may exceed it, with a warning)\n"
      "      --temp T            temperature (default 0.8; 0 = greedy)\n"
      "      --top-k K           top-k (default 40; 0 = off)\n"
      "      --top-p P           top-p (default 0.95; 1 = off)\n"
      "      --min-p P           min-p (default 0.05; 0 = off)\n"
      "      --repeat-penalty R  repetition penalty (default 1.0 = off)\n"
      "      --seed S            sampling seed (default -1 = random)\n"
      "      --precision P       quantized weights: fast (int8 dots, activations as two 8-bit parts;\n"
      "                          default), fast8 (one 8-bit part: llama.cpp's scheme, fastest prompt)\n"
      "                          or exact (f32 products with the dequantized weights, as HF)\n"
      "  -h, --help              this text\n",
      argv0);
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, tokenizer_path, prompt;
  kiln::GenerateOptions gen;
  kiln::SessionOptions sess;
  long long seed = -1;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      auto next = [&]() -> const char* {
        if (i + 1 >= argc) kiln::fail("missing value after ", a);
        return argv[++i];
      };
      auto num = [&](auto& out) {
        const char* s = next();
        char* end = nullptr;
        const double v = std::strtod(s, &end);
        if (end == s || *end) kiln::fail("bad number '", s, "' for ", a);
        out = static_cast<std::remove_reference_t<decltype(out)>>(v);
      };
      if (a == "-h" || a == "--help") { usage(argv[0]); return 0; }
      else if (a == "-m" || a == "--model") model_path = next();
      else if (a == "--tokenizer") tokenizer_path = next();
      else if (a == "-p" || a == "--prompt") prompt = next();
      else if (a == "-n" || a == "--n-predict") num(gen.max_tokens);
      else if (a == "-t" || a == "--threads") num(sess.threads);
      else if (a == "-c" || a == "--ctx-size") num(sess.ctx);
      else if (a == "--temp") num(gen.temperature);
      else if (a == "--top-k") num(gen.top_k);
      else if (a == "--top-p") num(gen.top_p);
      else if (a == "--min-p") num(gen.min_p);
      else if (a == "--repeat-penalty") num(gen.repeat_penalty);
      else if (a == "--seed") num(seed);
      else if (a == "--precision") {
        const std::string_view p = next();
        if (p == "fast") sess.precision = kiln::Precision::fast;
        else if (p == "fast8") sess.precision = kiln::Precision::fast8;
        else if (p == "exact") sess.precision = kiln::Precision::exact;
        else kiln::fail("--precision must be 'fast', 'fast8' or 'exact', not '", p, "'");
      }
      else kiln::fail("unknown option '", a, "' (see --help)");
    }
    if (model_path.empty()) {
      usage(argv[0]);
      return 1;
    }
    gen.seed = seed < 0 ? std::random_device{}() : static_cast<uint64_t>(seed);

    const kiln::Model model = tokenizer_path.empty() ? kiln::load(model_path)
                                                     : kiln::load_llama2c(model_path, tokenizer_path);
    kiln::Session session(model, sess);
    std::cout << prompt << std::flush;
    const auto r = kiln::generate(session, prompt, gen, [](std::string_view piece) { std::cout << piece << std::flush; });
    std::cout << std::endl;
    std::fprintf(stderr, "\nkiln: %s, %zu threads, ctx %zu\n", model_path.c_str(), session.threads(), session.ctx());
    std::fprintf(stderr, "kiln: prompt     %5zu tokens in %9.2f ms (%9.1f tok/s)\n", r.n_prompt, r.prompt_ms,
                 r.prompt_tok_s());
    std::fprintf(stderr, "kiln: generation %5zu tokens in %9.2f ms (%9.1f tok/s over %zu decode steps)\n",
                 r.n_generated, r.gen_ms, r.gen_tok_s(), r.n_generated ? r.n_generated - 1 : 0);
    std::fprintf(stderr, "kiln: time to first token %.2f ms; peak RSS %.1f MiB\n", r.ttft_ms, peak_rss_mib());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-generate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
