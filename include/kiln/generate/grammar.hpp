// kiln/generate/grammar.hpp - constrained decoding: a context-free grammar over bytes, a matcher that
// follows the bytes generated so far, and the vocabulary's tokens that may come next.
//
//   auto g = kiln::json_schema_grammar(R"({"type": "object", ...})");        // generate/json_schema.hpp
//   kiln::TokenTrie trie(model.tokenizer());                                 // once per vocabulary
//   kiln::Constraint c(g, trie);                                             // one per sequence
//   c.allows(token); c.mask(allowed); c.accept(token); c.complete(); c.finished();
//
// A Grammar is a set of rules, each a list of alternatives, each a sequence of byte sets and rule
// references (no left recursion: refused at finish(), as is a root that matches no text). The matcher is a pushdown recognizer: its state is
// a set of stacks of grammar positions (several while the bytes so far fit several alternatives, as in
// llama.cpp's grammar sampler), kept as linked nodes in one pool so that advancing by a byte copies nothing.
// Rules are expanded lazily, only into the alternatives whose first bytes contain the next byte (first
// sets and nullability are computed at finish()), so a deterministic grammar keeps one stack. A rule
// reference at the end of an alternative pushes no return position (right recursion runs in constant
// stack depth: a list of a thousand items is as deep as one of one).
//
// Whole tokens: an element may also be one token of the vocabulary (token(id)) or any token but one
// (token_not(id)), llama.cpp's <[id]> and !<[id]>. It takes the token as a whole, never its text, so a
// grammar can ask for a control token such as gpt-oss's <|channel|> and a client's text cannot spell it
// (generate/constraint.hpp: a token that the grammar names is never matched by its bytes). Byte elements
// never match part of a token taken whole, nor a token element part of a token's bytes (as in llama.cpp).
//
// Token level: a token is allowed when the matcher accepts all of its bytes or a token element takes it; an
// end-of-generation token when the bytes so far are complete. Constraint::mask walks a byte trie of the
// vocabulary with the matcher state (a subtree is skipped as soon as its prefix is refused), so one mask
// costs about one matcher step per trie node that stays valid; Constraint::allows checks one token (the
// sampler checks candidates in logit order first, and builds the whole mask only when those run out:
// generate/sampler.hpp). Tokens are bytes: a token that is part of a UTF-8 character is allowed where the
// grammar's UTF-8 rules let the character complete.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln {

class Tokenizer;

/// A set of bytes (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1u; }
  ByteSet& add(uint8_t b) {
    w[b >> 6] |= uint64_t(1) << (b & 63);
    return *this;
  }
  ByteSet& add(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(uint8_t(b));
    return *this;
  }
  ByteSet& add(std::string_view bytes) {
    for (char c : bytes) add(uint8_t(c));
    return *this;
  }
  ByteSet& operator|=(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) w[i] |= o.w[i];
    return *this;
  }
  bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
  static ByteSet of(std::string_view bytes) { return ByteSet{}.add(bytes); }
  static ByteSet range(uint8_t lo, uint8_t hi) { return ByteSet{}.add(lo, hi); }
};

class Grammar {
 public:
  enum Kind : uint8_t { kEnd, kByte, kRef, kToken };
  /// One element of an alternative: a byte from a set, a rule, or a whole token.
  struct Sym {
    Kind kind = kByte;
    uint32_t arg = 0;  ///< the byte set's index, the rule's id or the token element's index
  };
  /// A token element: token `id`, or (negated) any token but `id`; end-of-generation tokens are never taken
  /// by one (they end the output: generate/constraint.hpp).
  struct TokenElem {
    int32_t id = 0;
    bool negated = false;
  };

  /// A new rule without alternatives (add them with alt()); `name` shows in errors.
  uint32_t rule(std::string name) {
    check_open();
    names_.push_back(std::move(name));
    alts_.emplace_back();
    return uint32_t(names_.size() - 1);
  }
  Sym bytes(const ByteSet& s) {
    check_open();
    const auto [it, fresh] = set_ids_.try_emplace(s.w, uint32_t(sets_.size()));
    if (fresh) sets_.push_back(s);
    return {kByte, it->second};
  }
  Sym ref(uint32_t rule) const { return {kRef, rule}; }
  /// The token `id` taken whole (never its text).
  Sym token(int32_t id) { return token_elem({id, false}); }
  /// Any one token but `id`, taken whole (llama.cpp's !<[id]>).
  Sym token_not(int32_t id) { return token_elem({id, true}); }
  /// The token elements (ascending by index: Sym::arg of token()).
  std::span<const TokenElem> token_elems() const { return tokens_; }
  /// The syms of a literal text (one byte each).
  std::vector<Sym> literal(std::string_view text) {
    std::vector<Sym> out;
    for (char c : text) out.push_back(bytes(ByteSet{}.add(uint8_t(c))));
    return out;
  }
  /// Adds the alternative `seq` (empty: the rule matches nothing) to `rule`.
  void alt(uint32_t rule, std::span<const Sym> seq) {
    check_open();
    if (rule >= alts_.size()) fail("kiln::Grammar: rule ", rule, " does not exist");
    alts_[rule].push_back(uint32_t(elems_.size()));
    for (const Sym& s : seq) {
      if (s.kind == kEnd) fail("kiln::Grammar: an alternative's element of no kind");
      elems_.push_back({s.kind, s.arg});
    }
    elems_.push_back({kEnd, 0});
  }
  void alt(uint32_t rule, std::initializer_list<Sym> seq) { alt(rule, std::span<const Sym>(seq.begin(), seq.size())); }

  /// Ends building with `root` as the start: computes first sets and nullability, refuses left recursion
  /// and rules without alternatives.
  void finish(uint32_t root);
  bool finished() const { return finished_; }
  uint32_t root() const { return root_; }
  std::size_t rules() const { return alts_.size(); }
  const std::string& name(uint32_t rule) const { return names_.at(rule); }

 private:
  friend class GrammarMatcher;
  Sym token_elem(TokenElem t) {
    check_open();
    if (t.id < 0) fail("kiln::Grammar: token id ", t.id, " is negative");
    for (std::size_t i = 0; i < tokens_.size(); ++i)
      if (tokens_[i].id == t.id && tokens_[i].negated == t.negated) return {kToken, uint32_t(i)};
    tokens_.push_back(t);
    return {kToken, uint32_t(tokens_.size() - 1)};
  }
  static void merge(std::vector<uint32_t>& into, const std::vector<uint32_t>& from) {
    for (uint32_t x : from)
      if (std::find(into.begin(), into.end(), x) == into.end()) into.push_back(x);
  }
  struct Elem {
    Kind kind;
    uint32_t arg;
  };
  void check_open() const {
    if (finished_) fail("kiln::Grammar: already finished");
  }

  std::vector<std::string> names_;
  std::vector<std::vector<uint32_t>> alts_;  // rule -> its alternatives' first positions in elems_
  std::vector<Elem> elems_;                  // the alternatives, each ended by kEnd
  std::vector<ByteSet> sets_;
  std::map<std::array<uint64_t, 4>, uint32_t> set_ids_;
  // finish(): per position, the bytes that can begin what remains of its alternative from there, and
  // whether that remainder can be empty; per rule, the same for the whole rule.
  std::vector<ByteSet> first_;
  std::vector<uint8_t> nullable_;
  std::vector<ByteSet> rule_first_;
  std::vector<uint8_t> rule_nullable_;
  // The token elements that can begin the remainder from a position / a rule (indices into tokens_).
  std::vector<TokenElem> tokens_;
  std::vector<std::vector<uint32_t>> tok_first_, rule_tok_first_;
  uint32_t root_ = 0;
  bool finished_ = false;
};

inline void Grammar::finish(uint32_t root) {
  check_open();
  if (root >= alts_.size()) fail("kiln::Grammar: root rule ", root, " does not exist");
  for (std::size_t r = 0; r < alts_.size(); ++r)
    if (alts_[r].empty()) fail("kiln::Grammar: rule '", names_[r], "' has no alternatives");
  const std::size_t nr = alts_.size();
  rule_first_.assign(nr, ByteSet{});
  rule_nullable_.assign(nr, 0);
  rule_tok_first_.assign(nr, {});
  for (bool changed = true; changed;) {  // fixed point of first sets (bytes and token elements) and nullability
    changed = false;
    for (std::size_t r = 0; r < nr; ++r)
      for (uint32_t a : alts_[r]) {
        ByteSet f;
        std::vector<uint32_t> t = rule_tok_first_[r];
        bool nullable = true;
        for (uint32_t p = a; elems_[p].kind != kEnd && nullable; ++p) {
          if (elems_[p].kind == kByte) {
            f |= sets_[elems_[p].arg];
            nullable = false;
          } else if (elems_[p].kind == kToken) {
            merge(t, {elems_[p].arg});
            nullable = false;
          } else {
            f |= rule_first_[elems_[p].arg];
            merge(t, rule_tok_first_[elems_[p].arg]);
            nullable = rule_nullable_[elems_[p].arg];
          }
        }
        ByteSet u = rule_first_[r];
        u |= f;
        if (!(u == rule_first_[r]) || (nullable && !rule_nullable_[r]) || t.size() != rule_tok_first_[r].size())
          changed = true;
        rule_first_[r] = u;
        rule_nullable_[r] |= uint8_t(nullable);
        rule_tok_first_[r] = std::move(t);
      }
  }
  first_.assign(elems_.size(), ByteSet{});
  nullable_.assign(elems_.size(), 1);
  tok_first_.assign(elems_.size(), {});
  for (std::size_t p = elems_.size(); p-- > 0;) {
    const Elem& e = elems_[p];
    if (e.kind == kEnd) continue;  // empty remainder: nullable, no first bytes
    if (e.kind == kByte) {
      first_[p] = sets_[e.arg];
      nullable_[p] = 0;
    } else if (e.kind == kToken) {
      tok_first_[p] = {e.arg};
      nullable_[p] = 0;
    } else {
      first_[p] = rule_first_[e.arg];
      tok_first_[p] = rule_tok_first_[e.arg];
      if (rule_nullable_[e.arg]) {
        first_[p] |= first_[p + 1];
        merge(tok_first_[p], tok_first_[p + 1]);
      }
      nullable_[p] = rule_nullable_[e.arg] && nullable_[p + 1];
    }
  }
  // Left recursion: a rule reachable from itself through leading references (those after a nullable prefix)
  // with at least one reference on the cycle that is not its alternative's last element (each trip round the
  // cycle would push a return position: the matcher's stacks would grow without a byte). A cycle of last
  // elements only pushes nothing (llama.cpp's `( [x]* )*`: the outer repetition's rule is reached again
  // through the inner one, which can be empty) and is allowed: the matcher steps each stack once per byte.
  // Found as a leading non-last reference inside one strongly connected component (Tarjan's algorithm).
  std::vector<int32_t> index(nr, -1), low(nr, 0), comp(nr, -1);
  std::vector<uint32_t> path;
  std::vector<uint8_t> on_path(nr, 0);
  int32_t counter = 0, comps = 0;
  auto leading = [&](uint32_t r, auto&& f) {  // f(position) for each leading reference of r
    for (uint32_t a : alts_[r])
      for (uint32_t p = a; elems_[p].kind == kRef; ++p) {
        f(p);
        if (!rule_nullable_[elems_[p].arg]) break;
      }
  };
  auto connect = [&](auto&& self, uint32_t r) -> void {
    index[r] = low[r] = counter++;
    path.push_back(r);
    on_path[r] = 1;
    leading(r, [&](uint32_t p) {
      const uint32_t s = elems_[p].arg;
      if (index[s] < 0) {
        self(self, s);
        low[r] = std::min(low[r], low[s]);
      } else if (on_path[s]) {
        low[r] = std::min(low[r], index[s]);
      }
    });
    if (low[r] == index[r]) {
      for (uint32_t s = UINT32_MAX; s != r;) {
        s = path.back();
        path.pop_back();
        on_path[s] = 0;
        comp[s] = comps;
      }
      ++comps;
    }
  };
  for (uint32_t r = 0; r < nr; ++r)
    if (index[r] < 0) connect(connect, r);
  for (uint32_t r = 0; r < nr; ++r)
    leading(r, [&](uint32_t p) {
      if (comp[elems_[p].arg] == comp[r] && elems_[p + 1].kind != kEnd)
        fail("kiln::Grammar: rule '", names_[r], "' is left-recursive");
    });
  // A root that matches no text at all (`root ::= a`, `a ::= a`; a $ref to itself): refused, as the output
  // could never be completed. (A dead alternative elsewhere is never entered: allowed, as in llama.cpp.)
  std::vector<uint8_t> productive(nr, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (std::size_t r = 0; r < nr; ++r) {
      for (uint32_t a : alts_[r]) {
        if (productive[r]) break;
        bool ok = true;
        for (uint32_t p = a; elems_[p].kind != kEnd && ok; ++p)
          ok = elems_[p].kind == kByte    ? !sets_[elems_[p].arg].empty()
               : elems_[p].kind == kToken ? true
                                          : productive[elems_[p].arg] != 0;
        if (ok) productive[r] = 1, changed = true;
      }
    }
  }
  if (!productive[root])
    fail("kiln::Grammar: the root rule '", names_[root],
         "' matches no text (every alternative needs a rule that matches none, such as a cycle that reads no byte)");
  root_ = root;
  finished_ = true;
}

/// The state of a Grammar over the bytes seen so far (see the top of this file).
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)) {
    if (!g_ || !g_->finished()) fail("kiln::GrammarMatcher: the grammar is not finished");
    reset();
  }
  const Grammar& grammar() const { return *g_; }

  /// Back to the start (no bytes seen).
  void reset() {
    pool_.clear();
    tops_.clear();
    const uint32_t root = g_->root_;
    for (uint32_t a : g_->alts_[root]) tops_.push_back(push(a, kEmpty));  // (an empty alternative: kEmpty)
    dedup(tops_);
  }

  /// Takes `bytes` if the grammar allows them after what was seen; false (state unchanged) if not.
  bool accept(std::string_view bytes) {
    const std::size_t mark = pool_.size();
    if (!advance_all(bytes, tops_, next_)) {
      pool_.resize(mark);
      return false;
    }
    tops_.swap(next_);
    if (pool_.size() > 4096 + 8 * tops_.size()) compact();
    return true;
  }
  /// Whether `bytes` could be taken now (nothing changes).
  bool allows(std::string_view bytes) {
    const std::size_t mark = pool_.size();
    const bool ok = advance_all(bytes, tops_, next_);
    pool_.resize(mark);
    return ok;
  }
  /// The bytes seen so far are a whole sentence of the grammar.
  bool complete() const {
    for (int32_t t : tops_)
      if (accepting(t)) return true;
    return false;
  }
  /// The bytes that may come next (empty: nothing can follow).
  ByteSet next_bytes() const {
    ByteSet out;
    for (int32_t t : tops_)
      for (int32_t n = t; n != kEmpty; n = pool_[std::size_t(n)].parent) {
        out |= g_->first_[pool_[std::size_t(n)].pos];
        if (!g_->nullable_[pool_[std::size_t(n)].pos]) break;
      }
    return out;
  }

  /// The token elements that may take the next token (indices into Grammar::token_elems(), into `out`).
  void next_token_elems(std::vector<uint32_t>& out) const {
    out.clear();
    for (int32_t t : tops_)
      for (int32_t n = t; n != kEmpty; n = pool_[std::size_t(n)].parent) {
        Grammar::merge(out, g_->tok_first_[pool_[std::size_t(n)].pos]);
        if (!g_->nullable_[pool_[std::size_t(n)].pos]) break;
      }
  }
  /// Whether a token element may take the next token.
  bool takes_tokens() const {
    if (g_->tokens_.empty()) return false;
    for (int32_t t : tops_)
      for (int32_t n = t; n != kEmpty; n = pool_[std::size_t(n)].parent) {
        if (!g_->tok_first_[pool_[std::size_t(n)].pos].empty()) return true;
        if (!g_->nullable_[pool_[std::size_t(n)].pos]) break;
      }
    return false;
  }

  /// Takes one whole token: `bytes` through the byte elements (none: nullopt; an empty text is never taken)
  /// and token `id` through the token elements; false (state unchanged) if neither takes it.
  bool accept_token(int32_t id, std::optional<std::string_view> bytes) {
    const std::size_t mark = pool_.size();
    if (!advance_token_all(id, bytes)) {
      pool_.resize(mark);
      return false;
    }
    tops_.swap(next_);
    if (pool_.size() > 4096 + 8 * tops_.size()) compact();
    return true;
  }
  /// Whether accept_token(id, bytes) would take it (nothing changes).
  bool allows_token(int32_t id, std::optional<std::string_view> bytes) {
    const std::size_t mark = pool_.size();
    const bool ok = advance_token_all(id, bytes);
    pool_.resize(mark);
    return ok;
  }

  /// The state's stacks as grammar positions, top first, each ended by UINT32_MAX (equal signatures: equal
  /// states); false (out unfinished) when it would exceed `limit` entries.
  bool signature(std::vector<uint32_t>& out, std::size_t limit) const {
    out.clear();
    for (int32_t t : tops_) {
      for (int32_t n = t; n != kEmpty; n = pool_[std::size_t(n)].parent) {
        if (out.size() >= limit) return false;
        out.push_back(pool_[std::size_t(n)].pos);
      }
      out.push_back(UINT32_MAX);
    }
    return true;
  }

  // The state as a set of stack tops, advanced byte by byte (Constraint's trie walk). Stacks made after
  // pool_mark() are dropped by pool_release().
  std::span<const int32_t> tops() const { return tops_; }
  std::size_t pool_mark() const { return pool_.size(); }
  void pool_release(std::size_t mark) { pool_.resize(mark); }
  /// Appends to `out` the stacks that `in` becomes after byte b (none: b is refused).
  void advance(std::span<const int32_t> in, uint8_t b, std::vector<int32_t>& out) {
    out.clear();
    if (++stamp_gen_ == 0) {  // (wrapped: forget every stamp)
      std::fill(stamp_.begin(), stamp_.end(), 0u);
      stamp_gen_ = 1;
    }
    for (int32_t t : in) step(t, b, out, 0);
    if (out.size() > 1) dedup(out);
  }
  bool accepting_any(std::span<const int32_t> in) const {
    for (int32_t t : in)
      if (accepting(t)) return true;
    return false;
  }

 private:
  static constexpr int32_t kEmpty = -1;  // the empty stack: the sentence is complete, nothing may follow
  struct Node {
    uint32_t pos;    // the grammar position to match next (never an alternative's end)
    int32_t parent;  // the stack below (where to return when this alternative ends)
  };

  // A stack with position pos on top of `parent`; an alternative's end returns to the parent directly.
  // Equal stacks share their nodes where a small table remembers one (a node it names is checked to still
  // hold the same position and parent): inside a string, the stack after a character is the one before it.
  int32_t push(uint32_t pos, int32_t parent) {
    if (g_->elems_[pos].kind == Grammar::kEnd) return parent;
    const std::size_t h = (pos * 0x9E3779B1u ^ uint32_t(parent) * 0x85EBCA77u) & (kShare - 1);
    const int32_t seen = share_[h];
    if (seen >= 0 && std::size_t(seen) < pool_.size() && pool_[std::size_t(seen)].pos == pos &&
        pool_[std::size_t(seen)].parent == parent)
      return seen;
    pool_.push_back({pos, parent});
    return share_[h] = int32_t(pool_.size() - 1);
  }

  bool accepting(int32_t t) const {
    for (; t != kEmpty; t = pool_[std::size_t(t)].parent)
      if (!g_->nullable_[pool_[std::size_t(t)].pos]) return false;
    return true;
  }

  // Marks stack t as stepped with the current byte or token: false when t is empty or was stepped already.
  bool first_visit(int32_t t, int depth) {
    if (t == kEmpty) return false;
    if (std::size_t(t) >= stamp_.size()) stamp_.resize(std::max(pool_.size(), 2 * stamp_.size()), 0u);
    if (stamp_[std::size_t(t)] == stamp_gen_) return false;
    stamp_[std::size_t(t)] = stamp_gen_;
    if (depth > 1000) fail("kiln::GrammarMatcher: rules nested deeper than 1000 without a byte");
    return true;
  }

  // The stacks that stack t becomes after byte b, appended to out. Rules are entered only through the
  // alternatives whose first bytes hold b; an alternative (or rule) that can be empty is also skipped over.
  // A stack already stepped with this byte is not stepped again: nested rules that can be empty reach the same
  // return stack along several paths (a rule's empty alternative and the rule itself being empty), and
  // following each would cost time exponential in the nesting ((x*){0,99}: 2^99 paths).
  void step(int32_t t, uint8_t b, std::vector<int32_t>& out, int depth) {
    if (!first_visit(t, depth)) return;
    const Node n = pool_[std::size_t(t)];
    if (!g_->first_[n.pos].has(b)) {  // not here: perhaps after this alternative, if the rest may be empty
      if (g_->nullable_[n.pos]) step(n.parent, b, out, depth + 1);
      return;
    }
    const Grammar::Elem e = g_->elems_[n.pos];
    if (e.kind == Grammar::kByte) {  // first_ holds b: it matches
      out.push_back(push(n.pos + 1, n.parent));
      return;
    }
    const int32_t ret = push(n.pos + 1, n.parent);  // where the rule returns
    for (uint32_t a : g_->alts_[e.arg])
      if (g_->first_[a].has(b)) step(push(a, ret), b, out, depth + 1);
    if (g_->rule_nullable_[e.arg]) step(ret, b, out, depth + 1);  // the rule empty
  }

  // next_: the stacks after token id as bytes and as a whole token (empty: refused).
  bool advance_token_all(int32_t id, std::optional<std::string_view> bytes) {
    next_.clear();
    if (bytes && !bytes->empty() && !advance_all(*bytes, tops_, next_)) next_.clear();
    if (takes_tokens()) {
      if (++stamp_gen_ == 0) {
        std::fill(stamp_.begin(), stamp_.end(), 0u);
        stamp_gen_ = 1;
      }
      for (int32_t t : tops_) step_token(t, id, next_, 0);
      if (next_.size() > 1) dedup(next_);
    }
    return !next_.empty();
  }

  // step() for a whole token: through the token elements that may come first.
  void step_token(int32_t t, int32_t id, std::vector<int32_t>& out, int depth) {
    if (!first_visit(t, depth)) return;
    const Node n = pool_[std::size_t(t)];
    if (g_->tok_first_[n.pos].empty()) {
      if (g_->nullable_[n.pos]) step_token(n.parent, id, out, depth + 1);
      return;
    }
    const Grammar::Elem e = g_->elems_[n.pos];
    if (e.kind == Grammar::kToken) {
      const Grammar::TokenElem& te = g_->tokens_[e.arg];
      if ((te.id == id) != te.negated) out.push_back(push(n.pos + 1, n.parent));
      return;
    }
    if (e.kind != Grammar::kRef) return;
    const int32_t ret = push(n.pos + 1, n.parent);
    for (uint32_t a : g_->alts_[e.arg])
      if (!g_->tok_first_[a].empty()) step_token(push(a, ret), id, out, depth + 1);
    if (g_->rule_nullable_[e.arg]) step_token(ret, id, out, depth + 1);
  }

  bool advance_all(std::string_view bytes, std::span<const int32_t> from, std::vector<int32_t>& out) {
    std::span<const int32_t> cur = from;
    if (bytes.empty()) {
      out.assign(from.begin(), from.end());
      return true;
    }
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      std::vector<int32_t>& dst = (i % 2 == 0) ? out : tmp_;
      advance(cur, uint8_t(bytes[i]), dst);
      if (dst.empty()) return false;
      cur = dst;
    }
    if (bytes.size() % 2 == 0) out.swap(tmp_);  // the last result is in tmp_
    return true;
  }

  // Equal stacks (same positions all the way down) kept once: ambiguous alternatives that converge.
  void dedup(std::vector<int32_t>& v) const {
    auto same = [&](int32_t a, int32_t b) {
      while (a != kEmpty && b != kEmpty) {
        if (a == b) return true;
        if (pool_[std::size_t(a)].pos != pool_[std::size_t(b)].pos) return false;
        a = pool_[std::size_t(a)].parent, b = pool_[std::size_t(b)].parent;
      }
      return a == b;
    };
    std::size_t k = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      bool dup = false;
      for (std::size_t j = 0; j < k && !dup; ++j) dup = same(v[i], v[j]);
      if (!dup) v[k++] = v[i];
    }
    v.resize(k);
  }

  // Copies the stacks of tops_ into a fresh pool (the nodes of refused or old stacks are dropped).
  void compact() {
    std::vector<int32_t> remap(pool_.size(), kEmpty - 1);
    std::vector<Node> fresh;
    auto copy = [&](auto&& self, int32_t t) -> int32_t {
      if (t == kEmpty) return kEmpty;
      if (remap[std::size_t(t)] != kEmpty - 1) return remap[std::size_t(t)];
      const int32_t parent = self(self, pool_[std::size_t(t)].parent);
      fresh.push_back({pool_[std::size_t(t)].pos, parent});
      return remap[std::size_t(t)] = int32_t(fresh.size() - 1);
    };
    for (int32_t& t : tops_) t = copy(copy, t);
    pool_.swap(fresh);
  }

  static constexpr std::size_t kShare = 1024;
  std::shared_ptr<const Grammar> g_;
  std::vector<Node> pool_;
  std::vector<int32_t> share_ = std::vector<int32_t>(kShare, -1);
  std::vector<int32_t> tops_, next_, tmp_;
  std::vector<uint32_t> stamp_;  // per pool node: the advance() that stepped it last (step())
  uint32_t stamp_gen_ = 0;
};

}  // namespace kiln
