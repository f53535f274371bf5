// kiln/text/jinja_value.hpp - the values of kiln's Jinja interpreter (kiln/text/jinja.hpp): Python's
// None/bool/int/float/str/list/dict plus Jinja's Undefined, callables and namespace(), with the Python
// semantics chat templates depend on (truthiness, ==, <, str() and repr() printing, json.dumps as
// Hugging Face's tojson filter calls it). Dicts keep insertion order (Python 3.7+), keys are strings.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order; linear lookup (small dicts)
using KwArgs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(List& args, KwArgs& kwargs)>;
/// Byte ranges [first, second) of a string (or of the output) that came from message contents.
using Spans = std::vector<std::pair<std::size_t, std::size_t>>;

struct Value {
  enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function };
  Kind kind = Kind::undefined;
  bool b = false;
  bool is_namespace = false;  // namespace(): a dict whose attributes {% set ns.x = ... %} may assign
  bool is_generator = false;
  bool is_tuple = false;  // (a, b): a list that prints as Python's tuple
  bool is_safe =
      false;  // a markupsafe.Markup string (| safe, | escape): "+" escapes a plain str joined to it  // a list made by map/select/...: jinja2's are generators (tojson rejects them)
  int64_t i = 0;
  double f = 0;
  std::string s;                 // string; for undefined: the name that was looked up (for messages)
  std::shared_ptr<List> l;       // list (shared: Python reference semantics)
  std::shared_ptr<Dict> d;       // dict / namespace
  std::shared_ptr<Function> fn;  // function (macros, globals, bound methods)
  // Strings: the byte ranges that came from a string marked with mark_content() (ChatTemplate marks the
  // message contents). Copying, concatenation, slicing, strip and split keep them; other string
  // operations make new, unmarked strings. Template::render reports where they land in the output.
  std::shared_ptr<const Spans> marks;

  void mark_content() {
    if (kind == Kind::string && !s.empty()) marks = std::make_shared<const Spans>(Spans{{0, s.size()}});
  }
  /// The string s[a, a + n) with the marks inside it.
  Value substr(std::size_t a, std::size_t n) const {
    Value r(s.substr(a, n));
    if (marks) {
      Spans m;
      for (auto [x, y] : *marks) {
        const std::size_t lo = std::max(x, a), hi = std::min(y, a + n);
        if (lo < hi) m.emplace_back(lo - a, hi - a);
      }
      if (!m.empty()) r.marks = std::make_shared<const Spans>(std::move(m));
    }
    return r;
  }

  Value() = default;
  static Value undefined(std::string name = {}) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::none;
    return v;
  }
  Value(bool x) : kind(Kind::boolean), b(x) {}
  Value(int x) : kind(Kind::integer), i(x) {}
  Value(int64_t x) : kind(Kind::integer), i(x) {}
  Value(std::size_t x) : kind(Kind::integer), i(static_cast<int64_t>(x)) {}
  Value(double x) : kind(Kind::floating), f(x) {}
  Value(std::string x) : kind(Kind::string), s(std::move(x)) {}
  Value(std::string_view x) : kind(Kind::string), s(x) {}
  Value(const char* x) : kind(Kind::string), s(x) {}
  Value(List x) : kind(Kind::list), l(std::make_shared<List>(std::move(x))) {}
  Value(Dict x) : kind(Kind::dict), d(std::make_shared<Dict>(std::move(x))) {}
  static Value function(Function f) {
    Value v;
    v.kind = Kind::function;
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_list() const { return kind == Kind::list; }
  bool is_dict() const { return kind == Kind::dict; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  double num() const { return kind == Kind::floating ? f : kind == Kind::boolean ? double(b) : double(i); }

  /// dict[key]: the value, or nullptr.
  const Value* find(std::string_view key) const {
    if (!d) return nullptr;
    for (const auto& [k, v] : *d)
      if (k == key) return &v;
    return nullptr;
  }
  /// Sets dict[key] (appended if new, in place otherwise).
  void set(std::string key, Value v) {
    for (auto& [k, x] : *d)
      if (k == key) {
        x = std::move(v);
        return;
      }
    d->emplace_back(std::move(key), std::move(v));
  }

  /// Python truthiness (Undefined is false).
  bool truthy() const {
    switch (kind) {
      case Kind::undefined:
      case Kind::none:
        return false;
      case Kind::boolean:
        return b;
      case Kind::integer:
        return i != 0;
      case Kind::floating:
        return f != 0;
      case Kind::string:
        return !s.empty();
      case Kind::list:
        return !l->empty();
      case Kind::dict:
        return !d->empty();
      case Kind::function:
        return true;
    }
    return false;
  }

  const char* type_name() const {
    switch (kind) {
      case Kind::undefined:
        return "undefined";
      case Kind::none:
        return "NoneType";
      case Kind::boolean:
        return "bool";
      case Kind::integer:
        return "int";
      case Kind::floating:
        return "float";
      case Kind::string:
        return "str";
      case Kind::list:
        return "list";
      case Kind::dict:
        return is_namespace ? "Namespace" : "dict";
      case Kind::function:
        return "function";
    }
    return "?";
  }
};

/// Dict keys are strings; an integer key (rare: {0: 0, 512: 128}) is stored as "\x02" + its digits.
inline std::string dict_key(const Value& k) {
  if (k.kind == Value::Kind::integer) return "\x02" + std::to_string(k.i);
  return k.s;
}
inline Value key_value(const std::string& k) {
  if (!k.empty() && k[0] == '\x02') return Value(int64_t(std::stoll(k.substr(1))));
  return Value(k);
}

/// Appends the marks of string v (if any), shifted to start at `at`, to out.
inline void add_marks(Spans& out, const Value& v, std::size_t at) {
  if (v.kind == Value::Kind::string && v.marks)
    for (auto [x, y] : *v.marks) out.emplace_back(x + at, y + at);
}
/// a + b for strings, marks kept.
inline Value concat_marked(const Value& a, const Value& b) {
  Value r(a.s + b.s);
  if (a.marks || b.marks) {
    Spans m;
    add_marks(m, a, 0);
    add_marks(m, b, a.s.size());
    r.marks = std::make_shared<const Spans>(std::move(m));
  }
  return r;
}

/// Python's repr(float): the shortest text that reads back, "1.0" for integral values, "1e+20" style
/// exponents, inf/nan.
/// markupsafe's escape: & < > " ' as HTML entities (Jinja's `escape` filter and Markup + str).
inline std::string html_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&#34;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

inline std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  // Python switches to exponent form at exponents < -4 or >= 16 (repr uses 'r' format, precision 17).
  const double ax = std::fabs(x);
  const bool sci = ax != 0 && (ax < 1e-4 || ax >= 1e16);
  auto r = std::to_chars(buf, buf + sizeof buf, x, sci ? std::chars_format::scientific : std::chars_format::fixed);
  std::string o(buf, r.ptr);
  if (sci) {  // to_chars writes e+20 / e-05 as Python does; just ensure two exponent digits
    const auto e = o.find('e');
    std::string exp = o.substr(e + 2);
    if (exp.size() < 2) exp = "0" + exp;
    o = o.substr(0, e + 2) + exp;
  } else if (o.find('.') == std::string::npos) {
    o += ".0";
  }
  return o;
}

/// Python's repr(str): single quotes unless the text holds ' and no ".
inline std::string py_repr_str(std::string_view s) {
  const bool dq = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string o(1, q);
  for (unsigned char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == q) o.append("\\").append(1, char(c));
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else o += char(c);
  }
  return o + q;
}

std::string py_str(const Value& v);

/// Python's repr(): how a list or dict prints its elements.
inline std::string py_repr(const Value& v) {
  if (v.is_string()) return py_repr_str(v.s);
  if (v.is_undefined()) return "";
  return py_str(v);
}

/// Python's str() (what {{ value }} prints): None, True/False, 1.0, ['a', 1], {'k': 'v'}; Undefined
/// prints as "".
inline std::string py_str(const Value& v) {
  using K = Value::Kind;
  switch (v.kind) {
    case K::undefined:
      return "";
    case K::none:
      return "None";
    case K::boolean:
      return v.b ? "True" : "False";
    case K::integer:
      return std::to_string(v.i);
    case K::floating:
      return py_float(v.f);
    case K::string:
      return v.s;
    case K::list: {
      std::string o = v.is_tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.l->size(); ++k) o += (k ? ", " : "") + py_repr((*v.l)[k]);
      return o + (v.is_tuple ? (v.l->size() == 1 ? ",)" : ")") : "]");
    }
    case K::dict: {
      std::string o = v.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : *v.d) {
        o += (first ? "" : ", ") + py_repr(key_value(k)) + ": " + py_repr(x);
        first = false;
      }
      return o + (v.is_namespace ? "}>" : "}");
    }
    case K::function:
      return "<function>";
  }
  return "";
}

/// Python ==: numbers by value (True == 1 == 1.0), strings, lists and dicts element-wise.
inline bool py_eq(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind != K::floating && b.kind != K::floating)
      return (a.kind == K::boolean ? int64_t(a.b) : a.i) == (b.kind == K::boolean ? int64_t(b.b) : b.i);
    return a.num() == b.num();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::undefined:
    case K::none:
      return true;
    case K::string:
      return a.s == b.s;
    case K::list: {
      if (a.l->size() != b.l->size()) return false;
      for (std::size_t k = 0; k < a.l->size(); ++k)
        if (!py_eq((*a.l)[k], (*b.l)[k])) return false;
      return true;
    }
    case K::dict: {
      if (a.d->size() != b.d->size()) return false;
      for (const auto& [k, x] : *a.d) {
        const Value* y = b.find(k);
        if (!y || !py_eq(x, *y)) return false;
      }
      return true;
    }
    case K::function:
      return a.fn == b.fn;
    default:
      return false;
  }
}

/// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as HF's tojson filter
/// calls it (ensure_ascii=False by default: UTF-8 passes through). indent < 0: no newlines.
struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

inline void json_string(std::string& o, std::string_view s, bool ensure_ascii) {
  o += '"';
  for (std::size_t k = 0; k < s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"':
        o += "\\\"";
        continue;
      case '\\':
        o += "\\\\";
        continue;
      case '\n':
        o += "\\n";
        continue;
      case '\r':
        o += "\\r";
        continue;
      case '\t':
        o += "\\t";
        continue;
      case '\b':
        o += "\\b";
        continue;
      case '\f':
        o += "\\f";
        continue;
      default:
        break;
    }
    char b[16];
    if (c < 0x20) {
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else if (c >= 0x80 && ensure_ascii) {  // decode one UTF-8 character, write \uXXXX (surrogate pairs)
      const std::size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      char32_t cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
      for (std::size_t j = 1; j < n && k + j < s.size(); ++j)
        cp = (cp << 6) | (static_cast<unsigned char>(s[k + j]) & 0x3F);
      k += n - 1;
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", unsigned(0xD800 + (cp >> 10)), unsigned(0xDC00 + (cp & 0x3FF)));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", unsigned(cp));
      }
      o += b;
    } else {
      o += char(c);
    }
  }
  o += '"';
}

inline void to_json(std::string& o, const Value& v, const JsonStyle& st, int depth) {
  using K = Value::Kind;
  const auto newline = [&](int d) {
    if (st.indent < 0) return;
    o += '\n';
    o.append(std::size_t(st.indent) * std::size_t(d), ' ');
  };
  switch (v.kind) {
    case K::undefined:
      fail<FormatError>("jinja: tojson: value is undefined ('", v.s, "')");
    case K::none:
      o += "null";
      return;
    case K::boolean:
      o += v.b ? "true" : "false";
      return;
    case K::integer:
      o += std::to_string(v.i);
      return;
    case K::floating:
      o += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : py_float(v.f);
      return;
    case K::string:
      json_string(o, v.s, st.ensure_ascii);
      return;
    case K::list:
      if (v.is_generator)
        fail<FormatError>("jinja: tojson: Object of type generator is not JSON serializable (add '| list')");
      if (v.l->empty()) {
        o += "[]";
        return;
      }
      o += '[';
      for (std::size_t k = 0; k < v.l->size(); ++k) {
        if (k) o += st.item_sep;
        newline(depth + 1);
        to_json(o, (*v.l)[k], st, depth + 1);
      }
      newline(depth);
      o += ']';
      return;
    case K::dict: {
      if (v.d->empty()) {
        o += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& e : *v.d) items.push_back(&e);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      o += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) o += st.item_sep;
        newline(depth + 1);
        json_string(o, items[k]->first, st.ensure_ascii);
        o += st.key_sep;
        to_json(o, items[k]->second, st, depth + 1);
      }
      newline(depth);
      o += '}';
      return;
    }
    case K::function:
      fail<FormatError>("jinja: tojson: a function is not JSON serializable");
  }
}

}  // namespace kiln::jinja
