// Replaces the global operator new/delete of the test executable whose one file includes this header
// with versions that count every allocation (kiln::test::heap_allocs) and forward to malloc/free, so a
// test can prove that a code path never reaches the heap. Include it from exactly one file per
// executable: the operators are ordinary (non-inline) definitions.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace kiln::test {
/// Calls of any operator new since the program started.
inline std::atomic<long> heap_allocs{0};

inline void* counted_alloc(std::size_t n, std::size_t align) noexcept {
  heap_allocs.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}
inline void* counted_or_throw(std::size_t n, std::size_t align) {
  if (void* p = counted_alloc(n, align)) return p;
  throw std::bad_alloc();
}
}  // namespace kiln::test

void* operator new(std::size_t n) { return kiln::test::counted_or_throw(n, 0); }
void* operator new[](std::size_t n) { return kiln::test::counted_or_throw(n, 0); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return kiln::test::counted_alloc(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return kiln::test::counted_alloc(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return kiln::test::counted_or_throw(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return kiln::test::counted_or_throw(n, std::size_t(a)); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return kiln::test::counted_alloc(n, std::size_t(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return kiln::test::counted_alloc(n, std::size_t(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
