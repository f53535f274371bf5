// kiln/text/jinja_eval.hpp - the evaluator of kiln's Jinja interpreter (kiln/text/jinja.hpp): scopes,
// statements, operators and calls. Filters, tests and the methods of str / dict live in
// jinja_builtins.hpp.
//
// Scoping follows Jinja2: a for loop's body gets a fresh scope each iteration (a {% set %} inside it
// does not survive the iteration; templates use namespace() for that), if-blocks share their scope,
// macros run in a scope under the template's top level.
#pragma once

#include <cmath>
#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/text/jinja_builtins.hpp"
#include "kiln/text/jinja_parse.hpp"
#include "kiln/text/jinja_value.hpp"

namespace kiln::jinja::detail {

struct Frame {
  Dict vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(std::string_view n) const {
    for (const Frame* f = this; f; f = f->parent.get())
      for (const auto& [k, v] : f->vars)
        if (k == n) return &v;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& [k, x] : vars)
      if (k == n) {
        x = std::move(v);
        return;
      }
    vars.emplace_back(n, std::move(v));
  }
};
using FrameP = std::shared_ptr<Frame>;

// Rendered text and the ranges of it that came from marked strings (Value::marks).
struct Buf {
  std::string s;
  Spans m;
  void put(const Value& v) {
    if (v.is_string()) {
      add_marks(m, v, s.size());
      s += v.s;
    } else {
      s += py_str(v);
    }
  }
  Value value() && {
    Value v(std::move(s));
    if (!m.empty()) v.marks = std::make_shared<const Spans>(std::move(m));
    return v;
  }
};

class Interpreter : public Builtins {
 public:
  Interpreter(const Value& ctx, const std::tm* now) {
    root_ = std::make_shared<Frame>();
    if (now) now_ = *now;
    else {
      const std::time_t t = std::time(nullptr);
      localtime_r(&t, &now_);
    }
    add_globals();
    if (ctx.is_dict())
      for (const auto& [k, v] : *ctx.d) root_->set(k, v);
  }

  std::string run(const Body& body, Spans* marks) {
    Buf out;
    exec(body, root_, out);
    if (marks) *marks = std::move(out.m);
    return std::move(out.s);
  }

 private:
  enum class Flow { normal, break_, continue_ };

  void add_globals() {
    root_->set("range", Value::function([](List& a, KwArgs&) {
                 int64_t start = 0, stop = 0, step = 1;
                 if (a.size() == 1) stop = a[0].i;
                 else if (a.size() >= 2) start = a[0].i, stop = a[1].i;
                 if (a.size() >= 3) step = a[2].i;
                 if (a.empty() || a.size() > 3 || step == 0)
                   fail<FormatError>("jinja: range() takes 1 to 3 integers, step not 0");
                 // jinja2's sandbox refuses ranges over MAX_RANGE = 100000 items (a template must not exhaust memory).
                 const int64_t n = step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
                 if (n > 100000) fail<FormatError>("jinja: range() too big (", n, " items; the sandbox allows 100000)");
                 List out;
                 for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.emplace_back(k);
                 return Value(std::move(out));
               }));
    root_->set("namespace", Value::function([](List& a, KwArgs& kw) {
                 Value ns = Value(Dict{});
                 ns.is_namespace = true;
                 for (auto& x : a)
                   if (x.is_dict())
                     for (auto& [k, v] : *x.d) ns.set(k, v);
                 for (auto& [k, v] : kw) ns.set(k, v);
                 return ns;
               }));
    root_->set("dict", Value::function([](List& a, KwArgs& kw) {
                 Value d = Value(Dict{});
                 for (auto& x : a)
                   if (x.is_dict())
                     for (auto& [k, v] : *x.d) d.set(k, v);
                 for (auto& [k, v] : kw) d.set(k, v);
                 return d;
               }));
    root_->set("raise_exception", Value::function([](List& a, KwArgs&) -> Value {
                 fail<FormatError>("jinja: the template raised an exception: ",
                                   a.empty() ? std::string() : py_str(a[0]));
               }));
    root_->set("strftime_now", Value::function([this](List& a, KwArgs&) {
                 char buf[256];
                 const std::string fmt = a.empty() ? std::string() : py_str(a[0]);
                 const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &now_);
                 return Value(std::string(buf, n));
               }));
  }

  // ---- statements ----
  Flow exec(const Body& body, const FrameP& f, Buf& out) {
    for (const auto& sp : body) {
      const Stmt& s = *sp;
      switch (s.k) {
        case Stmt::K::text:
          out.s += s.text;
          break;
        case Stmt::K::output:
          out.put(eval(*s.e[0], f));
          break;
        case Stmt::K::if_: {
          std::size_t k = 0;
          for (; k < s.e.size(); ++k)
            if (eval(*s.e[k], f).truthy()) break;
          if (k < s.bodies.size())
            if (Flow fl = exec(s.bodies[k], f, out); fl != Flow::normal) return fl;
          break;
        }
        case Stmt::K::for_:
          exec_for(s, f, out);
          break;
        case Stmt::K::set: {
          Value v = eval(*s.e[0], f);
          if (!s.attr.empty()) {
            const Value* ns = f->lookup(s.text);
            if (!ns || !ns->is_namespace)
              fail<FormatError>("jinja: {% set ", s.text, ".", s.attr, " %}: '", s.text,
                                "' is not a namespace() at line ", s.line);
            Value n = *ns;  // shares the dict
            n.set(s.attr, std::move(v));
          } else if (s.targets.size() == 1) {
            f->set(s.targets[0], std::move(v));
          } else {
            const List items = iterate(v, s.line);
            if (items.size() != s.targets.size())
              fail<FormatError>("jinja: {% set %} unpacks ", items.size(), " values into ", s.targets.size(),
                                " names at line ", s.line);
            for (std::size_t k = 0; k < items.size(); ++k) f->set(s.targets[k], items[k]);
          }
          break;
        }
        case Stmt::K::set_block: {
          Buf body_out;
          exec(s.bodies[0], f, body_out);
          Value v = std::move(body_out).value();
          if (!s.e.empty()) v = eval_with_body(*s.e[0], f, std::move(v));
          f->set(s.text, std::move(v));
          break;
        }
        case Stmt::K::macro:
          f->set(s.text, make_macro(s, nullptr));
          break;
        case Stmt::K::call_block: {
          Value caller = make_macro(s, f);
          const Expr& c = *s.e[0];
          if (c.k != Expr::K::call) fail<FormatError>("jinja: {% call %} needs a macro call at line ", s.line);
          Value fn = eval(*c.a[0], f);
          List args;
          KwArgs kw;
          for (std::size_t k = 1; k < c.a.size(); ++k) args.push_back(eval(*c.a[k], f));
          for (const auto& [n, e] : c.kw) kw.emplace_back(n, eval(*e, f));
          kw.emplace_back("caller", caller);
          out.put(call(fn, args, kw, s.line, "call block"));
          break;
        }
        case Stmt::K::filter_block: {
          Buf body_out;
          exec(s.bodies[0], f, body_out);
          out.put(eval_with_body(*s.e[0], f, std::move(body_out).value()));
          break;
        }
        case Stmt::K::with: {
          auto fr = std::make_shared<Frame>();
          fr->parent = f;
          for (std::size_t k = 0; k < s.targets.size(); ++k) fr->set(s.targets[k], eval(*s.e[k], f));
          if (Flow fl = exec(s.bodies[0], fr, out); fl != Flow::normal) return fl;
          break;
        }
        case Stmt::K::break_:
          return Flow::break_;
        case Stmt::K::continue_:
          return Flow::continue_;
      }
    }
    return Flow::normal;
  }

  // Evaluates a filter chain whose innermost operand is the placeholder name "\x01body".
  Value eval_with_body(const Expr& e, const FrameP& f, Value body) {
    auto fr = std::make_shared<Frame>();
    fr->parent = f;
    fr->set("\x01body", std::move(body));
    return eval(e, fr);
  }

  void exec_for(const Stmt& s, const FrameP& f, Buf& out) {
    const List all = iterate(eval(*s.e[0], f), s.line);
    std::vector<const Value*> items;
    for (const auto& v : all) {
      if (s.e[1]) {  // {% for x in xs if cond %}: the condition sees the loop variables
        auto fr = std::make_shared<Frame>();
        fr->parent = f;
        bind_targets(*fr, s, v);
        if (!eval(*s.e[1], fr).truthy()) continue;
      }
      items.push_back(&v);
    }
    const std::size_t n = items.size();
    for (std::size_t k = 0; k < n; ++k) {
      auto fr = std::make_shared<Frame>();
      fr->parent = f;
      bind_targets(*fr, s, *items[k]);
      Value loop = Value(Dict{});
      loop.set("index0", Value(k));
      loop.set("index", Value(k + 1));
      loop.set("revindex", Value(n - k));
      loop.set("revindex0", Value(n - k - 1));
      loop.set("first", Value(k == 0));
      loop.set("last", Value(k + 1 == n));
      loop.set("length", Value(n));
      loop.set("depth", Value(1));
      loop.set("depth0", Value(0));
      loop.set("previtem", k > 0 ? *items[k - 1] : Value::undefined("loop.previtem"));
      loop.set("nextitem", k + 1 < n ? *items[k + 1] : Value::undefined("loop.nextitem"));
      loop.set("cycle", Value::function([k](List& a, KwArgs&) {
                 if (a.empty()) fail<FormatError>("jinja: loop.cycle() needs arguments");
                 return a[k % a.size()];
               }));
      fr->set("loop", std::move(loop));
      if (exec(s.bodies[0], fr, out) == Flow::break_) break;
    }
    if (n == 0 && s.bodies.size() > 1) exec(s.bodies[1], f, out);
  }

  void bind_targets(Frame& fr, const Stmt& s, const Value& v) {
    if (s.targets.size() == 1) {
      fr.set(s.targets[0], v);
      return;
    }
    const List parts = iterate(v, s.line);
    if (parts.size() != s.targets.size())
      fail<FormatError>("jinja: for loop unpacks ", parts.size(), " values into ", s.targets.size(), " names at line ",
                        s.line);
    for (std::size_t k = 0; k < parts.size(); ++k) fr.set(s.targets[k], parts[k]);
  }

  // A macro (or a call block's caller, which sees the scope of the call site) as a function value.
  Value make_macro(const Stmt& s, FrameP closure) {
    return Value::function([this, &s, closure](List& args, KwArgs& kw) {
      // A macro that calls itself without end is an error, not a stack overflow.
      if (depth_ >= 200)
        fail<FormatError>("jinja: macro '", s.text, "' nested more than 200 calls deep (line ", s.line, ")");
      struct Depth {
        int& d;
        explicit Depth(int& x) : d(++x) {}
        ~Depth() { --d; }
      } guard(depth_);
      auto fr = std::make_shared<Frame>();
      fr->parent = closure ? closure : root_;
      if (args.size() > s.params.size())
        fail<FormatError>("jinja: macro '", s.text, "' takes ", s.params.size(), " arguments, got ", args.size(),
                          " (line ", s.line, ")");
      for (std::size_t k = 0; k < s.params.size(); ++k) {
        const auto& [name, def] = s.params[k];
        if (k < args.size()) fr->set(name, args[k]);
        else fr->set(name, def ? eval(*def, fr) : Value::undefined(name));
      }
      bool has_caller = false;
      for (auto& [name, v] : kw) {
        bool known = name == "caller";
        has_caller |= known;
        for (const auto& p : s.params) known |= p.first == name;
        if (!known) fail<FormatError>("jinja: macro '", s.text, "' has no parameter '", name, "' (line ", s.line, ")");
        fr->set(name, v);
      }
      if (!has_caller && !closure && !fr->lookup("caller")) fr->set("caller", Value::undefined("caller"));
      Buf out;
      exec(s.bodies[0], fr, out);
      return std::move(out).value();
    });
  }

  // ---- expressions ----
  Value eval(const Expr& e, const FrameP& f) {
    switch (e.k) {
      case Expr::K::literal:
        return e.v;
      case Expr::K::name: {
        const Value* v = f->lookup(e.s);
        return v ? *v : Value::undefined(e.s);
      }
      case Expr::K::list:
      case Expr::K::tuple: {
        List l;
        for (const auto& x : e.a) l.push_back(eval(*x, f));
        Value v(std::move(l));
        v.is_tuple = e.k == Expr::K::tuple;
        return v;
      }
      case Expr::K::dict: {
        Value d = Value(Dict{});
        for (std::size_t k = 0; k + 1 < e.a.size(); k += 2) {
          Value key = eval(*e.a[k], f);
          if (!key.is_string() && key.kind != Value::Kind::integer)
            fail<FormatError>("jinja: unsupported dict key of type ", key.type_name(), " at line ", e.line);
          d.set(dict_key(key), eval(*e.a[k + 1], f));
        }
        return d;
      }
      case Expr::K::attr:
        return get_attr(eval(*e.a[0], f), e.s, e.line);
      case Expr::K::item:
        return get_item(eval(*e.a[0], f), eval(*e.a[1], f), e.line);
      case Expr::K::slice: {
        Value o = eval(*e.a[0], f);
        Value p[3];
        for (int k = 0; k < 3; ++k)
          if (e.a[std::size_t(k) + 1]) p[k] = eval(*e.a[std::size_t(k) + 1], f);
        return slice(o, p[0], p[1], p[2], e.line);
      }
      case Expr::K::call: {
        List args;
        KwArgs kw;
        for (std::size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], f));
        for (const auto& [n, x] : e.kw) kw.emplace_back(n, eval(*x, f));
        const Expr& callee = *e.a[0];
        if (callee.k == Expr::K::attr) {  // obj.method(...): str / dict / list methods
          Value obj = eval(*callee.a[0], f);
          if (obj.is_string() || (obj.is_dict() && !obj.is_namespace) || obj.is_list())
            if (auto r = method(obj, callee.s, args, kw, e.line)) return *r;
          return call(get_attr(obj, callee.s, callee.line), args, kw, e.line, callee.s);
        }
        return call(eval(callee, f), args, kw, e.line, callee.k == Expr::K::name ? callee.s : "expression");
      }
      case Expr::K::filter: {
        Value v = eval(*e.a[0], f);
        List args;
        KwArgs kw;
        for (std::size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], f));
        for (const auto& [n, x] : e.kw) kw.emplace_back(n, eval(*x, f));
        return filter(e.s, std::move(v), args, kw, e.line);
      }
      case Expr::K::test: {
        Value v = eval(*e.a[0], f);
        List args;
        for (std::size_t k = 1; k < e.a.size(); ++k) args.push_back(eval(*e.a[k], f));
        return Value(test(e.s, v, args, e.line) != e.negated);
      }
      case Expr::K::unary: {
        Value v = eval(*e.a[0], f);
        if (!v.is_number()) fail<FormatError>("jinja: unary '", e.s, "' on a ", v.type_name(), " at line ", e.line);
        if (e.s == "+") return v;
        if (v.kind == Value::Kind::floating) return Value(-v.f);
        return Value(-(v.kind == Value::Kind::boolean ? int64_t(v.b) : v.i));
      }
      case Expr::K::not_:
        return Value(!eval(*e.a[0], f).truthy());
      case Expr::K::and_: {
        Value l = eval(*e.a[0], f);
        return l.truthy() ? eval(*e.a[1], f) : l;
      }
      case Expr::K::or_: {
        Value l = eval(*e.a[0], f);
        return l.truthy() ? l : eval(*e.a[1], f);
      }
      case Expr::K::cond: {
        if (eval(*e.a[0], f).truthy()) return eval(*e.a[1], f);
        return e.a[2] ? eval(*e.a[2], f) : Value::undefined("else");
      }
      case Expr::K::binary:
        return binary(e.s, eval(*e.a[0], f), eval(*e.a[1], f), e.line);
    }
    return {};
  }

  Value call(const Value& fn, List& args, KwArgs& kw, int line, std::string_view what) {
    if (fn.kind != Value::Kind::function) {
      if (fn.is_undefined())
        fail<FormatError>("jinja: unsupported function or undefined callable '",
                          fn.s.empty() ? std::string(what) : fn.s, "' at line ", line);
      fail<FormatError>("jinja: '", what, "' (a ", fn.type_name(), ") is not callable at line ", line);
    }
    try {
      return (*fn.fn)(args, kw);
    } catch (const FormatError&) {
      throw;
    }
  }

  FrameP root_;
  std::tm now_{};
  int depth_ = 0;  // macro calls in progress
};

}  // namespace kiln::jinja::detail
