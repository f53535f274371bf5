// kiln/model/transformer.hpp - Transformer<Config>: the forward pass of a decoder-only model whose shape
// is given by compile-time traits (model/config.hpp) and whose sizes come from the file (HParams).
//
// forward(state, tokens, pos0, logits) runs n tokens at positions [pos0, pos0 + n): the prompt as one
// batch (every weight product an (n, K) x (K, N) GEMM), a decode step with n = 1 (GEMV). Activations
// come from the state's Arena (sized once for the largest batch), keys and values go to its KVCache,
// and nothing is allocated on the heap (tests/model/test_alloc.cpp counts). Attention of a prompt, per
// query head h and chunk of up to kQChunk query rows (tasks spread over the thread pool), is the tiled
// kernel of ops/attention.hpp: out_h = softmax(q_h K_g^T * scale, causal) V_g with g = h / (n_heads /
// n_kv_heads), never holding a (rows, kv_len) score matrix. A decode step (one row per sequence) computes
// S = q K_g^T for the group of query heads of g, softmax, then S V_g (matmul's GEMV).
// RoPE is kiln::rope over cos/sin tables computed once per context (ForwardState::rope), and a second
// table for sliding-window layers whose base differs (HParams::rope_theta_swa, Gemma 3).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/model/block.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/kv_cache.hpp"
#include "kiln/model/moe.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/ops/activation.hpp"
#include "kiln/ops/attention.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/norm.hpp"
#include "kiln/ops/rope.hpp"
#include "kiln/ops/softmax.hpp"
#include "kiln/text/chat.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln {

/// What one sequence's forward passes work in: sized once per context, reused for every call.
struct ForwardState {
  std::size_t ctx = 0, max_batch = 0;
  Precision precision = Precision::fast;  // how quantized weights are multiplied (model/weights.hpp)
  KVCache kv;
  Arena arena;
  RopeTable rope;      // positions [0, ctx), the file's scaling
  RopeTable rope_swa;  // the sliding-window layers' table; empty: they use rope
  std::unique_ptr<ThreadPool> pool;
  /// Not null: every MoE layer of every pass appends each token's chosen experts (model/moe.hpp), for
  /// tests and tools (appending may allocate).
  std::vector<int32_t>* expert_trace = nullptr;
};

namespace detail {

/// Counts the bytes a sequence of Arena::alloc calls would take (for sizing the arena up front).
struct ArenaCounter {
  std::size_t bytes = 0;
  template <class T, class... I>
  DenseTensor<T, sizeof...(I)> alloc(I... dims) {
    bytes += Arena::bytes_for<T>(checked_product(dims...));
    return make_tensor(static_cast<T*>(nullptr), dims...);
  }
};

/// A (rows, cols) view of rows `stride` elements apart.
template <class T>
StridedTensor<T, 2> rows_view(T* p, std::size_t rows, std::size_t cols, std::size_t stride) {
  return make_strided<T, 2>(p, {rows, cols}, {std::ptrdiff_t(stride), std::ptrdiff_t(1)});
}

/// The interface kiln::Model hides a Transformer<Config> behind.
class ModelImpl {
 public:
  ModelImpl(HParams hp, ModelWeights w, Tokenizer tok, std::shared_ptr<const void> owner)
      : hp_(std::move(hp)), w_(std::move(w)), tok_(std::move(tok)), owner_(std::move(owner)) {}
  virtual ~ModelImpl() = default;
  ModelImpl(const ModelImpl&) = delete;
  ModelImpl& operator=(const ModelImpl&) = delete;

  const HParams& hparams() const { return hp_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const ModelWeights& weights() const { return w_; }

  /// The chat template the model file carries (read at load; see Model::chat_template()).
  const ChatTemplate& chat_template() const {
    if (!chat_)
      fail<FormatError>(chat_error_.empty() ? std::string("kiln::Model: the model has no chat template") : chat_error_);
    return *chat_;
  }
  /// Set by the loaders: the template, or why there is none (the error chat_template() throws).
  void set_chat_template(std::optional<ChatTemplate> t, std::string why_not = {}) {
    chat_ = std::move(t);
    chat_error_ = std::move(why_not);
  }

  /// Runs tokens (at most state.max_batch) of one sequence at positions [pos0, pos0 + n), keys and values
  /// into `kv` (st.kv by default); writes the last token's logits (hparams().vocab floats) when logits is
  /// not null.
  virtual void forward(ForwardState& st, KVCache& kv, std::span<const int32_t> tokens, std::size_t pos0,
                       float* logits) const = 0;
  void forward(ForwardState& st, std::span<const int32_t> tokens, std::size_t pos0, float* logits) const {
    forward(st, st.kv, tokens, pos0, logits);
  }
  /// Tokens of several sequences in one pass (every weight matrix read once for all): token t at position
  /// pos[t] of the sequence whose cache is *kv[t] (caches of st.ctx positions). Rows that share a cache
  /// must have strictly increasing positions (a prompt chunk: pos, pos + 1, ...); every row's keys and
  /// values are stored before any attention, so each row attends to its own cache up to its own position.
  /// Writes logits (m, vocab): row i for token logit_rows[i] (strictly increasing), or for every token
  /// when logit_rows is empty (m = n). n <= st.max_batch.
  virtual void forward_multi(ForwardState& st, std::span<KVCache* const> kv, std::span<const int32_t> tokens,
                             std::span<const std::size_t> pos, float* logits,
                             std::span<const std::size_t> logit_rows) const = 0;
  void forward_multi(ForwardState& st, std::span<KVCache* const> kv, std::span<const int32_t> tokens,
                     std::span<const std::size_t> pos, float* logits) const {
    forward_multi(st, kv, tokens, pos, logits, {});
  }
  /// Arena bytes one forward of `batch` tokens needs with this context and thread count.
  virtual std::size_t arena_bytes(std::size_t batch, std::size_t ctx, std::size_t threads) const = 0;

  /// A fresh state: KV cache (of kv_type: f32 or f16), arena, RoPE tables and a thread pool.
  std::unique_ptr<ForwardState> make_state(std::size_t ctx, std::size_t max_batch, std::size_t threads,
                                           KVType kv_type = KVType::f32, KVPages kv_pages = KVPages::upfront) const {
    auto st = std::make_unique<ForwardState>();
    st->ctx = ctx;
    st->max_batch = max_batch;
    st->pool = std::make_unique<ThreadPool>(threads);
    st->kv = KVCache(hp_.n_layers, hp_.n_kv_heads, hp_.head_dim, ctx, kv_type, kv_pages);
    st->arena = Arena(arena_bytes(max_batch, ctx, st->pool->size()));
    // HF's float32 inverse frequencies, divided in float32 by the file's per-frequency factors (as
    // llama.cpp divides its angles), angle and cos/sin in double rounded once, times YaRN's attention
    // factor (HF: cos() * attention_scaling); LongRoPE's long set when ctx > rope_orig_ctx: RopeTable
    // (ops/rope.hpp).
    st->rope = RopeTable(ctx, hp_.rope_theta, hp_.rope_dim,
                         {.linear_factor = hp_.rope_linear_factor,
                          .freq_factors = hp_.rope_freq_factors,
                          .attention_factor = hp_.rope_mscale,
                          .long_freq_factors = hp_.rope_long_factors,
                          .original_ctx = hp_.rope_orig_ctx});
    const bool scaled = hp_.rope_linear_factor != 1.0f || !hp_.rope_freq_factors.empty() || hp_.rope_mscale != 1.0f;
    if (hp_.rope_theta_swa > 0 && (hp_.rope_theta_swa != hp_.rope_theta || scaled))
      st->rope_swa = RopeTable(ctx, hp_.rope_theta_swa, hp_.rope_dim);
    return st;
  }

 protected:
  HParams hp_;
  ModelWeights w_;
  Tokenizer tok_;
  std::shared_ptr<const void> owner_;  // keeps the mapped file alive
  std::optional<ChatTemplate> chat_;
  std::string chat_error_;
};

}  // namespace detail

template <ArchConfig C>
class Transformer final : public detail::ModelImpl {
  static_assert(C::norm_kind == NormKind::rms || C::norm_weight == NormWeight::plain,
                "kiln::Transformer: LayerNorm with a (1 + w) weight is not supported");

 public:
  using Config = C;
  static constexpr std::size_t kQChunk = detail::kAttnRows;  // query rows per attention task
  static constexpr std::size_t kDecodeSplit = 1024;          // cached positions per decode task

  Transformer(HParams hp, ModelWeights w, Tokenizer tok, std::shared_ptr<const void> owner = {})
      : ModelImpl(std::move(hp), std::move(w), std::move(tok), std::move(owner)) {
    if (w_.layers.size() != hp_.n_layers)
      fail("kiln::Transformer: ", w_.layers.size(), " layers of weights for n_layers ", hp_.n_layers);
  }

  std::size_t arena_bytes(std::size_t batch, std::size_t ctx, std::size_t threads) const override {
    detail::ArenaCounter c;
    plan(c, batch, ctx, threads);
    return c.bytes;
  }

  using ModelImpl::forward;

  void forward(ForwardState& st, KVCache& kv, std::span<const int32_t> tokens, std::size_t pos0,
               float* logits) const override {
    const std::size_t n = tokens.size();
    if (n == 0) return;
    if (n > st.max_batch) fail("kiln::Transformer::forward: ", n, " tokens exceed the batch size ", st.max_batch);
    if (pos0 + n > st.ctx || kv.ctx() != st.ctx)
      fail("kiln::Transformer::forward: positions [", pos0, ", ", pos0 + n, ") exceed the context of ", st.ctx,
           " (KV cache of ", kv.ctx(), ")");
    run(st, Rows{.kv0 = &kv, .pos0 = pos0, .kvs = {}, .pos = {}, .logit_rows = {}}, tokens, logits);
  }

  using ModelImpl::forward_multi;

  void forward_multi(ForwardState& st, std::span<KVCache* const> kv, std::span<const int32_t> tokens,
                     std::span<const std::size_t> pos, float* logits,
                     std::span<const std::size_t> logit_rows) const override {
    const std::size_t n = tokens.size();
    if (kv.size() != n || pos.size() != n)
      fail("kiln::Transformer::forward_multi: ", n, " tokens, ", kv.size(), " caches and ", pos.size(),
           " positions: need one of each per sequence");
    if (n == 0) return;
    if (n > st.max_batch)
      fail("kiln::Transformer::forward_multi: ", n, " sequences exceed the batch size ", st.max_batch);
    for (std::size_t t = 0; t < n; ++t) {
      if (!kv[t] || kv[t]->ctx() != st.ctx || pos[t] >= st.ctx)
        fail("kiln::Transformer::forward_multi: sequence ", t, ": position ", pos[t], " outside a context of ", st.ctx,
             " (or a missing cache or one of another size)");
      for (std::size_t u = 0; u < t; ++u)
        if (kv[u] == kv[t] && pos[u] >= pos[t])
          fail("kiln::Transformer::forward_multi: rows ", u, " and ", t, " share a KV cache at positions ", pos[u],
               " and ", pos[t], ": rows of one cache need strictly increasing positions");
    }
    for (std::size_t i = 0; i < logit_rows.size(); ++i)
      if (logit_rows[i] >= n || (i > 0 && logit_rows[i] <= logit_rows[i - 1]))
        fail("kiln::Transformer::forward_multi: logit row ", logit_rows[i], " (entry ", i,
             "): need strictly increasing rows below ", n);
    run(st, Rows{.kv0 = nullptr, .pos0 = 0, .kvs = kv, .pos = pos, .logit_rows = logit_rows}, tokens, logits);
  }

 private:
  // Where the n rows of a pass belong: one sequence at positions pos0, pos0 + 1, ... (kv0), or one token of
  // each of n sequences (kvs[t], pos[t]: forward_multi).
  struct Rows {
    KVCache* kv0 = nullptr;
    std::size_t pos0 = 0;
    std::span<KVCache* const> kvs;
    std::span<const std::size_t> pos;
    std::span<const std::size_t> logit_rows;  // multi: the rows whose logits are wanted; empty: all
    bool multi() const { return !kvs.empty(); }
    KVCache& kv(std::size_t t) const { return multi() ? *kvs[t] : *kv0; }
    std::size_t pos_of(std::size_t t) const { return multi() ? pos[t] : pos0 + t; }
  };

  void run(ForwardState& st, const Rows& rows, std::span<const int32_t> tokens, float* logits) const {
    const std::size_t n = tokens.size();
    if constexpr (detail::learned_positions<C>())
      for (std::size_t t = 0; t < n; ++t)
        if (rows.pos_of(t) >= w_.pos_embd.rows)
          fail("kiln::Transformer: position ", rows.pos_of(t), " is beyond the ", w_.pos_embd.rows,
               " positions of the model's learned position table '", w_.pos_embd.name,
               "' (create the Session with a smaller .ctx)");
    ThreadPool* pool = st.pool.get();
    const ThreadPool::KeepAwake awake(*pool);  // the pass's back-to-back jobs find the workers spinning
    st.arena.reset();
    const Acts a = plan(st.arena, n, st.ctx, pool->size());
    for (std::size_t t = 0; t < n; ++t) a.pos(t) = int32_t(rows.pos_of(t));
    embed_rows(w_.tok_embd, tokens, a.x, pool);
    if constexpr (C::embed_scale != EmbedScale::none) {
      const float s = hp_.embed_scale > 0                      ? hp_.embed_scale
                      : C::embed_scale == EmbedScale::sqrt_dim ? std::sqrt(float(hp_.dim))
                                                               : 1.0f;
      for (std::size_t i = 0; i < a.x.size(); ++i) a.x.data()[i] *= s;
    }
    if constexpr (detail::learned_positions<C>()) {  // x += position_embd[pos] (row by row into h, free here)
      for (std::size_t t = 0; t < n; ++t) {
        const auto p = int32_t(rows.pos_of(t));
        embed_rows(w_.pos_embd, std::span<const int32_t>(&p, 1), slice<0>(a.h, t, t + 1), nullptr);
      }
      add(a.x, a.h, a.x, pool);
    }
    for (std::size_t l = 0; l < hp_.n_layers; ++l) layer(st, a, l, rows, n);
    if (!logits) return;
    // One sequence: the last token's logits only. Several: every row's, or the listed rows' (gathered into
    // a.o, free after the last layer, so the classifier, the largest product, runs on those rows only).
    const bool pick = rows.multi() && !rows.logit_rows.empty();
    const std::size_t r0 = rows.multi() ? 0 : n - 1, nl = pick ? rows.logit_rows.size() : n - r0;
    if (pick)
      for (std::size_t i = 0; i < nl; ++i) std::copy_n(&a.x(rows.logit_rows[i], 0), hp_.dim, &a.o(i, 0));
    const auto xl = pick ? slice<0>(a.o, 0, nl) : slice<0>(a.x, r0, n), hl = slice<0>(a.h, 0, nl);
    norm(xl, w_.output_norm, w_.output_norm_b, hl, pool);
    linear(hl, w_.output, make_tensor(logits, nl, hp_.vocab), pool, st.precision);
    if (const float div = hp_.logit_scale; div != 1.0f)
      for (std::size_t i = 0; i < nl * hp_.vocab; ++i) logits[i] /= div;
    if constexpr (C::final_softcap) {
      if (const float cap = hp_.final_softcap; cap > 0)
        for (std::size_t i = 0; i < nl * hp_.vocab; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
    }
  }

  struct Acts {
    DenseTensor<float, 2> x, h, q, k, v, att, o, gate, up;  // (n, dim / q_dim / kv_dim / ffn_dim)
    DenseTensor<float, 2> scores;                           // (threads, score_floats()): attention scratch
    DenseTensor<float, 2> split;                            // decode parts' p V, m, l (see decode_parts)
    DenseTensor<int32_t, 1> pos;                            // (n): each row's position
    MoEScratch moe;                                         // empty views for a dense model
    // (no default constructor: views with run-time extents are built directly, see plan())
  };

  template <class A>
  Acts plan(A& arena, std::size_t n, std::size_t ctx, std::size_t threads) const {
    // q, k, v and att live only in a layer's attention and gate, up only in its MLP, so both sets share one
    // block (an (n, ffn_dim) pair is most of a pass's activations). Each view starts 64-byte aligned.
    auto floats = [&](std::size_t cols) {
      return Arena::bytes_for<float>(detail::checked_product(n, cols)) / sizeof(float);
    };
    const std::size_t qd = hp_.q_dim(), kvd = hp_.kv_dim(), fd = hp_.ffn_dim;
    const std::size_t attn = 2 * floats(qd) + 2 * floats(kvd), mlp = 2 * floats(fd);
    // x, h, o, the shared block, then the rest in order (braced initialisers run in order).
    const auto x = arena.template alloc<float>(n, hp_.dim), h = arena.template alloc<float>(n, hp_.dim),
               o = arena.template alloc<float>(n, hp_.dim);
    float* const shared = arena.template alloc<float>(std::max(attn, mlp)).data();  // null when counting
    auto view = [&](std::size_t off, std::size_t cols) { return make_tensor(shared ? shared + off : shared, n, cols); };
    return Acts{.x = x,
                .h = h,
                .q = view(0, qd),
                .k = view(floats(qd), kvd),
                .v = view(floats(qd) + floats(kvd), kvd),
                .att = view(floats(qd) + 2 * floats(kvd), qd),
                .o = o,
                .gate = view(0, fd),
                .up = view(floats(fd), fd),
                .scores = arena.template alloc<float>(threads, score_floats()),
                .split = arena.template alloc<float>(n * hp_.n_heads * decode_parts(ctx), hp_.head_dim + 2),
                .pos = arena.template alloc<int32_t>(n),
                .moe = moe_scratch(arena, n, hp_)};
  }

  // Attention scratch of one task: a decode part's scores (the n_heads / n_kv_heads query heads that share
  // a KV head, kDecodeSplit apart), or the tiled kernel's working set (a prompt chunk).
  std::size_t score_floats() const {
    return std::max(hp_.n_heads / hp_.n_kv_heads * kDecodeSplit, attention_scratch_floats(hp_.head_dim));
  }
  // A decode step splits the cached positions at multiples of kDecodeSplit, a task per part (split-K); Acts::split
  // holds, per (row, query head, part), (exp(y - m)) V, m and l: (n * n_heads * decode_parts(ctx), head_dim + 2).
  std::size_t decode_parts(std::size_t ctx) const { return (ctx + kDecodeSplit - 1) / kDecodeSplit; }

  template <class X, class O>
  void norm(const X& x, const VecRef& w, const VecRef& b, const O& out, ThreadPool* pool) const {
    if constexpr (C::norm_kind == NormKind::rms) rms_norm(x, w.view(), out, hp_.norm_eps, C::norm_weight, pool);
    else layer_norm(x, w.view(), b.view(), out, hp_.norm_eps, pool);
  }

  // Layer l of a pass: the Config's block hook, or default_block<C>, over this pass's pieces.
  void layer(ForwardState& st, const Acts& a, std::size_t l, const Rows& rows, std::size_t n) const {
    const Pieces pieces(*this, st, a, l, rows, n);
    const BlockArgs b(BlockViews{.x = a.x,
                                 .h = a.h,
                                 .o = a.o,
                                 .q = a.q,
                                 .k = a.k,
                                 .v = a.v,
                                 .att = a.att,
                                 .w = w_.layers[l],
                                 .hp = hp_,
                                 .layer = l,
                                 .pool = st.pool.get(),
                                 .precision = st.precision},
                      pieces);
    if constexpr (detail::has_block<C>()) C::block(b);
    else default_block<C>(b);
  }

  // BlockArgs' pieces for layer l of one pass.
  struct Pieces final : detail::BlockPieces {
    const Transformer& m;
    ForwardState& st;
    const Acts& a;
    std::size_t l;
    const Rows& rows;
    std::size_t n;
    Pieces(const Transformer& m_, ForwardState& st_, const Acts& a_, std::size_t l_, const Rows& rows_, std::size_t n_)
        : m(m_), st(st_), a(a_), l(l_), rows(rows_), n(n_) {}

    void norm(DenseTensor<float, 2> in, const VecRef& w, const VecRef& b, DenseTensor<float, 2> out) const override {
      m.norm(in, w, b, out, st.pool.get());
    }
    void qkv(DenseTensor<float, 2> h) const override {
      const LayerWeights& L = m.w_.layers[l];
      const HParams& hp = m.hp_;
      ThreadPool* pool = st.pool.get();
      linear_multi(h, {&L.wq, &L.wk, &L.wv}, {a.q, a.k, a.v}, pool, st.precision);  // h quantized once
      if constexpr (C::qkv_bias) {
        add_bias(a.q, L.bq);
        add_bias(a.k, L.bk);
        add_bias(a.v, L.bv);
      }
      if constexpr (C::qk_norm && detail::qk_norm_whole<C>()) {  // each token's whole q and k (OLMoE)
        rms_norm(a.q, L.q_norm.view(), a.q, hp.norm_eps, C::norm_weight, pool);
        rms_norm(a.k, L.k_norm.view(), a.k, hp.norm_eps, C::norm_weight, pool);
      } else if constexpr (C::qk_norm) {  // per head: view (n * heads, head_dim)
        const auto q2 = reshape(a.q, n * hp.n_heads, hp.head_dim), k2 = reshape(a.k, n * hp.n_kv_heads, hp.head_dim);
        rms_norm(q2, L.q_norm.view(), q2, hp.norm_eps, C::norm_weight, pool);
        rms_norm(k2, L.k_norm.view(), k2, hp.norm_eps, C::norm_weight, pool);
      }
    }
    void rope() const override {
      // The file's pairing (HParams::rope_style, else the Config's), the layer's table.
      const HParams& hp = m.hp_;
      const RopeTable& table = !st.rope_swa.empty() && m.is_sliding(l) ? st.rope_swa : st.rope;
      const RopeStyle style = hp.rope_style.value_or(C::rope_style);
      const auto q3 = reshape(a.q, n, hp.n_heads, hp.head_dim), k3 = reshape(a.k, n, hp.n_kv_heads, hp.head_dim);
      kiln::rope(q3, as_const(a.pos), q3, table, style, st.pool.get());
      kiln::rope(k3, as_const(a.pos), k3, table, style, st.pool.get());
    }
    void attend() const override {
      const std::ptrdiff_t kvd = std::ptrdiff_t(m.hp_.kv_dim());
      if (!rows.multi()) rows.kv0->store(l, rows.pos0, n, a.k.data(), kvd, a.v.data(), kvd);
      else
        for (std::size_t t = 0; t < n; ++t)
          rows.kvs[t]->store(l, rows.pos[t], 1, a.k.data() + std::ptrdiff_t(t) * kvd, kvd,
                             a.v.data() + std::ptrdiff_t(t) * kvd, kvd);
      m.attention(st, a, l, rows, n);
    }
    void attention(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const override {
      const LayerWeights& L = m.w_.layers[l];
      qkv(h);
      if constexpr (detail::uses_rope<C>()) rope();
      attend();
      kiln::linear(a.att, L.wo, out, st.pool.get(), st.precision);
      if constexpr (C::o_bias) add_bias(out, L.bo);
    }
    void mlp(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const override {
      const LayerWeights& L = m.w_.layers[l];
      ThreadPool* pool = st.pool.get();
      if (m.hp_.n_expert > 0)
        moe_ffn(h, L, out, a.moe, a.gate, a.up, m.hp_, C::activation, pool, st.precision, st.expert_trace);
      else if constexpr (requires(const MlpArgs& args) { C::mlp(args); })
        C::mlp(MlpArgs{h, out, a.gate, a.up, L, m.hp_, pool, st.precision});
      else m.dense_mlp(st, a, L, h, out);
    }
  };

  // The dense MLP of h: out = (act(h Wg^T [+bg]) * (h Wu^T [+bu])) Wd^T [+bd], or without a gate (gated_mlp
  // false) a.o = act(h Wu^T [+bu]) Wd^T [+bd].
  void dense_mlp(ForwardState& st, const Acts& a, const LayerWeights& L, const DenseTensor<float, 2>& h,
                 const DenseTensor<float, 2>& out) const {
    ThreadPool* pool = st.pool.get();
    if constexpr (!detail::gated_mlp<C>()) {
      linear(h, L.w_up, a.up, pool, st.precision);
      if constexpr (C::mlp_bias) add_bias(a.up, L.b_up);
      if constexpr (C::activation == Activation::silu) silu(a.up, a.up, pool);
      else if constexpr (C::activation == Activation::gelu_tanh) gelu_tanh(a.up, a.up, pool);
      else gelu_erf(a.up, a.up, pool);
      linear(a.up, L.w_down, out, pool, st.precision);
      if constexpr (C::mlp_bias) add_bias(out, L.b_down);
      return;
    }
    linear_multi(h, {&L.w_gate, &L.w_up}, {a.gate, a.up}, pool, st.precision);
    if constexpr (C::mlp_bias) {
      add_bias(a.gate, L.b_gate);
      add_bias(a.up, L.b_up);
    }
    if constexpr (C::activation == Activation::silu) swiglu(a.gate, a.up, a.gate, pool);
    else if constexpr (C::activation == Activation::gelu_tanh) geglu(a.gate, a.up, a.gate, Gelu::tanh, pool);
    else geglu(a.gate, a.up, a.gate, Gelu::erf, pool);
    linear(a.gate, L.w_down, out, pool, st.precision);
    if constexpr (C::mlp_bias) add_bias(out, L.b_down);
  }

  bool is_sliding(std::size_t l) const {
    if (!hp_.sliding_layers.empty()) return hp_.sliding_window > 0 && hp_.sliding_layers[l];
    if constexpr (C::sliding_window_pattern > 0)
      return hp_.sliding_window > 0 && (l + 1) % C::sliding_window_pattern != 0;
    else return false;
  }

  // s (rows, n - p0) = q K[l, g, p0:n]^T and out (rows, head_dim) = s V[l, g, p0:n, :] (V through values_t(),
  // a column-major B), in the cache's element type (kiln::matmul widens f16 rows inside its SIMD kernels).
  // p0 > 0: a sliding window's start.
  // A q8_0 cache: its rows of Q8_0 blocks at any number of query heads. The scores: q rounded to fast's two 8-bit
  // parts per block (fast8: one) and integer dot products where the target has them (dispatch::matmul_q8_0_int),
  // else, and with exact, the f32 GEMV (the bits of the f32 GEMV over the dequantized rows); the values: with fast
  // and fast8 each row's weights p d_p rounded to int16 per block and 256 positions and integer dot products
  // where the target has them, else, and with exact, the f32 GEMV.
  template <class Q, class S>
  static void attn_scores(const Q& q, const KVCache& kv, std::size_t l, std::size_t g, std::size_t p0, std::size_t n,
                          const S& s, Precision precision) {
    if (kv.type() == KVType::q8_0) {
      const auto k = kv.keys<block_q8_0>(l, g, n);  // (n, head_dim / 32)
      const unsigned parts = precision == Precision::exact ? 0u : precision == Precision::fast8 ? 1u : 2u;
      dispatch::matmul_q8_0_int(q.data(), q.stride(0), k.data() + p0 * k.extent(1), std::ptrdiff_t(k.extent(1)),
                                s.data(), s.stride(0), q.extent(0), n - p0, kv.head_dim(), parts, 0);
    } else if (kv.type() == KVType::f16) {
      matmul(q, slice<0>(kv.keys<f16>(l, g, n), p0, n), s);
    } else {
      matmul(q, slice<0>(kv.keys<float>(l, g, n), p0, n), s);
    }
  }
  template <class S, class O>
  static void attn_values(const S& s, const KVCache& kv, std::size_t l, std::size_t g, std::size_t p0, std::size_t n,
                          const O& out, Precision precision) {
    if (kv.type() == KVType::q8_0) {
      const auto v = kv.values<block_q8_0>(l, g, n);  // (n, head_dim / 32): B^T of out = s V, row-major
      const unsigned parts = precision == Precision::exact ? 0u : precision == Precision::fast8 ? 1u : 2u;
      dispatch::matmul_q8_0_int(s.data(), s.stride(0), v.data() + p0 * v.extent(1), std::ptrdiff_t(v.extent(1)),
                                out.data(), out.stride(0), s.extent(0), kv.head_dim(), n - p0, parts,
                                detail::kMatmulColMajorB);
    } else if (kv.type() == KVType::f16) {
      matmul(s, slice<1>(kv.values_t<f16>(l, g, n), p0, n), out);
    } else {
      matmul(s, slice<1>(kv.values_t<float>(l, g, n), p0, n), out);
    }
  }

  // out (rows, head_dim) = attention of q over K and V of layer l, KV head g, positions [0, kv_len), with
  // the tiled kernel (ops/attention.hpp) in the cache's element type.
  template <class Q, class O>
  static void attend(const Q& q, const KVCache& kv, std::size_t l, std::size_t g, std::size_t kv_len, const O& out,
                     const AttentionOptions& opt) {
    if (kv.type() == KVType::q8_0)
      kiln::attention(q, kv.keys<block_q8_0>(l, g, kv_len), kv.values<block_q8_0>(l, g, kv_len), out, opt);
    else if (kv.type() == KVType::f16)
      kiln::attention(q, kv.keys<f16>(l, g, kv_len), kv.values<f16>(l, g, kv_len), out, opt);
    else kiln::attention(q, kv.keys<float>(l, g, kv_len), kv.values<float>(l, g, kv_len), out, opt);
  }

  void attention(ForwardState& st, const Acts& a, std::size_t l, const Rows& rows, std::size_t n) const {
    const std::size_t hd = hp_.head_dim, qd = hp_.q_dim(), heads = hp_.n_heads, ctx = st.ctx;
    const std::size_t group = heads / hp_.n_kv_heads;
    const bool sliding = is_sliding(l);
    const std::size_t window = hp_.sliding_window;
    // The pass's rows in runs [b, run_end(b)) of one sequence at consecutive positions: forward()'s rows are
    // one run; forward_multi's are a prompt chunk (a run) beside one-row decode steps of other sequences.
    // A run of several rows takes the tiled causal kernel in chunks of kQChunk rows (a row's result does not
    // depend on the chunk it is in: ops/attention.hpp), a single row the decode path below. fast / fast8 with
    // AMX-BF16 usable: q K^T and P V on bf16 tiles (AttentionOptions::amx_bf16), a task per KV head's group
    // of query heads (AttentionOptions::heads) and chunk of positions, attn_amx_rows(head_dim) rows in all:
    // the rows that share one splitting of K and V into tiles.
    const bool amx_attn = st.precision != Precision::exact && st.kv.type() == KVType::f16 && amx_bf16_active();
    const std::size_t hgroup = amx_attn ? group : 1;  // query heads per chunk task
    const std::size_t htasks = heads / hgroup;
    const std::size_t qchunk = amx_attn ? std::max<std::size_t>(1, detail::attn_amx_rows(hd) / group) : kQChunk;
    auto run_end = [&](std::size_t b) {
      if (!rows.multi()) return n;
      std::size_t e = b + 1;
      while (e < n && rows.kvs[e] == rows.kvs[b] && rows.pos[e] == rows.pos[e - 1] + 1) ++e;
      return e;
    };
    std::size_t singles = 0, chunk_tasks = 0;
    for (std::size_t b = 0, e; b < n; b = e) {
      e = run_end(b);
      if (e - b == 1) ++singles;
      else chunk_tasks += htasks * ((e - b + qchunk - 1) / qchunk);
    }
    // One token of a sequence (decoding; row t): a task per KV head and part of the positions (split-K at
    // fixed multiples of kDecodeSplit, so the bits do not depend on the thread count), the KV head's `group`
    // query heads as the rows of one product, so K and V are read once per KV head. Nothing to mask: every
    // cached position is in the past; a sliding window reads only its positions [lo, kv_len). A part gives
    // each head its scores' maximum m, sum l of exp(y - m) and (exp(y - m)) V; combine_row() merges the parts.
    // Fewer tasks than threads (one or two KV heads: Gemma 3) and groups of at most kGemvMaxRows query heads:
    // each group's heads in `parts` tasks, every one reading K and V; each row's products are the same
    // whatever rows share them (matmul's GEMV), so the output is too.
    const std::size_t kvh = hp_.n_kv_heads, threads = st.pool->size(), P = decode_parts(ctx);
    std::size_t kparts = 0;  // parts of the longest single row's positions
    for (std::size_t b = 0, e; b < n; b = e) {
      e = run_end(b);
      if (e - b == 1) kparts = std::max(kparts, rows.pos_of(b) / kDecodeSplit + 1);
    }
    const std::size_t parts = chunk_tasks == 0 && singles * kvh * kparts < threads && group <= detail::kGemvMaxRows
                                  ? std::min(group, (threads + singles * kvh * kparts - 1) / (singles * kvh * kparts))
                                  : 1;
    const std::ptrdiff_t slot = std::ptrdiff_t(hd + 2);  // a.split row: (p V)[hd], m, l
    auto decode_task = [&](std::size_t t, std::size_t g, std::size_t part, std::size_t kpart, std::size_t thread) {
      const KVCache& kv = rows.kv(t);
      const std::size_t kv_len = rows.pos_of(t) + 1, lo = sliding && kv_len > window ? kv_len - window : 0;
      const std::size_t p0 = std::max(lo, kpart * kDecodeSplit), p1 = std::min(kv_len, (kpart + 1) * kDecodeSplit);
      const auto [h0, h1] = split_range(group, parts, part);  // query heads g * group + [h0, h1)
      const std::size_t off = t * qd + (g * group + h0) * hd, nh = h1 - h0;
      float* res = &a.split(((t * heads + g * group + h0) * P + kpart), 0);  // head rows P * slot apart
      const std::ptrdiff_t rs = std::ptrdiff_t(P) * slot;
      if (p0 >= p1) {  // nothing of this row's positions here
        for (std::size_t i = 0; i < nh; ++i) {
          res[std::ptrdiff_t(i) * rs + std::ptrdiff_t(hd)] = -std::numeric_limits<float>::infinity();
          res[std::ptrdiff_t(i) * rs + std::ptrdiff_t(hd) + 1] = 0.0f;
        }
        return;
      }
      const auto q = detail::rows_view(as_const(a.q).data() + off, nh, hd, hd);
      float* sp = &a.scores(thread, 0);
      const auto s = detail::rows_view(sp, nh, p1 - p0, kDecodeSplit);  // (nh, p1 - p0)
      attn_scores(q, kv, l, g, p0, p1, s, st.precision);
      dispatch::attention_exp_rows(sp, std::ptrdiff_t(kDecodeSplit), nh, p1 - p0, hp_.attn_scale, hp_.attn_softcap,
                                   res + hd, res + hd + 1, rs);
      attn_values(s, kv, l, g, p0, p1, detail::rows_view(res, nh, hd, std::size_t(rs)), st.precision);
    };
    // Row t's heads from its parts: out = sum_i w_i (p V)_i with w_i = e^(m_i - m) / sum_j e^(m_j - m) l_j,
    // m = max_i m_i (the weights in double, the sum over parts in f32, in order).
    auto combine_row = [&](std::size_t t) {
      for (std::size_t h = 0; h < heads; ++h) {
        const float* res = &a.split((t * heads + h) * P, 0);
        float* out = a.att.data() + t * qd + h * hd;
        double m = -std::numeric_limits<double>::infinity();
        bool nan = false;
        for (std::size_t i = 0; i < kparts; ++i) {
          const float mi = res[std::ptrdiff_t(i) * slot + std::ptrdiff_t(hd)];
          nan |= std::isnan(mi);
          if (res[std::ptrdiff_t(i) * slot + std::ptrdiff_t(hd) + 1] > 0) m = std::max(m, double(mi));
        }
        if (nan || m == -std::numeric_limits<double>::infinity()) {
          std::fill_n(out, hd, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
          continue;
        }
        double sum = 0;
        if constexpr (detail::attn_sinks<C>()) sum = std::exp(double(w_.layers[l].attn_sinks.data[h]) - m);
        for (std::size_t i = 0; i < kparts; ++i) {
          const float* ri = res + std::ptrdiff_t(i) * slot;
          if (ri[hd + 1] > 0) sum += std::exp(double(ri[hd]) - m) * double(ri[hd + 1]);
        }
        std::fill_n(out, hd, 0.0f);
        for (std::size_t i = 0; i < kparts; ++i) {  // out += w_i (p V)_i, w_i = e^(m_i - m) / sum
          const float* ri = res + std::ptrdiff_t(i) * slot;
          if (!(ri[hd + 1] > 0)) continue;
          const float w = float(std::exp(double(ri[hd]) - m) / sum);
          for (std::size_t d = 0; d < hd; ++d) out[d] += w * ri[d];
        }
      }
    };
    // Rows [r0, r1) of one run, query heads hh * hgroup + [0, hgroup): causal from the first row's position.
    const float* sinks = w_.layers[l].attn_sinks.data;  // null unless the Config has attention sinks
    auto chunk_task = [&](std::size_t r0, std::size_t r1, std::size_t hh, std::size_t thread) {
      const std::size_t nr = r1 - r0, p0 = rows.pos_of(r0), h = hh * hgroup;
      const auto q = detail::rows_view(as_const(a.q).data() + r0 * qd + h * hd, nr, hgroup * hd, qd);
      const auto o = detail::rows_view(a.att.data() + r0 * qd + h * hd, nr, hgroup * hd, qd);
      attend(q, rows.kv(r0), l, h / group, p0 + nr, o,
             AttentionOptions{.scale = hp_.attn_scale,
                              .softcap = hp_.attn_softcap,
                              .causal = true,
                              .pos0 = p0,
                              .window = sliding ? window : 0,
                              .scratch = std::span<float>(&a.scores(thread, 0), a.scores.extent(1)),
                              .amx_bf16 = amx_attn,
                              .heads = hgroup,
                              .sinks = sinks ? std::span<const float>(sinks + h, hgroup) : std::span<const float>()});
    };
    // Task i: the chunk tasks first (the latest chunk of each run first: it has the most positions), then
    // the decode tasks; found by walking the runs (a few per pass).
    auto run = [&](std::size_t i, std::size_t thread) {
      if (i < chunk_tasks) {
        for (std::size_t b = 0, e; b < n; b = e) {
          e = run_end(b);
          if (e - b == 1) continue;
          const std::size_t chunks = (e - b + qchunk - 1) / qchunk;
          if (i >= htasks * chunks) {
            i -= htasks * chunks;
            continue;
          }
          const std::size_t r0 = b + (chunks - 1 - i / htasks) * qchunk;
          return chunk_task(r0, std::min(e, r0 + qchunk), i % htasks, thread);
        }
      }
      i -= chunk_tasks;
      std::size_t s = i / (kvh * parts * kparts);  // the s-th single row
      for (std::size_t b = 0, e; b < n; b = e) {
        e = run_end(b);
        if (e - b == 1 && s-- == 0)
          return decode_task(b, i / (parts * kparts) % kvh, i / kparts % parts, i % kparts, thread);
      }
    };
    auto combine = [&](std::size_t s, std::size_t) {  // the s-th single row
      for (std::size_t b = 0, e; b < n; b = e) {
        e = run_end(b);
        if (e - b == 1 && s-- == 0) return combine_row(b);
      }
    };
    ThreadPool* pool = st.pool.get();
    std::size_t max_len = rows.pos0 + n;
    if (rows.multi()) max_len = *std::max_element(rows.pos.begin(), rows.pos.end()) + 1;
    const double work = double(heads) * double(n) * double(max_len) * double(hd);
    constexpr double kMinParallelWork = 1 << 15;  // multiply-adds: below this one thread is faster
    const std::size_t tasks = chunk_tasks + singles * kvh * parts * kparts;
    if (pool->size() > 1 && tasks > 1 && work >= kMinParallelWork) {
      pool->parallel_for(tasks, run);
      if (singles > 1) pool->parallel_for(singles, combine);
      else if (singles == 1) combine(0, 0);
    } else {
      for (std::size_t t = 0; t < tasks; ++t) run(t, 0);
      for (std::size_t t = 0; t < singles; ++t) combine(t, 0);
    }
  }
};

}  // namespace kiln
