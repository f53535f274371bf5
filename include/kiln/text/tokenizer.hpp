// kiln/text/tokenizer.hpp - the tokenizers of GGUF files and HF tokenizer.json files:
//   * SentencePiece-style BPE with byte fallback (GGUF `tokenizer.ggml.model = llama`, llama2.c's tokenizer
//     files), encoding and decoding as llama.cpp does (llm_tokenizer_spm);
//   * byte-level BPE (GGUF `tokenizer.ggml.model = gpt2`; tokenizer.json with a ByteLevel BPE model, see
//     text/hf_tokenizer.hpp), exact against Hugging Face tokenizers: text/pretokenize.hpp splits the text,
//     text/bpe.hpp merges each piece.
//
// Both start the same way: text -> fragments. User-defined tokens (HF: added tokens that are not special)
// are always cut out of the text as those tokens; control tokens (HF: special added tokens) only with
// parse_special. At each position the longest token text that starts there wins (HF's leftmost-longest).
//
// SentencePiece encoding of each text fragment:
//   1. a fragment that follows a special token or the start gets a leading space when the vocabulary
//      says add_space_prefix (SentencePiece's add_dummy_prefix); spaces become "▁" (U+2581).
//   2. the fragment is split into UTF-8 characters (a byte's length from its lead nibble, as llama.cpp
//      does, so stray continuation bytes are single symbols). Repeatedly, the adjacent pair whose
//      concatenation is a vocabulary token with the highest score is merged (ties: the leftmost pair).
//   3. a final symbol that is not a token is emitted as byte-fallback tokens <0xNN>, one per byte (the
//      unknown token when the vocabulary has no byte tokens).
//   (Gemma 3's 262144-token vocabulary encodes as transformers' conversion of it: tests/text/test_bpe.cpp.)
// Byte-level BPE: each text fragment is NFC-normalized if the vocabulary says so (text/nfc.hpp), then
// pre-tokenized (Vocabulary::pre) and each piece BPE-encoded (text/bpe.hpp). Invalid UTF-8 is kept: each
// bad byte is a non-letter character to the pre-tokenizer and its own byte to BPE, so token_bytes of the
// ids give the input back exactly (HF cannot take such input; Python would first turn it into U+FFFD).
//   BOS is prepended when asked and the vocabulary's add_bos says so; EOS appended likewise (add_eos).
//
// Decoding (SPM): normal tokens are their text with "▁" -> " "; byte tokens are their byte; control tokens
// are empty unless rendered as special; unknown tokens render as "▅" (U+2585, as llama.cpp).
// Decoding (BPE): normal tokens are the bytes their characters spell (HF's ByteLevel decoder);
// user-defined tokens are their text; control tokens are empty unless rendered as special.
// token_bytes(id) gives one token's bytes (possibly part of a UTF-8 character: text/utf8.hpp's
// Utf8Stream reassembles them); decode(ids) gives the whole text with invalid bytes as U+FFFD.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/io/llama2c.hpp"
#include "kiln/text/bpe.hpp"
#include "kiln/text/nfc.hpp"
#include "kiln/text/pretokenize.hpp"
#include "kiln/text/unicode.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln {

/// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type; a byte each: a vocabulary's types
/// are 256 KiB for Gemma 3's 262,144 tokens).
enum class TokenType : uint8_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6
};

/// The encoding algorithm.
enum class TokenizerModel : uint8_t {
  spm,  ///< SentencePiece-style BPE by piece scores, with byte fallback (GGUF "llama")
  bpe,  ///< byte-level BPE by merge ranks (GGUF "gpt2", HF ByteLevel + BPE)
};

/// Everything a Tokenizer is built from.
struct Vocabulary {
  /// Token texts as stored ("▁" for spaces, "<0x0A>" for bytes; BPE: "Ġ"). A Tokenizer keeps them in one
  /// arena instead: empty in its vocabulary() (Tokenizer::piece).
  std::vector<std::string> pieces;
  std::vector<float> scores;                       ///< SPM merge priority: higher merges first (BPE: unused)
  std::vector<TokenType> types;                    ///< empty: all normal
  int32_t bos = -1, eos = -1, unk = -1, eot = -1;  ///< -1: none
  bool add_bos = true, add_eos = false, add_space_prefix = true;
  TokenizerModel model = TokenizerModel::spm;
  // Byte-level BPE only:
  PreTokenizer pre = PreTokenizer::gpt2;
  /// (left, right) texts, rank order. A Tokenizer turns them into token-id ranks: empty in its vocabulary().
  std::vector<std::pair<std::string, std::string>> merges;
  bool ignore_merges = false;  ///< a piece that is a whole token is that token (Llama 3)
  bool nfc = false;            ///< NFC-normalize text fragments first (Qwen2/Qwen3 tokenizer.json)
};

/// How Tokenizer::encode reads a text.
struct EncodeOptions {
  bool add_special = true;     ///< prepend BOS (and append EOS) as the vocabulary says
  bool parse_special = false;  ///< control token texts in the text become those tokens (user-defined ones always do)
};

/// How Tokenizer::token_bytes and decode show tokens.
struct DecodeOptions {
  bool render_special = false;  ///< control tokens as their text (else they add nothing)
};

class Tokenizer {
 public:
  Tokenizer() = default;

  explicit Tokenizer(Vocabulary v) : v_(std::move(v)) {
    const std::size_t n = v_.pieces.size();
    if (n == 0) fail<FormatError>("kiln::Tokenizer: empty vocabulary");
    if (v_.scores.empty()) v_.scores.assign(n, 0.0f);
    if (v_.types.empty()) v_.types.assign(n, TokenType::normal);
    if (v_.scores.size() != n || v_.types.size() != n)
      fail<FormatError>("kiln::Tokenizer: ", n, " pieces but ", v_.scores.size(), " scores and ", v_.types.size(),
                        " token types");
    for (int32_t* id : {&v_.bos, &v_.eos, &v_.unk, &v_.eot})
      if (*id >= int32_t(n) || *id < -1)
        fail<FormatError>("kiln::Tokenizer: special token id ", *id, " is outside the vocabulary of ", n);
    if (n > kMaxPieces)
      fail<FormatError>("kiln::Tokenizer: ", n, " pieces are too many (the piece index holds ", kMaxPieces, ")");
    const bool byte_level = v_.model == TokenizerModel::bpe;
    byte_ids_.fill(-1);
    std::size_t slots = 16;
    while (slots < n + n / 2) slots *= 2;  // load factor <= 2/3
    // The pieces in one arena (Gemma 3's 262,144 std::strings were 8 MiB of string objects alone).
    std::size_t total = 0;
    for (const std::string& p : v_.pieces) total += p.size();
    if (total >= std::size_t(UINT32_MAX)) fail<FormatError>("kiln::Tokenizer: the token texts exceed 4 GiB");
    pieces_.reserve(total);
    piece_end_.reserve(n);
    for (const std::string& p : v_.pieces) {
      pieces_ += p;
      piece_end_.push_back(uint32_t(pieces_.size()));
    }
    std::vector<std::string>().swap(v_.pieces);
    index_.assign(slots, Slot{0});
    bytes_.resize(n);
    std::string decoded;
    for (std::size_t i = 0; i < n; ++i) {
      const std::string_view p = piece_at(i);
      const TokenType t = v_.types[i];
      if (t != TokenType::unused || !p.empty()) index_insert(int32_t(i));  // the first duplicate wins
      if (byte_level && (t == TokenType::normal || t == TokenType::undefined)) {
        decoded = text::ByteAlphabet::get().decode(p);
      } else if ((byte_level && t == TokenType::unknown) || t == TokenType::user_defined) {
        decoded.assign(p);
      } else if (t == TokenType::byte) {
        const int b = parse_byte_piece(p);
        if (b < 0) fail<FormatError>("kiln::Tokenizer: byte token ", i, " has text '", p, "' (expected <0xNN>)");
        if (byte_ids_[std::size_t(b)] < 0) byte_ids_[std::size_t(b)] = int32_t(i);
        decoded.assign(1, char(b));
      } else if (t == TokenType::control || t == TokenType::unused) {
        decoded.clear();
      } else if (t == TokenType::unknown) {
        decoded = "\xE2\x96\x85";  // U+2585, llama.cpp's rendering of <unk>
      } else {
        decoded = unescape_whitespace(p);
      }
      // Most tokens decode to their own text: only the others keep their bytes, in one arena.
      if (decoded != p) {
        if (bytes_arena_.size() + decoded.size() >= std::size_t(UINT32_MAX))
          fail<FormatError>("kiln::Tokenizer: the decoded token texts exceed 4 GiB");
        bytes_[i] = {uint32_t(bytes_arena_.size()), uint32_t(decoded.size())};
        bytes_arena_ += decoded;
      }
      if ((t == TokenType::control || t == TokenType::user_defined) && !p.empty())
        special_[static_cast<unsigned char>(p[0])].push_back(int32_t(i));
    }
    bytes_arena_.shrink_to_fit();
    for (auto& list : special_)
      std::stable_sort(list.begin(), list.end(),
                       [&](int32_t a, int32_t b) { return piece_at(a).size() > piece_at(b).size(); });
    if (byte_level) {
      for (int b = 0; b < 256; ++b)
        byte_ids_[std::size_t(b)] = lookup(text::ByteAlphabet::get().spell(static_cast<unsigned char>(b)));
      merges_ = text::BpeMerges(v_.merges, [&](const std::string& p) { return lookup(p); });
      // The ranks now live in merges_ (token ids): the texts go (SmolLM2's 48,900 pairs are 3 MiB).
      std::vector<std::pair<std::string, std::string>>().swap(v_.merges);
    }
  }

  /// From a GGUF file's tokenizer.ggml.* metadata: model "llama" (SentencePiece BPE) or "gpt2" (byte-level
  /// BPE with the pre-tokenizer named by tokenizer.ggml.pre).
  static Tokenizer from_gguf(const io::GGUFFile& f) {
    const auto model = f.get<std::string>("tokenizer.ggml.model");
    if (model != "llama" && model != "gpt2")
      fail<FormatError>("kiln::Tokenizer: GGUF file '", f.name(), "' has tokenizer.ggml.model = '", model,
                        "'; supported: 'llama' (SentencePiece BPE), 'gpt2' (byte-level BPE)");
    const bool byte_level = model == "gpt2";
    Vocabulary v;
    v.pieces = f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
    if (!byte_level) v.scores = f.get_or<std::vector<float>>("tokenizer.ggml.scores", {});
    for (int32_t t : f.get_or<std::vector<int32_t>>("tokenizer.ggml.token_type", {}))
      v.types.push_back(t < 0 || t > 6 ? TokenType::normal : TokenType(t));
    auto id = [&](std::string_view key, int32_t dflt) {
      const auto x = f.find<int64_t>(key);
      if (!x) return dflt;
      if (*x >= 0 && *x < int64_t(v.pieces.size())) return int32_t(*x);
      // -1 and 0xFFFFFFFF (llama.cpp's LLAMA_TOKEN_NULL written as uint32) say "none"; anything else is a
      // broken file, read as none too but said.
      if (*x != -1 && *x != 0xFFFFFFFF)
        warn("GGUF file '", f.name(), "': ", key, " = ", *x, " is outside the vocabulary of ", v.pieces.size(),
             " tokens; the model has no such token");
      return int32_t(-1);
    };
    v.bos = id("tokenizer.ggml.bos_token_id", byte_level ? -1 : 1);  // llama.cpp's SPM defaults
    v.eos = id("tokenizer.ggml.eos_token_id", byte_level ? -1 : 2);
    // BPE: a byte with no token is dropped (llama.cpp and HF), never the file's unknown token (SmolLM2's is
    // <|endoftext|>).
    v.unk = byte_level ? -1 : id("tokenizer.ggml.unknown_token_id", 0);
    v.eot = id("tokenizer.ggml.eot_token_id", -1);
    const text::GgufPreTokenizer* pre = nullptr;
    if (byte_level) {
      const auto name = f.get_or<std::string>("tokenizer.ggml.pre", "default");
      pre = text::find_gguf_pre_tokenizer(name);
      if (!pre) {
        std::string names;
        for (const auto& e : text::gguf_pre_tokenizers) (names += names.empty() ? "'" : ", '").append(e.name) += "'";
        fail<FormatError>("kiln::Tokenizer: GGUF file '", f.name(), "' has tokenizer.ggml.pre = '", name,
                          "', a pre-tokenizer kiln does not have; supported: ", names);
      }
    }
    v.add_bos = f.get_or<bool>("tokenizer.ggml.add_bos_token", byte_level ? pre->add_bos : true);
    v.add_eos = f.get_or<bool>("tokenizer.ggml.add_eos_token", false);
    v.add_space_prefix = !byte_level && f.get_or<bool>("tokenizer.ggml.add_space_prefix", true);
    if (byte_level) {
      v.model = TokenizerModel::bpe;
      v.pre = pre->pre;
      v.ignore_merges = pre->ignore_merges;  // as llama.cpp (Llama 3's and Tekken's tokenizer.json say so too)
      const auto merges = f.get<std::vector<std::string>>("tokenizer.ggml.merges");
      v.merges.reserve(merges.size());
      for (std::size_t r = 0; r < merges.size(); ++r) {
        const std::string& m = merges[r];
        const std::size_t sp = m.find(' ', 1);  // as llama.cpp: the first space after the first character
        if (sp == std::string::npos)
          fail<FormatError>("kiln::Tokenizer: GGUF file '", f.name(), "': tokenizer.ggml.merges[", r, "] = '", m,
                            "' is not two tokens separated by a space");
        v.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
      }
      try {
        return Tokenizer(std::move(v));
      } catch (const FormatError& e) {
        fail<FormatError>("kiln: GGUF file '", f.name(), "': ", e.what());
      }
    }
    return Tokenizer(std::move(v));
  }

#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
  /// From a Hugging Face tokenizer.json with a byte-level BPE model (text/hf_tokenizer.hpp); a
  /// tokenizer_config.json beside it, when present, names the BOS and EOS tokens.
  static Tokenizer from_hf_json(const std::filesystem::path& tokenizer_json);
#endif

  /// The pre-tokenizer a tokenizer.ggml.pre value means (text::gguf_pre_tokenizers lists them all).
  static std::optional<PreTokenizer> gguf_pre_tokenizer(std::string_view pre) {
    const auto* e = text::find_gguf_pre_tokenizer(pre);
    return e ? std::optional<PreTokenizer>(e->pre) : std::nullopt;
  }

  /// From a llama2.c tokenizer file: spaces become "▁"; token 0 is <unk>, 1 BOS, 2 EOS; <0xNN> are bytes.
  static Tokenizer from_llama2c(const io::Llama2cVocab& lv) {
    Vocabulary v;
    v.scores = lv.scores;
    for (std::size_t i = 0; i < lv.pieces.size(); ++i) {
      std::string p = lv.pieces[i];
      TokenType t = TokenType::normal;
      if (i == 0) t = TokenType::unknown;
      else if (i == 1 || i == 2) t = TokenType::control;
      else if (parse_byte_piece(p) >= 0) t = TokenType::byte;
      if (t == TokenType::control) p = i == 1 ? "<s>" : "</s>";  // stored as "\n<s>\n" / "\n</s>\n"
      else if (t == TokenType::normal) p = escape_whitespace(p);
      v.pieces.push_back(std::move(p));
      v.types.push_back(t);
    }
    if (v.pieces.size() < 3) fail<FormatError>("kiln::Tokenizer: a llama2.c vocabulary needs at least 3 tokens");
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
    return Tokenizer(std::move(v));
  }

  std::size_t size() const { return piece_end_.size(); }
  int32_t bos() const { return v_.bos; }
  int32_t eos() const { return v_.eos; }
  int32_t unk() const { return v_.unk; }
  bool add_bos() const { return v_.add_bos && v_.bos >= 0; }
  TokenizerModel model() const { return v_.model; }
  const Vocabulary& vocabulary() const { return v_; }
  /// End of generation: EOS or EOT.
  bool is_eog(int32_t id) const { return id >= 0 && (id == v_.eos || id == v_.eot); }
  TokenType type(int32_t id) const { return v_.types.at(std::size_t(id)); }
  /// The stored text of a token ("▁Once", "<0x0A>", "<s>").
  std::string_view piece(int32_t id) const {
    check_id(id);
    return piece_at(std::size_t(id));
  }
  /// The bytes a token decodes to (may be part of a UTF-8 character). Never allocates.
  std::string_view token_bytes(int32_t id, DecodeOptions o = {}) const {
    check_id(id);
    if (o.render_special && v_.types[std::size_t(id)] == TokenType::control) return piece_at(std::size_t(id));
    const ByteSpan b = bytes_[std::size_t(id)];
    if (b.off == ByteSpan::kPiece) return piece_at(std::size_t(id));
    return std::string_view(bytes_arena_).substr(b.off, b.len);
  }
  /// The token of an exact piece text, or -1.
  int32_t find(std::string_view piece) const { return lookup(piece); }

  /// Token ids for text (EncodeOptions: BOS/EOS, control token texts).
  std::vector<int32_t> encode(std::string_view text, EncodeOptions o = {}) const {
    return encode_impl(text, o.add_special, o.parse_special, {});
  }

  /// A rendered chat (ChatTemplate::render_marked) as the template's tokens: control token texts are
  /// recognised in the template's markup only, never inside a message's content (prompt.content), so no
  /// message can forge a turn. Outside the contents it is encode(text, {.add_special = false, .parse_special = true}). P: kiln::ChatPrompt
  /// (anything with .text and .content, the sorted byte ranges [first, second) of message text).
  template <class P>
  std::vector<int32_t> encode_chat(const P& prompt) const {
    return encode_impl(prompt.text, false, true, prompt.content);
  }

 private:
  std::vector<int32_t> encode_impl(std::string_view text, bool add_special, bool parse_special,
                                   std::span<const std::pair<std::size_t, std::size_t>> plain) const {
    // Whether a control token matched at [i, i + len) touches message text (then it is text itself).
    auto in_plain = [&](std::size_t i, std::size_t len) {
      for (const auto& [a, b] : plain)
        if (i < b && a < i + len) return true;
      return false;
    };
    std::vector<int32_t> out;
    if (add_special && add_bos()) out.push_back(v_.bos);
    bool prev_special = true;  // the start counts as "after a special token": it gets the space prefix
    auto raw = [&](std::string_view frag) {
      if (frag.empty()) return;
      if (v_.model == TokenizerModel::bpe) {
        bpe(frag, out);
      } else {
        std::string s;
        if (v_.add_space_prefix && prev_special) s = " ";
        s += frag;
        spm(escape_whitespace(s), out);
      }
      prev_special = false;
    };
    std::size_t i = 0, start = 0;
    while (i < text.size()) {
      int32_t hit = -1;
      for (int32_t s : special_[static_cast<unsigned char>(text[i])]) {  // longest first
        const bool control = v_.types[std::size_t(s)] == TokenType::control;
        if (!parse_special && control) continue;
        const std::string_view p = piece_at(std::size_t(s));
        if (text.compare(i, p.size(), p) == 0 && !(control && in_plain(i, p.size()))) {
          hit = s;
          break;
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      raw(text.substr(start, i - start));
      out.push_back(hit);
      prev_special = true;
      i += piece_at(std::size_t(hit)).size();
      start = i;
    }
    raw(text.substr(start));
    if (add_special && v_.add_eos && v_.eos >= 0) out.push_back(v_.eos);
    return out;
  }

 public:
  /// Text of a sequence of tokens: their bytes concatenated, ill-formed UTF-8 replaced by U+FFFD.
  std::string decode(std::span<const int32_t> ids, DecodeOptions o = {}) const {
    std::string bytes;
    for (int32_t id : ids) bytes += token_bytes(id, o);
    return text::sanitize_utf8(bytes);
  }

  static std::string escape_whitespace(std::string_view s) {
    std::string o;
    o.reserve(s.size());
    for (char c : s) {
      if (c == ' ') o += "\xE2\x96\x81";  // U+2581 "▁"
      else o += c;
    }
    return o;
  }
  static std::string unescape_whitespace(std::string_view s) {
    std::string o;
    o.reserve(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s.compare(i, 3, "\xE2\x96\x81") == 0) {
        o += ' ';
        i += 2;
      } else o += s[i];
    }
    return o;
  }
  /// 0..255 for "<0xNN>" (hex digits in either case), else -1.
  static int parse_byte_piece(std::string_view p) {
    if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = hex(p[3]), lo = hex(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
  }

 private:
  void check_id(int32_t id) const {
    if (id < 0 || std::size_t(id) >= piece_end_.size())
      fail("kiln::Tokenizer: token id ", id, " is outside the vocabulary of ", piece_end_.size());
  }
  // Token i's piece: pieces_[piece_end_[i - 1], piece_end_[i]).
  std::string_view piece_at(std::size_t i) const {
    const uint32_t b = i == 0 ? 0 : piece_end_[i - 1];
    return std::string_view(pieces_).substr(b, piece_end_[i] - b);
  }

  // The piece index: open addressing with linear probing over token ids, so it holds no copy of any piece
  // and stays valid when the Tokenizer is copied or moved (ids index the copy's own pieces).
  // A slot: id + 1 in the low 24 bits (0: empty) and the hash's top 8 bits above them, so that most probes
  // of other pieces end without a string compare (4 bytes a slot: Gemma 3's 262,144 pieces take 2 MiB).
  using Slot = uint32_t;
  static constexpr std::size_t kMaxPieces = (std::size_t{1} << 24) - 1;
  static constexpr uint32_t kTagMask = 0xff000000u;
  static uint32_t slot_tag(uint64_t h) { return uint32_t(h >> 56) << 24; }
  static int32_t slot_id(Slot s) { return int32_t(s & ~kTagMask) - 1; }
  static uint64_t hash(std::string_view s) { return std::hash<std::string_view>{}(s); }

  void index_insert(int32_t id) {
    const std::string_view p = piece_at(std::size_t(id));
    const uint64_t h = hash(p);
    const std::size_t mask = index_.size() - 1;
    const uint32_t tag = slot_tag(h);
    for (std::size_t i = std::size_t(h) & mask;; i = (i + 1) & mask) {
      Slot& s = index_[i];
      if (s == 0) {
        s = tag | (uint32_t(id) + 1);
        return;
      }
      if ((s & kTagMask) == tag && piece_at(std::size_t(slot_id(s))) == p) return;  // the first duplicate wins
    }
  }

  int32_t lookup(std::string_view p) const {
    if (index_.empty()) return -1;
    const uint64_t h = hash(p);
    const std::size_t mask = index_.size() - 1;
    const uint32_t tag = slot_tag(h);
    for (std::size_t i = std::size_t(h) & mask;; i = (i + 1) & mask) {
      const Slot s = index_[i];
      if (s == 0) return -1;
      if ((s & kTagMask) == tag && piece_at(std::size_t(slot_id(s))) == p) return slot_id(s);
    }
  }

  // Byte-level BPE of one text fragment: pre-tokenize, then merge each piece's bytes.
  void bpe(std::string_view frag, std::vector<int32_t>& out) const {
    std::string normalized;
    if (v_.nfc) {
      normalized = text::nfc(frag);
      frag = normalized;
    }
    text::CodePoints cps;
    cps.assign(frag);
    std::vector<std::size_t> ends;
    text::pre_tokenize(v_.pre, cps, ends);
    std::vector<int32_t> sym;
    std::string spelled;
    std::size_t b = 0;
    for (const std::size_t e : ends) {
      const std::string_view piece = frag.substr(cps.offsets[b], cps.offsets[e] - cps.offsets[b]);
      b = e;
      if (v_.ignore_merges) {
        spelled.clear();
        for (char c : piece) spelled += text::ByteAlphabet::get().spell(static_cast<unsigned char>(c));
        if (const int32_t id = lookup(spelled); id >= 0) {
          out.push_back(id);
          continue;
        }
      }
      sym.clear();
      for (char c : piece) {
        const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
        if (id >= 0) sym.push_back(id);
        else if (v_.unk >= 0) sym.push_back(v_.unk);  // no unknown token: the byte is dropped, as in HF
      }
      merges_.apply(sym);
      out.insert(out.end(), sym.begin(), sym.end());
    }
  }

  // llama.cpp's llm_tokenizer_spm on one escaped fragment.
  void spm(const std::string& text, std::vector<int32_t>& out) const {
    struct Symbol {
      int prev, next;
      std::size_t pos, n;
    };
    static constexpr std::size_t kUtf8Len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    std::vector<Symbol> sym;
    for (std::size_t off = 0; off < text.size();) {
      const std::size_t len = std::min(kUtf8Len[static_cast<unsigned char>(text[off]) >> 4], text.size() - off);
      const int idx = int(sym.size());
      sym.push_back({idx - 1, off + len == text.size() ? -1 : idx + 1, off, len});
      off += len;
    }
    struct Bigram {
      int left, right;
      float score;
      std::size_t size;
    };
    auto worse = [](const Bigram& a, const Bigram& b) {  // max-heap: highest score, then leftmost
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
    auto try_add = [&](int l, int r) {
      if (l < 0 || r < 0) return;
      const std::string_view s(text.data() + sym[l].pos, sym[l].n + sym[r].n);
      const int32_t id = lookup(s);
      if (id < 0) return;
      queue.push({l, r, v_.scores[std::size_t(id)], s.size()});
    };
    for (int i = 1; i < int(sym.size()); ++i) try_add(i - 1, i);
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      Symbol& r = sym[b.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale: one side was merged since
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }
    for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[i].next) {
      const std::string_view s(text.data() + sym[i].pos, sym[i].n);
      const int32_t id = lookup(s);
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      for (char c : s) {  // only single characters can fail to be tokens: merges always form tokens
        const int32_t bid = byte_ids_[static_cast<unsigned char>(c)];
        out.push_back(bid >= 0 ? bid : v_.unk >= 0 ? v_.unk : 0);
      }
    }
  }

  // A token's decoded bytes: its piece text (most tokens), or bytes_arena_[off, off + len).
  struct ByteSpan {
    static constexpr uint32_t kPiece = UINT32_MAX;
    uint32_t off = kPiece, len = 0;
  };

  Vocabulary v_;                                   // pieces empty: they are in pieces_
  std::string pieces_;                             // every token's piece, one after another
  std::vector<uint32_t> piece_end_;                // per token: the end of its piece in pieces_
  std::vector<Slot> index_;                        // power-of-two size; empty for a default-constructed one
  std::vector<ByteSpan> bytes_;                    // per token
  std::string bytes_arena_;                        // the decoded bytes of tokens whose bytes differ from the piece
  std::array<int32_t, 256> byte_ids_{};            // SPM: <0xNN> tokens; BPE: the tokens of single byte characters
  std::array<std::vector<int32_t>, 256> special_;  // control and user-defined tokens by first byte, longest first
  text::BpeMerges merges_;
};

}  // namespace kiln

#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#include "kiln/text/hf_tokenizer.hpp"
#endif
