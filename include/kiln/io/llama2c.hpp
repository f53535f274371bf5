// kiln/io/llama2c.hpp - readers for Andrej Karpathy's llama2.c formats: the legacy (version 0) .bin
// checkpoint and the tokenizer .bin (tok512.bin, tokenizer.bin).
//
// Checkpoint: 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
// seq_len; a negative vocab_size means the classifier is stored separately, positive means it is the
// token embedding), then f32 arrays in this order (run.c's memory_map_weights; (rows, cols) are
// PyTorch Linear (out, in) layouts):
//   token_embedding (vocab, dim); rms_att (L, dim); wq (L, n_heads*hd, dim); wk (L, n_kv*hd, dim);
//   wv (L, n_kv*hd, dim); wo (L, dim, n_heads*hd); rms_ffn (L, dim); w1 (L, hidden, dim) (gate);
//   w2 (L, dim, hidden) (down); w3 (L, hidden, dim) (up); rms_final (dim);
//   freq_cis_real and freq_cis_imag (seq_len, hd/2 each; unused: RoPE is recomputed); [wcls (vocab, dim)]
// with hd = dim / n_heads. RoPE in llama2.c rotates adjacent pairs (2i, 2i+1) (RopeStyle::gptj).
// The newer "ak42" export versions (1 and 2) are not supported.
//
// Tokenizer: int32 max_token_length, then vocab_size records of (f32 score, int32 len, len bytes).
// SentencePiece's "▁" is stored as a plain space, BOS/EOS as "\n<s>\n" and "\n</s>\n", byte-fallback
// pieces as "<0xNN>". The vocabulary size is not stored: it comes from the checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/common.hpp"
#include "kiln/io/mmap.hpp"

namespace kiln::io {

struct Llama2cConfig {
  std::size_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool shared_classifier = true;
  std::size_t head_dim() const { return dim / n_heads; }
};

/// A llama2.c checkpoint, memory-mapped (or loaded); every pointer stays valid while this object lives.
class Llama2cCheckpoint {
 public:
  explicit Llama2cCheckpoint(const std::filesystem::path& path, LoadMode mode = LoadMode::map)
      : file_(std::make_unique<MappedFile>(path, mode)) {
    detail::Cursor c(file_->bytes(), "llama2.c checkpoint", file_->path());
    const auto magic = c.read<uint32_t>("the header");
    if (magic == 0x616b3432u)
      c.error(
          "this is a llama2.c export of version 1 or 2 (magic 'ak42'); only the legacy version 0 format "
          "(export.py --version 0) is supported");
    c = detail::Cursor(file_->bytes(), "llama2.c checkpoint", file_->path());
    int32_t h[7];
    const char* names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; ++i) h[i] = c.read<int32_t>("header field ", names[i]);
    for (int i = 0; i < 7; ++i)
      if ((i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0) || std::abs(h[i]) > (1 << 24))
        c.error("header field ", names[i], " = ", h[i], " is not a sensible value");
    cfg_.dim = std::size_t(h[0]);
    cfg_.hidden_dim = std::size_t(h[1]);
    cfg_.n_layers = std::size_t(h[2]);
    cfg_.n_heads = std::size_t(h[3]);
    cfg_.n_kv_heads = std::size_t(h[4]);
    cfg_.shared_classifier = h[5] > 0;
    cfg_.vocab_size = std::size_t(h[5] > 0 ? h[5] : -h[5]);
    cfg_.seq_len = std::size_t(h[6]);
    if (cfg_.dim % cfg_.n_heads != 0 || cfg_.n_heads % cfg_.n_kv_heads != 0 || cfg_.head_dim() % 2 != 0)
      c.error("dim ", cfg_.dim, ", n_heads ", cfg_.n_heads, " and n_kv_heads ", cfg_.n_kv_heads,
              " do not fit (need dim % n_heads == 0, n_heads % n_kv_heads == 0 and an even head size)");
    const std::size_t L = cfg_.n_layers, d = cfg_.dim, hd = cfg_.head_dim(), kv = cfg_.n_kv_heads * hd;
    const std::size_t f = cfg_.hidden_dim, v = cfg_.vocab_size;
    // Element counts in file order; all factors are < 2^24 and there are at most 3, so no overflow in 64 bits.
    const uint64_t counts[] = {v * d, L * d,     L * d * d, L * kv * d, L * kv * d, L * d * d,
                               L * d, L * f * d, L * d * f, L * f * d,  d,          uint64_t(cfg_.seq_len) * (hd / 2)};
    const float** dest[] = {&emb_,     &rms_att_, &wq_, &wk_, &wv_,        &wo_,
                            &rms_ffn_, &w1_,      &w2_, &w3_, &rms_final_, nullptr};
    const char* what[] = {"token_embedding", "rms_att", "wq", "wk", "wv",        "wo",
                          "rms_ffn",         "w1",      "w2", "w3", "rms_final", "freq_cis_real"};
    for (std::size_t i = 0; i < std::size(counts); ++i) {
      const auto bytes = c.take(counts[i] * sizeof(float), "weights '", what[i], "'");
      if (dest[i]) *dest[i] = reinterpret_cast<const float*>(bytes.data());
      if (i + 1 == std::size(counts)) c.take(counts[i] * sizeof(float), "weights 'freq_cis_imag'");
    }
    wcls_ = emb_;
    if (!cfg_.shared_classifier)
      wcls_ = reinterpret_cast<const float*>(c.take(uint64_t(v) * d * 4, "weights 'wcls'").data());
    if (c.remaining() != 0)
      c.error(c.remaining(), " bytes follow the weights: the header (", describe(), ") does not match the file");
  }

  const Llama2cConfig& config() const { return cfg_; }
  const MappedFile& file() const { return *file_; }
  std::string describe() const {
    return kiln::detail::concat("dim ", cfg_.dim, ", hidden_dim ", cfg_.hidden_dim, ", n_layers ", cfg_.n_layers,
                                ", n_heads ", cfg_.n_heads, ", n_kv_heads ", cfg_.n_kv_heads, ", vocab ",
                                cfg_.vocab_size, ", seq_len ", cfg_.seq_len);
  }

  // Per-layer weights, row-major (rows, cols) as in the header comment.
  const float* token_embedding() const { return emb_; }
  const float* classifier() const { return wcls_; }
  const float* rms_final() const { return rms_final_; }
  const float* rms_att(std::size_t l) const { return rms_att_ + l * cfg_.dim; }
  const float* rms_ffn(std::size_t l) const { return rms_ffn_ + l * cfg_.dim; }
  const float* wq(std::size_t l) const { return wq_ + l * cfg_.dim * cfg_.dim; }
  const float* wk(std::size_t l) const { return wk_ + l * kv_dim() * cfg_.dim; }
  const float* wv(std::size_t l) const { return wv_ + l * kv_dim() * cfg_.dim; }
  const float* wo(std::size_t l) const { return wo_ + l * cfg_.dim * cfg_.dim; }
  const float* w1(std::size_t l) const { return w1_ + l * cfg_.hidden_dim * cfg_.dim; }
  const float* w2(std::size_t l) const { return w2_ + l * cfg_.dim * cfg_.hidden_dim; }
  const float* w3(std::size_t l) const { return w3_ + l * cfg_.hidden_dim * cfg_.dim; }

 private:
  std::size_t kv_dim() const { return cfg_.n_kv_heads * cfg_.head_dim(); }

  std::unique_ptr<MappedFile> file_;  // heap: the pointers below survive moves
  Llama2cConfig cfg_;
  const float *emb_ = nullptr, *rms_att_ = nullptr, *wq_ = nullptr, *wk_ = nullptr, *wv_ = nullptr, *wo_ = nullptr;
  const float *rms_ffn_ = nullptr, *w1_ = nullptr, *w2_ = nullptr, *w3_ = nullptr, *rms_final_ = nullptr;
  const float* wcls_ = nullptr;
};

/// A llama2.c tokenizer file's contents, as stored.
struct Llama2cVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  uint32_t max_token_length = 0;
};

/// Reads `vocab_size` records (the checkpoint's vocab_size) from a llama2.c tokenizer file.
inline Llama2cVocab read_llama2c_vocab(const std::filesystem::path& path, std::size_t vocab_size) {
  const MappedFile f(path, LoadMode::read);
  detail::Cursor c(f.bytes(), "llama2.c tokenizer", f.path());
  Llama2cVocab v;
  const int32_t mtl = c.read<int32_t>("max_token_length");
  if (mtl <= 0 || mtl > (1 << 16)) c.error("max_token_length ", mtl, " is not sensible");
  v.max_token_length = uint32_t(mtl);
  if (vocab_size > c.remaining() / 8)
    c.error("vocab_size ", vocab_size, " (from the checkpoint) needs at least ", vocab_size * 8, " bytes but only ",
            c.remaining(), " follow");
  v.pieces.reserve(vocab_size);
  v.scores.reserve(vocab_size);
  for (std::size_t i = 0; i < vocab_size; ++i) {
    v.scores.push_back(c.read<float>("score of token ", i));
    const int32_t len = c.read<int32_t>("length of token ", i);
    if (len < 0 || uint32_t(len) > v.max_token_length)
      c.error("token ", i, " has length ", len, " (max_token_length is ", v.max_token_length, ")");
    v.pieces.emplace_back(detail::as_string_view(c.take(uint64_t(len), "bytes of token ", i)));
  }
  if (c.remaining() != 0)
    c.error(c.remaining(), " bytes follow the ", vocab_size,
            " tokens: the tokenizer does not match the checkpoint's vocabulary size");
  return v;
}

}  // namespace kiln::io
