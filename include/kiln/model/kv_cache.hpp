// kiln/model/kv_cache.hpp - the keys and values of every past position, f32 or f16, allocated once per
// context.
//
// Layout: both position-major, so a head's keys and its values are each one contiguous read stream:
//   K: (n_layers, n_kv_heads, ctx, head_dim)  -> scores = q K^T reads K[l, g, 0:kv_len, :] as B (N = kv_len)
//   V: (n_layers, n_kv_heads, ctx, head_dim)  -> out = p V reads values_t(): V[l, g, 0:kv_len, :] viewed
//                                                as (head_dim, kv_len), column-major (strides 1, head_dim),
//                                                which matmul takes as a column-major B
// Writing one position is a row copy for each. (V is not stored transposed, (head_dim, ctx): its head_dim
// rows would be as many short read streams, ctx apart, for a decode step's values product, and each stored
// position would touch head_dim cache lines.)
//
// Memory: K and V are fresh anonymous mappings (Linux; elsewhere zero-filled buffers), not written at
// construction: a page costs resident memory once a position in it is stored, so a large context costs
// only the pages its stored positions span (per layer and KV head), not its whole size up front (-c is
// then cheap to set generously). Never-written positions read as zeros, as before (the kernel's zero
// page), though nothing reads past the positions a forward pass has stored. The first store into each page
// is a page fault, as the first touch of the old zero fill was: one per 4 KiB (2048 / head_dim positions of
// one layer and KV head in f16), or per 2 MiB with transparent huge pages; the first page of each layer's
// and head's K and V is faulted at construction (position 0 needs it), not by the first token. With
// huge pages (KVPages::upfront, the default) that is 2 MiB per layer, KV head and K/V: a context whose
// (layer, head) rows of K take 2 MiB or less is resident whole from the start. KVPages::on_use keeps
// 4 KiB pages, so that such a cache (a server's slots) holds only the pages of the positions stored.
//
// Element type (KVType, chosen at construction): f32, or f16 (llama.cpp's default), which halves the
// cache and the bytes attention reads per decoded token. store() rounds f32 to f16 to nearest even
// (kiln::f32_to_f16_bits: IEEE binary16, overflow to +-inf, subnormals kept), so each cached element is
// within a relative 2^-11 of the f32 value (|x| >= 2^-14; absolute 2^-25 below). kiln::matmul widens f16
// rows exactly inside its SIMD kernels.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln {

/// The element type of a KVCache. `automatic` is for options (SessionOptions::kv_type): f32 with
/// Precision::exact, f16 otherwise; a KVCache itself holds f32 or f16.
enum class KVType { automatic, f32, f16 };

/// How a KVCache's memory becomes resident (SessionOptions::kv_pages).
enum class KVPages {
  /// 2 MiB transparent huge pages (where the kernel grants them), the first page of every (layer, KV head)
  /// run of positions faulted at construction: the fewest TLB misses and no page fault for the first
  /// token. A run under 2 MiB (ctx x head_dim x element size) shares its huge page with the next runs, so
  /// such a cache is resident whole from the start.
  upfront,
  /// 4 KiB pages (MADV_NOHUGEPAGE), each faulted when a position in it is first stored: resident memory
  /// follows the positions used (a server's slots, most of them short, with a generous context), at a page
  /// fault per 4 KiB of each run and more TLB misses at long contexts.
  on_use,
};

inline const char* kv_type_name(KVType t) { return t == KVType::f32 ? "f32" : t == KVType::f16 ? "f16" : "automatic"; }

/// Bytes of a KVCache's K and V for these sizes, as a double (sizes whose product overflows size_t come out
/// large instead of wrapping): for checking before allocating.
inline double kv_cache_bytes(std::size_t n_layers, std::size_t n_kv_heads, std::size_t head_dim, std::size_t ctx,
                             KVType type) {
  return 2.0 * double(n_layers) * double(n_kv_heads) * double(head_dim) * double(ctx) *
         (type == KVType::f32 ? 4.0 : 2.0);
}

/// The memory available for new allocations without swapping (MemAvailable of /proc/meminfo, Linux 3.14+),
/// in bytes; nullopt where it cannot be read.
inline std::optional<double> available_memory_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return std::nullopt;
  char line[256];
  std::optional<double> r;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "MemAvailable:", 13) == 0) {
      const double kib = std::strtod(line + 13, nullptr);
      if (kib > 0) r = kib * 1024.0;
      break;
    }
  std::fclose(f);
  return r;
}

class KVCache {
 public:
  KVCache() = default;
  KVCache(std::size_t n_layers, std::size_t n_kv_heads, std::size_t head_dim, std::size_t ctx,
          KVType type = KVType::f32, KVPages pages = KVPages::upfront)
      : n_layers_(n_layers), n_kv_(n_kv_heads), hd_(head_dim), ctx_(ctx), type_(type) {
    const std::size_t n = detail::checked_product(n_layers, n_kv_heads, ctx, head_dim);
    const auto ps = pages == KVPages::upfront ? detail::PageSize::huge : detail::PageSize::small;
    if (type == KVType::f32) {
      k32_ = detail::LazyZeros<float>(n, ps);
      v32_ = detail::LazyZeros<float>(n, ps);
    } else if (type == KVType::f16) {
      k16_ = detail::LazyZeros<f16>(n, ps);
      v16_ = detail::LazyZeros<f16>(n, ps);
    } else {
      fail(
          "kiln::KVCache: the element type must be KVType::f32 or KVType::f16 (KVType::automatic is for "
          "SessionOptions, resolved by the session)");
    }
    // The first store (position 0 of every layer and KV head) faults the first page of each (layer, head)
    // slab of K and V: faulted here instead, as the old zero fill did, so that the first token does not
    // pay for them (with 2 MiB pages that is 2 MiB of zeroing per layer, head and K/V).
    const std::size_t es = type == KVType::f32 ? sizeof(float) : sizeof(f16);
    const std::size_t slab = ctx * head_dim * es;
    const bool huge = pages == KVPages::upfront && huge_pages();
    const std::size_t first = std::min(slab, huge ? std::size_t(2) << 20 : std::size_t(4096));
    if (slab == 0) return;
    auto* kb = reinterpret_cast<unsigned char*>(type == KVType::f32 ? static_cast<void*>(k32_.data())
                                                                    : static_cast<void*>(k16_.data()));
    auto* vb = reinterpret_cast<unsigned char*>(type == KVType::f32 ? static_cast<void*>(v32_.data())
                                                                    : static_cast<void*>(v16_.data()));
    for (std::size_t s = 0; s < n_layers * n_kv_heads; ++s) {
      std::memset(kb + s * slab, 0, first);
      std::memset(vb + s * slab, 0, first);
    }
  }

  std::size_t ctx() const { return ctx_; }
  std::size_t n_layers() const { return n_layers_; }
  std::size_t n_kv_heads() const { return n_kv_; }
  std::size_t head_dim() const { return hd_; }
  KVType type() const { return type_; }
  /// Bytes of K and V together.
  std::size_t bytes() const {
    return (k32_.size() + v32_.size()) * sizeof(float) + (k16_.size() + v16_.size()) * sizeof(f16);
  }

  /// K[l, g, 0:n, :] as (n, head_dim). T is the cache's element type (float or f16; else kiln::Error).
  template <class T = float>
  DenseTensor<const T, 2> keys(std::size_t l, std::size_t g, std::size_t n) const {
    check_view<T>("keys", l, g, n);
    return make_tensor(data<T>(k32_, k16_) + ((l * n_kv_ + g) * ctx_) * hd_, n, hd_);
  }
  /// V[l, g, 0:n, :] as (n, head_dim). T as for keys().
  template <class T = float>
  DenseTensor<const T, 2> values(std::size_t l, std::size_t g, std::size_t n) const {
    check_view<T>("values", l, g, n);
    return make_tensor(data<T>(v32_, v16_) + ((l * n_kv_ + g) * ctx_) * hd_, n, hd_);
  }
  /// values(l, g, n) transposed: (head_dim, n), column-major (strides 1, head_dim), the B of out = p V for
  /// kiln::matmul (which takes a column-major B). T as for keys().
  template <class T = float>
  StridedTensor<const T, 2> values_t(std::size_t l, std::size_t g, std::size_t n) const {
    check_view<T>("values_t", l, g, n);
    return make_strided<const T, 2>(data<T>(v32_, v16_) + ((l * n_kv_ + g) * ctx_) * hd_, {hd_, n},
                                    {std::ptrdiff_t(1), std::ptrdiff_t(hd_)});
  }

  /// Stores n positions starting at pos from k, v (n, n_kv_heads * head_dim), rows `ks` / `vs` apart
  /// (rounded to nearest even in an f16 cache).
  void store(std::size_t l, std::size_t pos, std::size_t n, const float* k, std::ptrdiff_t ks, const float* v,
             std::ptrdiff_t vs) {
    if (l >= n_layers_ || pos > ctx_ || n > ctx_ - pos)
      fail("kiln::KVCache::store: layer ", l, ", positions [", pos, ", ", pos + n, ") outside ", n_layers_,
           " layers and a context of ", ctx_);
    if (type_ == KVType::f16) store_as(k16_.data(), v16_.data(), l, pos, n, k, ks, v, vs);
    else store_as(k32_.data(), v32_.data(), l, pos, n, k, ks, v, vs);
  }

  /// Copies positions [0, n) of every layer and KV head from `src`, a cache of the same shape and type (a
  /// prefix another sequence computed, reused: the bits it stored).
  void copy_prefix(const KVCache& src, std::size_t n) {
    if (src.n_layers_ != n_layers_ || src.n_kv_ != n_kv_ || src.hd_ != hd_ || src.ctx_ != ctx_ || src.type_ != type_)
      fail("kiln::KVCache::copy_prefix: the caches differ in shape or element type");
    if (n > ctx_) fail("kiln::KVCache::copy_prefix: ", n, " positions of a context of ", ctx_);
    if (&src == this || n == 0) return;
    if (type_ == KVType::f16) copy_rows(src.k16_.data(), src.v16_.data(), k16_.data(), v16_.data(), n);
    else copy_rows(src.k32_.data(), src.v32_.data(), k32_.data(), v32_.data(), n);
  }

 private:
  template <class T>
  void copy_rows(const T* ks, const T* vs, T* kd, T* vd, std::size_t n) {
    for (std::size_t lg = 0; lg < n_layers_ * n_kv_; ++lg) {
      std::memcpy(kd + lg * ctx_ * hd_, ks + lg * ctx_ * hd_, n * hd_ * sizeof(T));
      std::memcpy(vd + lg * ctx_ * hd_, vs + lg * ctx_ * hd_, n * hd_ * sizeof(T));
    }
  }

  template <class T>
  static constexpr KVType type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16>,
                  "kiln::KVCache: the element type is float or kiln::f16");
    return std::is_same_v<T, float> ? KVType::f32 : KVType::f16;
  }

  template <class T>
  void check_view(const char* what, std::size_t l, std::size_t g, std::size_t n) const {
    if (type_ != type_of<T>())
      fail("kiln::KVCache::", what, "<", dtype_name<T>, ">: the cache holds ", kv_type_name(type_), " elements");
    if (l >= n_layers_ || g >= n_kv_ || n > ctx_)
      fail("kiln::KVCache::", what, ": layer ", l, ", KV head ", g, ", ", n, " positions outside ", n_layers_,
           " layers, ", n_kv_, " KV heads and a context of ", ctx_);
  }

  template <class T>
  static const T* data(const detail::LazyZeros<float>& b32, const detail::LazyZeros<f16>& b16) {
    if constexpr (std::is_same_v<T, float>) return b32.data();
    else return b16.data();
  }

  static void put(float& d, float x) { d = x; }
  static void put(f16& d, float x) { d = f16::from_bits(f32_to_f16_bits(x)); }

  template <class T>
  void store_as(T* kbase, T* vbase, std::size_t l, std::size_t pos, std::size_t n, const float* k, std::ptrdiff_t ks,
                const float* v, std::ptrdiff_t vs) {
    for (std::size_t g = 0; g < n_kv_; ++g) {
      T* kd = kbase + ((l * n_kv_ + g) * ctx_ + pos) * hd_;
      T* vd = vbase + ((l * n_kv_ + g) * ctx_ + pos) * hd_;
      for (std::size_t t = 0; t < n; ++t) {
        const float* kt = k + std::ptrdiff_t(t) * ks + std::ptrdiff_t(g * hd_);
        const float* vt = v + std::ptrdiff_t(t) * vs + std::ptrdiff_t(g * hd_);
        for (std::size_t d = 0; d < hd_; ++d) put(kd[t * hd_ + d], kt[d]);
        for (std::size_t d = 0; d < hd_; ++d) put(vd[t * hd_ + d], vt[d]);
      }
    }
  }

  std::size_t n_layers_ = 0, n_kv_ = 0, hd_ = 0, ctx_ = 0;
  KVType type_ = KVType::f32;
  detail::LazyZeros<float> k32_, v32_;  // f32 cache (else empty)
  detail::LazyZeros<f16> k16_, v16_;    // f16 cache (else empty)
};

}  // namespace kiln
