// kiln/generate/constraint.hpp - a Grammar at the token level: which tokens may come next, and when the
// output is complete (see generate/grammar.hpp for the matcher, generate/json_schema.hpp for JSON).
//
// A TokenTrie holds the vocabulary's token bytes in a byte trie, once per vocabulary (shared by every
// sequence). Control tokens have no bytes (they are never allowed) unless given as `render` (tool-call
// markers such as <tool_call> or <|python_tag|>, whose text the reply keeps); end-of-generation tokens are
// allowed only when the output is complete. A Constraint is one sequence's matcher over that trie.
//
// Whole tokens (Grammar::token / token_not): a token that the grammar names in a token element is matched
// only as that token, never by its bytes, even where `render` gives it text (so text cannot forge it); any
// other token by its bytes or by a token_not element. End-of-generation tokens are never taken by a token
// element. A token id beyond the vocabulary is refused when the Constraint is made.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/generate/grammar.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln {

class TokenTrie {
 public:
  /// bytes[id]: token id's bytes (empty: never allowed); eog: the end-of-generation tokens.
  TokenTrie(const std::vector<std::string>& bytes, std::vector<int32_t> eog) : eog_(std::move(eog)) {
    vocab_ = bytes.size();
    offs_.reserve(bytes.size() + 1);
    for (const auto& b : bytes) {
      offs_.push_back(uint32_t(arena_.size()));
      arena_ += b;
    }
    offs_.push_back(uint32_t(arena_.size()));
    std::vector<int32_t> ids;
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (!bytes[i].empty()) ids.push_back(int32_t(i));
    std::sort(ids.begin(), ids.end(),
              [&](int32_t a, int32_t b) { return token(a) < token(b) || (token(a) == token(b) && a < b); });
    // Preorder: a node's subtree is the nodes [i, end); the sorted tokens arrive in preorder too, so each
    // node's tokens are one range of toks_.
    nodes_.push_back({0, 0, 0, 0, 0});  // the root (no byte)
    std::vector<uint32_t> path = {0};   // the nodes from the root to the last token's node
    for (int32_t id : ids) {
      const std::string_view s = token(id);
      std::size_t common = 0;  // bytes shared with the path
      while (common + 1 < path.size() && common < s.size() && nodes_[path[common + 1]].byte == uint8_t(s[common]))
        ++common;
      while (path.size() > common + 1) {
        nodes_[path.back()].end = uint32_t(nodes_.size());
        path.pop_back();
      }
      for (std::size_t k = common; k < s.size(); ++k) {
        nodes_.push_back({uint8_t(s[k]), uint16_t(std::min<std::size_t>(k + 1, 65535)), 0, uint32_t(toks_.size()),
                          uint32_t(toks_.size())});
        path.push_back(uint32_t(nodes_.size() - 1));
      }
      toks_.push_back(id);
      nodes_[path.back()].tok_end = uint32_t(toks_.size());
    }
    while (!path.empty()) {
      nodes_[path.back()].end = uint32_t(nodes_.size());
      path.pop_back();
    }
    for (std::size_t i = 1; i < nodes_.size(); ++i) max_depth_ = std::max<std::size_t>(max_depth_, nodes_[i].depth);
    if (max_depth_ >= 65535) fail("kiln::TokenTrie: a token of 65535 bytes or more");
  }

  /// The tokenizer's vocabulary: each token's bytes (control tokens: none, unless in `render`, where they
  /// are their text).
  static std::shared_ptr<const TokenTrie> of(const Tokenizer& tok, std::span<const int32_t> render = {}) {
    std::vector<std::string> bytes(tok.size());
    for (std::size_t i = 0; i < tok.size(); ++i) {
      const auto id = int32_t(i);
      const bool r = std::find(render.begin(), render.end(), id) != render.end();
      if (tok.type(id) == TokenType::control && !r) continue;
      bytes[i] = std::string(tok.token_bytes(id, {.render_special = r}));
    }
    std::vector<int32_t> eog;
    for (int32_t id : {tok.eos(), tok.vocabulary().eot})
      if (id >= 0 && std::find(eog.begin(), eog.end(), id) == eog.end()) eog.push_back(id);
    return std::make_shared<const TokenTrie>(bytes, std::move(eog));
  }

  std::size_t vocab() const { return vocab_; }
  std::string_view token(int32_t id) const {
    return std::string_view(arena_).substr(offs_[std::size_t(id)], offs_[std::size_t(id) + 1] - offs_[std::size_t(id)]);
  }
  bool is_eog(int32_t id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }
  std::span<const int32_t> eog() const { return eog_; }
  std::size_t nodes() const { return nodes_.size(); }
  std::size_t bytes() const {
    return arena_.size() + offs_.size() * 4 + nodes_.size() * sizeof(Node) + toks_.size() * 4;
  }

 private:
  friend class Constraint;
  struct Node {
    uint8_t byte;
    uint16_t depth;
    uint32_t end;                 // one past the subtree (preorder)
    uint32_t tok_begin, tok_end;  // the tokens whose bytes end here
  };
  std::size_t vocab_ = 0;
  std::string arena_;
  std::vector<uint32_t> offs_;
  std::vector<Node> nodes_;
  std::vector<int32_t> toks_;
  std::vector<int32_t> eog_;
  std::size_t max_depth_ = 0;
};

/// One sequence's constraint: a GrammarMatcher over a TokenTrie's tokens.
class Constraint {
 public:
  Constraint(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenTrie> trie)
      : m_(std::move(g)), trie_(std::move(trie)) {
    if (!trie_) fail("kiln::Constraint: no vocabulary trie");
    for (const auto& t : m_.grammar().token_elems()) {
      if (std::size_t(t.id) >= trie_->vocab())
        fail("kiln::Constraint: the grammar names token ", t.id, ", beyond the vocabulary's ", trie_->vocab(),
             " tokens");
      if (std::find(named_.begin(), named_.end(), t.id) == named_.end()) named_.push_back(t.id);
    }
    std::sort(named_.begin(), named_.end());
    states_.resize(trie_->max_depth_ + 1);
    flags_.assign(trie_->vocab(), 0);
    marks_.resize(trie_->max_depth_ + 2);
  }
  const TokenTrie& trie() const { return *trie_; }
  std::size_t vocab() const { return trie_->vocab(); }

  /// The output so far is a whole sentence (an end-of-generation token is allowed).
  bool complete() const { return m_.complete(); }
  /// Complete, and no byte or token may follow: generation is over.
  bool finished() const { return m_.complete() && m_.next_bytes().empty() && !m_.takes_tokens(); }

  /// Whether token id may come next.
  bool allows(int32_t id) {
    if (id < 0 || std::size_t(id) >= trie_->vocab()) return false;
    const std::string_view b = trie_->token(id);
    if (trie_->is_eog(id)) return b.empty() || named(id) ? m_.complete() : m_.allows(b);  // (never taken whole)
    if (named_.empty()) return !b.empty() && m_.allows(b);
    return m_.allows_token(id, bytes_of(id));
  }
  /// Takes token id (false: not allowed; nothing changes). An end-of-generation token changes nothing.
  bool accept(int32_t id) {
    if (!allows(id)) return false;
    const std::string_view b = trie_->token(id);
    if (trie_->is_eog(id) && (b.empty() || named(id))) return true;
    if (named_.empty() || trie_->is_eog(id)) m_.accept(b);
    else m_.accept_token(id, bytes_of(id));
    return true;
  }
  /// Takes text that the prompt forced (a template's prefix): false if the grammar refuses it.
  bool accept_text(std::string_view text) { return m_.accept(text); }

  /// Every token that may come next, ascending ids, into `out` (cleared). The last few masks are kept by
  /// state: inside a string the state repeats from character to character, and its mask (most of the
  /// vocabulary, the costliest to walk) is computed once.
  void mask(std::vector<int32_t>& out) {
    const bool keyed = m_.signature(sig_, 256);
    if (keyed)
      for (auto& e : memo_)
        if (e.sig == sig_) {
          e.used = ++clock_;
          out = e.mask;
          return;
        }
    walk(out);
    if (!keyed) return;
    Memo* slot = memo_.size() < kMemo ? &memo_.emplace_back() : nullptr;
    if (!slot)
      slot =
          &*std::min_element(memo_.begin(), memo_.end(), [](const Memo& a, const Memo& b) { return a.used < b.used; });
    slot->sig = sig_;
    slot->mask = out;
    slot->used = ++clock_;
  }

 private:
  static constexpr std::size_t kMemo = 8;

  bool named(int32_t id) const { return std::binary_search(named_.begin(), named_.end(), id); }
  // A token's bytes for the byte elements: none for a token the grammar names (or one without bytes).
  std::optional<std::string_view> bytes_of(int32_t id) const {
    const std::string_view b = trie_->token(id);
    if (b.empty() || named(id)) return std::nullopt;
    return b;
  }
  // Appends the tokens that the token elements which may come next take (end-of-generation ones aside):
  // token(T) takes T, token_not(T) every token but T.
  void whole_tokens(std::vector<int32_t>& out) {
    m_.next_token_elems(elems_);
    if (elems_.empty()) return;
    const auto te = m_.grammar().token_elems();
    int32_t only_not = -1;  // the token every token_not element refuses (-1: none, -2: they differ)
    for (uint32_t e : elems_) {
      if (!te[e].negated) {
        if (!trie_->is_eog(te[e].id)) out.push_back(te[e].id);
      } else {
        only_not = only_not == -1 || only_not == te[e].id ? te[e].id : -2;
      }
    }
    if (only_not != -1) {  // nearly every token: all ids but the refused one (unless a token element takes it)
      const bool refused_taken =
          std::any_of(elems_.begin(), elems_.end(), [&](uint32_t e) { return !te[e].negated && te[e].id == only_not; });
      for (std::size_t id = 0; id < trie_->vocab(); ++id)
        if ((int32_t(id) != only_not || refused_taken) && !trie_->is_eog(int32_t(id))) out.push_back(int32_t(id));
    }
  }
  struct Memo {
    std::vector<uint32_t> sig;
    std::vector<int32_t> mask;
    uint64_t used = 0;
  };

  void walk(std::vector<int32_t>& out) {
    out.clear();
    steps_.clear();
    const auto& nodes = trie_->nodes_;
    const std::size_t base = m_.pool_mark();
    states_[0].assign(m_.tops().begin(), m_.tops().end());
    marks_[1] = base;
    for (std::size_t i = 1; i < nodes.size();) {
      const auto& n = nodes[i];
      const std::size_t d = n.depth;
      m_.pool_release(marks_[d]);
      advance(states_[d - 1], n.byte, states_[d], base);
      if (states_[d].empty()) {
        i = n.end;
        continue;
      }
      out.insert(out.end(), trie_->toks_.begin() + n.tok_begin, trie_->toks_.begin() + n.tok_end);
      marks_[d + 1] = m_.pool_mark();
      ++i;
    }
    m_.pool_release(base);
    if (!named_.empty()) {  // named tokens: never by their bytes; then the ones the token elements take
      std::erase_if(out, [&](int32_t id) { return named(id); });
      whole_tokens(out);
    }
    if (m_.complete())
      for (int32_t id : trie_->eog()) out.push_back(id);
    if (out.size() < flags_.size() / 32) {
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());  // (a token by its bytes and whole)
      return;
    }
    for (int32_t id : out) flags_[std::size_t(id)] = 1;  // many: ascending by a scan (a sort costs more)
    out.clear();
    for (std::size_t id = 0; id < flags_.size(); ++id)
      if (flags_[id]) {
        out.push_back(int32_t(id));
        flags_[id] = 0;
      }
  }

  // m_.advance, remembered for a one-stack state made of nodes that outlive the walk (those below `base`):
  // inside a string the state after a plain character is the same stack, so most of the walk is lookups.
  void advance(const std::vector<int32_t>& in, uint8_t b, std::vector<int32_t>& out, std::size_t base) {
    if (in.size() != 1 || in[0] < 0 || std::size_t(in[0]) >= base) return m_.advance(in, b, out);
    Step* memo = nullptr;
    for (auto& e : steps_)
      if (e.from == in[0]) memo = &e;
    if (!memo) {
      memo = &steps_.emplace_back();
      memo->from = in[0];
      memo->to.fill(kUnknown);
    }
    int32_t& r = memo->to[b];
    if (r == kRefused) return out.clear();
    if (r >= -1) {
      out.assign(1, r);
      return;
    }
    m_.advance(in, b, out);
    if (out.empty()) r = kRefused;
    else if (out.size() == 1 && out[0] >= -1 && std::size_t(out[0] + 1) <= base) r = out[0];  // (-1: the empty stack)
    else r = kUncached;
  }
  static constexpr int32_t kUnknown = -2, kRefused = -3, kUncached = -4;
  struct Step {
    int32_t from;
    std::array<int32_t, 256> to;
  };

  GrammarMatcher m_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<std::vector<int32_t>> states_;  // the trie walk's matcher states per depth
  std::vector<std::size_t> marks_;            // the pool's size before each depth's stacks
  std::vector<uint32_t> sig_;
  std::vector<Memo> memo_;      // the last kMemo masks by state signature
  std::vector<Step> steps_;     // one walk's remembered steps
  std::vector<uint8_t> flags_;  // vocab zeros: the walk's allowed tokens, collected in id order
  std::vector<int32_t> named_;  // the token ids the grammar's token elements name (ascending)
  std::vector<uint32_t> elems_;
  uint64_t clock_ = 0;
};

}  // namespace kiln
