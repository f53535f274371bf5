// kiln-perplexity: what a quantization or a precision costs, measured as llama-perplexity does (its flag
// names): the perplexity of a model over a text, and the KL divergence of its next-token distributions
// from a base model's (kiln/generate/perplexity.hpp explains both).
//
//   kiln-perplexity -m model.Q4_0.gguf -f /usr/share/common-licenses/GPL-3 -c 512 --chunks 8
//   kiln-perplexity -m model.F16.gguf -f text.txt --kl-divergence-base base.kld     # PPL, and the base saved
//   kiln-perplexity -m model.Q4_0.gguf --kl-divergence-base base.kld --kl-divergence  # against it
//
// Results go to stdout (llama-perplexity's lines: "[1]12.3456,[2]...", "Final estimate: PPL = ...",
// the KL divergence statistics), what was run to stderr.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include "cli_common.hpp"
#include "kiln/kiln.hpp"

namespace {

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m MODEL -f TEXT [options]\n"
      "       %s -m BASE_MODEL -f TEXT --kl-divergence-base FILE [options]   (perplexity; base saved)\n"
      "       %s -m MODEL --kl-divergence-base FILE --kl-divergence [options]  (KL divergence from it)\n"
      "  -m, --model PATH          GGUF model or Hugging Face checkpoint folder\n"
      "  -f, --file PATH           the text (one trailing newline dropped, as llama.cpp); tokenized once\n"
      "                            with BOS first when the vocabulary adds one; it must make two chunks\n"
      "  -c, --ctx-size N          tokens per chunk, in [4, the model's trained context] (default 512);\n"
      "                            each chunk's second half is scored\n"
      "  -b, --batch-size N        tokens per forward pass, in [1, 2^30] (default 512; at most -c)\n"
      "  -t, --threads N           threads, in [0, 1024] (default 1; 0 = all cores)\n"
      "      --chunks N            at most N chunks, an integer >= 0 (default 0 = all)\n"
      "      --kl-divergence-base FILE\n"
      "                            without --kl-divergence: save this model's distributions to FILE\n"
      "                            (kiln's own format, not llama.cpp's); with it: compare against FILE\n"
      "                            (tokens and -c come from FILE; -f is not needed)\n"
      "      --kl-divergence       KL divergence of -m's distributions from the base FILE's\n"
      "      --kl-top-k K          tokens saved per position in the base, in [1, 2^20] (default 256;\n"
      "                            the probability outside them is one bucket)\n"
      "      --precision P         quantized weights: fast (default), fast8 or exact (see kiln-generate)\n"
      "      --kv T                KV cache element type: auto (default), f32, f16 or q8_0\n"
      "      --amx / --no-amx      prompts' integer GEMMs on AMX tiles (default where the CPU has them) / not\n"
      "  -h, --help                this text\n",
      argv0, argv0, argv0);
}

const char* precision_name(kiln::Precision p) {
  return p == kiln::Precision::exact ? "exact" : p == kiln::Precision::fast8 ? "fast8" : "fast";
}

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) kiln::fail("-f: '", path, "' does not exist or is not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) kiln::fail("-f: cannot open '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  std::string s = os.str();
  if (!s.empty() && s.back() == '\n') s.pop_back();  // llama.cpp's -f drops one trailing newline
  return s;
}

void print_ppl(const kiln::PerplexityResult& r) {
  std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl.value, r.ppl.uncertainty);
  std::printf("(%zu chunks of %zu tokens, %zu tokens scored; mean NLL %.6f +/- %.6f; mean logit range %.4f)\n",
              r.chunks, r.ctx, r.count, r.nll.value, r.nll.uncertainty, r.logit_range);
}

void print_kld(const kiln::KldResult& k) {
  auto est = [](const char* name, const kiln::Estimate& e, double scale = 1.0, const char* unit = "") {
    std::printf("%-30s: %10.6f +/- %10.6f%s\n", name, scale * e.value, scale * e.uncertainty, unit);
  };
  std::printf("====== Perplexity statistics ======\n");
  est("Mean PPL(Q)", k.ppl);
  est("Mean PPL(base)", k.ppl_base);
  std::printf("%-30s: %6.2f%%\n", "Cor(ln(PPL(Q)), ln(PPL(base)))", 100.0 * k.ppl_correlation);
  est("Mean ln(PPL(Q)/PPL(base))", k.log_ppl_ratio);
  est("Mean PPL(Q)/PPL(base)", k.ppl_ratio);
  est("Mean PPL(Q)-PPL(base)", k.ppl_diff);
  std::printf("\n====== KL divergence statistics ======\n");
  std::printf("Mean    KLD: %10.3e +/- %10.3e\n", k.kld.value, k.kld.uncertainty);
  std::printf("Maximum KLD: %10.3e\n99.9%%   KLD: %10.3e\n99.0%%   KLD: %10.3e\n95.0%%   KLD: %10.3e\n", k.kld_max,
              k.kld_p999, k.kld_p99, k.kld_p95);
  std::printf("90.0%%   KLD: %10.3e\nMedian  KLD: %10.3e\nMinimum KLD: %10.3e\n", k.kld_p90, k.kld_median, k.kld_min);
  std::printf(
      "(over the base's top %zu tokens and one bucket for the rest, which held %.4f%% of the base's\n"
      " probability on average)\n",
      k.top_k, 100.0 * k.rest_mass);
  std::printf("\n====== Token probability statistics ======\n");
  std::printf("Mean    Δp: %6.3f +/- %5.3f %%\n", 100.0 * k.p_diff.value, 100.0 * k.p_diff.uncertainty);
  std::printf("Maximum |Δp|: %6.3f%%\n", 100.0 * k.p_diff_max);
  std::printf("RMS Δp    : %6.3f +/- %5.3f %%\n", 100.0 * k.p_diff_rms.value, 100.0 * k.p_diff_rms.uncertainty);
  std::printf("Same top p: %6.3f +/- %5.3f %%\n", 100.0 * k.same_top.value, 100.0 * k.same_top.uncertainty);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, text_path, base_path;
  bool kld = false, ctx_given = false;
  kiln::PerplexityOptions opt;
  kiln::LoadOptions load;
  kiln::io::install_map_fault_handler();
  try {
    kiln_cli::Args args(argc, argv);
    while (args.more()) {
      const std::string_view f = args.flag();
      if (f == "-h" || f == "--help") {
        usage(argv[0]);
        return 0;
      } else if (f == "-m" || f == "--model") model_path = args.next();
      else if (f == "-f" || f == "--file") text_path = args.next();
      else if (f == "-c" || f == "--ctx-size") {
        args.num(opt.ctx, kiln_cli::Range<std::size_t>{.lo = 4, .hi = std::size_t(1) << 30});
        ctx_given = true;
      } else if (f == "-b" || f == "--batch-size")
        args.num(opt.batch, kiln_cli::Range<std::size_t>{.lo = 1, .hi = std::size_t(1) << 30});
      else if (f == "-t" || f == "--threads") args.num(opt.threads, kiln_cli::kRangeThreads);
      else if (f == "--chunks")
        args.num(opt.max_chunks, kiln_cli::Range<std::size_t>{.lo = 0, .hi = std::size_t(1) << 30});
      else if (f == "--kl-divergence-base") base_path = args.next();
      else if (f == "--kl-divergence") kld = true;
      else if (f == "--kl-top-k")
        args.num(opt.kld_top_k, kiln_cli::Range<std::size_t>{.lo = 1, .hi = std::size_t(1) << 20});
      else if (f == "--precision") {
        const std::string_view p = args.next();
        if (p == "fast") opt.precision = kiln::Precision::fast;
        else if (p == "fast8") opt.precision = kiln::Precision::fast8;
        else if (p == "exact") opt.precision = kiln::Precision::exact;
        else kiln::fail("--precision must be 'fast', 'fast8' or 'exact', not '", p, "'");
      } else if (f == "--kv") {
        const std::string_view t = args.next();
        const auto kv = kiln::kv_type_from_name(t);
        if (!kv) kiln::fail("--kv must be 'auto', 'f32', 'f16' or 'q8_0', not '", t, "'");
        opt.kv_type = *kv;
      } else if (f == "--amx" || f == "--no-amx") kiln::set_amx_enabled({.enabled = f == "--amx"});
      else kiln::fail("unknown option '", f, "' (see --help)");
    }
    if (model_path.empty()) {
      usage(argv[0]);
      return 1;
    }
    if (kld && base_path.empty())
      kiln::fail("--kl-divergence needs --kl-divergence-base FILE (the base to compare with)");
    if (!kld && text_path.empty()) kiln::fail("-f TEXT is needed (the text to measure perplexity on)");

    // Everything about the inputs is checked before the model loads (a base file is read first).
    kiln::KldBase base;
    std::string text;
    if (kld) {
      base = kiln::load_kld_base(base_path);
      if (ctx_given && opt.ctx != base.ctx)
        kiln::fail("-c ", opt.ctx, ": the base '", base_path, "' was computed with -c ", base.ctx,
                   " (leave -c out to use it)");
    } else {
      text = read_text(text_path);
    }
    const kiln::Model model = kiln::load(model_path, load);
    const kiln::HParams& hp = model.hparams();
    const std::size_t ctx = kld ? base.ctx : opt.ctx;
    if (hp.ctx_train > 0 && ctx > hp.ctx_train)
      kiln::fail(kld ? "the base's context " : "-c ", ctx, " exceeds the model's trained context of ", hp.ctx_train);
    const auto progress = [](const kiln::PerplexityProgress& p) {
      std::printf("[%zu]%.4f,", p.chunk, p.ppl.value);
      std::fflush(stdout);
    };
    opt.on_chunk = progress;
    const char* precision = precision_name(opt.precision);
    if (kld) {
      std::fprintf(
          stderr,
          "kiln-perplexity: %s, precision %s, %zu threads: KL divergence from '%s' (%zu chunks of %zu, top %zu)\n",
          model_path.c_str(), precision, opt.threads, base_path.c_str(), base.chunks, base.ctx, base.top_k);
      const kiln::KldResult r = kiln::kl_divergence(model, base, opt);
      std::printf("\n");
      print_kld(r);
      return 0;
    }
    const std::vector<int32_t> tokens = model.tokenizer().encode(text, {.add_special = true});
    if (tokens.size() < 2 * opt.ctx)
      kiln::fail("-f '", text_path, "' tokenizes to ", tokens.size(), " tokens; -c ", opt.ctx, " needs at least ",
                 2 * opt.ctx, " (two chunks): give a longer text or a smaller -c");
    const std::size_t chunks =
        opt.max_chunks ? std::min(opt.max_chunks, tokens.size() / opt.ctx) : tokens.size() / opt.ctx;
    std::fprintf(stderr,
                 "kiln-perplexity: %s, precision %s, %zu threads: %zu tokens, %zu chunks of %zu (%zu scored each)%s\n",
                 model_path.c_str(), precision, opt.threads, tokens.size(), chunks, opt.ctx, opt.ctx - 1 - opt.ctx / 2,
                 model.tokenizer().add_bos() ? ", BOS first" : "");
    if (base_path.empty()) {
      const kiln::PerplexityResult r = kiln::perplexity(model, tokens, opt);
      std::printf("\n");
      print_ppl(r);
    } else {
      const kiln::KldBase b = kiln::make_kld_base(model, tokens, opt);
      std::printf("\n");
      print_ppl(b.perplexity);
      kiln::save_kld_base(b, base_path);
      std::fprintf(stderr, "kiln-perplexity: base saved to '%s' (%zu positions, top %zu tokens each)\n",
                   base_path.c_str(), b.positions(), b.top_k);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-perplexity: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
