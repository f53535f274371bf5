// examples/cli_common.hpp - the command-line flags kiln-generate and kiln-chat share (llama.cpp's names).
#pragma once

#include <chrono>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <system_error>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/kiln.hpp"
#include "kiln/core/amx.hpp"

namespace kiln_cli {

/// The values a numeric flag accepts: [lo, hi], or (lo, hi] with lo_open.
template <class T>
struct Range {
  T lo, hi;
  bool lo_open = false;
};

/// `text` as a T in `r`, or kiln::Error naming `flag`, the text and the range. Integers are read exactly
/// (std::from_chars), or as a double with an integral value ("1e3"); floating-point values must be finite.
template <class T>
T parse_num(std::string_view flag, std::string_view text, const Range<T>& r) {
  static_assert(std::is_arithmetic_v<T>);
  auto range = [&] {
    std::ostringstream os;
    os << (r.lo_open ? "(" : "[") << +r.lo << ", " << +r.hi << "]";
    return os.str();
  };
  auto bad = [&](std::string_view why) {
    kiln::fail(flag, ": '", text, "' ", why, "; expected ", std::is_integral_v<T> ? "an integer" : "a number", " in ",
               range());
  };
  if constexpr (std::is_integral_v<T>) {
    // Exact parse first: every 64-bit value, no rounding through double.
    using Wide = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    Wide w{};
    const char* b = text.data();
    const char* e = b + text.size();
    if (const auto [p, ec] = std::from_chars(b, e, w);
        ec == std::errc() && p == e && !(std::is_unsigned_v<T> && *b == '-')) {
      if (w < Wide(r.lo) || w > Wide(r.hi) || (r.lo_open && w == Wide(r.lo))) bad("is out of range");
      return T(w);
    }
  }
  const std::string s(text);  // strtod needs a terminated string
  char* end = nullptr;
  const double v = s.empty() || std::isspace(static_cast<unsigned char>(s[0])) ? 0.0 : std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || s.empty()) bad("is not a number");
  if (std::isnan(v)) bad("is not a number");
  if (!std::isfinite(v)) bad("is not finite");
  if constexpr (std::is_integral_v<T>)
    if (v != std::trunc(v)) bad("is not an integer");
  // Compared as doubles before any conversion: an out-of-range float-to-integer cast is undefined.
  if (v < double(r.lo) || v > double(r.hi) || (r.lo_open && v == double(r.lo))) bad("is out of range");
  if constexpr (std::is_integral_v<T>) {
    // hi as a double may round up past hi (2^63 - 1 -> 2^63): such a v is outside T's range too.
    if (v >= std::ldexp(1.0, std::numeric_limits<T>::digits)) bad("is out of range");
  }
  const T out = static_cast<T>(v);
  // A double inside an open range may round onto its end as a float (1e-50 -> 0).
  if (r.lo_open && out == r.lo) bad("is out of range");
  return out;
}

/// Walks argv: the current flag, its value (next()) and numeric values (num()).
class Args {
 public:
  Args(int argc, char** argv) : argc_(argc), argv_(argv) {}
  bool more() { return ++i_ < argc_; }
  std::string_view flag() const { return argv_[i_]; }
  const char* next() {
    if (i_ + 1 >= argc_) kiln::fail("missing value after ", flag());
    return argv_[++i_];
  }
  /// The current flag's value as a number in `r`; anything else (not a number, NaN, inf, out of range, a
  /// fraction for an integer, a negative count) fails naming the flag, the value and the range, before any
  /// conversion that could be undefined.
  template <class T>
  void num(T& out, const Range<T>& r) {
    const std::string_view f = flag();
    out = parse_num<T>(f, next(), r);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

// The ranges of the numeric flags (also in the --help texts). -n -1: until the context is full (or EOS).
// -t: kiln::ThreadPool's limit. -c: KV cache memory is checked separately, against the machine's.
inline constexpr Range<int> kRangeN{.lo = -1, .hi = std::numeric_limits<int>::max()};
inline constexpr Range<std::size_t> kRangeThreads{.lo = 0, .hi = 1024};
inline constexpr Range<std::size_t> kRangeCtx{.lo = 0, .hi = std::size_t(1) << 30};
inline constexpr Range<float> kRangeTemp{.lo = 0.0f, .hi = 100.0f};
inline constexpr Range<int> kRangeTopK{.lo = 0, .hi = std::numeric_limits<int>::max()};
inline constexpr Range<float> kRangeTopP{.lo = 0.0f, .hi = 1.0f, .lo_open = true};
inline constexpr Range<float> kRangeMinP{.lo = 0.0f, .hi = 1.0f};
inline constexpr Range<float> kRangeRepeatPenalty{.lo = 0.0f, .hi = 100.0f, .lo_open = true};
inline constexpr Range<long long> kRangeSeed{.lo = -1, .hi = std::numeric_limits<long long>::max()};

/// --help lines of the sampling, precision, KV cache and load flags (Common::parse), 28 columns to the description.
inline constexpr const char* kSamplingHelp =
    "      --temp T              temperature in [0, 100] (default 0.8; 0 = greedy)\n"
    "      --top-k K             top-k, an integer >= 0 (default 40; 0 = off)\n"
    "      --top-p P             top-p in (0, 1] (default 0.95; 1 = off)\n"
    "      --min-p P             min-p in [0, 1] (default 0.05; 0 = off)\n"
    "      --repeat-penalty R    repetition penalty in (0, 100] (default 1.0 = off)\n"
    "      --seed S              sampling seed in [-1, 2^63-1] (default -1 = random)\n"
    "      --precision P         quantized weights: fast (int8 dots, activations as two 8-bit parts;\n"
    "                            default), fast8 (one 8-bit part: llama.cpp's scheme, fastest prompt)\n"
    "                            or exact (f32 products with the dequantized weights, as HF)\n"
    "      --kv T                KV cache element type: auto (default: f32 with --precision exact,\n"
    "                            else f16), f32, f16 (half the memory; keys/values rounded to f16) or\n"
    "                            q8_0 (0.53x f16: 8-bit blocks of 32 along head_dim, as llama.cpp's -ctk q8_0)\n"
    "      --load MODE           map (default: the file memory-mapped; it must not change while in use:\n"
    "                            truncating it stops the program with an error) or read (a copy in memory)\n"
    "      --no-pack             keep weights in the file's row-major layout (default: f16/bf16 in packed\n"
    "                            rows, q4_0/q4_1/q5_0/q5_1/q8_0/q4_K in 16-row interleaved blocks)\n"
    "      --check-tensors       scan every weight for NaN and Inf before loading (one extra read and\n"
    "                            scalar dequantization of the whole file on one thread: roughly a second\n"
    "                            per 100 MB of quantized weights, more than loading itself)\n"
    "      --no-huge-pages       do not ask for transparent huge pages for weights, KV cache and\n"
    "                            activations (default: asked for; faster decoding, slower first load on\n"
    "                            some VMs)\n"
    "      --amx                 prompts' integer GEMMs (and at fast/fast8 F16/BF16 weights' GEMMs and the\n"
    "                            attention over an f16 cache) on Intel AMX tiles where the CPU has them\n"
    "                            (the default; KILN_AMX=0 starts with it off)\n"
    "      --no-amx              AMX off: AVX-512 VNNI and f32 FMA (KILN_NO_AMX=1 keeps it off whatever\n"
    "                            else says)\n"
    "  -h, --help                this text\n";

/// Sampling, session and model flags.
struct Common {
  std::string model_path;
  kiln::GenerateOptions gen;
  kiln::SessionOptions sess;
  kiln::LoadOptions load;
  long long seed = -1;
  bool check_tensors = false;

  /// Consumes the current flag if it is one of these; false otherwise.
  bool parse(Args& a) {
    const std::string_view f = a.flag();
    if (f == "-m" || f == "--model") model_path = a.next();
    else if (f == "-n" || f == "--n-predict") a.num(gen.max_tokens, kRangeN);
    else if (f == "-t" || f == "--threads") a.num(sess.threads, kRangeThreads);
    else if (f == "-c" || f == "--ctx-size") a.num(sess.ctx, kRangeCtx);
    else if (f == "--temp") a.num(gen.sampling.temperature, kRangeTemp);
    else if (f == "--top-k") a.num(gen.sampling.top_k, kRangeTopK);
    else if (f == "--top-p") a.num(gen.sampling.top_p, kRangeTopP);
    else if (f == "--min-p") a.num(gen.sampling.min_p, kRangeMinP);
    else if (f == "--repeat-penalty") a.num(gen.sampling.repeat_penalty, kRangeRepeatPenalty);
    else if (f == "--seed") a.num(seed, kRangeSeed);
    else if (f == "--precision") {
      const std::string_view p = a.next();
      if (p == "fast") sess.precision = kiln::Precision::fast;
      else if (p == "fast8") sess.precision = kiln::Precision::fast8;
      else if (p == "exact") sess.precision = kiln::Precision::exact;
      else kiln::fail("--precision must be 'fast', 'fast8' or 'exact', not '", p, "'");
    } else if (f == "--load") {
      const std::string_view m = a.next();
      if (m == "map") load.mode = kiln::io::LoadMode::map;
      else if (m == "read") load.mode = kiln::io::LoadMode::read;
      else kiln::fail("--load must be 'map' or 'read', not '", m, "'");
    } else if (f == "--no-pack") {
      load.pack = false;
    } else if (f == "--check-tensors") {
      check_tensors = true;
    } else if (f == "--no-huge-pages") {
      kiln::set_huge_pages(false);
    } else if (f == "--amx" || f == "--no-amx") {
      kiln::set_amx_enabled({.enabled = f == "--amx"});
    } else if (f == "--kv") {
      const std::string_view t = a.next();
      const auto kv = kiln::kv_type_from_name(t);
      if (!kv) kiln::fail("--kv must be 'auto', 'f32', 'f16' or 'q8_0', not '", t, "'");
      sess.kv_type = *kv;
    } else {
      return false;
    }
    return true;
  }

  /// After parsing: a random seed unless one was given; -n -1: as many tokens as the context holds.
  void finish() {
    gen.sampling.seed = seed < 0 ? std::random_device{}() : static_cast<uint64_t>(seed);
    if (gen.max_tokens < 0) gen.max_tokens = std::numeric_limits<int>::max();
  }

  /// The model of -m (a GGUF file or a Hugging Face checkpoint; with `tokenizer`, a llama2.c checkpoint),
  /// its tensors scanned first with --check-tensors (GGUF files only).
  kiln::Model load_model(const std::string& tokenizer = {}) const {
    if (!tokenizer.empty()) {
      if (check_tensors)
        std::fputs("kiln: warning: --check-tensors reads GGUF files only; the llama2.c checkpoint is not scanned\n",
                   stderr);
      return kiln::load_llama2c(model_path, tokenizer, load);
    }
    if (check_tensors) {
      const std::string_view p = model_path;
      if (p.size() >= 5 && p.substr(p.size() - 5) == ".gguf")
        kiln::check_tensors_finite(kiln::io::GGUFFile(model_path));
      else std::fputs("kiln: warning: --check-tensors reads GGUF files only; the model is not scanned\n", stderr);
    }
    return kiln::load(model_path, load);
  }

  /// After loading: the context when -c gave none (min(4096, the model's trained length), as llama.cpp),
  /// then a KV cache larger than the machine's available memory fails here, naming -c.
  void resolve_ctx(const kiln::Model& model) {
    const bool given = sess.ctx != 0;
    const std::size_t train = model.hparams().ctx_train;
    if (!given) sess.ctx = std::min<std::size_t>(kDefaultCtx, train ? train : kDefaultCtx);
    const kiln::HParams& hp = model.hparams();
    const double need =
        kiln::kv_cache_bytes(hp.n_layers, hp.n_kv_heads, hp.head_dim, sess.ctx, kiln::resolve_kv_type(sess));
    if (const auto avail = kiln::available_memory_bytes(); avail && need > *avail)
      kiln::fail("KV cache for ", given ? "-c " : "the default context (min(4096, the model's)) ", sess.ctx, " needs ",
                 kiln::detail::gib(need), " GiB, ", kiln::detail::gib(*avail),
                 " GiB available (MemAvailable in /proc/meminfo); give a smaller -c");
  }
  static constexpr std::size_t kDefaultCtx = 4096;
};

/// Progress of a long prompt on stderr, one line rewritten in place: "[prompt: done/total tokens, tok/s,
/// time left]", from the first update a second or more after start() on (a short prompt prints nothing).
class PromptProgress {
 public:
  using clock = std::chrono::steady_clock;
  void start() {
    t0_ = clock::now();
    shown_ = false;
  }
  /// done of total tokens run; `now` for tests.
  void update(std::size_t done, std::size_t total, clock::time_point now = clock::now()) {
    const double s = std::chrono::duration<double>(now - t0_).count();
    if (s < 1.0 || done == 0 || done >= total) return;
    const std::string line = format(done, total, s);
    std::fprintf(stderr, "\r%s", line.c_str());
    std::fflush(stderr);
    shown_ = true;
  }
  /// Ends the line when one was shown.
  void finish() {
    if (shown_) std::fputs("\n", stderr);
    shown_ = false;
  }
  static std::string format(std::size_t done, std::size_t total, double seconds) {
    const double rate = double(done) / seconds;
    const double left = double(total - done) / rate;
    char buf[160];
    std::snprintf(buf, sizeof buf, "[prompt: %zu/%zu tokens, %.1f tok/s, %.0f s left]", done, total, rate, left);
    return buf;
  }

 private:
  clock::time_point t0_ = clock::now();
  bool shown_ = false;
};

}  // namespace kiln_cli
