// kiln-generate: generate text from a prompt with a GGUF (or llama2.c) model, streamed to stdout.
// Timings (prompt and generation tok/s, time to first token) and peak RSS go to stderr.
//
//   kiln-generate -m stories260K.gguf -p "Once upon a time" -n 64 --temp 0
//   kiln-generate -m stories260K.bin --tokenizer tok512.bin -p "Once upon a time"
//   kiln-generate -m SmolLM2.gguf -p "Answer yes or no:" --grammar 'root ::= " yes" | " no"'
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
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
      "  -p, --prompt TEXT         prompt (default: empty: generation starts from the BOS token alone;\n"
      "                            an error for a model without one)\n"
      "  -n, --n-predict N         tokens to generate, in [-1, 2^31-1] (default 128; -1 = until the\n"
      "                            context is full); a full context ends generation (finish reason length)\n"
      "  -t, --threads N           threads, in [0, 1024] (default 1; 0 = all cores)\n"
      "  -c, --ctx-size N          context size, in [0, 2^30] (default 0: min(4096, the model's); may\n"
      "                            exceed the model's, with a warning; fails when its KV cache needs more\n"
      "                            than the available memory)\n"
      "      --grammar GBNF        constrain the output to a llama.cpp GBNF grammar (its 'root' rule);\n"
      "                            generation ends when the output is complete and nothing can follow\n"
      "      --grammar-file PATH   the same, the grammar read from a file (llama.cpp's grammars/*.gbnf)\n",
      argv0);
  std::fputs(kiln_cli::kSamplingHelp, stdout);
}

// llama.cpp's (and OpenAI's) names: "length" for -n reached or the context full.
const char* finish_reason(kiln::StopReason r) {
  switch (r) {
    case kiln::StopReason::eos:
      return "stop (end-of-generation token)";
    case kiln::StopReason::stop_string:
      return "stop (stop string)";
    case kiln::StopReason::callback:
      return "cancelled";
    case kiln::StopReason::max_tokens:
      return "length (-n tokens generated)";
    case kiln::StopReason::context_full:
      return "length (context full: -c sets a larger one)";
    case kiln::StopReason::complete:
      return "stop (the constrained output is complete)";
  }
  return "unknown";
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path, prompt, grammar;
  kiln_cli::Common common;
  const std::string& model_path = common.model_path;
  const kiln::GenerateOptions& gen = common.gen;
  const kiln::SessionOptions& sess = common.sess;
  kiln::io::install_map_fault_handler();  // a mapped model file truncated under us: a message, not "Bus error"
  try {
    kiln_cli::Args args(argc, argv);
    while (args.more()) {
      const std::string_view f = args.flag();
      if (common.parse(args)) continue;
      if (f == "-h" || f == "--help") {
        usage(argv[0]);
        return 0;
      } else if (f == "--tokenizer") tokenizer_path = args.next();
      else if (f == "-p" || f == "--prompt") prompt = args.next();
      else if (f == "--grammar") grammar = args.next();
      else if (f == "--grammar-file") {
        const std::string path(args.next());
        std::ifstream in(path, std::ios::binary);
        if (!in) kiln::fail("--grammar-file: cannot open '", path, "'");
        std::stringstream ss;
        ss << in.rdbuf();
        grammar = ss.str();
      } else kiln::fail("unknown option '", f, "' (see --help)");
    }
    if (model_path.empty()) {
      usage(argv[0]);
      return 1;
    }
    common.finish();

    const kiln::Model model = common.load_model(tokenizer_path);
    common.resolve_ctx(model);
    kiln::Session session(model, sess);
    kiln_cli::PromptProgress progress;
    kiln::GenerateOptions g = gen;
    if (!grammar.empty()) g.grammar = kiln::gbnf_grammar(grammar, {.vocabulary = &model.tokenizer()});
    g.on_prompt_progress = [&](std::size_t done, std::size_t total) { progress.update(done, total); };
    // The prompt's text is echoed once it has run, so that a progress line on a terminal does not
    // overwrite it.
    bool echoed = false;
    auto echo_prompt = [&] {
      if (echoed) return;
      echoed = true;
      progress.finish();
      std::cout << prompt;
    };
    progress.start();
    const auto r = kiln::generate(session, prompt, g, [&](std::string_view piece) {
      echo_prompt();
      std::cout << piece << std::flush;
    });
    echo_prompt();
    std::cout << std::endl;
    std::fprintf(stderr, "\nkiln: %s, %zu threads, ctx %zu, KV cache %s (%.1f MiB)\n", model_path.c_str(),
                 session.threads(), session.ctx(), kiln::kv_type_name(session.kv_type()),
                 double(session.kv_bytes()) / (1 << 20));
    std::fprintf(stderr, "kiln: prompt     %5zu tokens in %9.2f ms (%9.1f tok/s)\n", r.n_prompt, r.prompt_ms,
                 r.prompt_tok_s());
    std::fprintf(stderr, "kiln: generation %5zu tokens in %9.2f ms (%9.1f tok/s over %zu decode steps)\n",
                 r.n_generated, r.gen_ms, r.gen_tok_s(), r.n_generated ? r.n_generated - 1 : 0);
    std::fprintf(stderr, "kiln: time to first token %.2f ms; peak RSS %.1f MiB\n", r.ttft_ms, peak_rss_mib());
    std::fprintf(stderr, "kiln: finish reason: %s\n", finish_reason(r.stop));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-generate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
