// kiln-bench-e2e: end-to-end timings of one GGUF model through kiln's public API (kiln::load, kiln::Session),
// on token ids (no tokenizer in the timed loops), one JSON object per line on stdout. bench/compare.sh runs
// it next to llama.cpp on the same file, ids and context (bench/compare_llamacpp.py).
//
//   kiln-bench-e2e -m model.gguf -t 2 -p 128,512 -n 128 -r 3 --load read
//   kiln-bench-e2e --read-bandwidth -t 2        # memory read bandwidth (the roofline of tg), then exit
//
// Per repetition, for each prompt size P (a fresh sequence each time, Session::reset()):
//   pp:  eval(P prompt ids) -> logits of the last one; argmax: the first generated token.
//        pp tok/s = P / that time; ttft = the same time (prompt in, first token id out); cpu_s = the process's
//        CPU time (user + system, all threads) over the same eval.
//   tg:  after the first prompt size only (depth P_min): n_gen steps of eval(1 token) + argmax (greedy),
//        tg tok/s = n_gen / their time; cpu_s / cpu_ms_per_tok: the process's CPU time over those steps
//        (all threads, the pool's spinning included).
//   tg_group (--seqs N,...; after the repetitions above): N sequences in a kiln::SessionGroup, each fed the
//        P_min prompt (rotated by its index), then n_gen steps of all N in one forward pass each;
//        tok/s = N * n_gen / their time.
// Before the repetitions a warm-up pass (P_min prompt, 8 tokens) runs untimed but is reported as "warmup"
// (with --load map its first eval pays the page faults of the mapped weights). Lines:
//   {"engine":"kiln","test":"load",...}  {"test":"warmup",...}  {"test":"pp",...}  {"test":"tg",...} (with the
//   generated ids)
//   {"test":"peak",...}   (peak RSS: VmHWM of /proc/self/status, in MiB)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "../examples/cli_common.hpp"  // kiln_cli::parse_num: range-checked numeric flags
#include "kiln/kiln.hpp"
#include "kiln/core/amx.hpp"
#include "read_bandwidth.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void usage(const char* argv0) {
  std::printf(
      "usage: %s -m MODEL [options]     |     %s --read-bandwidth [-t N]\n"
      "  -m, --model PATH      GGUF model\n"
      "  -t, --threads N       threads, in [1, 1024] (default 1)\n"
      "  -p, --prompt LIST     prompt sizes, comma-separated, each in [1, 2^30] (default 128,512)\n"
      "  -n, --n-gen N         tokens generated one at a time after the first prompt size, in [0, 2^30]\n"
      "                        (default 128; 0: none)\n"
      "  -r, --reps N          repetitions, in [1, 1000000] (default 3)\n"
      "  -c, --ctx N           context size, in [0, 2^30] (default 0: max(largest prompt, smallest prompt +\n"
      "                        n-gen))\n"
      "  -b, --batch N         the most prompt tokens per forward pass, in [1, 2^20] (default 512)\n"
      "      --load MODE       map (default: weights stay memory-mapped) or read (read into memory)\n"
      "      --no-pack         keep weights row-major (LoadOptions::pack = false; default: f16/bf16 in\n"
      "                        packed rows, q4_0/q4_1/q5_0/q5_1/q8_0/q4_K in 16-row interleaved blocks)\n"
      "      --no-huge-pages   do not ask for transparent huge pages (kiln::set_huge_pages(false))\n"
      "      --amx, --no-amx   prompts' integer GEMMs (and at fast/fast8 F16/BF16 weights' GEMMs and the attention\n"
      "                        over an f16 cache) on Intel AMX tiles where usable (the default), or on AVX-512 VNNI\n"
      "                        and f32 FMA (kiln::set_amx_enabled; KILN_AMX=0, KILN_NO_AMX=1)\n"
      "      --target NAME     run the kernels of this SIMD target (kiln::simd::force_target, e.g. AVX2,\n"
      "                        AVX3, AVX3_DL, SSE4; default: the best this CPU runs)\n"
      "      --precision P     fast (default: integer dots, activations in two 8-bit parts, or on AVX2\n"
      "                        prompts in 16-bit integers), fast8 (one 8-bit part, llama.cpp's scheme)\n"
      "                        or exact (dequantized f32 products)\n"
      "      --kv T            KV cache element type: auto (default: f32 with --precision exact, else f16),\n"
      "                        f32, f16 or q8_0\n"
      "      --ids FILE        prompt token ids (whitespace or comma separated; at least the largest prompt)\n"
      "      --seed S          seed of the random prompt ids when no --ids, in [0, 2^32-1] (default 42)\n"
      "      --label TEXT      copied into every line as \"label\"\n"
      "      --seqs LIST       also decode this many sequences together (kiln::SessionGroup; comma-separated\n"
      "                        sizes, each in [1, 4096]): each gets the smallest prompt, then n-gen steps of one token "
      "each for\n"
      "                        all of them in one forward pass (\"tg_group\": tok/s of all sequences together)\n"
      "      --read-bandwidth  measure the memory read bandwidth at -t threads (512 MiB, 1 and 4 streams per\n"
      "                        thread, best of 5; the loop of kiln-bench's BM_memory_read) and exit\n",
      argv0, argv0);
}

double status_mib(const char* key) {  // a "VmHWM:   1234 kB" line of /proc/self/status, in MiB
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::size_t n = std::strlen(key);
  while (std::getline(f, line))
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':')
      return std::strtod(line.c_str() + n + 1, nullptr) / 1024.0;
  return -1.0;
}

// User + system CPU time of the process (every thread), seconds: on a shared machine, where wall time also
// counts the time other processes held the cores.
double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto sec = [](const timeval& t) { return double(t.tv_sec) + 1e-6 * double(t.tv_usec); };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

double ru_maxrss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;  // KiB on Linux
}

// Comma-separated integers, each in r (an error names the flag, the item and the range).
std::vector<std::size_t> parse_list(std::string_view s, std::string_view what, const kiln_cli::Range<std::size_t>& r) {
  std::vector<std::size_t> v;
  std::string item;
  std::stringstream ss{std::string(s)};
  while (std::getline(ss, item, ',')) v.push_back(kiln_cli::parse_num(what, item, r));
  if (v.empty()) kiln::fail("empty list for ", what);
  return v;
}

std::vector<int32_t> read_ids(const std::string& path) {
  std::ifstream f(path);
  if (!f) kiln::fail("cannot open the ids file '", path, "'");
  std::vector<int32_t> ids;
  std::string tok;
  char c;
  auto flush = [&] {
    if (tok.empty()) return;
    char* end = nullptr;
    const long long x = std::strtoll(tok.c_str(), &end, 10);
    if (*end || x < 0 || x > INT32_MAX) kiln::fail("bad token id '", tok, "' in '", path, "'");
    ids.push_back(int32_t(x));
    tok.clear();
  };
  while (f.get(c)) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') flush();
    else tok += c;
  }
  flush();
  return ids;
}

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::string json_str(std::string_view s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else o += c;
  }
  return o + "\"";
}

int read_bandwidth(std::size_t threads, const std::string& label) {
  constexpr std::size_t kBytes = std::size_t(512) << 20;
  // On transparent huge pages, as the weights are (kiln::detail::aligned_alloc_bytes).
  auto* buf = static_cast<char*>(kiln::detail::aligned_alloc_bytes(kBytes));
  for (std::size_t i = 0; i < kBytes; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(buf + i, &v, 8);
  }
  kiln::ThreadPool pool(threads);
  const std::size_t part = kBytes / threads / (128 * 4) * (128 * 4);
  std::vector<uint64_t> sums(threads);
  for (int streams : {1, 4}) {
    std::vector<double> gbs;
    for (int rep = 0; rep < 6; ++rep) {  // the first is a warm-up
      const auto t0 = Clock::now();
      pool.parallel_for(threads, [&](std::size_t t, std::size_t) {
        const char* p = buf + t * part;
        sums[t] = streams == 4 ? kiln::bench::read_streams<4>(p, part) : kiln::bench::read_streams<1>(p, part);
      });
      const double s = seconds_since(t0);
      if (rep > 0) gbs.push_back(double(part * threads) / s / 1e9);
    }
    std::sort(gbs.begin(), gbs.end());
    std::printf(
        "{\"engine\":\"read_bw\",\"test\":\"read_bw\",\"threads\":%zu,\"streams\":%d,\"bytes\":%zu,"
        "\"gb_s_best\":%.3f,\"gb_s_median\":%.3f,\"checksum\":%llu%s}\n",
        threads, streams, part * threads, gbs.back(), gbs[gbs.size() / 2],
        static_cast<unsigned long long>(sums[0] & 0xff),
        label.empty() ? "" : (",\"label\":" + json_str(label)).c_str());
    std::fflush(stdout);
  }
  kiln::detail::aligned_free(buf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, ids_path, label;
  std::size_t threads = 1, n_gen = 128, reps = 3, ctx = 0, batch = 512;
  std::vector<std::size_t> prompts{128, 512};
  std::vector<std::size_t> seqs;  // --seqs: SessionGroup sizes for tg_group
  kiln::LoadOptions load_opt;
  kiln::Precision precision = kiln::Precision::fast;
  kiln::KVType kv_type = kiln::KVType::automatic;
  uint32_t seed = 42;
  bool bw = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) kiln::fail("missing value after ", a);
        return argv[++i];
      };
      // The flag's value in [lo, hi], or an error naming the flag, the value and the range.
      auto num = [&](std::size_t lo, std::size_t hi) -> std::size_t {
        const std::string s = next();
        return kiln_cli::parse_num<std::size_t>(a, s, {.lo = lo, .hi = hi});
      };
      constexpr std::size_t k30 = std::size_t(1) << 30;
      if (a == "-h" || a == "--help") {
        usage(argv[0]);
        return 0;
      } else if (a == "-m" || a == "--model") model_path = next();
      else if (a == "-t" || a == "--threads") threads = num(1, 1024);
      else if (a == "-p" || a == "--prompt") prompts = parse_list(next(), a, {.lo = 1, .hi = k30});
      else if (a == "-n" || a == "--n-gen") n_gen = num(0, k30);
      else if (a == "-r" || a == "--reps") reps = num(1, 1000000);
      else if (a == "-c" || a == "--ctx") ctx = num(0, k30);
      else if (a == "-b" || a == "--batch") batch = num(1, std::size_t(1) << 20);
      else if (a == "--ids") ids_path = next();
      else if (a == "--seed") seed = uint32_t(num(0, UINT32_MAX));
      else if (a == "--label") label = next();
      else if (a == "--seqs") seqs = parse_list(next(), a, {.lo = 1, .hi = 4096});
      else if (a == "--read-bandwidth") bw = true;
      else if (a == "--no-pack") load_opt.pack = false;
      else if (a == "--no-huge-pages") kiln::set_huge_pages(false);
      else if (a == "--amx" || a == "--no-amx") kiln::set_amx_enabled({.enabled = a == "--amx"});
      else if (a == "--target") kiln::simd::force_target(next());
      else if (a == "--load") {
        const std::string m = next();
        if (m == "map") load_opt.mode = kiln::io::LoadMode::map;
        else if (m == "read") load_opt.mode = kiln::io::LoadMode::read;
        else kiln::fail("--load takes map or read, not '", m, "'");
      } else if (a == "--precision") {
        const std::string m = next();
        if (m == "fast") precision = kiln::Precision::fast;
        else if (m == "fast8") precision = kiln::Precision::fast8;
        else if (m == "exact") precision = kiln::Precision::exact;
        else kiln::fail("--precision takes fast, fast8 or exact, not '", m, "'");
      } else if (a == "--kv") {
        const std::string m = next();
        const auto kv = kiln::kv_type_from_name(m);
        if (!kv) kiln::fail("--kv takes auto, f32, f16 or q8_0, not '", m, "'");
        kv_type = *kv;
      } else kiln::fail("unknown option '", a, "' (see --help)");
    }
    if (bw) return read_bandwidth(threads, label);
    if (model_path.empty()) {
      usage(argv[0]);
      return 2;
    }

    const std::size_t p_min = *std::min_element(prompts.begin(), prompts.end());
    const std::size_t p_max = *std::max_element(prompts.begin(), prompts.end());
    if (ctx == 0) ctx = std::max(p_max, p_min + n_gen);
    if (p_max > ctx || p_min + n_gen > ctx)
      kiln::fail("context ", ctx, " is too small for prompt ", p_max, " and ", p_min, " + ", n_gen,
                 " generated tokens");
    const std::string extra = label.empty() ? "" : ",\"label\":" + json_str(label);
    const char* mode = load_opt.mode == kiln::io::LoadMode::read ? "read" : "map";

    const double rss0 = status_mib("VmRSS");
    auto t0 = Clock::now();
    kiln::Model model = kiln::load(model_path, load_opt);
    const double load_s = seconds_since(t0);
    const double rss_model = status_mib("VmRSS");
    t0 = Clock::now();
    kiln::Session s(model,
                    {.ctx = ctx, .threads = threads, .batch = batch, .precision = precision, .kv_type = kv_type});
    const double session_s = seconds_since(t0);
    const auto& hp = model.hparams();

    std::vector<int32_t> ids;
    if (!ids_path.empty()) {
      ids = read_ids(ids_path);
      if (ids.size() < p_max)
        kiln::fail("the ids file '", ids_path, "' has ", ids.size(), " ids; the largest prompt needs ", p_max);
    } else {
      std::mt19937 rng(seed);
      std::uniform_int_distribution<int32_t> dist(0, int32_t(hp.vocab) - 1);
      ids.resize(p_max);
      for (auto& id : ids) id = dist(rng);
    }

    std::printf(
        "{\"engine\":\"kiln\",\"test\":\"load\",\"model\":%s,\"arch\":%s,\"load_mode\":\"%s\",\"threads\":%zu,"
        "\"ctx\":%zu,\"batch\":%zu,\"vocab\":%zu,\"n_layers\":%zu,\"dim\":%zu,\"file_bytes\":%llu,"
        "\"load_s\":%.6f,\"session_s\":%.6f,\"rss_before_mib\":%.1f,\"rss_after_load_mib\":%.1f,"
        "\"simd\":%s,\"precision\":\"%s\",\"kv_type\":\"%s\",\"kv_bytes\":%zu,\"pack\":%s,\"huge_pages\":%s%s}\n",
        json_str(model_path).c_str(), json_str(hp.arch).c_str(), mode, threads, ctx, batch, hp.vocab, hp.n_layers,
        hp.dim, static_cast<unsigned long long>(std::filesystem::file_size(model_path)), load_s, session_s, rss0,
        rss_model, json_str(kiln::simd::current_target()).c_str(),
        precision == kiln::Precision::fast    ? "fast"
        : precision == kiln::Precision::fast8 ? "fast8"
                                              : "exact",
        kiln::kv_type_name(s.kv_type()), s.kv_bytes(), load_opt.pack ? "true" : "false",
        kiln::huge_pages() ? "true" : "false", extra.c_str());
    std::fflush(stdout);

    auto prompt = [&](std::size_t n) { return std::span<const int32_t>(ids.data(), n); };
    std::vector<int32_t> generated;
    generated.reserve(n_gen);

    {  // warm-up: first touch of the weights (page faults with --load map), caches, thread wake-up
      s.reset();
      t0 = Clock::now();
      int32_t tok = argmax(s.eval(prompt(p_min)));
      const double ttft = seconds_since(t0);
      const std::size_t n_warm = std::min<std::size_t>(8, ctx - p_min);
      t0 = Clock::now();
      for (std::size_t i = 0; i < n_warm; ++i) tok = argmax(s.eval(tok));
      const double tg = seconds_since(t0);
      std::printf(
          "{\"engine\":\"kiln\",\"test\":\"warmup\",\"n_prompt\":%zu,\"ttft_s\":%.6f,\"n_gen\":%zu,\"tg_s\":%.6f%s}\n",
          p_min, ttft, n_warm, tg, extra.c_str());
      std::fflush(stdout);
    }

    for (std::size_t rep = 0; rep < reps; ++rep) {
      for (std::size_t p : prompts) {
        s.reset();
        const double cpu0 = cpu_seconds();
        t0 = Clock::now();
        int32_t tok = argmax(s.eval(prompt(p)));
        const double pp_s = seconds_since(t0), pp_cpu = cpu_seconds() - cpu0;
        std::printf(
            "{\"engine\":\"kiln\",\"test\":\"pp\",\"n_prompt\":%zu,\"threads\":%zu,\"rep\":%zu,\"s\":%.6f,"
            "\"tok_s\":%.3f,\"ttft_s\":%.6f,\"cpu_s\":%.6f,\"first_token\":%d%s}\n",
            p, threads, rep, pp_s, double(p) / pp_s, pp_s, pp_cpu, tok, extra.c_str());
        std::fflush(stdout);
        if (p != p_min || n_gen == 0) continue;
        generated.clear();
        const double tg_cpu0 = cpu_seconds();
        t0 = Clock::now();
        for (std::size_t i = 0; i < n_gen; ++i) {
          tok = argmax(s.eval(tok));
          generated.push_back(tok);
        }
        const double tg_s = seconds_since(t0), tg_cpu = cpu_seconds() - tg_cpu0;
        std::string head, all;
        for (std::size_t i = 0; i < generated.size(); ++i) {
          if (i) all += ',';
          all += std::to_string(generated[i]);
          if (i == std::min<std::size_t>(8, generated.size()) - 1) head = all;
        }
        std::printf(
            "{\"engine\":\"kiln\",\"test\":\"tg\",\"n_gen\":%zu,\"depth\":%zu,\"threads\":%zu,\"rep\":%zu,"
            "\"s\":%.6f,\"tok_s\":%.3f,\"ms_per_tok\":%.4f,\"cpu_s\":%.6f,\"cpu_ms_per_tok\":%.4f,"
            "\"tokens_head\":[%s],\"tokens\":[%s]%s}\n",
            n_gen, p, threads, rep, tg_s, double(n_gen) / tg_s, 1e3 * tg_s / double(n_gen), tg_cpu,
            1e3 * tg_cpu / double(n_gen), head.c_str(), all.c_str(), extra.c_str());
        std::fflush(stdout);
      }
    }
    // Several sequences decoded together (kiln::SessionGroup): each gets the smallest prompt (sequence i its ids
    // rotated by i), then n_gen steps of one token each for all of them in one forward pass.
    for (const std::size_t n_seqs : seqs) {
      if (n_seqs == 0 || n_gen == 0) continue;
      kiln::SessionGroup g(
          model, n_seqs, {.ctx = ctx, .threads = threads, .batch = batch, .precision = precision, .kv_type = kv_type});
      std::vector<std::size_t> all(n_seqs);
      std::iota(all.begin(), all.end(), std::size_t{0});
      std::vector<int32_t> toks(n_seqs), pr(p_min);
      for (std::size_t rep = 0; rep < reps; ++rep) {
        for (std::size_t i = 0; i < n_seqs; ++i) {
          g.reset(i);
          for (std::size_t j = 0; j < p_min; ++j) pr[j] = ids[(j + i) % p_min];
          toks[i] = argmax(g.eval(i, pr));
        }
        t0 = Clock::now();
        for (std::size_t t = 0; t < n_gen; ++t) {
          const auto logits = g.step(all, toks);  // (n_seqs, vocab)
          for (std::size_t i = 0; i < n_seqs; ++i)
            toks[i] = argmax(std::span<const float>(&logits(i, 0), logits.extent(1)));
        }
        const double tg_s = seconds_since(t0);
        std::printf(
            "{\"engine\":\"kiln\",\"test\":\"tg_group\",\"seqs\":%zu,\"n_gen\":%zu,\"depth\":%zu,"
            "\"threads\":%zu,\"rep\":%zu,\"s\":%.6f,\"tok_s\":%.3f,\"ms_per_step\":%.4f%s}\n",
            n_seqs, n_gen, p_min, threads, rep, tg_s, double(n_seqs * n_gen) / tg_s, 1e3 * tg_s / double(n_gen),
            extra.c_str());
        std::fflush(stdout);
      }
    }
    std::printf("{\"engine\":\"kiln\",\"test\":\"peak\",\"peak_rss_mib\":%.1f,\"ru_maxrss_mib\":%.1f%s}\n",
                status_mib("VmHWM"), ru_maxrss_mib(), extra.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-bench-e2e: error: %s\n", e.what());
    return 1;
  }
}
