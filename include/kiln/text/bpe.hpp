// kiln/text/bpe.hpp - byte-level BPE (GPT-2's scheme; GGUF tokenizer.ggml.model = gpt2, HF ByteLevel + BPE).
//
// Every byte of a pre-tokenized piece is spelled as one printable character (GPT-2's bytes_to_unicode:
// the bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves, the other 68 become U+0100..U+0143
// in order, so a space is "Ġ" and a newline "Ċ"); the vocabulary and the merges are written in that
// alphabet. A piece starts as one symbol per byte; then, as HF tokenizers' BPE does, the adjacent pair
// whose merge has the lowest rank (its index in the merges list) is merged, ties going to the leftmost
// pair, until no adjacent pair has a merge. With ignore_merges (Llama 3), a piece that is a whole token
// is that token at once. A byte whose character is not in the vocabulary becomes the unknown token, or
// is dropped when there is none (as HF does).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln::text {

/// GPT-2's bytes_to_unicode: the code point that spells byte b.
constexpr char32_t byte_to_code_point(unsigned char b) {
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
  int n = 0;  // rank of b among the bytes that are remapped
  for (int x = 0; x < b; ++x)
    if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++n;
  return char32_t(0x100 + n);
}

/// The byte-level alphabet: UTF-8 spelling of each byte, and the inverse.
class ByteAlphabet {
 public:
  ByteAlphabet() {
    inverse_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = byte_to_code_point(static_cast<unsigned char>(b));
      std::string& s = spell_[std::size_t(b)];
      if (cp < 0x80) {
        s = char(cp);
      } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
      }
      inverse_[cp] = int16_t(b);
    }
  }
  const std::string& spell(unsigned char b) const { return spell_[b]; }
  /// The byte a code point spells, or -1 when it is not in the alphabet.
  int byte_of(char32_t cp) const { return cp < inverse_.size() ? inverse_[cp] : -1; }

  /// A token's text back to bytes (HF's ByteLevel decoder): when every character is in the alphabet,
  /// the bytes they spell; otherwise the text itself. Invalid UTF-8 in the text: the text itself.
  std::string decode(std::string_view piece) const {
    std::string out;
    for (std::size_t i = 0; i < piece.size();) {
      const auto c0 = static_cast<unsigned char>(piece[i]);
      char32_t cp;
      if (c0 < 0x80) {
        cp = c0;
        i += 1;
      } else if ((c0 & 0xE0) == 0xC0 && i + 1 < piece.size()) {
        cp = (char32_t(c0 & 0x1F) << 6) | (static_cast<unsigned char>(piece[i + 1]) & 0x3F);
        i += 2;
      } else {
        return std::string(piece);  // 3- and 4-byte characters are never in the alphabet
      }
      const int b = byte_of(cp);
      if (b < 0) return std::string(piece);
      out += char(b);
    }
    return out;
  }

  static const ByteAlphabet& get() {
    static const ByteAlphabet a;
    return a;
  }

 private:
  std::array<std::string, 256> spell_;
  std::array<int16_t, 0x144> inverse_;
};

/// Merge ranks over token ids and the per-piece merge loop.
class BpeMerges {
 public:
  BpeMerges() = default;

  /// merges[r] = (left, right) texts of rank r; lookup(text) gives a token id or -1. A merge whose parts
  /// or result are not tokens is an error (as in HF). A repeated pair keeps its last rank (as HF).
  template <class Lookup>
  BpeMerges(const std::vector<std::pair<std::string, std::string>>& merges, Lookup&& lookup) {
    ranks_.reserve(merges.size());
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const auto& [a, b] = merges[r];
      const int32_t ia = lookup(a), ib = lookup(b), iab = lookup(a + b);
      if (ia < 0 || ib < 0 || iab < 0)
        fail<FormatError>("kiln::Tokenizer: BPE merge ", r, " ('", a, "' + '", b, "'): '",
                          ia < 0   ? a
                          : ib < 0 ? b
                                   : a + b,
                          "' is not in the vocabulary");
      ranks_.insert_or_assign(key(ia, ib), Merge{uint32_t(r), iab});
    }
  }

  std::size_t size() const { return ranks_.size(); }

  /// Merges symbols (token ids of one piece, in order) in place.
  void apply(std::vector<int32_t>& sym) const {
    if (sym.size() < 2) return;
    struct Node {
      int32_t id;
      int prev, next;
    };
    std::vector<Node> nodes;
    nodes.reserve(sym.size());
    for (std::size_t i = 0; i < sym.size(); ++i)
      nodes.push_back({sym[i], int(i) - 1, i + 1 < sym.size() ? int(i) + 1 : -1});
    struct Cand {
      uint32_t rank;
      int pos;
      int32_t left, right;  // the pair when queued: stale entries are skipped
    };
    auto worse = [](const Cand& x, const Cand& y) { return x.rank > y.rank || (x.rank == y.rank && x.pos > y.pos); };
    std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> queue(worse);
    auto push = [&](int l) {
      if (l < 0 || nodes[std::size_t(l)].next < 0) return;
      const int32_t a = nodes[std::size_t(l)].id, b = nodes[std::size_t(nodes[std::size_t(l)].next)].id;
      const auto it = ranks_.find(key(a, b));
      if (it != ranks_.end()) queue.push({it->second.rank, l, a, b});
    };
    for (int i = 0; i + 1 < int(nodes.size()); ++i) push(i);
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      Node& l = nodes[std::size_t(c.pos)];
      if (l.id < 0 || l.next < 0 || l.id != c.left || nodes[std::size_t(l.next)].id != c.right) continue;
      Node& r = nodes[std::size_t(l.next)];
      l.id = ranks_.find(key(c.left, c.right))->second.id;
      r.id = -1;
      l.next = r.next;
      if (r.next >= 0) nodes[std::size_t(r.next)].prev = c.pos;
      push(l.prev);
      push(c.pos);
    }
    sym.clear();
    for (int i = 0; i >= 0; i = nodes[std::size_t(i)].next) sym.push_back(nodes[std::size_t(i)].id);
  }

 private:
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  std::unordered_map<uint64_t, Merge> ranks_;
};

}  // namespace kiln::text
