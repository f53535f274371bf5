// MappedFile: both load modes give the file's exact bytes, LoadMode::read is 64-byte aligned, moves keep
// the pointer, and errors name the file and the errno text.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "io_test_util.hpp"
#include "kiln/io/mmap.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {
Bytes pattern_bytes(std::size_t n) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  return b;
}
}  // namespace

TEST_CASE("MappedFile: map and read modes see the file's bytes") {
  for (std::size_t n : {std::size_t(1), std::size_t(4095), std::size_t(4096), std::size_t(100001)}) {
    CAPTURE(n);
    const auto path = temp_path("bytes.bin");
    const Bytes want = pattern_bytes(n);
    write_file(path, want);
    for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
      CAPTURE(int(mode));
      io::MappedFile f(path, mode);
      REQUIRE(f.size() == n);
      CHECK(std::memcmp(f.data(), want.data(), n) == 0);
      CHECK(f.path() == path.string());
      CHECK(f.mode() == mode);
      CHECK(f.is_mapped() == (mode == io::LoadMode::map));
      if (mode == io::LoadMode::read) CHECK(reinterpret_cast<std::uintptr_t>(f.data()) % 64 == 0);
      else CHECK(reinterpret_cast<std::uintptr_t>(f.data()) % 4096 == 0);  // mmap returns page-aligned addresses
      f.prefetch();
    }
  }
}

TEST_CASE("MappedFile: moving keeps the bytes at the same address") {
  const auto path = temp_path("move.bin");
  write_file(path, pattern_bytes(5000));
  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    io::MappedFile a(path, mode);
    const std::byte* p = a.data();
    io::MappedFile b(std::move(a));
    CHECK(b.data() == p);
    CHECK(b.size() == 5000);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    io::MappedFile c;
    c = std::move(b);
    CHECK(c.data() == p);
    CHECK(std::to_integer<int>(c.data()[4999]) == int((4999 * 131 + 7) & 0xff));
  }
}

TEST_CASE("MappedFile: an empty file has no bytes") {
  const auto path = temp_path("empty.bin");
  write_file(path, Bytes{});
  for (auto mode : {io::LoadMode::map, io::LoadMode::read}) {
    io::MappedFile f(path, mode);
    CHECK(f.size() == 0);
    CHECK(f.bytes().empty());
  }
}

TEST_CASE("MappedFile: errors name the file and the system's reason") {
  const auto missing = io_temp_dir() / "does_not_exist.gguf";
  CHECK_THROWS_WITH_AS(io::MappedFile{missing}, doctest::Contains("does_not_exist.gguf"), kiln::Error);
  CHECK_THROWS_WITH_AS(io::MappedFile{missing}, doctest::Contains("No such file or directory"), kiln::Error);
  CHECK_THROWS_WITH_AS(io::MappedFile(missing, io::LoadMode::read), doctest::Contains("cannot open"), kiln::Error);
  CHECK_THROWS_WITH_AS(io::MappedFile{io_temp_dir()}, doctest::Contains("is not a regular file"), kiln::Error);
}

namespace {
// The "THPeligible:" value of the mapping that holds address p in /proc/self/smaps (-1: not found).
int thp_eligible(const void* p) {
  std::ifstream in("/proc/self/smaps");
  REQUIRE_MESSAGE(in, "cannot read /proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    unsigned long long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::atoi(line.c_str() + 12);
    }
  }
  return -1;
}
}  // namespace

TEST_CASE("MappedFile: LoadMode::read of a large file (read by several threads) gets every byte, on huge pages") {
  // Over two 64 MiB read pieces plus a tail that is not a whole page: with 2+ cores, 2+ threads read it.
  const std::size_t n = (std::size_t{128} << 20) + 12345;
  const auto path = temp_path("large.bin");
  Bytes want(n);
  for (std::size_t i = 0; i < n; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    std::memcpy(want.data() + i, &v, std::min<std::size_t>(8, n - i));
  }
  write_file(path, want);
  io::MappedFile f(path, io::LoadMode::read);
  REQUIRE(f.size() == n);
  CHECK(std::memcmp(f.data(), want.data(), n) == 0);
  // Transparent huge pages were asked for (kiln::detail::advise_huge_pages), unless THP is off here.
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  const int eligible = thp_eligible(f.data() + (std::size_t{4} << 20));
  MESSAGE("THP mode: '" << mode << "', THPeligible of the buffer: " << eligible);
  if (mode.empty() || mode.find("[never]") != std::string::npos) CHECK(eligible <= 0);
  else CHECK(eligible == 1);
}

TEST_CASE("kiln::set_huge_pages(false): large buffers no longer ask for huge pages") {
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  REQUIRE(kiln::huge_pages());  // the default
  kiln::set_huge_pages(false);
  Buffer<std::byte> off(std::size_t{32} << 20);
  kiln::set_huge_pages(true);
  Buffer<std::byte> on(std::size_t{32} << 20);
  const int e_off = thp_eligible(off.data() + (std::size_t{4} << 20)),
            e_on = thp_eligible(on.data() + (std::size_t{4} << 20));
  MESSAGE("THP mode: '" << mode << "', THPeligible off: " << e_off << ", on: " << e_on);
  if (mode.find("[madvise]") != std::string::npos) {  // only madvise tells the two apart
    CHECK(e_off == 0);
    CHECK(e_on == 1);
  } else if (mode.find("[always]") != std::string::npos) {
    CHECK(e_on == 1);
  } else {
    CHECK(e_on <= 0);
  }
}
