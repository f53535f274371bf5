// tests/quant/quant_fixture.hpp - reads the gguf-py fixtures written by
// scripts/fixtures/make_quant_fixtures.py (tests/fixtures/quant/, layouts described there).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kiln/quant/convert.hpp"
#include "test_util.hpp"

namespace kiln::test {

inline std::string quant_fixture_path(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/quant/" + name;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) FAIL("missing fixture ", path, " (regenerate with scripts/fixtures/make_quant_fixtures.py)");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The per-record notes (.txt next to the .bin), one line each.
inline std::vector<std::string> read_notes(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  return lines;
}

/// A fixture split into n records of `in_bytes` input followed by n records of `out_bytes` output.
struct Records {
  std::vector<uint8_t> in, out;
  std::vector<std::string> notes;
  std::size_t n = 0;
  std::string note(std::size_t i) const { return i < notes.size() ? notes[i] : std::to_string(i); }
};

inline Records read_records(const std::string& stem, std::size_t in_bytes, std::size_t out_bytes) {
  const auto bytes = read_bytes(quant_fixture_path(stem + ".bin"));
  Records r;
  r.n = bytes.size() / (in_bytes + out_bytes);
  REQUIRE_MESSAGE(r.n * (in_bytes + out_bytes) == bytes.size(), stem, ".bin: size ", bytes.size(),
                  " is not a whole number of records of ", in_bytes, " + ", out_bytes, " bytes");
  REQUIRE_MESSAGE(r.n > 0, stem, ".bin is empty");
  r.in.assign(bytes.begin(), bytes.begin() + std::ptrdiff_t(r.n * in_bytes));
  r.out.assign(bytes.begin() + std::ptrdiff_t(r.n * in_bytes), bytes.end());
  r.notes = read_notes(quant_fixture_path(stem + ".txt"));
  return r;
}

/// Bit-for-bit float comparison, except that two NaNs are equal whatever their sign and payload (the
/// CPU picks those; see make_quant_fixtures.py). Returns the index of the first difference or n.
inline std::size_t first_bit_difference(const float* got, const float* want, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) return i;
  }
  return n;
}

inline std::vector<float> as_floats(const uint8_t* p, std::size_t n) {
  std::vector<float> v(n);
  std::memcpy(v.data(), p, n * 4);
  return v;
}

}  // namespace kiln::test
