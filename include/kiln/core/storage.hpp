// kiln/core/storage.hpp - owning, 64-byte-aligned storage (Buffer) and the activation Arena.
//
// Tensors are views; these own the bytes. An Arena is sized once (per context) and hands out aligned
// views by bumping an offset; reset() makes all of it reusable, so a forward pass that allocates its
// activations from an Arena never touches the heap.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/tensor.hpp"

#if defined(__linux__) && __has_include(<sys/mman.h>)
#include <sys/mman.h>
#endif
#if defined(MADV_HUGEPAGE)
#define KILN_HAS_MADV_HUGEPAGE 1
#else
#define KILN_HAS_MADV_HUGEPAGE 0
#endif

// KILN_DETAIL_ASAN: 1 when AddressSanitizer instruments this translation unit (GCC or clang).
#if defined(__SANITIZE_ADDRESS__)
#define KILN_DETAIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_DETAIL_ASAN 1
#endif
#endif
#ifndef KILN_DETAIL_ASAN
#define KILN_DETAIL_ASAN 0
#endif

namespace kiln {

inline constexpr std::size_t alignment = 64;

namespace detail {
inline std::size_t align_up(std::size_t n, std::size_t a = alignment) {
  if (n > SIZE_MAX - (a - 1)) fail("kiln: allocation size ", n, " overflows");
  return (n + a - 1) / a * a;
}
inline std::atomic<bool>& huge_pages_flag() {
  static std::atomic<bool> on{true};
  return on;
}
/// Asks Linux for transparent huge pages (2 MiB) over the whole 2 MiB pages inside [p, p + bytes), before
/// their first touch: weights read into memory and the KV cache are streamed once per token, and with 4 KiB
/// pages that is a TLB miss and a page fault every 4 KiB. A hint only: the kernel may decline (THP "never").
/// Nothing when kiln::set_huge_pages(false).
inline void advise_huge_pages([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) {
#if KILN_HAS_MADV_HUGEPAGE
  if (!huge_pages_flag().load(std::memory_order_relaxed)) return;
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const std::uintptr_t a = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) & ~(huge - 1);
  const std::uintptr_t b = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(huge - 1);
  if (a < b) (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE);
#endif
}
inline void* aligned_alloc_bytes(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = ::operator new(align_up(bytes), std::align_val_t(alignment), std::nothrow);
  if (!p) fail("kiln: out of memory allocating ", bytes, " bytes");
  if (bytes >= (std::size_t{8} << 20)) advise_huge_pages(p, bytes);  // large: a fresh mmap from malloc
  return p;
}
/// memset(p, 0, bytes); from 64 MiB on split over up to 4 threads in whole 2 MiB pieces
/// (run_once_parallel): the first touch of fresh memory (a page fault per page, on a VM often a host fault
/// too: ~1 GB/s on this machine's huge pages) is most of the cost of a large buffer.
inline void zero_fill(void* p, std::size_t bytes) {
  constexpr std::size_t kMin = std::size_t{64} << 20, kPage = std::size_t{2} << 20;
  auto* b = static_cast<unsigned char*>(p);
  const std::size_t n = bytes < kMin ? 1 : std::min<std::size_t>(4, bytes / (kMin / 2));
  const std::size_t step = (bytes / n + kPage - 1) / kPage * kPage;
  run_once_parallel((bytes + step - 1) / step, n,
                    [&](std::size_t i) { std::memset(b + i * step, 0, std::min(step, bytes - i * step)); });
}
inline void aligned_free(void* p) {
  if (p) ::operator delete(p, std::align_val_t(alignment));
}
template <class... I>
std::size_t checked_product(I... dims) {
  std::size_t n = 1;
  for (std::size_t d : {static_cast<std::size_t>(dims)...}) {
    if (d != 0 && n > SIZE_MAX / d) fail("kiln: element count overflows size_t");
    n *= d;
  }
  return n;
}
}  // namespace detail

/// Whether kiln's large buffers (8 MiB and up: weights read into memory or repacked at load, the KV cache,
/// the arena) ask Linux for transparent huge pages; on by default. Faster decoding (fewer TLB misses when
/// the weights are streamed: 1B Q4_0 decode +30% on Zen 5), but the first touch of huge pages can cost
/// more at load on some VMs (see README). Process-wide; affects buffers allocated after the call.
inline void set_huge_pages(bool on) { detail::huge_pages_flag().store(on, std::memory_order_relaxed); }
inline bool huge_pages() { return detail::huge_pages_flag().load(std::memory_order_relaxed); }

/// Owning, 64-byte-aligned array of n elements of a trivially copyable dtype, zero-initialised.
template <class T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>, "kiln::Buffer: T must be trivially copyable");

 public:
  Buffer() = default;
  explicit Buffer(std::size_t n) : n_(n) {
    if (n > SIZE_MAX / sizeof(T)) fail("kiln::Buffer: ", n, " elements overflow size_t");
    data_ = static_cast<T*>(detail::aligned_alloc_bytes(n * sizeof(T)));
    if (n) detail::zero_fill(data_, n * sizeof(T));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      detail::aligned_free(data_);
      data_ = std::exchange(o.data_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~Buffer() { detail::aligned_free(data_); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return n_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + n_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + n_; }

  /// A row-major view of the whole buffer with the given extents (their product must equal size()).
  template <class... I>
  DenseTensor<T, sizeof...(I)> view(I... dims) {
    return reshape(make_tensor(data_, n_), dims...);
  }
  template <class... I>
  DenseTensor<const T, sizeof...(I)> view(I... dims) const {
    return reshape(make_tensor(static_cast<const T*>(data_), n_), dims...);
  }

 private:
  T* data_ = nullptr;
  std::size_t n_ = 0;
};

/// A Buffer together with its shape: Storage<float>(rows, cols).view() is a DenseTensor<float, 2>.
template <class T, std::size_t R>
class Storage {
 public:
  Storage() = default;
  template <class... I>
  requires(sizeof...(I) == R) explicit Storage(I... dims)
      : buf_(detail::checked_product(dims...)), ext_(static_cast<std::size_t>(dims)...) {}
  DenseTensor<T, R> view() { return {buf_.data(), ext_}; }
  DenseTensor<const T, R> view() const { return {buf_.data(), ext_}; }
  operator DenseTensor<T, R>() { return view(); }
  operator DenseTensor<const T, R>() const { return view(); }
  T* data() { return buf_.data(); }
  const T* data() const { return buf_.data(); }
  std::size_t size() const { return buf_.size(); }
  std::size_t extent(std::size_t r) const { return ext_.extent(r); }

 private:
  Buffer<T> buf_;
  dextents<R> ext_{std::array<std::size_t, R>{}};
};

namespace detail {
/// How a LazyZeros mapping is paged: huge (2 MiB transparent huge pages, where the kernel grants them: fewest
/// TLB misses, committed 2 MiB at a time) or small (4 KiB pages, MADV_NOHUGEPAGE: committed 4 KiB at a time).
enum class PageSize { huge, small };

/// n zero elements of T whose pages take memory only when first written: an anonymous private mapping
/// (Linux), else a zero-filled Buffer. The KV cache and the Arena: memory sized for the most a context or a
/// pass can use, of which a resident set counts only what was used.
template <class T>
class LazyZeros {
 public:
  LazyZeros() = default;
  explicit LazyZeros(std::size_t n, PageSize pages = PageSize::huge) : n_(n) {
#if defined(__linux__) && defined(MAP_ANONYMOUS) && defined(MAP_NORESERVE)
    if (n == 0) return;
    if (n > SIZE_MAX / sizeof(T)) fail("kiln: ", n, " elements overflow size_t");
    void* p =
        ::mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("kiln: out of memory mapping ", n * sizeof(T), " bytes");
    map_ = static_cast<T*>(p);
    if (pages == PageSize::huge) advise_huge_pages(p, n * sizeof(T));
#ifdef MADV_NOHUGEPAGE
    else (void)::madvise(p, n * sizeof(T), MADV_NOHUGEPAGE);  // also where THP is "always"
#endif
#else
    (void)pages;
    buf_ = Buffer<T>(n);
#endif
  }
  LazyZeros(const LazyZeros&) = delete;
  LazyZeros& operator=(const LazyZeros&) = delete;
  LazyZeros(LazyZeros&& o) noexcept
      : n_(std::exchange(o.n_, 0)), map_(std::exchange(o.map_, nullptr)), buf_(std::move(o.buf_)) {}
  LazyZeros& operator=(LazyZeros&& o) noexcept {
    if (this != &o) {
      release();
      n_ = std::exchange(o.n_, 0);
      map_ = std::exchange(o.map_, nullptr);
      buf_ = std::move(o.buf_);
    }
    return *this;
  }
  ~LazyZeros() { release(); }
  T* data() { return map_ ? map_ : buf_.data(); }
  const T* data() const { return map_ ? map_ : buf_.data(); }
  std::size_t size() const { return n_; }

 private:
  void release() {
#if defined(__linux__) && defined(MAP_ANONYMOUS)
    if (map_) ::munmap(map_, n_ * sizeof(T));
#endif
    map_ = nullptr;
  }
  std::size_t n_ = 0;
  T* map_ = nullptr;
  Buffer<T> buf_;
};

/// A kernel's grow-only scratch (kept per thread by its owner): get(n) returns at least n elements of T,
/// 64-byte aligned; the contents do not survive a call that grows it. Its memory is its own mapping of
/// 4 KiB pages (LazyZeros): growing returns the old pages to the system rather than leaving them in a
/// malloc arena, and what a call never writes takes no memory. Under AddressSanitizer it is a heap block,
/// whose redzones catch a kernel writing past its scratch.
template <class T>
class Scratch {
 public:
  T* get(std::size_t n) {
    if (size() < n) {
      n = std::max(n, size() + size() / 2);
      if constexpr (KILN_DETAIL_ASAN != 0) heap_ = Buffer<T>(n);
      else map_ = LazyZeros<T>(n, PageSize::small);
    }
    return KILN_DETAIL_ASAN != 0 ? heap_.data() : map_.data();
  }

 private:
  std::size_t size() const { return KILN_DETAIL_ASAN != 0 ? heap_.size() : map_.size(); }
  Buffer<T> heap_;    // under AddressSanitizer (the same members in every translation unit)
  LazyZeros<T> map_;  // otherwise
};
}  // namespace detail

/// Bump allocator over one 64-byte-aligned block: alloc<T>(dims...) returns an aligned, row-major view;
/// reset() releases everything at once. Exhaustion throws (it never falls back to the heap). The block is
/// sized for the largest pass (a full prompt batch) but committed as it is first written (detail::LazyZeros):
/// a pass lays out its activations from the start, sized for its own rows, so a server whose steps carry a
/// few rows holds the pages those rows reach, not the whole block.
class Arena {
 public:
  Arena() = default;
  explicit Arena(std::size_t bytes) : buf_(bytes), cap_(bytes) {}

  template <class T, class... I>
  DenseTensor<T, sizeof...(I)> alloc(I... dims) {
    const std::size_t n = detail::checked_product(dims...);
    if (n > SIZE_MAX / sizeof(T)) fail("kiln::Arena: allocation overflows size_t");
    const std::size_t bytes = detail::align_up(n * sizeof(T));
    if (bytes > cap_ - used_)
      fail("kiln::Arena: out of space: asked for ", bytes, " bytes with ", cap_ - used_, " of ", cap_, " free");
    T* p = reinterpret_cast<T*>(buf_.data() + used_);
    used_ += bytes;
    if (used_ > high_water_) high_water_ = used_;
    return make_tensor(p, dims...);
  }

  void reset() { used_ = 0; }
  std::size_t used() const { return used_; }
  std::size_t capacity() const { return cap_; }
  std::size_t high_water() const { return high_water_; }

  /// Bytes an alloc of n elements of T takes (for sizing an arena up front).
  template <class T>
  static std::size_t bytes_for(std::size_t n) {
    return detail::align_up(n * sizeof(T));
  }

 private:
  detail::LazyZeros<std::byte> buf_;
  std::size_t cap_ = 0;
  std::size_t used_ = 0;
  std::size_t high_water_ = 0;
};

}  // namespace kiln
