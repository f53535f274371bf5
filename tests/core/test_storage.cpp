// kiln/core/storage.hpp: Buffer and Storage (64-byte alignment, zero fill, moves) and Arena (alignment,
// exhaustion, reset, high water, and no heap allocation per alloc) and Scratch.
//
// This file replaces the global operator new/delete for the whole test executable with counting
// versions that forward to malloc/free, so the Arena test can prove it never reaches the heap.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "counting_new.hpp"
#include "test_util.hpp"

using namespace kiln;

namespace {
bool aligned64(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 64 == 0; }
}  // namespace

TEST_CASE("the counting operator new is the one in use") {
  const long before = kiln::test::heap_allocs.load();
  void* p = ::operator new(16);  // a direct call: a new-expression's allocation may be elided
  ::operator delete(p);
  Buffer<float> b(5);  // aligned nothrow new
  CHECK(kiln::test::heap_allocs.load() == before + 2);
}

TEST_CASE("Buffer: 64-byte aligned, zero-filled, every size and dtype") {
  for (std::size_t n : {1, 2, 3, 15, 16, 17, 63, 64, 65, 1000, 4097}) {
    CAPTURE(n);
    Buffer<float> f(n);
    Buffer<bf16> h(n);
    Buffer<int8_t> q(n);
    CHECK(aligned64(f.data()));
    CHECK(aligned64(h.data()));
    CHECK(aligned64(q.data()));
    CHECK(f.size() == n);
    bool zero = true;
    for (std::size_t i = 0; i < n; ++i) zero = zero && f[i] == 0.f && h[i].bits == 0 && q[i] == 0;
    CHECK(zero);
    f[n - 1] = 1.f;  // the whole range is writable (ASan checks the end)
  }
  Buffer<float> empty(0);
  CHECK(empty.size() == 0);
  CHECK(empty.data() == nullptr);
  CHECK_THROWS_AS(Buffer<float>(SIZE_MAX / 2), Error);  // size overflow is an error, not a wrap
}

TEST_CASE("zero_fill: large sizes (split over threads) clear every byte, the pieces' edges included") {
  // From 64 MiB up zero_fill splits the range over threads in 2 MiB pieces: sizes around the split points
  // and with tails, over memory that starts out all ones, and the bytes just past the end untouched.
  for (std::size_t n : {std::size_t{64} << 20, (std::size_t{96} << 20) + 12345, (std::size_t{130} << 20) + 1}) {
    CAPTURE(n);
    std::vector<unsigned char> v(n + 64, 0xFF);
    detail::zero_fill(v.data(), n);
    CHECK(std::all_of(v.begin(), v.begin() + std::ptrdiff_t(n), [](unsigned char c) { return c == 0; }));
    CHECK(std::all_of(v.begin() + std::ptrdiff_t(n), v.end(), [](unsigned char c) { return c == 0xFF; }));
  }
  Buffer<std::byte> big((std::size_t{72} << 20) + 3);
  CHECK(std::all_of(big.begin(), big.end(), [](std::byte c) { return c == std::byte{0}; }));
}

TEST_CASE("Buffer: moves transfer ownership and leave the source empty") {
  Buffer<float> a(100);
  a[7] = 7.f;
  float* p = a.data();
  Buffer<float> b(std::move(a));
  CHECK(b.data() == p);
  CHECK(b.size() == 100);
  CHECK(b[7] == 7.f);
  CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  CHECK(a.size() == 0);
  Buffer<float> c(10);
  c = std::move(b);  // frees c's old block (ASan's leak check would report it otherwise)
  CHECK(c.data() == p);
  CHECK(b.data() == nullptr);
  Buffer<float>& alias = c;
  c = std::move(alias);  // self-move keeps the buffer
  CHECK(c.data() == p);
  auto v = c.view(10, 10);
  CHECK(v.data() == p);
  CHECK(v(0, 7) == 7.f);
  CHECK_THROWS_AS(c.view(9, 10), ShapeError);
}

TEST_CASE("Storage: shaped, aligned, movable, converts to views") {
  Storage<float, 3> s(2, 3, 5);
  CHECK(aligned64(s.data()));
  CHECK(s.size() == 30);
  CHECK(s.extent(2) == 5);
  DenseTensor<float, 3> v = s;
  CHECK(v.shape() == std::array<std::size_t, 3>{2, 3, 5});
  v(1, 2, 4) = 9.f;
  const Storage<float, 3>& cs = s;
  DenseTensor<const float, 3> cv = cs;
  CHECK(cv(1, 2, 4) == 9.f);
  float* p = s.data();
  Storage<float, 3> m = std::move(s);
  CHECK(m.data() == p);
  CHECK(m.view()(1, 2, 4) == 9.f);
  CHECK(m.extent(0) == 2);
}

TEST_CASE("Arena: aligned views, exhaustion throws, reset reuses, high water") {
  Arena arena(1024);
  CHECK(arena.capacity() == 1024);
  auto a = arena.alloc<float>(3);    // 12 bytes -> 64
  auto b = arena.alloc<bf16>(5, 7);  // 70 bytes -> 128
  auto c = arena.alloc<int8_t>(1);   // 1 byte -> 64
  CHECK(aligned64(a.data()));
  CHECK(aligned64(b.data()));
  CHECK(aligned64(c.data()));
  static_assert(std::is_same_v<decltype(b), DenseTensor<bf16, 2>>, "alloc gives a row-major view");
  CHECK(b.shape() == std::array<std::size_t, 2>{5, 7});
  CHECK(reinterpret_cast<std::byte*>(b.data()) == reinterpret_cast<std::byte*>(a.data()) + 64);
  CHECK(arena.used() == 64 + 128 + 64);
  CHECK(Arena::bytes_for<bf16>(35) == 128);
  b(4, 6) = bf16(1.f);  // last element writable

  CHECK_THROWS_WITH_AS(arena.alloc<float>(200), doctest::Contains("out of space"), Error);  // 800 > 768 free
  CHECK(arena.used() == 256);        // a failed alloc takes nothing
  auto d = arena.alloc<float>(192);  // exactly the rest
  CHECK(arena.used() == 1024);
  CHECK_THROWS_AS(arena.alloc<int8_t>(1), Error);
  d(191) = 1.f;
  CHECK(arena.high_water() == 1024);

  arena.reset();
  CHECK(arena.used() == 0);
  auto e = arena.alloc<float>(3);
  CHECK(e.data() == a.data());                               // reuses the same memory
  CHECK(arena.high_water() == 1024);                         // high water survives reset
  CHECK_THROWS_AS(arena.alloc<float>(SIZE_MAX / 2), Error);  // overflow, not a wrap
  Arena none;
  CHECK_THROWS_AS(none.alloc<float>(1), Error);
}

TEST_CASE("Arena: alloc and reset never touch the heap") {
  Arena arena(1 << 20);
  std::size_t worst = 0;
  const long before = kiln::test::heap_allocs.load();
  for (int step = 0; step < 100; ++step) {
    arena.reset();
    for (std::size_t n = 1; n < 40; ++n) {
      auto t = arena.alloc<float>(n, 3);
      t(n - 1, 2) = 1.f;
      auto u = arena.alloc<bf16>(n);
      u(n - 1) = bf16(2.f);
    }
    worst = std::max(worst, arena.used());
  }
  const long after = kiln::test::heap_allocs.load();
  CHECK(after == before);
  CHECK(arena.high_water() == worst);
}

TEST_CASE("Scratch: at least n aligned zeroed elements; kept until a larger n; growing takes no heap outside ASan") {
  detail::Scratch<float> s;
  CHECK(s.get(0) == nullptr);
  const long before = kiln::test::heap_allocs.load();
  float* a = s.get(1000);
  REQUIRE(a != nullptr);
  CHECK(aligned64(a));
  CHECK(std::all_of(a, a + 1000, [](float v) { return v == 0.0f; }));  // fresh memory reads as zeros
  std::fill_n(a, 1000, 7.0f);                                          // every element writable
  CHECK(s.get(10) == a);                                               // no growth: the same memory
  CHECK(s.get(1000) == a);
  float* b = s.get(100000);  // grows: at least 100000 elements, fresh
  REQUIRE(b != nullptr);
  CHECK(aligned64(b));
  CHECK(std::all_of(b, b + 100000, [](float v) { return v == 0.0f; }));
  b[99999] = 1.0f;
  CHECK(s.get(1001) == b);  // within the grown size: kept
  // Its own mapping (the memory a growth leaves goes back to the system, not to a malloc arena); a heap
  // block under AddressSanitizer, whose redzones catch a kernel writing past its scratch.
#if defined(__linux__)
  constexpr bool mapped = KILN_DETAIL_ASAN == 0;
#else
  constexpr bool mapped = false;
#endif
  CHECK((kiln::test::heap_allocs.load() == before) == mapped);
}
