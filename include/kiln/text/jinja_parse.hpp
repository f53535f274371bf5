// kiln/text/jinja_parse.hpp - the parser of kiln's Jinja interpreter (kiln/text/jinja.hpp): the lexer's
// pieces (jinja_lexer.hpp) to a small tree (Expr, Stmt) with Jinja's operator precedence. Errors are
// kiln::FormatError naming the construct and the line.
#pragma once

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/text/jinja_builtins.hpp"
#include "kiln/text/jinja_lexer.hpp"
#include "kiln/text/jinja_value.hpp"

namespace kiln::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K : uint8_t {
    literal,
    name,
    list,
    tuple,
    dict,
    attr,
    item,
    slice,
    call,
    filter,
    test,
    unary,
    binary,
    cond,
    and_,
    or_,
    not_
  };
  K k;
  int line = 0;
  std::string s;         // name / attribute / operator / filter or test name
  Value v;               // literal
  bool negated = false;  // test: "is not"
  std::vector<ExprP> a;  // operands; dict: key, value, key, value...; slice: obj, start, stop, step (may be null)
  std::vector<std::pair<std::string, ExprP>> kw;  // call / filter / test keyword arguments
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class K : uint8_t {
    text,
    output,
    if_,
    for_,
    set,
    set_block,
    macro,
    call_block,
    filter_block,
    with,
    break_,
    continue_
  };
  K k;
  int line = 0;
  std::string text;                  // text; set: the name (or namespace); macro: its name
  std::string attr;                  // set ns.attr = ...: the attribute
  std::vector<std::string> targets;  // for: loop variables; set: several names (a, b = ...); with: its names
  std::vector<ExprP> e;  // output: expr; if: conditions; for: iterable, filter (or null); set: value; call_block: call
  std::vector<Body> bodies;                           // if: one per condition + else; for: body, else
  std::vector<std::pair<std::string, ExprP>> params;  // macro / call-block caller parameters and defaults
};

namespace detail {

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  [[noreturn]] void error(const std::string& what, int line) const {
    fail<FormatError>("jinja: ", what, " at line ", line);
  }

  // Parses pieces until a statement tag whose first name is one of `ends` (returned in `end`, its
  // tokens left in toks_/ti_ for the caller).
  Body parse_body(std::vector<std::string_view> ends, std::string& end) {
    Body body;
    while (pi_ < pieces_.size()) {
      Piece& pc = pieces_[pi_++];
      if (pc.t == Piece::T::text) {
        auto s = std::make_unique<Stmt>(Stmt{Stmt::K::text, pc.line, pc.text, {}, {}, {}, {}, {}});
        body.push_back(std::move(s));
        continue;
      }
      toks_ = &pc.toks;
      ti_ = 0;
      if (pc.t == Piece::T::expr) {
        auto s = std::make_unique<Stmt>(Stmt{Stmt::K::output, pc.line, {}, {}, {}, {}, {}, {}});
        s->e.push_back(expression());
        expect_end("{{ }}");
        body.push_back(std::move(s));
        continue;
      }
      const Tok& kw = next();
      if (kw.t != Tok::T::name) error("expected a statement name after '{%'", kw.line);
      for (auto e : ends)
        if (kw.s == e) {
          end = kw.s;
          return body;
        }
      if (auto s = statement(kw)) body.push_back(std::move(s));
    }
    if (!ends.empty()) {
      std::string list;
      for (auto e : ends) list += (list.empty() ? "" : " or ") + std::string("{% ") + std::string(e) + " %}";
      error("missing " + list, pieces_.empty() ? 0 : pieces_.back().line);
    }
    return body;
  }

  std::unique_ptr<Stmt> make(Stmt::K k, int line) {
    auto s = std::make_unique<Stmt>();
    s->k = k;
    s->line = line;
    return s;
  }

  std::unique_ptr<Stmt> statement(const Tok& kw) {
    const int line = kw.line;
    std::string end;
    if (kw.s == "if") {
      auto s = make(Stmt::K::if_, line);
      s->e.push_back(expression());
      expect_end("{% if %}");
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          s->e.push_back(expression());
          expect_end("{% elif %}");
        } else if (end == "else") {
          expect_end("{% else %}");
          s->bodies.push_back(parse_body({"endif"}, end));
          expect_end("{% endif %}");
          break;
        } else {
          expect_end("{% endif %}");
          break;
        }
      }
      return s;
    }
    if (kw.s == "for") {
      auto s = make(Stmt::K::for_, line);
      do s->targets.push_back(name_tok("a loop variable").s);
      while (accept(","));
      if (!accept_name("in")) error("expected 'in' in {% for %}", line);
      s->e.push_back(or_expr(true));
      s->e.push_back(accept_name("if") ? expression() : nullptr);
      if (accept_name("recursive")) error("unsupported construct 'recursive' for loop", line);
      expect_end("{% for %}");
      s->bodies.push_back(parse_body({"else", "endfor"}, end));
      if (end == "else") {
        expect_end("{% else %}");
        s->bodies.push_back(parse_body({"endfor"}, end));
      }
      expect_end("{% endfor %}");
      return s;
    }
    if (kw.s == "set") {
      const Tok& n = name_tok("a variable name");
      if (accept(".")) {
        auto s = make(Stmt::K::set, line);
        s->text = n.s;
        s->attr = name_tok("an attribute name").s;
        if (!accept("=")) error("expected '=' in {% set %}", line);
        s->e.push_back(expression());
        expect_end("{% set %}");
        return s;
      }
      std::vector<std::string> names{n.s};
      while (accept(",")) names.push_back(name_tok("a variable name").s);
      if (accept("=")) {
        auto s = make(Stmt::K::set, line);
        s->targets = names;
        s->e.push_back(tuple_or_expr());
        expect_end("{% set %}");
        return s;
      }
      auto s = make(Stmt::K::set_block, line);  // {% set x %}...{% endset %}, optionally {% set x | filter %}
      s->text = n.s;
      if (peek_is("|")) {
        auto placeholder = std::make_unique<Expr>();
        placeholder->k = Expr::K::name;
        placeholder->s = "\x01body";
        s->e.push_back(filters(std::move(placeholder)));
      }
      expect_end("{% set %}");
      s->bodies.push_back(parse_body({"endset"}, end));
      expect_end("{% endset %}");
      return s;
    }
    if (kw.s == "macro") {
      auto s = make(Stmt::K::macro, line);
      s->text = name_tok("a macro name").s;
      params(*s);
      expect_end("{% macro %}");
      s->bodies.push_back(parse_body({"endmacro"}, end));
      expect_end("{% endmacro %}");
      return s;
    }
    if (kw.s == "call") {
      auto s = make(Stmt::K::call_block, line);
      if (peek_is("(")) params(*s);
      s->e.push_back(expression());
      expect_end("{% call %}");
      s->bodies.push_back(parse_body({"endcall"}, end));
      expect_end("{% endcall %}");
      return s;
    }
    if (kw.s == "filter") {
      auto s = make(Stmt::K::filter_block, line);
      auto placeholder = std::make_unique<Expr>();
      placeholder->k = Expr::K::name;
      placeholder->s = "\x01body";
      s->e.push_back(filter_chain(std::move(placeholder), true));
      expect_end("{% filter %}");
      s->bodies.push_back(parse_body({"endfilter"}, end));
      expect_end("{% endfilter %}");
      return s;
    }
    if (kw.s == "with") {  // {% with a = 1, b = x %}...{% endwith %}: a scope with those names
      auto s = make(Stmt::K::with, line);
      while (peek().t != Tok::T::end) {
        if (!s->targets.empty()) expect(",", "{% with %}");
        s->targets.push_back(name_tok("a variable name").s);
        expect("=", "{% with %}");
        s->e.push_back(expression());
      }
      s->bodies.push_back(parse_body({"endwith"}, end));
      expect_end("{% endwith %}");
      return s;
    }
    if (kw.s == "generation") {  // HF's AssistantTracker extension: the body renders as is
      expect_end("{% generation %}");
      auto s = make(Stmt::K::if_, line);
      auto t = std::make_unique<Expr>();
      t->k = Expr::K::literal;
      t->v = Value(true);
      s->e.push_back(std::move(t));
      s->bodies.push_back(parse_body({"endgeneration"}, end));
      expect_end("{% endgeneration %}");
      return s;
    }
    if (kw.s == "break" || kw.s == "continue") {
      expect_end("{% " + kw.s + " %}");
      return make(kw.s == "break" ? Stmt::K::break_ : Stmt::K::continue_, line);
    }
    error("unsupported statement '" + kw.s + "'", line);
  }

  void params(Stmt& s) {
    if (!accept("(")) error("expected '(' after the macro name", peek().line);
    while (!accept(")")) {
      if (!s.params.empty() && !accept(",")) error("expected ',' between macro parameters", peek().line);
      if (accept(")")) break;
      std::string n = name_tok("a parameter name").s;
      s.params.emplace_back(n, accept("=") ? expression() : nullptr);
    }
  }

  // ---- tokens ----
  const Tok& peek(std::size_t k = 0) const { return (*toks_)[std::min(ti_ + k, toks_->size() - 1)]; }
  const Tok& next() { return (*toks_)[std::min(ti_++, toks_->size() - 1)]; }
  bool peek_is(std::string_view op) const { return peek().t == Tok::T::op && peek().s == op; }
  bool accept(std::string_view op) {
    if (!peek_is(op)) return false;
    ++ti_;
    return true;
  }
  bool peek_name(std::string_view n, std::size_t k = 0) const { return peek(k).t == Tok::T::name && peek(k).s == n; }
  bool accept_name(std::string_view n) {
    if (!peek_name(n)) return false;
    ++ti_;
    return true;
  }
  void expect(std::string_view op, std::string_view where) {
    if (!accept(op))
      error("expected '" + std::string(op) + "' in " + std::string(where) + ", got '" + peek().s + "'", peek().line);
  }
  const Tok& name_tok(std::string_view what) {
    if (peek().t != Tok::T::name) error("expected " + std::string(what), peek().line);
    return next();
  }
  void expect_end(const std::string& where) {
    if (peek().t != Tok::T::end) error("unexpected '" + peek().s + "' in " + where, peek().line);
  }

  ExprP node(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  ExprP binary(std::string op, ExprP l, ExprP r, Expr::K k = Expr::K::binary) {
    auto e = node(k, l->line);
    e->s = std::move(op);
    e->a.push_back(std::move(l));
    e->a.push_back(std::move(r));
    return e;
  }

  // ---- expressions (Jinja's precedence, lowest first) ----
  ExprP tuple_or_expr() {  // a, b (a tuple, as a list) or one expression
    ExprP first = expression();
    if (!peek_is(",")) return first;
    auto l = node(Expr::K::tuple, first->line);
    l->a.push_back(std::move(first));
    while (accept(",")) {
      if (peek().t == Tok::T::end) break;
      l->a.push_back(expression());
    }
    return l;
  }

  ExprP expression() {
    ExprP e = or_expr(false);
    while (accept_name("if")) {
      auto c = node(Expr::K::cond, e->line);
      ExprP cond = or_expr(false);
      c->a.push_back(std::move(cond));
      c->a.push_back(std::move(e));
      c->a.push_back(accept_name("else") ? expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }
  // no_cond: the iterable of a for loop ("for x in xs if cond" filters, it is no ternary)
  ExprP or_expr(bool no_cond) {
    (void)no_cond;
    ExprP e = and_expr();
    while (accept_name("or")) e = binary("or", std::move(e), and_expr(), Expr::K::or_);
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (accept_name("and")) e = binary("and", std::move(e), not_expr(), Expr::K::and_);
    return e;
  }
  ExprP not_expr() {
    if (peek_name("not")) {
      const int line = next().line;
      auto n = node(Expr::K::not_, line);
      n->a.push_back(not_expr());
      return n;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    while (true) {
      const Tok& t = peek();
      if (t.t == Tok::T::op && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == ">" || t.s == "<=" || t.s == ">=")) {
        std::string op = next().s;
        e = binary(op, std::move(e), math1());
      } else if (peek_name("in")) {
        next();
        e = binary("in", std::move(e), math1());
      } else if (peek_name("not") && peek_name("in", 1)) {
        next(), next();
        e = binary("not in", std::move(e), math1());
      } else {
        return e;
      }
    }
  }
  ExprP math1() {
    ExprP e = concat();
    while (peek_is("+") || peek_is("-")) {
      std::string op = next().s;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  ExprP concat() {
    ExprP e = math2();
    while (accept("~")) e = binary("~", std::move(e), math2());
    return e;
  }
  ExprP math2() {
    ExprP e = power();
    while (peek_is("*") || peek_is("/") || peek_is("//") || peek_is("%")) {
      std::string op = next().s;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  ExprP power() {
    ExprP e = unary();
    while (accept("**")) e = binary("**", std::move(e), unary());
    return e;
  }
  // Jinja: "-x | f" is (-x) | f; the operand of - takes no filters.
  ExprP unary(bool with_filters = true) {
    ExprP e;
    if (peek_is("-") || peek_is("+")) {
      const Tok& t = next();
      e = node(Expr::K::unary, t.line);
      e->s = t.s;
      e->a.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filters ? filters(std::move(e)) : std::move(e);
  }

  ExprP primary() {
    const Tok& t = next();
    auto lit = [&](Value v) {
      auto e = node(Expr::K::literal, t.line);
      e->v = std::move(v);
      return e;
    };
    switch (t.t) {
      case Tok::T::str: {
        std::string s = t.s;
        while (peek().t == Tok::T::str) s += next().s;  // adjacent literals concatenate
        return lit(Value(s));
      }
      case Tok::T::integer:
        return lit(Value(t.i));
      case Tok::T::floating:
        return lit(Value(t.f));
      case Tok::T::name: {
        if (t.s == "true" || t.s == "True") return lit(Value(true));
        if (t.s == "false" || t.s == "False") return lit(Value(false));
        if (t.s == "none" || t.s == "None") return lit(Value::none());
        auto e = node(Expr::K::name, t.line);
        e->s = t.s;
        return e;
      }
      case Tok::T::op:
        if (t.s == "(") {
          if (accept(")")) return node(Expr::K::tuple, t.line);
          ExprP e = expression();
          if (peek_is(",")) {
            auto l = node(Expr::K::tuple, t.line);
            l->a.push_back(std::move(e));
            while (accept(",") && !peek_is(")")) l->a.push_back(expression());
            e = std::move(l);
          }
          expect(")", "a parenthesized expression");
          return e;
        }
        if (t.s == "[") {
          auto l = node(Expr::K::list, t.line);
          while (!accept("]")) {
            if (!l->a.empty()) expect(",", "a list literal");
            if (accept("]")) break;
            l->a.push_back(expression());
          }
          return l;
        }
        if (t.s == "{") {
          auto d = node(Expr::K::dict, t.line);
          while (!accept("}")) {
            if (!d->a.empty()) expect(",", "a dict literal");
            if (accept("}")) break;
            d->a.push_back(expression());
            expect(":", "a dict literal");
            d->a.push_back(expression());
          }
          return d;
        }
        break;
      case Tok::T::end:
        error("unexpected end of expression", t.line);
    }
    error("unexpected '" + t.s + "' in an expression", t.line);
  }

  void call_args(Expr& e) {  // after '(': positional and keyword arguments up to ')'
    bool first = true;
    while (!accept(")")) {
      if (!first) expect(",", "a call's arguments");
      first = false;
      if (accept(")")) break;
      if (peek().t == Tok::T::name && peek(1).t == Tok::T::op && peek(1).s == "=") {
        std::string k = next().s;
        next();
        e.kw.emplace_back(std::move(k), expression());
      } else {
        e.a.push_back(expression());
      }
    }
  }

  ExprP postfix(ExprP e) {
    while (true) {
      if (accept(".")) {
        const Tok& t = next();
        if (t.t == Tok::T::integer) {  // foo.0 is foo[0]
          auto it = node(Expr::K::item, t.line);
          it->a.push_back(std::move(e));
          auto idx = node(Expr::K::literal, t.line);
          idx->v = Value(t.i);
          it->a.push_back(std::move(idx));
          e = std::move(it);
          continue;
        }
        if (t.t != Tok::T::name) error("expected an attribute name after '.'", t.line);
        auto at = node(Expr::K::attr, t.line);
        at->s = t.s;
        at->a.push_back(std::move(e));
        e = std::move(at);
      } else if (peek_is("[")) {
        const int line = next().line;
        ExprP parts[3];
        int n = 0;
        bool slice = false;
        while (!accept("]")) {
          if (accept(":")) {
            slice = true;
            if (++n > 2) error("too many ':' in a slice", line);
            continue;
          }
          parts[n] = expression();
          if (!slice && peek_is(",")) error("unsupported construct: tuple subscript", line);
        }
        if (slice) {
          auto sl = node(Expr::K::slice, line);
          sl->a.push_back(std::move(e));
          for (auto& p : parts) sl->a.push_back(std::move(p));
          e = std::move(sl);
        } else {
          if (!parts[0]) error("empty subscript []", line);
          auto it = node(Expr::K::item, line);
          it->a.push_back(std::move(e));
          it->a.push_back(std::move(parts[0]));
          e = std::move(it);
        }
      } else if (peek_is("(")) {
        const int line = next().line;
        auto c = node(Expr::K::call, line);
        c->a.push_back(std::move(e));
        call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprP filter_chain(ExprP e, bool first_without_bar) {
    bool need_bar = !first_without_bar;
    while (!need_bar || accept("|")) {
      need_bar = true;
      const Tok& n = name_tok("a filter name");
      std::string name = n.s;
      while (accept(".")) name += "." + name_tok("a filter name").s;
      auto f = node(Expr::K::filter, n.line);
      f->s = name;
      f->a.push_back(std::move(e));
      if (accept("(")) call_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprP filters(ExprP e) {  // "| filter(...)" chains and "is [not] test" after a unary expression
    while (true) {
      if (peek_is("|")) {
        e = filter_chain(std::move(e), false);
        e = postfix(std::move(e));
      } else if (peek_name("is")) {
        const int line = next().line;
        auto t = node(Expr::K::test, line);
        t->negated = accept_name("not");
        const Tok& n = next();
        if (n.t != Tok::T::name) error("expected a test name after 'is'", line);
        t->s = n.s;
        t->a.push_back(std::move(e));
        if (accept("(")) {
          call_args(*t);
        } else {
          const Tok& p = peek();  // "is divisibleby 3", "is sameas none": one argument without parentheses
          const bool arg = p.t == Tok::T::str || p.t == Tok::T::integer || p.t == Tok::T::floating ||
                           (p.t == Tok::T::name && p.s != "else" && p.s != "or" && p.s != "and" && p.s != "if" &&
                            p.s != "not" && p.s != "in" && p.s != "is") ||
                           (p.t == Tok::T::op && (p.s == "[" || p.s == "{"));
          if (arg) t->a.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Piece> pieces_;
  std::size_t pi_ = 0;
  const std::vector<Tok>* toks_ = nullptr;
  std::size_t ti_ = 0;
};

}  // namespace detail
}  // namespace kiln::jinja
