// kiln/model/kv_cache.hpp - the keys and values of every past position, f32, allocated once per context.
//
// Layout, chosen so both attention products are plain matmuls over contiguous rows:
//   K: (n_layers, n_kv_heads, ctx, head_dim)  -> scores = q K^T reads K[l, g, 0:kv_len, :] as B (N = kv_len)
//   V: (n_layers, n_kv_heads, head_dim, ctx)  -> out = p V reads V[l, g, :, 0:kv_len] as B (N = head_dim),
//                                                rows `ctx` apart (V is stored transposed)
// Writing one position is a row copy for K and a strided column store for V.
#pragma once

#include <cstddef>

#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

class KVCache {
 public:
  KVCache() = default;
  KVCache(std::size_t n_layers, std::size_t n_kv_heads, std::size_t head_dim, std::size_t ctx)
      : n_layers_(n_layers), n_kv_(n_kv_heads), hd_(head_dim), ctx_(ctx),
        k_(detail::checked_product(n_layers, n_kv_heads, ctx, head_dim)),
        v_(detail::checked_product(n_layers, n_kv_heads, ctx, head_dim)) {}

  std::size_t ctx() const { return ctx_; }
  std::size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  /// K[l, g, 0:n, :] as (n, head_dim).
  DenseTensor<const float, 2> keys(std::size_t l, std::size_t g, std::size_t n) const {
    return make_tensor(static_cast<const float*>(k_.data()) + ((l * n_kv_ + g) * ctx_) * hd_, n, hd_);
  }
  /// V[l, g, :, 0:n] as (head_dim, n), rows ctx apart.
  StridedTensor<const float, 2> values_t(std::size_t l, std::size_t g, std::size_t n) const {
    return make_strided<const float, 2>(static_cast<const float*>(v_.data()) + ((l * n_kv_ + g) * hd_) * ctx_, {hd_, n},
                                       {std::ptrdiff_t(ctx_), std::ptrdiff_t(1)});
  }

  /// Stores n positions starting at pos from k, v (n, n_kv_heads * head_dim), rows `ks` / `vs` apart.
  void store(std::size_t l, std::size_t pos, std::size_t n, const float* k, std::ptrdiff_t ks, const float* v,
             std::ptrdiff_t vs) {
    if (l >= n_layers_ || pos + n > ctx_)
      fail("kiln::KVCache::store: layer ", l, ", positions [", pos, ", ", pos + n, ") outside ", n_layers_,
           " layers and a context of ", ctx_);
    for (std::size_t g = 0; g < n_kv_; ++g) {
      float* kd = k_.data() + ((l * n_kv_ + g) * ctx_ + pos) * hd_;
      float* vd = v_.data() + ((l * n_kv_ + g) * hd_) * ctx_ + pos;
      for (std::size_t t = 0; t < n; ++t) {
        const float* kt = k + std::ptrdiff_t(t) * ks + std::ptrdiff_t(g * hd_);
        const float* vt = v + std::ptrdiff_t(t) * vs + std::ptrdiff_t(g * hd_);
        for (std::size_t d = 0; d < hd_; ++d) kd[t * hd_ + d] = kt[d];
        for (std::size_t d = 0; d < hd_; ++d) vd[d * ctx_ + t] = vt[d];
      }
    }
  }

 private:
  std::size_t n_layers_ = 0, n_kv_ = 0, hd_ = 0, ctx_ = 0;
  Buffer<float> k_, v_;
};

}  // namespace kiln
