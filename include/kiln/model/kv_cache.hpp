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
// rows exactly inside its SIMD kernels. Or q8_0 (llama.cpp's `-ctk q8_0 -ctv q8_0`): each position's head_dim
// values in GGUF Q8_0 blocks of 32 (an f16 scale d = max|x| / 127 and 32 int8 q = round(x / d): 34 bytes, 8.5
// bits a value, 0.53x f16), quantized by quant_traits<block_q8_0>::quantize (byte-identical with gguf-py), so
// an element is within d / 2 (plus d's own f16 rounding, relative 2^-11) of the f32 value; head_dim must be a
// multiple of 32. The attention kernels widen a block to d * q, exact in f32, so a q8_0 cache gives the bits
// of an f32 cache holding the dequantized values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/dequant.hpp"

namespace kiln {

/// The element type of a KVCache. `automatic` is for options (SessionOptions::kv_type): f32 with
/// Precision::exact, f16 otherwise; a KVCache itself holds f32, f16 or q8_0 (never chosen automatically).
enum class KVType { automatic, f32, f16, q8_0 };

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

inline const char* kv_type_name(KVType t) {
  switch (t) {
    case KVType::f32:
      return "f32";
    case KVType::f16:
      return "f16";
    case KVType::q8_0:
      return "q8_0";
    default:
      return "automatic";
  }
}

/// The KVType a name spells ("auto", "f32", "f16", "q8_0": the tools' --kv), or nullopt.
inline std::optional<KVType> kv_type_from_name(std::string_view name) {
  if (name == "auto") return KVType::automatic;
  for (KVType t : {KVType::f32, KVType::f16, KVType::q8_0})
    if (name == kv_type_name(t)) return t;
  return std::nullopt;
}

/// Bytes one cached value takes in a KVCache of this type (q8_0: 34 bytes per 32 values).
inline double kv_bytes_per_value(KVType type) {
  return type == KVType::f32 ? 4.0 : type == KVType::q8_0 ? double(sizeof(block_q8_0)) / QK8_0 : 2.0;
}

/// Bytes of a KVCache's K and V for these sizes, as a double (sizes whose product overflows size_t come out
/// large instead of wrapping): for checking before allocating.
inline double kv_cache_bytes(std::size_t n_layers, std::size_t n_kv_heads, std::size_t head_dim, std::size_t ctx,
                             KVType type) {
  return 2.0 * double(n_layers) * double(n_kv_heads) * double(head_dim) * double(ctx) * kv_bytes_per_value(type);
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
    if (type != KVType::f32 && type != KVType::f16 && type != KVType::q8_0)
      fail(
          "kiln::KVCache: the element type must be KVType::f32, f16 or q8_0 (KVType::automatic is for "
          "SessionOptions, resolved by the session)");
    if (type == KVType::q8_0 && head_dim % QK8_0 != 0)
      fail("kiln::KVCache: a q8_0 cache needs a head_dim that is a multiple of ", QK8_0,
           " (Q8_0 blocks along it); this model's is ", head_dim, ": use KVType::f16 or f32");
    const auto ps = pages == KVPages::upfront ? detail::PageSize::huge : detail::PageSize::small;
    // elements of K (and of V): head_dim values, or head_dim / 32 blocks, per position
    const std::size_t n =
        detail::checked_product(n_layers, n_kv_heads, ctx, type == KVType::q8_0 ? head_dim / QK8_0 : head_dim);
    if (type == KVType::f32) {
      k32_ = detail::LazyZeros<float>(n, ps);
      v32_ = detail::LazyZeros<float>(n, ps);
    } else if (type == KVType::f16) {
      k16_ = detail::LazyZeros<f16>(n, ps);
      v16_ = detail::LazyZeros<f16>(n, ps);
    } else {
      k8_ = detail::LazyZeros<block_q8_0>(n, ps);
      v8_ = detail::LazyZeros<block_q8_0>(n, ps);
    }
    // The first store (position 0 of every layer and KV head) faults the first page of each (layer, head)
    // slab of K and V: faulted here instead, as the old zero fill did, so that the first token does not
    // pay for them (with 2 MiB pages that is 2 MiB of zeroing per layer, head and K/V).
    const std::size_t slab = ctx * row_bytes();
    const bool huge = pages == KVPages::upfront && huge_pages();
    const std::size_t first = std::min(slab, huge ? std::size_t(2) << 20 : std::size_t(4096));
    if (slab == 0) return;
    for (std::size_t s = 0; s < n_layers * n_kv_heads; ++s) {
      std::memset(kbytes() + s * slab, 0, first);
      std::memset(vbytes() + s * slab, 0, first);
    }
  }

  std::size_t ctx() const { return ctx_; }
  std::size_t n_layers() const { return n_layers_; }
  std::size_t n_kv_heads() const { return n_kv_; }
  std::size_t head_dim() const { return hd_; }
  KVType type() const { return type_; }
  /// Bytes of K and V together.
  std::size_t bytes() const { return 2 * n_layers_ * n_kv_ * ctx_ * row_bytes(); }
  /// Bytes of one position of one KV head in K (or V): head_dim elements, or head_dim / 32 Q8_0 blocks.
  std::size_t row_bytes() const {
    return type_ == KVType::q8_0 ? hd_ / QK8_0 * sizeof(block_q8_0) : hd_ * (type_ == KVType::f32 ? 4 : 2);
  }

  /// K[l, g, 0:n, :] as (n, head_dim), or for a q8_0 cache (T = block_q8_0) as (n, head_dim / 32) blocks. T is the
  /// cache's element type (float, f16 or block_q8_0; else kiln::Error).
  template <class T = float>
  DenseTensor<const T, 2> keys(std::size_t l, std::size_t g, std::size_t n) const {
    check_view<T>("keys", l, g, n);
    return make_tensor(data<T>(true) + ((l * n_kv_ + g) * ctx_) * row_elems<T>(), n, row_elems<T>());
  }
  /// V[l, g, 0:n, :] as (n, head_dim), or (n, head_dim / 32) blocks. T as for keys().
  template <class T = float>
  DenseTensor<const T, 2> values(std::size_t l, std::size_t g, std::size_t n) const {
    check_view<T>("values", l, g, n);
    return make_tensor(data<T>(false) + ((l * n_kv_ + g) * ctx_) * row_elems<T>(), n, row_elems<T>());
  }
  /// values(l, g, n) transposed: (head_dim, n), column-major (strides 1, head_dim), the B of out = p V for
  /// kiln::matmul (which takes a column-major B). T: float or f16 (a q8_0 cache's values are read through values()).
  template <class T = float>
  StridedTensor<const T, 2> values_t(std::size_t l, std::size_t g, std::size_t n) const {
    static_assert(!std::is_same_v<T, block_q8_0>, "kiln::KVCache::values_t: q8_0 values are read through values()");
    check_view<T>("values_t", l, g, n);
    return make_strided<const T, 2>(data<T>(false) + ((l * n_kv_ + g) * ctx_) * hd_, {hd_, n},
                                    {std::ptrdiff_t(1), std::ptrdiff_t(hd_)});
  }

  /// Stores n positions starting at pos from k, v (n, n_kv_heads * head_dim), rows `ks` / `vs` apart
  /// (rounded to nearest even in an f16 cache, quantized to Q8_0 blocks in a q8_0 one).
  void store(std::size_t l, std::size_t pos, std::size_t n, const float* k, std::ptrdiff_t ks, const float* v,
             std::ptrdiff_t vs) {
    if (l >= n_layers_ || pos > ctx_ || n > ctx_ - pos)
      fail("kiln::KVCache::store: layer ", l, ", positions [", pos, ", ", pos + n, ") outside ", n_layers_,
           " layers and a context of ", ctx_);
    if (type_ == KVType::f16) store_as(k16_.data(), v16_.data(), l, pos, n, k, ks, v, vs);
    else if (type_ == KVType::q8_0) store_as(k8_.data(), v8_.data(), l, pos, n, k, ks, v, vs);
    else store_as(k32_.data(), v32_.data(), l, pos, n, k, ks, v, vs);
  }

  /// Copies positions [0, n) of every layer and KV head from `src`, a cache of the same shape and type (a
  /// prefix another sequence computed, reused: the bits it stored).
  void copy_prefix(const KVCache& src, std::size_t n) {
    if (src.n_layers_ != n_layers_ || src.n_kv_ != n_kv_ || src.hd_ != hd_ || src.ctx_ != ctx_ || src.type_ != type_)
      fail("kiln::KVCache::copy_prefix: the caches differ in shape or element type");
    if (n > ctx_) fail("kiln::KVCache::copy_prefix: ", n, " positions of a context of ", ctx_);
    if (&src == this || n == 0) return;
    const std::size_t slab = ctx_ * row_bytes();
    for (std::size_t lg = 0; lg < n_layers_ * n_kv_; ++lg) {
      std::memcpy(kbytes() + lg * slab, src.kbytes() + lg * slab, n * row_bytes());
      std::memcpy(vbytes() + lg * slab, src.vbytes() + lg * slab, n * row_bytes());
    }
  }

 private:
  unsigned char* kbytes() const {  // the mapping is writable; const only for copy_prefix's source
    const void* p = type_ == KVType::f32   ? static_cast<const void*>(k32_.data())
                    : type_ == KVType::f16 ? static_cast<const void*>(k16_.data())
                                           : static_cast<const void*>(k8_.data());
    return const_cast<unsigned char*>(static_cast<const unsigned char*>(p));
  }
  unsigned char* vbytes() const {  // the mapping is writable; const only for copy_prefix's source
    const void* p = type_ == KVType::f32   ? static_cast<const void*>(v32_.data())
                    : type_ == KVType::f16 ? static_cast<const void*>(v16_.data())
                                           : static_cast<const void*>(v8_.data());
    return const_cast<unsigned char*>(static_cast<const unsigned char*>(p));
  }

  template <class T>
  static constexpr KVType type_of() {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, block_q8_0>,
                  "kiln::KVCache: the element type is float, kiln::f16 or kiln::block_q8_0");
    return std::is_same_v<T, float> ? KVType::f32 : std::is_same_v<T, f16> ? KVType::f16 : KVType::q8_0;
  }
  // Elements of T per stored position of one KV head.
  template <class T>
  std::size_t row_elems() const {
    return std::is_same_v<T, block_q8_0> ? hd_ / QK8_0 : hd_;
  }

  template <class T>
  void check_view(const char* what, std::size_t l, std::size_t g, std::size_t n) const {
    if (type_ != type_of<T>())
      fail("kiln::KVCache::", what, "<", kv_type_name(type_of<T>()), ">: the cache holds ", kv_type_name(type_),
           " elements");
    if (l >= n_layers_ || g >= n_kv_ || n > ctx_)
      fail("kiln::KVCache::", what, ": layer ", l, ", KV head ", g, ", ", n, " positions outside ", n_layers_,
           " layers, ", n_kv_, " KV heads and a context of ", ctx_);
  }

  template <class T>
  const T* data(bool keys) const {
    if constexpr (std::is_same_v<T, float>) return keys ? k32_.data() : v32_.data();
    else if constexpr (std::is_same_v<T, f16>) return keys ? k16_.data() : v16_.data();
    else return keys ? k8_.data() : v8_.data();
  }

  // One position's head_dim values of one KV head, converted: dst holds row_elems<T>() elements.
  static void put_row(float* d, const float* x, std::size_t hd) { std::memcpy(d, x, hd * sizeof(float)); }
  static void put_row(f16* d, const float* x, std::size_t hd) {
    for (std::size_t i = 0; i < hd; ++i) d[i] = f16::from_bits(f32_to_f16_bits(x[i]));
  }
  static void put_row(block_q8_0* d, const float* x, std::size_t hd) {
    for (std::size_t b = 0; b < hd / QK8_0; ++b) quant_traits<block_q8_0>::quantize(x + b * QK8_0, d[b]);
  }

  template <class T>
  void store_as(T* kbase, T* vbase, std::size_t l, std::size_t pos, std::size_t n, const float* k, std::ptrdiff_t ks,
                const float* v, std::ptrdiff_t vs) {
    const std::size_t re = row_elems<T>();
    for (std::size_t g = 0; g < n_kv_; ++g) {
      T* kd = kbase + ((l * n_kv_ + g) * ctx_ + pos) * re;
      T* vd = vbase + ((l * n_kv_ + g) * ctx_ + pos) * re;
      for (std::size_t t = 0; t < n; ++t) {
        put_row(kd + t * re, k + std::ptrdiff_t(t) * ks + std::ptrdiff_t(g * hd_), hd_);
        put_row(vd + t * re, v + std::ptrdiff_t(t) * vs + std::ptrdiff_t(g * hd_), hd_);
      }
    }
  }

  std::size_t n_layers_ = 0, n_kv_ = 0, hd_ = 0, ctx_ = 0;
  KVType type_ = KVType::f32;
  detail::LazyZeros<float> k32_, v32_;     // f32 cache (else empty)
  detail::LazyZeros<f16> k16_, v16_;       // f16 cache (else empty)
  detail::LazyZeros<block_q8_0> k8_, v8_;  // q8_0 cache (else empty)
};

}  // namespace kiln
