// kiln/model/weights.hpp - a model's weights as named, typed views of the file's bytes (WeightRef and
// linear(), the one function every weight product goes through, are in ops/linear.hpp).
//
//   embed_rows(W, ids, out): out[i] = W[ids[i]] widened (or dequantized) to f32.
//   pack_weights(weights, file): f16/bf16 matrices into packed rows, q4_0/q4_1/q5_0/q5_1/q8_0/q4_K into 16-row
//              interleaved blocks (in place when read into memory).
//   load_gguf_weights<Config>(file, hparams): llama.cpp's tensor names -> ModelWeights, every shape
//              checked; norm and bias vectors stored as f16/bf16 are widened into owned f32 buffers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/model/config.hpp"
#include "kiln/ops/embedding.hpp"
#include "kiln/ops/linear.hpp"
#include "kiln/quant/convert.hpp"

namespace kiln {

namespace detail {
/// Part `part` (0: q, 1: k, 2: v) of a fused (q_dim + 2 kv_dim, dim) attention input: rows [0, q_dim) are q,
/// then kv_dim rows of k and of v.
inline WeightRef fused_qkv_part(const WeightRef& qkv, int part, const HParams& hp) {
  static constexpr const char* names[] = {"q", "k", "v"};
  const std::size_t q = hp.q_dim(), kv = hp.kv_dim();
  return weight_rows(qkv, part == 0 ? 0 : q + std::size_t(part - 1) * kv, part == 0 ? q : kv, names[part]);
}
/// The gate (part 0) or up (part 1) half of a fused (2 ffn_dim, dim) MLP input (Phi-3's chunk(2)).
inline WeightRef fused_gate_up_part(const WeightRef& gate_up, int part, const HParams& hp) {
  return weight_rows(gate_up, std::size_t(part) * hp.ffn_dim, hp.ffn_dim, part == 0 ? "gate" : "up");
}
/// Config members that say a file fuses q/k/v (fused_qkv) or gate/up (fused_gate_up) into one matrix.
template <class C>
constexpr bool fused_qkv() {
  if constexpr (requires { C::fused_qkv; }) return C::fused_qkv;
  else return false;
}
template <class C>
constexpr bool fused_gate_up() {
  if constexpr (requires { C::fused_gate_up; }) return C::fused_gate_up;
  else return false;
}
}  // namespace detail

/// A vector of f32 (norm weights, biases).
struct VecRef {
  const float* data = nullptr;
  std::size_t n = 0;
  explicit operator bool() const { return data != nullptr; }
  DenseTensor<const float, 1> view() const { return make_tensor(data, n); }
};

/// out (n, dim) = rows ids of the table (vocab, dim), as f32.
template <class O>
void embed_rows(const WeightRef& table, std::span<const int32_t> ids, const O& out, ThreadPool* pool) {
  const auto idv = make_tensor(ids.data(), ids.size());
  const auto type = static_cast<uint32_t>(table.type);
  if (table.packed && !kernels::qmm_interleavable(type))
    fail("kiln::embed_rows: weight '", table.name, "' is stored in packed rows (LoadOptions::pack)");
  switch (table.type) {
    case io::GGMLType::F32:
      embedding(table.view<float>(), idv, out, pool);
      return;
    case io::GGMLType::F16:
      embedding(table.view<f16>(), idv, out, pool);
      return;
    case io::GGMLType::BF16:
      embedding(table.view<bf16>(), idv, out, pool);
      return;
    default:
      break;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || std::size_t(ids[i]) >= table.rows)
      fail("kiln::embed_rows: token id ", ids[i], " (ids[", i, "]) is out of range for a vocabulary of ", table.rows);
    // the exact path's row dequantizer: SIMD, 16-row interleaved blocks (LoadOptions::pack) read in place
    dispatch::dequant_rows(type, table.data, table.rows, table.row_bytes, table.packed, std::size_t(ids[i]), 1,
                           table.cols, &out(i, 0));
  }
}

/// x (rows, n) += b (n) on every row.
template <class X>
void add_bias(const X& x, const VecRef& b) {
  for (std::size_t r = 0; r < x.extent(0); ++r) {
    float* row = &x(r, 0);
    for (std::size_t j = 0; j < b.n; ++j) row[j] += b.data[j];
  }
}

struct LayerWeights {
  VecRef attn_norm, attn_norm_b;  // _b: LayerNorm bias
  WeightRef wq, wk, wv, wo;
  VecRef bq, bk, bv, bo;
  VecRef q_norm, k_norm;  // (head_dim): qk_norm; (q_dim), (kv_dim): qk_norm_whole
  VecRef post_attn_norm, post_ffw_norm;
  VecRef ffn_norm, ffn_norm_b;
  WeightRef w_gate, w_up, w_down;
  VecRef b_gate, b_up, b_down;
  // Mixture of experts (HParams::n_expert > 0, model/moe.hpp) instead of w_gate, w_up, w_down: the router
  // (n_expert, dim) and n_expert matrices each of (ffn_dim, dim), (ffn_dim, dim), (dim, ffn_dim).
  WeightRef ffn_gate_inp;
  std::vector<WeightRef> exp_gate, exp_up, exp_down;
  VecRef exp_probs_b;  // (n_expert), optional: added to the router's weights to choose experts, not to weigh them
  // expert_bias Configs (gpt-oss): the router's bias (n_expert), added to its logits, and each expert's
  // biases (ffn_dim), (ffn_dim), (dim).
  VecRef ffn_gate_inp_b;
  std::vector<VecRef> exp_gate_b, exp_up_b, exp_down_b;
  // The shared expert (HParams::shexp_ffn_dim > 0): (shexp_ffn_dim, dim), (shexp_ffn_dim, dim),
  // (dim, shexp_ffn_dim), and its gate (1, dim).
  WeightRef shexp_gate, shexp_up, shexp_down, shexp_gate_inp;
  VecRef attn_sinks;  // (n_heads): attn_sinks Configs (gpt-oss), each head's sink logit
};

struct ModelWeights {
  WeightRef tok_embd;  // (vocab, dim)
  VecRef output_norm, output_norm_b;
  WeightRef output;    // (vocab, dim); the token embedding when tied
  WeightRef pos_embd;  // (positions, dim): a Config with learned_positions (GPT-2's wpe)
  std::vector<LayerWeights> layers;
  std::vector<Buffer<float>> owned;             // vectors widened to f32 at load time
  std::vector<Buffer<std::byte>> owned_packed;  // matrices repacked out of a mapped file (pack_weights)
};

/// Repacks the model's weight matrices that only linear() reads (a layer's Q, K, V, O, gate, up, down; the
/// output matrix, or a quantized token embedding it is tied to), those inside the file's bytes `file`, into
/// the layout the kernels read fastest: f16/bf16 into ops/matmul.hpp's packed rows (results bit-identical:
/// the GEMV reads the 8 rows of a group as one stream instead of 8); q4_0, q4_1, q5_0, q5_1, q8_0, q4_K and
/// mxfp4 into quant/interleave.hpp's 16-row interleaved groups (prompt results bit-identical; the decode
/// GEMV on AVX3_DL, with no byte permutes or cross-lane sums, sums in another f32 order) when the dispatched
/// target reads those groups natively (dispatch::qmatmul_interleaved_native: AVX3_DL, AVX2 and AVX3;
/// other targets and types stay row-major, far faster than groups copied back per call). Read into memory
/// (file.writable_data()): in place. Mapped: into one owned buffer (w.owned_packed), ~8 MiB at a time, the
/// mapping's pages for them then released (MappedFile::release), as llama.cpp copies the tensors it
/// repacks out of its mapping. Returns the number of matrices packed.
inline std::size_t pack_weights(ModelWeights& w, io::MappedFile& file) {
  const std::byte* base = file.data();
  std::byte* writable = file.writable_data();
  // Quantized matrices are interleaved only for a target whose kernels read the groups as they are.
  auto interleavable = [](uint32_t type) { return dispatch::qmatmul_interleaved_native(type); };
  auto eligible = [&](const WeightRef& r) {
    const auto type = static_cast<uint32_t>(r.type);
    const bool half = r.type == io::GGMLType::F16 || r.type == io::GGMLType::BF16;
    if (!r || r.packed || !(half || (interleavable(type) && r.rows >= kernels::kQmmInterleaveRows))) return false;
    return r.row_bytes == ggml_row_bytes(type, r.cols) && r.data >= base && std::size_t(r.data - base) <= file.size() &&
           r.rows * r.row_bytes <= file.size() - std::size_t(r.data - base);
  };
  // The matrices, in the order they are packed (a tied quantized classifier last; see below).
  std::vector<WeightRef*> todo;
  for (auto& L : w.layers) {
    for (WeightRef* r :
         {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.shexp_gate, &L.shexp_up, &L.shexp_down})
      if (eligible(*r)) todo.push_back(r);
    for (auto* experts : {&L.exp_gate, &L.exp_up, &L.exp_down})  // each expert a matrix of its own
      for (WeightRef& r : *experts)
        if (eligible(r)) todo.push_back(&r);
  }
  const bool tied = w.output.data == w.tok_embd.data;
  if (!tied && eligible(w.output)) todo.push_back(&w.output);
  // A tied quantized classifier (SmolLM2, Gemma 3): the largest matrix a decoded token reads. Interleaved
  // too; embed_rows reads rows back out of the groups (f16/bf16 tables stay row-major for embedding()).
  if (tied && interleavable(static_cast<uint32_t>(w.tok_embd.type)) && eligible(w.tok_embd))
    todo.push_back(&w.tok_embd);
  if (todo.empty()) return 0;
  // Mapped: one owned buffer for all of them (64-byte-aligned slices), so that its memory is one run of
  // whole huge pages (kiln::detail::advise_huge_pages): the decode GEMV streams it with fewer TLB misses.
  std::vector<std::byte*> dsts(todo.size());
  if (writable) {
    for (std::size_t i = 0; i < todo.size(); ++i) dsts[i] = writable + (todo[i]->data - base);  // in place
  } else {
    std::size_t total = 0;
    for (const WeightRef* r : todo) total += detail::align_up(r->rows * r->row_bytes);
    w.owned_packed.emplace_back(total);
    std::byte* owned = w.owned_packed.back().data();
    for (std::size_t i = 0; i < todo.size(); ++i) {
      dsts[i] = owned;
      owned += detail::align_up(todo[i]->rows * todo[i]->row_bytes);
    }
  }
  auto pack_one = [&](std::size_t i) {
    WeightRef& r = *todo[i];
    std::byte* const dst = dsts[i];
    const auto type = static_cast<uint32_t>(r.type);
    // Rows [0, n) at src (row-major) into dst (dst == src: in place), in the type's layout. Both layouts
    // keep whole groups (8 or 16 rows) in the groups' bytes, so a matrix can go a run of groups at a time.
    auto repack = [&](const std::byte* src, std::byte* dst, std::size_t n) {
      visit_ggml_type(type, [&]<class T>(T*) {
        if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
          if (src == dst) pack_rows_in_place(reinterpret_cast<T*>(dst), n, r.cols);
          else pack_rows(make_tensor(reinterpret_cast<const T*>(src), n, r.cols), reinterpret_cast<T*>(dst));
        } else if constexpr (kernels::qmm_interleavable_v<T>) {
          const std::size_t nb = r.cols / dtype_traits<T>::block_size;
          if (src == dst) kernels::qmm_interleave_rows_in_place(reinterpret_cast<T*>(dst), n, nb);
          else kernels::qmm_interleave_rows(reinterpret_cast<const T*>(src), n, nb, reinterpret_cast<T*>(dst));
        }
      });
    };
    if (writable) {
      repack(dst, dst, r.rows);  // the same bytes, through the writable pointer
    } else {
      // ~8 MiB of whole 16-row groups at a time (the last run takes the rest), each run's mapped pages
      // released once copied: the file's pages and the copy are never both resident for a whole matrix
      // (a tied 262144 x 640 Q8_0 classifier is 178 MB).
      const std::size_t run = std::max<std::size_t>(1, (std::size_t{8} << 20) / (16 * r.row_bytes)) * 16;
      for (std::size_t j = 0; j < r.rows; j += run) {
        const std::size_t n = r.rows - j <= run + 15 ? r.rows - j : run;  // no run of under 16 rows last
        file.populate(r.data + j * r.row_bytes, n * r.row_bytes);
        repack(r.data + j * r.row_bytes, dst + j * r.row_bytes, n);
        file.release(r.data, (j + n) * r.row_bytes);  // from the start: pages straddling runs go too
        if (n != run) break;
      }
    }
  };
  // The matrices are independent: up to 4 threads take them in turn. Reordering bytes is cheap; the first
  // touch of fresh memory (mapped: the owned copy) and of the file's pages is not, and it spreads.
  detail::run_once_parallel(todo.size(), 4, pack_one);
  for (std::size_t i = 0; i < todo.size(); ++i) {
    todo[i]->data = dsts[i];
    todo[i]->packed = true;
  }
  if (tied && w.tok_embd.packed) {
    w.output.data = w.tok_embd.data;
    w.output.packed = true;
  }
  return todo.size();
}

/// The tensors of a mapped file (GGUF or safetensors) read a few bytes at a time, marked so
/// (MappedFile::advise_sparse): the token embedding where the model reads it from the file and the
/// classifier is another matrix (a token reads one row), and every vector (norms, biases). The matrices
/// read whole for every token keep their huge-page mappings.
template <class Tensors>
void advise_sparse_tensors(const Tensors& tensors, const ModelWeights& w, const io::MappedFile& file) {
  const bool embedding_sparse = w.output.data != w.tok_embd.data;
  for (const auto& t : tensors)
    if (t.rank() == 1 || (embedding_sparse && t.data.data() == w.tok_embd.data))
      file.advise_sparse(t.data.data(), t.data.size());
}

namespace detail {

class GGUFWeightReader {
 public:
  GGUFWeightReader(const io::GGUFFile& f, ModelWeights& w) : f_(f), w_(w) {}

  WeightRef matrix(const std::string& name, std::size_t rows, std::size_t cols, bool required = true) {
    const auto* t = f_.find_tensor(name);
    if (!t) {
      if (required) fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' not found");
      return {};
    }
    // Checked here, at load, so that the error names the tensor (the kernels would only see a type id).
    if (!visit_ggml_type(t->type, [](auto*) {}))
      fail<FormatError>(
          "kiln: GGUF file '", f_.name(), "': weight '", name, "' has type ", io::ggml_type_name(t->type), " (",
          uint32_t(t->type),
          "), which kiln cannot multiply by "
          "(supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, mxfp4)");
    WeightRef r = WeightRef::from_gguf(*t);
    if (r.rows != rows || r.cols != cols)
      fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' is (", r.rows, ", ", r.cols,
                        ") but the model's hyper-parameters need (", rows, ", ", cols, ")");
    return r;
  }

  /// The n (rows, cols) matrices of a stacked 3-D tensor (GGUF's (n, rows, cols) expert tensors), each a
  /// view of its whole rows.
  std::vector<WeightRef> stacked(const std::string& name, std::size_t n, std::size_t rows, std::size_t cols) {
    const auto* t = f_.find_tensor(name);
    if (!t) fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' not found");
    if (t->n_dims != 3 || t->extent(0) != n || t->extent(1) != rows || t->extent(2) != cols)
      fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' has shape ", t->shape().str(),
                        " but the model's hyper-parameters need (", n, ", ", rows, ", ", cols, ")");
    if (!visit_ggml_type(t->type, [](auto*) {}))
      fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' has type ", io::ggml_type_name(t->type),
                        ", which kiln cannot multiply by");
    std::vector<WeightRef> out(n);
    const std::size_t rb = std::size_t(t->row_bytes());
    for (std::size_t e = 0; e < n; ++e)
      out[e] = {t->data.data() + e * rows * rb, t->type, rows, cols, rb, name + "[" + std::to_string(e) + "]"};
    return out;
  }

  /// The n vectors of len values of a 2-D (n, len) tensor (GGUF's stacked expert biases), as f32.
  std::vector<VecRef> stacked_vectors(const std::string& name, std::size_t n, std::size_t len) {
    const auto* t = f_.find_tensor(name);
    if (t && (t->n_dims != 2 || t->extent(0) != n || t->extent(1) != len))
      fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' has shape ", t->shape().str(),
                        " but the model's hyper-parameters need (", n, ", ", len, ")");
    if (!t) fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' not found");
    const float* all = reinterpret_cast<const float*>(t->data.data());
    if (t->type != io::GGMLType::F32 || reinterpret_cast<std::uintptr_t>(all) % alignof(float) != 0) {
      Buffer<float> buf(n * len);
      dequantize_row(t->type, t->data.data(), buf.data(), n * len);
      all = buf.data();
      w_.owned.push_back(std::move(buf));
    }
    std::vector<VecRef> out(n);
    for (std::size_t e = 0; e < n; ++e) out[e] = {all + e * len, len};
    return out;
  }

  VecRef vector(const std::string& name, std::size_t n, bool required = true) {
    const auto* t = f_.find_tensor(name);
    if (!t) {
      if (required) fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' not found");
      return {};
    }
    if (t->n_elements != n)
      fail<FormatError>("kiln: GGUF file '", f_.name(), "': weight '", name, "' has ", t->n_elements,
                        " elements but the model needs ", n);
    if (t->type == io::GGMLType::F32) return {t->view<float, 1>().data(), n};
    Buffer<float> buf(n);
    dequantize_row(t->type, t->data.data(), buf.data(), n);
    const float* p = buf.data();
    w_.owned.push_back(std::move(buf));
    return {p, n};
  }

 private:
  const io::GGUFFile& f_;
  ModelWeights& w_;
};

}  // namespace detail

namespace detail {
/// The name of a tensor: prefix, role (a TensorNames entry), suffix (".weight", ".bias" or none).
inline std::string tensor_name(const std::string& prefix, std::string_view role, std::string_view suffix = ".weight") {
  std::string s = prefix;
  s += role;
  s += suffix;
  return s;
}
/// Part `part` (0: q, 1: k, 2: v) of layer prefix p's attention input: wq/wk/wv (attn_q/k/v.weight), or with
/// a fused_qkv Config whose file has it, rows of wqkv (attn_qkv.weight; llama.cpp reads either).
template <class C>
WeightRef gguf_qkv(GGUFWeightReader& r, const io::GGUFFile& f, const std::string& p, int part, const HParams& hp) {
  const TensorNames& N = gguf_names<C>();
  const std::size_t q = hp.q_dim(), kv = hp.kv_dim(), rows = part == 0 ? q : kv;
  if (fused_qkv<C>() && f.find_tensor(tensor_name(p, N.wqkv)))
    return fused_qkv_part(r.matrix(tensor_name(p, N.wqkv), q + 2 * kv, hp.dim), part, hp);
  return r.matrix(tensor_name(p, part == 0 ? N.wq : part == 1 ? N.wk : N.wv), rows, hp.dim);
}
/// The MLP's gate (part 0) or up (part 1): w_gate/w_up (ffn_gate/ffn_up.weight), or with a fused_gate_up
/// Config (no ffn_gate; llama.cpp's fused SwiGLU) rows [0, ffn_dim) and [ffn_dim, 2 ffn_dim) of w_gate_up
/// (ffn_up.weight).
template <class C>
WeightRef gguf_gate_up(GGUFWeightReader& r, const std::string& p, int part, const HParams& hp) {
  const TensorNames& N = gguf_names<C>();
  if constexpr (fused_gate_up<C>())
    return fused_gate_up_part(r.matrix(tensor_name(p, N.w_gate_up), 2 * hp.ffn_dim, hp.dim), part, hp);
  return r.matrix(tensor_name(p, part == 0 ? N.w_gate : N.w_up), hp.ffn_dim, hp.dim);
}
}  // namespace detail

/// The weights of a Config architecture from a GGUF file, by the Config's gguf_names (llama.cpp's by default).
template <ArchConfig C>
ModelWeights load_gguf_weights(const io::GGUFFile& f, const HParams& hp) {
  ModelWeights w;
  detail::GGUFWeightReader r(f, w);
  const TensorNames& N = detail::gguf_names<C>();
  using detail::tensor_name;
  const std::string top;  // the model's tensors have no prefix
  const std::size_t d = hp.dim, q = hp.q_dim(), kv = hp.kv_dim(), ff = hp.ffn_dim;
  constexpr bool ln = C::norm_kind == NormKind::layer;
  w.tok_embd = r.matrix(tensor_name(top, N.tok_embd), hp.vocab, d);
  w.output_norm = r.vector(tensor_name(top, N.output_norm), d);
  if (ln) w.output_norm_b = r.vector(tensor_name(top, N.output_norm, ".bias"), d);
  w.output = r.matrix(tensor_name(top, N.output), hp.vocab, d, !C::tied_embeddings);
  if (!w.output) w.output = w.tok_embd;
  if constexpr (detail::learned_positions<C>()) w.pos_embd = r.matrix(tensor_name(top, N.pos_embd), hp.ctx_train, d);
  w.layers.resize(hp.n_layers);
  for (std::size_t l = 0; l < hp.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    const auto weight = [&](std::string_view role) { return tensor_name(p, role); };
    const auto bias = [&](std::string_view role) { return tensor_name(p, role, ".bias"); };
    L.attn_norm = r.vector(weight(N.attn_norm), d);
    L.wq = detail::gguf_qkv<C>(r, f, p, 0, hp);
    L.wk = detail::gguf_qkv<C>(r, f, p, 1, hp);
    L.wv = detail::gguf_qkv<C>(r, f, p, 2, hp);
    L.wo = r.matrix(weight(N.wo), d, q);
    // A block hook uses the norms it wants: a parallel block (GPT-J, Phi-2) has no ffn_norm.
    L.ffn_norm = r.vector(weight(N.ffn_norm), d, /*required=*/!detail::has_block<C>());
    if constexpr (detail::attn_sinks<C>()) {
      const std::string sinks = tensor_name(p, N.attn_sinks, "");
      L.attn_sinks = r.vector(sinks, hp.n_heads);
      for (std::size_t h = 0; h < hp.n_heads; ++h)  // a NaN or inf sink has no meaning (kiln::attention refuses it)
        if (!std::isfinite(L.attn_sinks.data[h]))
          fail<FormatError>("kiln: GGUF file '", f.name(), "': weight '", sinks, "' holds ", L.attn_sinks.data[h],
                            " for head ", h, "; attention sinks must be finite");
    }
    if (hp.n_expert) {  // model/moe.hpp
      if (const std::string one = tensor_name(p, N.w_gate, ".0.weight"); f.find_tensor(one))
        fail<FormatError>("kiln: GGUF file '", f.name(), "': weight '", one,
                          "': experts stored one tensor each (an older Mixtral conversion) are "
                          "not supported; convert the model again (stacked ",
                          weight(N.exp_gate), ")");
      L.ffn_gate_inp = r.matrix(weight(N.router), hp.n_expert, d);
      L.exp_gate = r.stacked(weight(N.exp_gate), hp.n_expert, ff, d);
      L.exp_up = r.stacked(weight(N.exp_up), hp.n_expert, ff, d);
      L.exp_down = r.stacked(weight(N.exp_down), hp.n_expert, d, ff);
      L.exp_probs_b = r.vector(tensor_name(p, N.exp_probs_b, ""), hp.n_expert, /*required=*/false);
      if constexpr (detail::expert_bias<C>()) {
        L.ffn_gate_inp_b = r.vector(bias(N.router), hp.n_expert);
        L.exp_gate_b = r.stacked_vectors(bias(N.exp_gate), hp.n_expert, ff);
        L.exp_up_b = r.stacked_vectors(bias(N.exp_up), hp.n_expert, ff);
        L.exp_down_b = r.stacked_vectors(bias(N.exp_down), hp.n_expert, d);
      }
      if (const std::size_t sf = hp.shexp_ffn_dim) {
        L.shexp_gate_inp = r.matrix(weight(N.shexp_gate_inp), 1, d);
        L.shexp_gate = r.matrix(weight(N.shexp_gate), sf, d);
        L.shexp_up = r.matrix(weight(N.shexp_up), sf, d);
        L.shexp_down = r.matrix(weight(N.shexp_down), d, sf);
      }
    } else if constexpr (!detail::gated_mlp<C>()) {
      L.w_up = r.matrix(weight(N.w_up), ff, d);
      L.w_down = r.matrix(weight(N.w_down), d, ff);
    } else {
      L.w_gate = detail::gguf_gate_up<C>(r, p, 0, hp);
      L.w_up = detail::gguf_gate_up<C>(r, p, 1, hp);
      L.w_down = r.matrix(weight(N.w_down), d, ff);
    }
    if constexpr (ln) {
      L.attn_norm_b = r.vector(bias(N.attn_norm), d);
      L.ffn_norm_b = r.vector(bias(N.ffn_norm), d, /*required=*/!detail::has_block<C>());
    }
    if constexpr (C::qkv_bias) {
      if (detail::fused_qkv<C>() && f.find_tensor(bias(N.wqkv))) {  // the fused bias's parts (GPT-2)
        const VecRef b = r.vector(bias(N.wqkv), q + 2 * kv);
        L.bq = {b.data, q};
        L.bk = {b.data + q, kv};
        L.bv = {b.data + q + kv, kv};
      } else {
        L.bq = r.vector(bias(N.wq), q);
        L.bk = r.vector(bias(N.wk), kv);
        L.bv = r.vector(bias(N.wv), kv);
      }
    }
    if constexpr (C::o_bias) L.bo = r.vector(bias(N.wo), d);
    if constexpr (C::mlp_bias) {
      if constexpr (detail::gated_mlp<C>()) L.b_gate = r.vector(bias(N.w_gate), ff);
      L.b_up = r.vector(bias(N.w_up), ff);
      L.b_down = r.vector(bias(N.w_down), d);
    }
    if constexpr (C::qk_norm) {
      constexpr bool whole = detail::qk_norm_whole<C>();
      L.q_norm = r.vector(weight(N.q_norm), whole ? q : hp.head_dim);
      L.k_norm = r.vector(weight(N.k_norm), whole ? kv : hp.head_dim);
    }
    if constexpr (C::post_attn_norm) L.post_attn_norm = r.vector(weight(N.post_attn_norm), d);
    if constexpr (C::post_ffw_norm) L.post_ffw_norm = r.vector(weight(N.post_ffw_norm), d);
  }
  return w;
}

/// Hyper-parameters of a Config architecture from GGUF metadata ({arch}.* keys, llama.cpp's names).
template <ArchConfig C>
HParams read_gguf_hparams(const io::GGUFFile& f) {
  HParams hp;
  hp.arch = std::string(C::name);
  const std::string a = hp.arch + ".";
  auto u = [&](const std::string& key) { return std::size_t(f.get<uint64_t>(a + key)); };
  auto u_or = [&](const std::string& key, std::size_t dflt) { return std::size_t(f.get_or<uint64_t>(a + key, dflt)); };
  auto f32_or = [&](const std::string& key, float dflt) {
    const auto v = f.find<double>(a + key);
    return v ? float(*v) : dflt;
  };
  hp.dim = u("embedding_length");
  hp.n_layers = u("block_count");
  hp.n_heads = u("attention.head_count");
  hp.n_kv_heads = u_or("attention.head_count_kv", hp.n_heads);
  hp.head_dim = u_or("attention.key_length", hp.n_heads ? hp.dim / hp.n_heads : 0);
  hp.ffn_dim = u("feed_forward_length");
  hp.ctx_train = u_or("context_length", 2048);
  // Mixture of experts: expert_count > 0 (Mixtral is general.architecture "llama" with experts). Each
  // expert's hidden size is expert_feed_forward_length where the file has it (Qwen3-MoE), else
  // feed_forward_length (Mixtral). llama.cpp renormalises the chosen experts' weights of Mixtral and
  // Qwen3-MoE whatever the file says; kiln follows a file's expert_weights_norm where it has one, else
  // renormalises unless C::adjust_hparams says otherwise (Qwen2-MoE, OLMoE: never, as llama.cpp). A shared
  // expert: the file's ffn_up_shexp tensors, of hidden size expert_shared_feed_forward_length, else
  // feed_forward_length (llama.cpp's default).
  hp.n_expert = u_or("expert_count", 0);
  if (hp.n_expert) {
    hp.n_expert_used = u("expert_used_count");
    if (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "expert_used_count = ", hp.n_expert_used,
                        " must be within 1 and ", a, "expert_count = ", hp.n_expert);
    if (f.find_tensor(detail::tensor_name("blk.0.", detail::gguf_names<C>().shexp_up)))
      hp.shexp_ffn_dim = u_or("expert_shared_feed_forward_length", hp.ffn_dim);
    hp.ffn_dim = u_or("expert_feed_forward_length", hp.ffn_dim);
    hp.expert_weights_norm = f.get_or<bool>(a + "expert_weights_norm", true);
    if (const auto g = f.find<uint64_t>(a + "expert_gating_func"); g && *g != 1 && *g != 2)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "expert_gating_func = ", *g,
                        " is not supported (supported: 1, softmax; 2, sigmoid)");
    else if (g && *g == 2) hp.expert_gating = ExpertGating::sigmoid;
    // llama.cpp reads expert_group_count for every architecture and then chooses experts within the best
    // groups (DeepSeek-V3's n_group, topk_group): kiln does not, so such a file is refused, not run otherwise.
    if (const auto groups = u_or("expert_group_count", 0); groups > 1)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "expert_group_count = ", groups,
                        " (experts chosen within groups) is not supported");
  }
  // Each layer has several tensors: a block_count beyond the file's tensor count is corrupt (and would
  // otherwise size the layer table first, std::bad_alloc for 0xFFFFFFFF).
  if (hp.n_layers > f.tensors().size())
    fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "block_count = ", hp.n_layers, " but the file has only ",
                      f.tensors().size(), " tensors");
  if (hp.ctx_train > kMaxContextLength)
    fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "context_length = ", hp.ctx_train,
                      " exceeds kiln's limit of ", kMaxContextLength, " positions");
  hp.rope_dim = u_or("rope.dimension_count", hp.head_dim);
  hp.rope_theta = f32_or("rope.freq_base", 10000.0f);
  // RoPE scaling: none, linear or YaRN. Any other would give another model's positions: refused, not
  // ignored. Llama 3.x's "llama3" scaling has no key: llama.cpp's converter writes it as per-frequency
  // divisors, the tensor rope_freqs.weight (rope_dimension_count / 2 values), which llama.cpp divides each
  // angle by. YaRN as llama.cpp runs it (ext_factor 1): rope.scaling.factor, original_context_length
  // (default: the context length), yarn_beta_fast / yarn_beta_slow (32 / 1), and an attention factor of
  // 0.1 ln(factor) + 1 times rope.scaling.attn_factor; the keys with which DeepSeek and gpt-oss change that
  // factor are refused.
  const std::string scaling = f.get_or<std::string>(a + "rope.scaling.type", "none");
  if (scaling == "linear") {
    hp.rope_linear_factor = f32_or("rope.scaling.factor", 1.0f);
  } else if (scaling == "yarn") {
    for (const char* k : {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor"})
      if (f.contains(a + k))
        fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, k,
                          " (a YaRN attention factor of its own) is not supported");
    const float factor = f32_or("rope.scaling.factor", 1.0f);
    const std::size_t orig = u_or("rope.scaling.original_context_length", hp.ctx_train);
    if (!(factor >= 1) || !std::isfinite(factor) || orig == 0)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': YaRN factor ", factor, " (need >= 1) or original context ",
                        orig, " (need > 0) out of range");
    hp.rope_freq_factors = rope_yarn_factors(hp.rope_theta, hp.rope_dim,
                                             {.factor = factor,
                                              .original_ctx = double(orig),
                                              .beta_fast = f32_or("rope.scaling.yarn_beta_fast", 32.0f),
                                              .beta_slow = f32_or("rope.scaling.yarn_beta_slow", 1.0f)});
    hp.rope_mscale = (factor > 1 ? 0.1f * std::log(factor) + 1.0f : 1.0f) * f32_or("rope.scaling.attn_factor", 1.0f);
  } else if (scaling != "none") {
    fail<FormatError>("kiln: GGUF file '", f.name(), "': ", a, "rope.scaling.type = '", scaling,
                      "' is not supported (supported: none, linear, yarn)");
  }
  // Per-frequency divisors in a tensor of rope_dimension_count / 2 values (F32, or any type kiln dequantizes).
  const auto read_factors = [&](const char* name, const io::GGUFTensor& t, std::vector<float>& out) {
    if (t.n_elements != hp.rope_dim / 2)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': tensor '", name, "' has ", t.n_elements,
                        " RoPE frequency factors for a rotary dimension of ", hp.rope_dim, " (need ", hp.rope_dim / 2,
                        ")");
    out.resize(hp.rope_dim / 2);
    if (t.type == io::GGMLType::F32) std::copy_n(t.view<float, 1>().data(), hp.rope_dim / 2, out.begin());
    else dequantize_row(t.type, t.data.data(), out.data(), out.size());
    for (const float v : out)
      if (!(v > 0) || !std::isfinite(v))
        fail<FormatError>("kiln: GGUF file '", f.name(), "': tensor '", name, "' holds the RoPE frequency factor ", v,
                          "; each must be positive and finite");
  };
  if (const auto* t = f.find_tensor("rope_freqs.weight")) {
    if (!hp.rope_freq_factors.empty())
      fail<FormatError>("kiln: GGUF file '", f.name(),
                        "': tensor 'rope_freqs.weight' with YaRN scaling is not supported");
    read_factors("rope_freqs.weight", *t, hp.rope_freq_factors);
  }
  // LongRoPE (Phi-3 / Phi-3.5 128k, Phi-4-mini): llama.cpp's converter writes long_factor and short_factor
  // as these two tensors, original_max_position_embeddings as rope.scaling.original_context_length and the
  // attention factor as rope.scaling.attn_factor; llama.cpp uses the long set when the context is longer
  // than the original one (llama_model::get_rope_factors), as kiln does (RopeTableOptions).
  const auto* t_long = f.find_tensor("rope_factors_long.weight");
  const auto* t_short = f.find_tensor("rope_factors_short.weight");
  if (t_long || t_short) {
    if (!t_long || !t_short)
      fail<FormatError>("kiln: GGUF file '", f.name(), "': tensor '",
                        t_long ? "rope_factors_long.weight" : "rope_factors_short.weight", "' without '",
                        t_long ? "rope_factors_short.weight" : "rope_factors_long.weight", "' (LongRoPE needs both)");
    if (scaling != "none" || !hp.rope_freq_factors.empty())
      fail<FormatError>("kiln: GGUF file '", f.name(), "': LongRoPE tensors with other RoPE scaling (", a,
                        "rope.scaling.type = '", scaling, "'",
                        hp.rope_freq_factors.empty() ? "" : ", rope_freqs.weight", ") are not supported");
    read_factors("rope_factors_short.weight", *t_short, hp.rope_freq_factors);
    read_factors("rope_factors_long.weight", *t_long, hp.rope_long_factors);
    hp.rope_orig_ctx = u_or("rope.scaling.original_context_length", hp.ctx_train);
  }
  // llama.cpp multiplies cos and sin by rope.scaling.attn_factor whatever the scaling (YaRN's above).
  if (scaling != "yarn") hp.rope_mscale = f32_or("rope.scaling.attn_factor", 1.0f);
  hp.norm_eps = C::norm_kind == NormKind::rms ? f32_or("attention.layer_norm_rms_epsilon", 1e-5f)
                                              : f32_or("attention.layer_norm_epsilon", 1e-5f);
  hp.attn_scale = hp.head_dim ? 1.0f / std::sqrt(float(hp.head_dim)) : 0.0f;
  if constexpr (C::attn_softcap) hp.attn_softcap = f32_or("attn_logit_softcapping", 0.0f);
  if constexpr (C::final_softcap) hp.final_softcap = f32_or("final_logit_softcapping", 0.0f);
  if constexpr (C::sliding_window_pattern > 0) hp.sliding_window = u_or("attention.sliding_window", 0);
  const std::string emb_name = detail::tensor_name("", detail::gguf_names<C>().tok_embd);
  const auto* emb = f.find_tensor(emb_name);
  if (!emb) fail<FormatError>("kiln: GGUF file '", f.name(), "': weight '", emb_name, "' not found");
  hp.vocab = std::size_t(emb->rows());
  if (hp.n_heads && hp.n_kv_heads && hp.n_heads % hp.n_kv_heads != 0)
    fail<FormatError>("kiln: GGUF file '", f.name(), "': head_count ", hp.n_heads,
                      " is not a multiple of head_count_kv ", hp.n_kv_heads);
  if constexpr (requires(HParams & h) { C::adjust_hparams(h, f); }) C::adjust_hparams(hp, f);
  hp.validate(f.name());
  return hp;
}

}  // namespace kiln
