// tests/model/model_test_util.hpp - shared helpers of the model tests: fixture paths, a dummy tokenizer,
// logits comparison and GGUF rewriting.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "kiln/io/gguf.hpp"
#include "kiln/io/gguf_writer.hpp"
#include "kiln/model/model.hpp"
#include "kiln/quant/convert.hpp"

namespace kiln::test {

/// ../shared/models/<name>; a missing file FAILs the test with the path (never a skip).
inline std::string shared_model(const std::string& name) {
  // Appended, not std::string(..) + "..": GCC 12 warns falsely (-Warray-bounds) on that temporary's
  // operator+ when this header is compiled after the tests' precompiled header.
  std::string p = KILN_SHARED_DIR;
  p += "/models/";
  p += name;
  if (!std::filesystem::exists(p))
    FAIL("missing test fixture '", p, "' (the shared models folder, see ../shared/README.md)");
  return p;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) FAIL("cannot read '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

/// max |got - want| / (max(want) - min(want)): a row of logits' error relative to the reference row's range
/// (a NaN anywhere gives NaN).
inline double rel_error(std::span<const float> got, std::span<const float> want) {
  REQUIRE(got.size() == want.size());
  float lo = want[0], hi = want[0];
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    lo = std::min(lo, want[i]);
    hi = std::max(hi, want[i]);
    const double d = std::fabs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) worst = d;  // NaN propagates
  }
  return worst / (double(hi) - double(lo));
}

/// A reference's logits file: shape[0] x shape[1] little-endian f32 (the fixture scripts' hf_logits.f32),
/// its size checked against the shape.
inline std::vector<float> read_logits(const std::string& path, const std::vector<std::size_t>& shape) {
  REQUIRE(shape.size() == 2);
  const std::string bytes = read_text(path);
  REQUIRE(bytes.size() == shape[0] * shape[1] * sizeof(float));
  std::vector<float> out(shape[0] * shape[1]);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

/// A vocabulary of `n` pieces "t0", "t1", ... (no special tokens): for models built in tests.
inline Tokenizer dummy_tokenizer(std::size_t n) {
  Vocabulary v;
  for (std::size_t i = 0; i < n; ++i) {
    std::string p = "t";  // (not "t" + to_string: GCC 12 -Wrestrict false positive)
    p += std::to_string(i);
    v.pieces.push_back(p);
  }
  v.bos = v.eos = v.unk = -1;
  v.add_bos = false;
  return Tokenizer(std::move(v));
}

/// max over i of |got - want| / (atol + rtol |want|) <= 1.
inline void check_logits(std::span<const float> got, const std::vector<double>& want, double rtol, double atol,
                         const std::string& what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = std::fabs(double(got[i]) - want[i]) / (atol + rtol * std::fabs(want[i]));
    if (!(r <= worst)) {
      worst = r;
      at = i;
    }
  }
  INFO(what, ": worst logit ", at, " got ", got[at], " want ", want[at], " (ratio ", worst, ")");
  CHECK(worst <= 1.0);
}

/// A temporary file path, removed when this object dies.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& stem) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (stem + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".gguf");
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

/// Copies a GGUF file's metadata (the types stories260K uses) and tensors, with `arch` replacing
/// general.architecture (and the "<arch>." key prefix), 2-D tensors stored as `matrix_type`
/// (F32, F16, BF16 or a block type kiln quantizes to: matrices whose rows are not whole blocks stay F32), tensors named in `drop` left out, and token_embd.weight quantized to Q8_0 when
/// `q8_embedding`, and the f32 keys of `extra` added (replacing any of the same name).
inline void rewrite_gguf(const io::GGUFFile& f, const std::filesystem::path& out, const std::string& arch,
                         io::GGMLType matrix_type, const std::vector<std::string>& drop = {}, bool q8_embedding = false,
                         const std::vector<std::pair<std::string, float>>& extra = {}) {
  using io::GGUFValueType;
  io::GGUFWriter w;
  const std::string old_arch(f.architecture());
  for (const auto& v : f.metadata()) {
    std::string key(v.key());
    if (key == "general.architecture") {
      w.add(key, arch);
      continue;
    }
    if (key.rfind(old_arch + ".", 0) == 0) key = arch + key.substr(old_arch.size());
    if (std::any_of(extra.begin(), extra.end(), [&](const auto& e) { return e.first == key; })) continue;
    switch (v.type()) {
      case GGUFValueType::UINT32:
        w.add(key, v.as<uint32_t>());
        break;
      case GGUFValueType::INT32:
        w.add(key, v.as<int32_t>());
        break;
      case GGUFValueType::FLOAT32:
        w.add(key, v.as<float>());
        break;
      case GGUFValueType::BOOL:
        w.add(key, v.as<bool>());
        break;
      case GGUFValueType::STRING:
        w.add(key, v.as<std::string>());
        break;
      case GGUFValueType::ARRAY:
        if (v.array_type() == GGUFValueType::STRING) w.add(key, v.as<std::vector<std::string>>());
        else if (v.array_type() == GGUFValueType::FLOAT32) w.add(key, v.as<std::vector<float>>());
        else if (v.array_type() == GGUFValueType::INT32) w.add(key, v.as<std::vector<int32_t>>());
        else FAIL("rewrite_gguf: unhandled array type for ", key);
        break;
      default:
        FAIL("rewrite_gguf: unhandled metadata type for ", key);
    }
  }
  for (const auto& [key, value] : extra) w.add(key, value);
  for (const auto& t : f.tensors()) {
    if (std::find(drop.begin(), drop.end(), std::string(t.name)) != drop.end()) continue;
    REQUIRE(t.type == io::GGMLType::F32);
    const auto v = t.view<float, 1 + 1>();  // every stories260K tensor as (rows, row_length)
    if (q8_embedding && t.name == "token_embd.weight") {
      std::vector<block_q8_0> q(v.size() / QK8_0);
      quantize_row(v.data(), q.data(), v.size());
      w.add_tensor(std::string(t.name), io::GGMLType::Q8_0, {uint64_t(v.extent(1)), uint64_t(v.extent(0))},
                   std::as_bytes(std::span(q)));
    } else if (t.n_dims == 2 && matrix_type == io::GGMLType::F16) {
      std::vector<f16> h(v.size());
      quantize_row(v.data(), h.data(), v.size());
      w.add_tensor(std::string(t.name), make_tensor(static_cast<const f16*>(h.data()), v.extent(0), v.extent(1)));
    } else if (t.n_dims == 2 && matrix_type == io::GGMLType::BF16) {
      std::vector<bf16> h(v.size());
      quantize_row(v.data(), h.data(), v.size());
      w.add_tensor(std::string(t.name), make_tensor(static_cast<const bf16*>(h.data()), v.extent(0), v.extent(1)));
    } else if (t.n_dims == 2 && matrix_type != io::GGMLType::F32) {
      // A block type: quantized when the rows are whole blocks (else kept f32, as llama-quantize does).
      bool done = false;
      visit_ggml_type(static_cast<uint32_t>(matrix_type), [&]<class B>(B*) {
        if constexpr (Quantizable<B>) {
          if (v.extent(1) % block_size_v<B> != 0) return;
          std::vector<B> q(v.size() / block_size_v<B>);
          quantize_row(v.data(), q.data(), v.size());
          w.add_tensor(std::string(t.name), matrix_type, {uint64_t(v.extent(1)), uint64_t(v.extent(0))},
                       std::as_bytes(std::span(q)));
          done = true;
        }
      });
      if (!done) w.add_tensor(std::string(t.name), v);
    } else if (t.n_dims == 1) {
      w.add_tensor(std::string(t.name), make_tensor(v.data(), v.size()));
    } else {
      w.add_tensor(std::string(t.name), v);
    }
  }
  w.write(out);
}

}  // namespace kiln::test
