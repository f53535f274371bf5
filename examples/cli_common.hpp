// examples/cli_common.hpp - the command-line flags kiln-generate and kiln-chat share (llama.cpp's names).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/kiln.hpp"

namespace kiln_cli {

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
  template <class T>
  void num(T& out) {
    const std::string_view f = flag();
    const char* s = next();
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end == s || *end) kiln::fail("bad number '", s, "' for ", f);
    out = static_cast<T>(v);
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
};

/// --help lines of the sampling, precision, KV cache and load flags (Common::parse), 28 columns to the description.
inline constexpr const char* kSamplingHelp =
    "      --temp T              temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K             top-k (default 40; 0 = off)\n"
    "      --top-p P             top-p (default 0.95; 1 = off)\n"
    "      --min-p P             min-p (default 0.05; 0 = off)\n"
    "      --repeat-penalty R    repetition penalty (default 1.0 = off)\n"
    "      --seed S              sampling seed (default -1 = random)\n"
    "      --precision P         quantized weights: fast (int8 dots, activations as two 8-bit parts;\n"
    "                            default), fast8 (one 8-bit part: llama.cpp's scheme, fastest prompt)\n"
    "                            or exact (f32 products with the dequantized weights, as HF)\n"
    "      --kv T                KV cache element type: auto (default: f32 with --precision exact,\n"
    "                            else f16), f32 or f16 (half the memory; keys/values rounded to f16)\n"
    "      --load MODE           map (default: the file memory-mapped) or read (read into memory)\n"
    "      --no-pack             keep weights in the file's row-major layout (default: f16/bf16 in packed\n"
    "                            rows, q4_0/q4_1/q5_0/q5_1/q8_0/q4_K in 16-row interleaved blocks)\n"
    "      --no-huge-pages       do not ask for transparent huge pages for weights, KV cache and\n"
    "                            activations (default: asked for; faster decoding, slower first load on\n"
    "                            some VMs)\n"
    "  -h, --help                this text\n";

/// Sampling, session and model flags.
struct Common {
  std::string model_path;
  kiln::GenerateOptions gen;
  kiln::SessionOptions sess;
  kiln::LoadOptions load;
  long long seed = -1;

  /// Consumes the current flag if it is one of these; false otherwise.
  bool parse(Args& a) {
    const std::string_view f = a.flag();
    if (f == "-m" || f == "--model") model_path = a.next();
    else if (f == "-n" || f == "--n-predict") a.num(gen.max_tokens);
    else if (f == "-t" || f == "--threads") a.num(sess.threads);
    else if (f == "-c" || f == "--ctx-size") a.num(sess.ctx);
    else if (f == "--temp") a.num(gen.temperature);
    else if (f == "--top-k") a.num(gen.top_k);
    else if (f == "--top-p") a.num(gen.top_p);
    else if (f == "--min-p") a.num(gen.min_p);
    else if (f == "--repeat-penalty") a.num(gen.repeat_penalty);
    else if (f == "--seed") a.num(seed);
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
    } else if (f == "--no-huge-pages") {
      kiln::set_huge_pages(false);
    } else if (f == "--kv") {
      const std::string_view t = a.next();
      if (t == "auto") sess.kv_type = kiln::KVType::automatic;
      else if (t == "f32") sess.kv_type = kiln::KVType::f32;
      else if (t == "f16") sess.kv_type = kiln::KVType::f16;
      else kiln::fail("--kv must be 'auto', 'f32' or 'f16', not '", t, "'");
    } else {
      return false;
    }
    return true;
  }

  /// After parsing: a random seed unless one was given.
  void finish() { gen.seed = seed < 0 ? std::random_device{}() : static_cast<uint64_t>(seed); }
};

}  // namespace kiln_cli
