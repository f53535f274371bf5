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

#include "cli_common.hpp"
#include "kiln/kiln.hpp"

namespace {

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m MODEL [options]\n"
      "  -m, --model PATH          GGUF model (or llama2.c .bin with --tokenizer)\n"
      "      --tokenizer PATH      llama2.c tokenizer .bin (for a llama2.c checkpoint)\n"
      "  -p, --prompt TEXT         prompt (default: empty, just BOS)\n"
      "  -n, --n-predict N         tokens to generate (default 128)\n"
      "  -t, --threads N           threads (default 1; 0 = all cores)\n"
      "  -c, --ctx-size N          context size (default: the model's; may exceed it, with a warning)\n",
      argv0);
  std::fputs(kiln_cli::kSamplingHelp, stdout);
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, prompt;
  kiln_cli::Common common;
  const std::string& model_path = common.model_path;
  const kiln::GenerateOptions& gen = common.gen;
  const kiln::SessionOptions& sess = common.sess;
  try {
    kiln_cli::Args args(argc, argv);
    while (args.more()) {
      const std::string_view f = args.flag();
      if (common.parse(args)) continue;
      if (f == "-h" || f == "--help") { usage(argv[0]); return 0; }
      else if (f == "--tokenizer") tokenizer_path = args.next();
      else if (f == "-p" || f == "--prompt") prompt = args.next();
      else kiln::fail("unknown option '", f, "' (see --help)");
    }
    if (model_path.empty()) {
      usage(argv[0]);
      return 1;
    }
    common.finish();

    const kiln::Model model = tokenizer_path.empty() ? kiln::load(model_path, common.load)
                                                     : kiln::load_llama2c(model_path, tokenizer_path);
    kiln::Session session(model, sess);
    std::cout << prompt << std::flush;
    const auto r = kiln::generate(session, prompt, gen, [](std::string_view piece) { std::cout << piece << std::flush; });
    std::cout << std::endl;
    std::fprintf(stderr, "\nkiln: %s, %zu threads, ctx %zu, KV cache %s (%.1f MiB)\n", model_path.c_str(),
                 session.threads(), session.ctx(), kiln::kv_type_name(session.kv_type()),
                 double(session.kv_bytes()) / (1 << 20));
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
