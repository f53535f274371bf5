// kiln/model/block.hpp - what a Config's hooks get: one layer of a forward pass as public pieces.
//
// Every layer of Transformer<Config> (model/transformer.hpp) is a block: the Config's
// `static void block(const BlockArgs&)` when it has one, else default_block<Config>, which every built-in
// architecture runs. BlockArgs holds the pass's views (the residual stream x and scratch from the arena),
// the layer's weights and how to multiply, and the pieces the built-in layer is made of (norm, qkv, rope,
// attend, attention, mlp, linear, residual), each the code Transformer<Config> runs for the Config's traits.
// The narrower `static void mlp(const MlpArgs&)` hook replaces only the dense MLP.
#pragma once

#include <cstddef>

#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/ops/activation.hpp"
#include "kiln/ops/linear.hpp"

namespace kiln {

/// What a Config's MLP hook gets (`static void mlp(const MlpArgs&)`, model/config.hpp): one layer's dense MLP
/// input h, where its output goes, two (n, ffn_dim) scratch matrices, the layer's weights and how to multiply
/// (pass pool and precision on to kiln::linear / linear_multi). Built from public pieces: linear, add_bias,
/// the activations, norms.
struct MlpArgs {
  DenseTensor<float, 2> h;         ///< (n, dim): the normed residual stream
  DenseTensor<float, 2> out;       ///< (n, dim): write the MLP's output here (before post_ffw_norm, residual)
  DenseTensor<float, 2> gate, up;  ///< (n, ffn_dim) each: scratch
  const LayerWeights& w;           ///< the layer's weights (w_gate, w_up, w_down, b_*)
  const HParams& hp;
  ThreadPool* pool;
  Precision precision;
};

namespace detail {
/// BlockArgs' pieces that depend on the Config: Transformer<C>'s code for one layer of one pass.
class BlockPieces {
 public:
  virtual void norm(DenseTensor<float, 2> in, const VecRef& w, const VecRef& b, DenseTensor<float, 2> out) const = 0;
  virtual void qkv(DenseTensor<float, 2> h) const = 0;
  virtual void rope() const = 0;
  virtual void attend() const = 0;
  virtual void attention(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const = 0;
  virtual void mlp(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const = 0;

 protected:
  ~BlockPieces() = default;
};
}  // namespace detail

/// One layer of one forward pass of n rows (tokens) as a block sees it: the residual stream, scratch
/// views of the pass's arena, the layer's weights, and how to multiply.
struct BlockViews {
  DenseTensor<float, 2> x;        ///< (n, dim): the residual stream; the block updates it in place
  DenseTensor<float, 2> h, o;     ///< (n, dim) scratch each
  DenseTensor<float, 2> q, k, v;  ///< (n, q_dim), (n, kv_dim), (n, kv_dim): what qkv() writes
  DenseTensor<float, 2> att;      ///< (n, q_dim): what attend() writes (the heads' outputs, before Wo)
  const LayerWeights& w;          ///< the layer's weights
  const HParams& hp;
  std::size_t layer;  ///< 0 .. hp.n_layers - 1
  ThreadPool* pool;   ///< pass it on to kiln's ops
  Precision precision;
};

/// What a Config's block hook gets (`static void block(const BlockArgs&)`): the views and the pieces.
/// A block reads x and adds its sublayers' outputs to it with residual(); kiln's ops (linear, add_bias,
/// the norms and activations, rope) work on the same views. The pieces use the views q, k, v, att and the
/// pass's MLP scratch, which share memory (mlp() overwrites q, k, v and att); h and o are the block's own.
class BlockArgs : public BlockViews {
 public:
  BlockArgs(const BlockViews& v, const detail::BlockPieces& pieces) : BlockViews(v), pieces_(&pieces) {}

  /// out = the Config's norm (RMSNorm or LayerNorm, its weight convention, hp.norm_eps) of in with weight w
  /// and, for LayerNorm, bias b; out may be in.
  void norm(DenseTensor<float, 2> in, const VecRef& w, const VecRef& b, DenseTensor<float, 2> out) const {
    pieces_->norm(in, w, b, out);
  }
  /// q, k, v = h Wq^T, h Wk^T, h Wv^T (one linear_multi: h quantized once) [+ biases] [q/k norms].
  void qkv(DenseTensor<float, 2> h) const { pieces_->qkv(h); }
  /// q and k rotated in place at the rows' positions: kiln::rope with the context's RopeTable (the
  /// sliding-window layers' own where their base differs) and the file's pairing.
  void rope() const { pieces_->rope(); }
  /// k and v into the KV cache at the rows' positions, then att = attention of q over the cache (causal,
  /// grouped heads, the layer's window, softcap, sinks): kiln::attention for a prompt, a decode step split
  /// over the cached positions.
  void attend() const { pieces_->attend(); }
  /// out = the attention sublayer of h: qkv(h), rope() (Configs with RoPE), attend(), att Wo^T [+ bo].
  void attention(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const { pieces_->attention(h, out); }
  /// out = the layer's MLP of h: the experts (HParams::n_expert > 0), the Config's mlp hook, or the
  /// traits' dense MLP.
  void mlp(DenseTensor<float, 2> h, DenseTensor<float, 2> out) const { pieces_->mlp(h, out); }
  /// out = in W^T: kiln::linear with the pass's pool and precision.
  template <class X, class Y>
  void linear(const X& in, const WeightRef& W, const Y& out) const {
    kiln::linear(in, W, out, pool, precision);
  }
  /// x += o, o first scaled in place by hp.residual_scale (Granite's residual_multiplier) unless that is 1.
  void residual(DenseTensor<float, 2> o) const {
    if (const float s = hp.residual_scale; s != 1.0f)
      for (std::size_t i = 0; i < o.size(); ++i) o.data()[i] *= s;
    add(x, o, x, pool);
  }

 private:
  const detail::BlockPieces* pieces_;
};

/// The built-in transformer's layer, run for every Config without a block hook (a hook may call it too):
///   x += post_attn_norm(attention(norm(x)))      post_attn_norm, post_ffw_norm: Configs with those traits
///   x += post_ffw_norm(mlp(norm(x)))
template <ArchConfig C>
void default_block(const BlockArgs& b) {
  const LayerWeights& w = b.w;
  b.norm(b.x, w.attn_norm, w.attn_norm_b, b.h);
  b.attention(b.h, b.o);
  if constexpr (C::post_attn_norm) b.norm(b.o, w.post_attn_norm, VecRef{}, b.o);
  b.residual(b.o);
  b.norm(b.x, w.ffn_norm, w.ffn_norm_b, b.h);
  b.mlp(b.h, b.o);
  if constexpr (C::post_ffw_norm) b.norm(b.o, w.post_ffw_norm, VecRef{}, b.o);
  b.residual(b.o);
}

}  // namespace kiln
