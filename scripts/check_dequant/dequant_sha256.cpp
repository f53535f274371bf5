// dequant_sha256 MODEL.gguf MANIFEST.tsv - dequantizes every tensor listed in the manifest (written by
// gguf_dequant_sha256.py: name, ggml type id, element count, absolute data offset, gguf-py's sha256 of
// the f32 values) with kiln and compares the sha256 of kiln's f32 output. Prints each mismatch and a
// per-type summary; exits 1 on any mismatch or error. Built and run by scripts/check_dequant_models.sh.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/quant/convert.hpp"

namespace {

/// SHA-256 (FIPS 180-4), streaming.
class Sha256 {
 public:
  void update(const uint8_t* p, std::size_t n) {
    total_ += n;
    while (n) {
      const std::size_t take = std::min(n, std::size_t(64) - fill_);
      std::memcpy(buf_ + fill_, p, take);
      fill_ += take, p += take, n -= take;
      if (fill_ == 64) block(buf_), fill_ = 0;
    }
  }
  std::string hex() {
    const uint64_t bits = total_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
    update(len, 8);
    std::string s;
    char b[9];
    for (uint32_t v : h_) std::snprintf(b, sizeof b, "%08x", v), s += b;
    return s;
  }

 private:
  static uint32_t rotr(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }
  void block(const uint8_t* p) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    auto [a, b, c, d, e, f, g, h] = h_;
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    const std::array<uint32_t, 8> add{a, b, c, d, e, f, g, h};
    for (int i = 0; i < 8; ++i) h_[i] += add[i];
  }
  std::array<uint32_t, 8> h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf_[64]{};
  std::size_t fill_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const void* p, std::size_t n) {
  Sha256 s;
  s.update(static_cast<const uint8_t*>(p), n);
  return s.hex();
}

}  // namespace

int main(int argc, char** argv) {
  if (sha256_hex("abc", 3) != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" ||
      sha256_hex("", 0) != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") {
    std::cerr << "dequant_sha256: the SHA-256 self-test failed\n";
    return 1;
  }
  if (argc != 3) {
    std::cerr << "usage: dequant_sha256 MODEL.gguf MANIFEST.tsv\n";
    return 2;
  }
  std::ifstream model(argv[1], std::ios::binary);
  std::ifstream manifest(argv[2]);
  if (!model || !manifest) {
    std::cerr << "dequant_sha256: cannot open " << (model ? argv[2] : argv[1]) << "\n";
    return 1;
  }
  std::map<uint32_t, std::pair<int, int>> per_type;  // type -> (matched, mismatched)
  int bad = 0, n_lines = 0;
  std::vector<uint8_t> raw;
  std::vector<float> out;
  for (std::string line; std::getline(manifest, line);) {
    std::istringstream ls(line);
    std::string name, want;
    uint32_t type = 0;
    std::size_t n = 0;
    uint64_t offset = 0;
    if (!(ls >> name >> type >> n >> offset >> want)) {
      std::cerr << "dequant_sha256: bad manifest line: " << line << "\n";
      return 1;
    }
    ++n_lines;
    try {
      const auto info = kiln::io::ggml_type_info(type);
      if (!info.known() || n % info.block_size != 0) kiln::fail<kiln::FormatError>("unknown type or a partial block");
      raw.resize(n / info.block_size * info.type_size);
      model.seekg(std::streamoff(offset));
      model.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
      if (!model) kiln::fail<kiln::FormatError>("tensor data past the end of the file");
      out.assign(n, 0.f);
      kiln::dequantize_row(kiln::io::GGMLType(type), raw.data(), out.data(), n);  // vector data is 16-byte aligned
      const std::string got = sha256_hex(out.data(), n * sizeof(float));
      if (got == want) {
        ++per_type[type].first;
      } else {
        ++per_type[type].second, ++bad;
        std::cerr << "MISMATCH " << name << " (type " << type << ", " << n << " values): kiln " << got << " gguf-py "
                  << want << "\n";
      }
    } catch (const std::exception& e) {
      ++per_type[type].second, ++bad;
      std::cerr << "ERROR " << name << ": " << e.what() << "\n";
    }
  }
  if (n_lines == 0) {
    std::cerr << "dequant_sha256: empty manifest " << argv[2] << "\n";
    return 1;
  }
  for (auto& [type, c] : per_type)
    std::cout << "  ggml type " << type << ": " << c.first << " tensors match, " << c.second << " differ\n";
  return bad ? 1 : 0;
}
