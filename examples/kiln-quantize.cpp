// kiln-quantize: converts a GGUF with F32/F16/BF16 weights, or a Hugging Face safetensors checkpoint
// (config.json + *.safetensors), into a GGUF with Q8_0, Q4_0, Q4_1 (or Q5_0, Q5_1, F16, BF16, F32) weights, or
// MXFP4 experts (mxfp4_moe), like llama.cpp's llama-quantize (and convert_hf_to_gguf.py for safetensors).
//
//   kiln-quantize stories260K.gguf stories260K-q8_0.gguf q8_0
//   kiln-quantize path/to/hf_model_dir model-q4_0.gguf q4_0 -t 2
//
// What is quantized (llama.cpp's rules): tensors whose name ends in "weight" with 2 or more dimensions,
// except norms, positional embeddings and a few small special matrices; the token embedding too. A
// tensor whose rows (ne[0]) are not a multiple of 32 stays as it is (with a note). 1-D tensors (norms,
// biases) are written as F32. output.weight (or the token embedding when it doubles as the output, tied
// embeddings) gets Q8_0 when the type is Q4_0, Q4_1, Q5_0 or Q5_1: llama.cpp gives it Q6_K, a type kiln
// cannot quantize into, so kiln uses the nearest finer one; --pure writes it with the requested type
// (as llama-quantize --pure does). mxfp4_moe (llama.cpp's MOSTLY_MXFP4_MOE, gpt-oss's released layout):
// stacked expert tensors (3-D with more than one expert) MXFP4, every other quantized weight Q8_0, output
// included. Every metadata pair is copied; general.file_type is set to llama.cpp's
// LLAMA_FTYPE (MOSTLY_Q8_0 = 7, MOSTLY_Q4_0 = 2, MOSTLY_Q4_1 = 3, ...) and general.quantization_version
// to 2. Each quantized row is byte-identical to gguf-py's quantizers (kiln/quant/convert.hpp).
//
// Memory: the input is memory-mapped and the output streamed tensor by tensor (GGUFWriter's
// add_tensor_info / write_tensor_data), so the peak is one output tensor plus the pages of the input
// being read. The output is written to OUT.part and renamed when complete.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hf_to_gguf.hpp"
#include "kiln/kiln.hpp"

namespace {

using namespace kiln_quantize;
using kiln::io::GGMLType;
using Clock = std::chrono::steady_clock;

struct Target {
  std::string_view name;
  GGMLType type;
  uint32_t file_type;  // llama.cpp's enum llama_ftype
};
constexpr Target targets[] = {
    {"q8_0", GGMLType::Q8_0, 7},  {"q4_0", GGMLType::Q4_0, 2}, {"q4_1", GGMLType::Q4_1, 3},
    {"q5_0", GGMLType::Q5_0, 8},  {"q5_1", GGMLType::Q5_1, 9}, {"f16", GGMLType::F16, 1},
    {"bf16", GGMLType::BF16, 32}, {"f32", GGMLType::F32, 0},   {"mxfp4_moe", GGMLType::MXFP4, 38},
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s IN OUT TYPE [options]\n"
      "  IN     a GGUF file with F32, F16 or BF16 weights, or a Hugging Face checkpoint directory\n"
      "         (config.json, *.safetensors, tokenizer.model or tokenizer.json; Llama architecture)\n"
      "  OUT    the GGUF file to write\n"
      "  TYPE   q8_0, q4_0, q4_1 (also q5_0, q5_1; f16, bf16, f32 to convert without quantizing);\n"
      "         mxfp4_moe: expert tensors (3-D) mxfp4, the other weights q8_0 (llama.cpp's MXFP4_MOE)\n"
      "options:\n"
      "  -t, --threads N          threads, in [0, 1024] (default 0: all cores)\n"
      "      --pure               output.weight (or a tied token embedding) gets TYPE too; by default it\n"
      "                           gets q8_0 for the 4- and 5-bit types (llama.cpp gives it q6_k)\n"
      "      --tokenizer-pre NAME tokenizer.ggml.pre for a byte-level BPE tokenizer.json (smollm, llama-bpe, ...)\n"
      "  -h, --help               this text\n"
      "Weight matrices are quantized (rows that are not a multiple of 32 are kept as they are), 1-D tensors\n"
      "are written as F32, metadata is copied with general.file_type set to llama.cpp's value.\n",
      argv0);
}

std::string human(double bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
  return buf;
}

bool is_float_type(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

// llama.cpp's llama_model_quantize_impl: which tensors are quantized at all.
bool quantizable_name(std::string_view n, std::size_t n_dims) {
  if (!n.ends_with("weight") || n_dims < 2) return false;
  for (std::string_view no : {"_norm.weight",
                              "ffn_gate_inp.weight",
                              "altup",
                              "laurel",
                              "per_layer_model_proj",
                              "ssm_conv1d.weight",
                              "shortconv.conv.weight",
                              "time_mix_first.weight",
                              "time_mix_w0.weight",
                              "time_mix_w1.weight",
                              "time_mix_w2.weight",
                              "time_mix_v0.weight",
                              "time_mix_v1.weight",
                              "time_mix_v2.weight",
                              "time_mix_a0.weight",
                              "time_mix_a1.weight",
                              "time_mix_a2.weight",
                              "time_mix_g1.weight",
                              "time_mix_g2.weight",
                              "time_mix_decay_w1.weight",
                              "time_mix_decay_w2.weight",
                              "time_mix_lerp_fused.weight",
                              "attn_rel_b.weight"})
    if (n.find(no) != std::string_view::npos) return false;
  return n != "position_embd.weight" && n != "token_types.weight";
}

struct Plan {
  GGMLType out = GGMLType::F32;
  uint64_t rows = 0, row_len = 0;  // the conversion runs over rows x row_len
  std::string note;                // why a weight was not quantized
};

Plan plan_tensor(const SourceTensor& t, const Target& target, bool has_output, bool pure) {
  Plan p;
  const uint64_t n = t.n_elements();
  p.row_len = t.ne.size() == 1 ? (t.permute_heads ? 1 : n) : t.ne[0];  // a permuted bias: rows of 1
  p.rows = p.row_len ? n / p.row_len : 0;
  if (!is_float_type(t.type)) {
    const auto info = kiln::io::ggml_type_info(t.type);
    if (info.quantized)
      fail("tensor '", t.name, "' is already quantized (", info.name,
           "); kiln-quantize reads F32, F16 or BF16 weights (quantize from the original, not twice)");
    p.out = t.type;  // integer tensors: copied as they are
    return p;
  }
  if (t.ne.size() == 1) {
    p.out = GGMLType::F32;
    return p;
  }
  if (!quantizable_name(t.name, t.ne.size())) {
    p.out = t.type;
    return p;
  }
  GGMLType want = target.type;
  if (want == GGMLType::MXFP4 && !(t.ne.size() >= 3 && t.ne[2] > 1)) want = GGMLType::Q8_0;  // mxfp4_moe
  const auto info = kiln::io::ggml_type_info(want);
  const bool is_output = t.name == "output.weight" || (!has_output && t.name == "token_embd.weight");
  if (is_output && !pure && info.quantized && want != GGMLType::Q8_0) want = GGMLType::Q8_0;
  if (t.ne[0] % kiln::io::ggml_type_info(want).block_size != 0) {
    p.out = t.type;
    p.note = std::to_string(t.ne[0]) + "-element rows are not a multiple of " +
             std::to_string(kiln::io::ggml_type_info(want).block_size);
    return p;
  }
  p.out = want;
  return p;
}

// Progress on stderr: a redrawn bar on a terminal, one line per tensor otherwise.
class Progress {
 public:
  Progress(std::size_t n, uint64_t total) : tty_(isatty(2) == 1), n_(n), total_(total ? total : 1) {}
  void begin(std::size_t i, const std::string& name) {
    i_ = i;
    name_ = name;
    draw(true);
  }
  void add(uint64_t bytes) { done_.fetch_add(bytes, std::memory_order_relaxed); }
  void draw(bool force = false) {  // only from the calling thread
    if (!tty_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double f = double(done_.load(std::memory_order_relaxed)) / double(total_);
    char bar[31];
    const int fill = int(f * 30 + 0.5);
    for (int k = 0; k < 30; ++k) bar[k] = k < fill ? '#' : '.';
    bar[30] = 0;
    std::fprintf(stderr, "\r\x1b[K[%4zu/%zu] [%s] %5.1f%% %s / %s  %s", i_ + 1, n_, bar, f * 100,
                 human(double(done_.load())).c_str(), human(double(total_)).c_str(), name_.c_str());
    std::fflush(stderr);
  }
  void end(const std::string& line) {
    const double f = double(done_.load()) / double(total_);
    if (tty_) {
      draw(true);
      if (i_ + 1 == n_) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "[%4zu/%zu] %5.1f%% %s\n", i_ + 1, n_, f * 100, line.c_str());
    }
  }

 private:
  bool tty_;
  std::size_t n_, i_ = 0;
  uint64_t total_;
  std::atomic<uint64_t> done_{0};
  std::string name_;
  Clock::time_point last_{};
};

// dst (rows x row_len of Out) = src converted; row r of dst comes from row perm(r) of src.
template <class In, class Out>
void convert_rows(const SourceTensor& t, const Plan& p, std::byte* dst, kiln::ThreadPool& pool, Progress& prog) {
  const std::size_t n = p.row_len, in_row = n * sizeof(In);
  const std::size_t out_row = kiln::ggml_row_bytes(p.out, n);
  const uint64_t heads = t.permute_heads, per_head = heads ? p.rows / heads : 0;
  auto src_row = [&](uint64_t r) {
    if (!heads) return r;
    const uint64_t h = r / per_head, j = r % per_head;  // output row j of head h is (i, s) = (j / 2, j % 2)
    return h * per_head + (j % 2) * (per_head / 2) + j / 2;
  };
  const std::size_t chunk = std::max<std::size_t>(1, (std::size_t(1) << 16) / std::max<std::size_t>(n, 1));
  const std::size_t tasks = (p.rows + chunk - 1) / chunk;
  std::vector<std::vector<In>> in_buf(pool.size(), std::vector<In>(n));
  std::vector<std::vector<float>> f32_buf(pool.size(), std::vector<float>(n));
  pool.parallel_for(tasks, [&](std::size_t task, std::size_t thread) {
    In* x = in_buf[thread].data();
    float* tmp = f32_buf[thread].data();
    const std::size_t r1 = std::min<std::size_t>(p.rows, (task + 1) * chunk);
    for (std::size_t r = task * chunk; r < r1; ++r) {
      std::memcpy(x, t.data.data() + src_row(r) * in_row, in_row);  // the input may be unaligned
      Out* y = reinterpret_cast<Out*>(dst + r * out_row);
      if constexpr (std::is_same_v<In, Out>) std::memcpy(y, x, in_row);
      else if constexpr (std::is_same_v<Out, float>) kiln::dequantize_row(x, y, n);
      else if constexpr (std::is_same_v<In, float>) kiln::quantize_row(x, y, n);
      else {
        kiln::dequantize_row(x, tmp, n);  // f16/bf16 -> f32 is exact, as gguf-py's astype(float32)
        kiln::quantize_row(tmp, y, n);
      }
    }
    prog.add((r1 - task * chunk) * in_row);
    if (thread == 0) prog.draw();
  });
}

template <class T>
constexpr bool is_output_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, kiln::f16> || std::is_same_v<T, kiln::bf16> ||
    std::is_same_v<T, kiln::block_q8_0> || std::is_same_v<T, kiln::block_q4_0> || std::is_same_v<T, kiln::block_q4_1> ||
    std::is_same_v<T, kiln::block_q5_0> || std::is_same_v<T, kiln::block_q5_1> || std::is_same_v<T, kiln::block_mxfp4>;

void convert(const SourceTensor& t, const Plan& p, std::byte* dst, kiln::ThreadPool& pool, Progress& prog) {
  if (!is_float_type(t.type)) {  // integer tensors: bytes as they are
    std::memcpy(dst, t.data.data(), t.data.size());
    prog.add(t.data.size());
    return;
  }
  kiln::visit_ggml_type(t.type, [&]<class In>(In*) {
    if constexpr (std::is_same_v<In, float> || std::is_same_v<In, kiln::f16> || std::is_same_v<In, kiln::bf16>) {
      kiln::visit_ggml_type(p.out, [&]<class Out>(Out*) {
        if constexpr (is_output_type_v<Out>) convert_rows<In, Out>(t, p, dst, pool, prog);
        else fail("kiln-quantize: cannot write type ", kiln::io::ggml_type_name(p.out));
      });
    }
  });
}

Input open_gguf(const std::filesystem::path& path) {
  auto f = std::make_shared<const kiln::io::GGUFFile>(path);
  Input in;
  in.kind = "GGUF";
  in.alignment = f->alignment();
  in.bytes = f->bytes().size();
  for (const auto& t : f->tensors()) {
    SourceTensor s;
    s.name = std::string(t.name);
    s.type = t.type;
    s.ne.assign(t.ne.begin(), t.ne.begin() + t.n_dims);
    s.data = t.data;
    in.tensors.push_back(std::move(s));
  }
  const kiln::io::GGUFFile* fp = f.get();
  in.add_metadata = [fp](kiln::io::GGUFWriter& w, uint32_t file_type) {
    for (const auto& v : fp->metadata()) {
      const auto k = v.key();
      if (k == "general.alignment" || k == "general.file_type" || k == "general.quantization_version") continue;
      w.add(k, v);
    }
    w.add("general.quantization_version", uint32_t(2));  // llama-quantize sets both last
    w.add("general.file_type", file_type);
  };
  in.keep_alive = f;
  return in;
}

Input open_input(const std::filesystem::path& p, const HFOptions& hf) {
  namespace fs = std::filesystem;
  if (!fs::exists(p)) fail("input '", p.string(), "' does not exist");
  if (fs::is_directory(p)) return open_hf(p, hf);
  char magic[4] = {};
  if (std::FILE* f = std::fopen(p.string().c_str(), "rb")) {
    const std::size_t got = std::fread(magic, 1, 4, f);
    std::fclose(f);
    if (got == 4 && std::memcmp(magic, "GGUF", 4) == 0) return open_gguf(p);
  } else {
    fail("cannot open input '", p.string(), "': ", std::strerror(errno));
  }
  const std::string s = p.string();
  if (s.ends_with(".safetensors") || s.ends_with(".safetensors.index.json")) return open_hf(p, hf);
  fail("input '", s,
       "' is neither a GGUF file (it does not start with 'GGUF') nor a safetensors checkpoint "
       "(a directory with config.json and *.safetensors)");
}

void check_output(const std::filesystem::path& out, const std::filesystem::path& in) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(out)) fail("output '", out.string(), "' is a directory");
  if (fs::exists(out) && fs::equivalent(out, in, ec)) fail("output '", out.string(), "' is the input file");
  const fs::path dir = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  if (!fs::is_directory(dir)) fail("cannot write '", out.string(), "': directory '", dir.string(), "' does not exist");
  if (access(dir.c_str(), W_OK) != 0)
    fail("cannot write '", out.string(), "': directory '", dir.string(), "': ", std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  std::size_t threads = 0;
  bool pure = false;
  HFOptions hf;
  std::filesystem::path part;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      auto next = [&]() -> const char* {
        if (i + 1 >= argc) fail("missing value after ", a);
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        usage(argv[0]);
        return 0;
      } else if (a == "-t" || a == "--threads") {
        const char* s = next();
        char* end = nullptr;
        const long v = std::strtol(s, &end, 10);
        if (end == s || *end || v < 0 || v > 1024)
          fail(a, ": '", s, "' is not a thread count; expected an integer in [0, 1024]");
        threads = std::size_t(v);
      } else if (a == "--pure") {
        pure = true;
      } else if (a == "--tokenizer-pre") {
        hf.tokenizer_pre = next();
      } else if (a.size() > 1 && a[0] == '-') {
        fail("unknown option '", a, "' (see --help)");
      } else {
        pos.emplace_back(a);
      }
    }
    if (pos.size() != 3) {
      usage(argv[0]);
      return 1;
    }
    const Target* target = nullptr;
    std::string tname = pos[2];
    for (auto& c : tname) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (const auto& t : targets)
      if (t.name == tname) target = &t;
    if (!target)
      fail("unknown type '", pos[2], "' (supported: q8_0, q4_0, q4_1, q5_0, q5_1, f16, bf16, f32, mxfp4_moe)");

    const auto t0 = Clock::now();
    const std::filesystem::path in_path = pos[0], out_path = pos[1];
    Input in = open_input(in_path, hf);
    check_output(out_path, in_path);

    // Plan every tensor first: errors (already-quantized input) come before any output is written.
    bool has_output = false;
    for (const auto& t : in.tensors) has_output |= t.name == "output.weight";
    std::vector<Plan> plans;
    uint64_t total = 0;
    for (const auto& t : in.tensors) {
      plans.push_back(plan_tensor(t, *target, has_output, pure));
      total += t.data.size();
    }
    kiln::io::GGUFWriter w(in.alignment);
    in.add_metadata(w, target->file_type);
    uint64_t out_bytes_max = 0;
    for (std::size_t i = 0; i < in.tensors.size(); ++i)
      out_bytes_max = std::max(out_bytes_max, w.add_tensor_info(in.tensors[i].name, plans[i].out, in.tensors[i].ne));

    part = out_path;
    part += ".part";
    kiln::ThreadPool pool(threads);
    Progress prog(in.tensors.size(), total);
    std::vector<std::byte> buf;
    buf.reserve(out_bytes_max);  // one tensor at a time: the peak is the largest output tensor
    std::map<std::string, std::size_t> counts;
    std::vector<std::string> notes;
    w.begin(part);
    for (std::size_t i = 0; i < in.tensors.size(); ++i) {
      const auto& t = in.tensors[i];
      const auto& p = plans[i];
      prog.begin(i, t.name);
      buf.resize(kiln::ggml_row_bytes(p.out, p.row_len) * p.rows);
      convert(t, p, buf.data(), pool, prog);
      w.write_tensor_data(buf);
      const auto in_name = kiln::io::ggml_type_name(t.type), out_name = kiln::io::ggml_type_name(p.out);
      ++counts[std::string(out_name)];
      if (!p.note.empty()) notes.push_back(t.name + " (" + p.note + ")");
      std::string shape;
      for (std::size_t d = t.ne.size(); d-- > 0;) shape += std::to_string(t.ne[d]) + (d ? " x " : "");
      prog.end(t.name + "  [" + shape + "]  " + std::string(in_name) + " -> " + std::string(out_name) + "  " +
               human(double(t.data.size())) + " -> " + human(double(buf.size())) +
               (p.note.empty() ? "" : "  (kept: " + p.note + ")"));
    }
    w.finish();
    std::filesystem::rename(part, out_path);
    part.clear();

    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto out_size = std::filesystem::file_size(out_path);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    for (const auto& n : notes) std::fprintf(stderr, "kiln-quantize: note: kept %s\n", n.c_str());
    std::string per_type;
    for (const auto& [ty, c] : counts) per_type += (per_type.empty() ? "" : ", ") + std::to_string(c) + " " + ty;
    std::fprintf(stderr,
                 "kiln-quantize: %s (%s) -> %s as %s (general.file_type %u)\n"
                 "kiln-quantize: input %s, output %s, ratio %.2fx; %zu tensors: %s\n"
                 "kiln-quantize: %.2f s with %zu threads; peak RSS %s, the memory-mapped input included (largest "
                 "output tensor %s)\n",
                 in_path.string().c_str(), in.kind.c_str(), out_path.string().c_str(),
                 std::string(target->name).c_str(), target->file_type, human(double(in.bytes)).c_str(),
                 human(double(out_size)).c_str(), double(in.bytes) / double(out_size), in.tensors.size(),
                 per_type.c_str(), secs, pool.size(), human(double(ru.ru_maxrss) * 1024).c_str(),
                 human(double(out_bytes_max)).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%skiln-quantize: error: %s\n", isatty(2) == 1 ? "\n" : "", e.what());
    std::error_code ec;
    if (!part.empty()) std::filesystem::remove(part, ec);
    return 1;
  }
  return 0;
}
