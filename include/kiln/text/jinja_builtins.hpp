// kiln/text/jinja_builtins.hpp - what kiln's Jinja interpreter (kiln/text/jinja.hpp) knows about
// values: attribute and item access (Jinja's rules: obj.x tries a method first, then the key; obj['x']
// the key first), slicing, the binary operators with Python semantics, Jinja's filters and tests, and
// the str / dict methods templates call. Strings index, slice and count by code point, as Python's.
// upper/lower/title/capitalize change ASCII letters only (chat templates apply them to ASCII roles).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/text/jinja_value.hpp"

namespace kiln::jinja::detail {

/// Byte offsets of the code points of s (and s.size() last).
inline std::vector<std::size_t> cp_offsets(std::string_view s) {
  std::vector<std::size_t> o;
  for (std::size_t k = 0; k < s.size(); ++k)
    if ((static_cast<unsigned char>(s[k]) & 0xC0) != 0x80) o.push_back(k);
  o.push_back(s.size());
  return o;
}
inline std::size_t cp_count(std::string_view s) { return cp_offsets(s).size() - 1; }

/// Python's str.isspace() for the code point starting at s[k] (length in n).
inline bool py_space_at(std::string_view s, std::size_t k, std::size_t& n) {
  const auto u = [&](std::size_t j) { return static_cast<unsigned char>(s[k + j]); };
  n = 1;
  const unsigned c = u(0);
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  if (c == 0xC2 && k + 1 < s.size()) {
    n = 2;
    return u(1) == 0x85 || u(1) == 0xA0;
  }
  if (c == 0xE1 && k + 2 < s.size() && u(1) == 0x9A && u(2) == 0x80) {
    n = 3;
    return true;
  }
  if (c == 0xE2 && k + 2 < s.size()) {
    n = 3;
    return (u(1) == 0x80 && (u(2) <= 0x8A || u(2) == 0xA8 || u(2) == 0xA9 || u(2) == 0xAF)) ||
           (u(1) == 0x81 && u(2) == 0x9F);
  }
  if (c == 0xE3 && k + 2 < s.size() && u(1) == 0x80 && u(2) == 0x80) {
    n = 3;
    return true;
  }
  return false;
}

/// Python's str.strip / lstrip / rstrip: whitespace (no chars given) or the characters of chars.
inline std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::size_t a = 0, e = s.size();
  if (chars && chars->is_string()) {
    const auto in = [&](std::size_t from, std::size_t to) {
      return chars->s.find(s.substr(from, to - from)) != std::string::npos;
    };
    const auto off = cp_offsets(s);
    std::size_t i = 0, j = off.size() - 1;
    if (left)
      while (i < j && in(off[i], off[i + 1])) ++i;
    if (right)
      while (j > i && in(off[j - 1], off[j])) --j;
    return std::string(s.substr(off[i], off[j] - off[i]));
  }
  if (left) {
    std::size_t n;
    while (a < e && py_space_at(s, a, n)) a += n;
  }
  if (right) {
    while (e > a) {
      std::size_t st = e - 1, n;
      while (st > a && (static_cast<unsigned char>(s[st]) & 0xC0) == 0x80) --st;
      if (!py_space_at(s, st, n) || st + n != e) break;
      e = st;
    }
  }
  return std::string(s.substr(a, e - a));
}

inline std::string ascii_map(std::string s, int (*fn)(int)) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(fn(c));
  return s;
}

/// o.strip()-like result r (a substring of o.s), with o's marks: r starts at o.s.find(r) (the text before
/// it is all stripped characters, so no earlier occurrence can start there).
inline Value stripped(const Value& o, const std::string& r) {
  if (!o.marks || r.empty()) return Value(r);
  return o.substr(o.s.find(r), r.size());
}

class Builtins {
 public:
  static Value item_at(const Value& o, int64_t k) { return get_item(o, Value(k), 0); }

 protected:
  [[noreturn]] static void err(int line, const auto&... args) {
    fail<FormatError>("jinja: ", args..., " at line ", line);
  }

  /// The elements a for loop or a filter walks: list items, dict keys, string characters.
  static List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Value::Kind::undefined:
        return {};
      case Value::Kind::list:
        return *v.l;
      case Value::Kind::dict: {
        List keys;
        for (const auto& kv : *v.d) keys.push_back(key_value(kv.first));
        return keys;
      }
      case Value::Kind::string: {
        List cs;
        const auto off = cp_offsets(v.s);
        for (std::size_t k = 0; k + 1 < off.size(); ++k) cs.emplace_back(v.s.substr(off[k], off[k + 1] - off[k]));
        return cs;
      }
      default:
        err(line, "'", v.type_name(), "' object is not iterable");
    }
  }

  static Value get_attr(const Value& o, const std::string& name, int line) {
    if (o.is_undefined()) err(line, "'", o.s, "' is undefined (reading its attribute '", name, "')");
    if (o.is_dict()) {
      if (const Value* v = o.find(name)) return *v;
      return Value::undefined(name);
    }
    if (o.is_none()) err(line, "'None' has no attribute '", name, "'");
    return Value::undefined(name);
  }

  static Value get_item(const Value& o, const Value& key, int line) {
    if (o.is_undefined()) err(line, "'", o.s, "' is undefined (reading its item ", py_repr(key), ")");
    if (o.is_dict()) {
      if (key.is_string() || key.kind == Value::Kind::integer)
        if (const Value* v = o.find(dict_key(key))) return *v;
      return Value::undefined(py_str(key));
    }
    if ((o.is_list() || o.is_string()) && key.kind == Value::Kind::integer) {
      if (o.is_list()) {
        const int64_t n = int64_t(o.l->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n) return Value::undefined("index " + std::to_string(key.i));  // jinja2: Undefined
        return (*o.l)[std::size_t(k)];
      }
      const auto off = cp_offsets(o.s);
      const int64_t n = int64_t(off.size() - 1);
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value::undefined("index " + std::to_string(key.i));
      return Value(o.s.substr(off[std::size_t(k)], off[std::size_t(k) + 1] - off[std::size_t(k)]));
    }
    if (o.is_none()) err(line, "'None' is not subscriptable");
    return Value::undefined(py_str(key));
  }

  static Value slice(const Value& o, const Value& a, const Value& b, const Value& c, int line) {
    const int64_t step = c.kind == Value::Kind::integer ? c.i : 1;
    if (step == 0) err(line, "slice step cannot be zero");
    std::vector<std::size_t> off;
    int64_t n;
    if (o.is_list()) n = int64_t(o.l->size());
    else if (o.is_string()) off = cp_offsets(o.s), n = int64_t(off.size() - 1);
    else err(line, "cannot slice a ", o.type_name());
    const auto norm = [&](const Value& v, int64_t def) {
      if (v.kind != Value::Kind::integer) return def;
      int64_t x = v.i < 0 ? v.i + n : v.i;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t st = norm(a, step > 0 ? 0 : n - 1), en = norm(b, step > 0 ? n : -1);
    if (o.is_string() && step == 1)
      return st < en ? o.substr(off[std::size_t(st)], off[std::size_t(en)] - off[std::size_t(st)]) : Value("");
    List items;
    std::string s;
    for (int64_t k = st; step > 0 ? k < en : k > en; k += step) {
      if (o.is_list()) items.push_back((*o.l)[std::size_t(k)]);
      else s.append(o.s, off[std::size_t(k)], off[std::size_t(k) + 1] - off[std::size_t(k)]);
    }
    return o.is_list() ? Value(std::move(items)) : Value(std::move(s));
  }

  static bool less(const Value& a, const Value& b, int line) {
    if (a.is_number() && b.is_number()) return a.num() < b.num();
    if (a.is_string() && b.is_string()) return a.s < b.s;
    if (a.is_list() && b.is_list()) {
      for (std::size_t k = 0; k < std::min(a.l->size(), b.l->size()); ++k) {
        if (less((*a.l)[k], (*b.l)[k], line)) return true;
        if (less((*b.l)[k], (*a.l)[k], line)) return false;
      }
      return a.l->size() < b.l->size();
    }
    err(line, "'<' not supported between a ", a.type_name(), " and a ", b.type_name());
  }

  static bool contains(const Value& hay, const Value& x, int line) {
    if (hay.is_string()) {
      if (!x.is_string()) err(line, "'in <string>' requires a string, not a ", x.type_name());
      return hay.s.find(x.s) != std::string::npos;
    }
    if (hay.is_list()) return std::any_of(hay.l->begin(), hay.l->end(), [&](const Value& v) { return py_eq(v, x); });
    if (hay.is_dict()) return (x.is_string() || x.kind == Value::Kind::integer) && hay.find(dict_key(x));
    if (hay.is_undefined()) return false;
    err(line, "'in' on a ", hay.type_name());
  }

  static Value binary(const std::string& op, const Value& a, const Value& b, int line) {
    using K = Value::Kind;
    if (op == "==") return Value(py_eq(a, b));
    if (op == "!=") return Value(!py_eq(a, b));
    if (op == "<") return Value(less(a, b, line));
    if (op == ">") return Value(less(b, a, line));
    if (op == "<=") return Value(!less(b, a, line));
    if (op == ">=") return Value(!less(a, b, line));
    if (op == "in") return Value(contains(b, a, line));
    if (op == "not in") return Value(!contains(b, a, line));
    if (op == "~") return concat_marked(a.is_string() ? a : Value(py_str(a)), b.is_string() ? b : Value(py_str(b)));
    if (a.is_undefined() || b.is_undefined())
      err(line, "'", a.is_undefined() ? a.s : b.s, "' is undefined (operand of '", op, "')");
    const bool ints = (a.kind == K::integer || a.kind == K::boolean) && (b.kind == K::integer || b.kind == K::boolean);
    const auto iv = [](const Value& v) { return v.kind == K::boolean ? int64_t(v.b) : v.i; };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.is_safe == b.is_safe) {
          Value r = concat_marked(a, b);
          r.is_safe = a.is_safe;
          return r;
        }
        // Markup + str escapes the str (markupsafe), the sum is Markup.
        Value r(a.is_safe ? a.s + html_escape(b.s) : html_escape(a.s) + b.s);
        r.is_safe = true;
        return r;
      }
      if (a.is_list() && b.is_list()) {
        List l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return Value(std::move(l));
      }
      if (ints) return Value(iv(a) + iv(b));
      if (a.is_number() && b.is_number()) return Value(a.num() + b.num());
    } else if (op == "-") {
      if (ints) return Value(iv(a) - iv(b));
      if (a.is_number() && b.is_number()) return Value(a.num() - b.num());
    } else if (op == "*") {
      if (ints) return Value(iv(a) * iv(b));
      if ((a.is_string() || a.is_list()) && (b.kind == K::integer)) {
        if (a.is_string()) {
          std::string s;
          for (int64_t k = 0; k < b.i; ++k) s += a.s;
          return Value(s);
        }
        List l;
        for (int64_t k = 0; k < b.i; ++k) l.insert(l.end(), a.l->begin(), a.l->end());
        return Value(std::move(l));
      }
      if (a.is_number() && b.is_number()) return Value(a.num() * b.num());
    } else if (op == "/") {
      if (a.is_number() && b.is_number()) {
        if (b.num() == 0) err(line, "division by zero");
        return Value(a.num() / b.num());
      }
    } else if (op == "//" || op == "%") {
      if (ints) {
        if (iv(b) == 0) err(line, "integer division or modulo by zero");
        const int64_t x = iv(a), y = iv(b);
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python floors
        return Value(op == "//" ? q : r);
      }
      if (a.is_number() && b.is_number()) {
        if (b.num() == 0) err(line, "float division or modulo by zero");
        const double q = std::floor(a.num() / b.num());
        return Value(op == "//" ? q : a.num() - q * b.num());
      }
      if (op == "%" && a.is_string()) return Value(percent_format(a.s, b, line));
    } else if (op == "**") {
      if (ints && iv(b) >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < iv(b); ++k) r *= iv(a);
        return Value(r);
      }
      if (a.is_number() && b.is_number()) return Value(std::pow(a.num(), b.num()));
    }
    err(line, "unsupported operand types for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
  }

  static const Value* kwarg(const KwArgs& kw, std::string_view name) {
    for (const auto& [k, v] : kw)
      if (k == name) return &v;
    return nullptr;
  }
  // Positional argument k, else keyword `name`, else nullptr.
  static const Value* arg(const List& a, const KwArgs& kw, std::size_t k, std::string_view name) {
    return k < a.size() ? &a[k] : kwarg(kw, name);
  }

  static std::vector<std::string> split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right) {
    std::vector<std::string> out;
    if (sep && sep->is_string()) {
      if (sep->s.empty()) fail<FormatError>("jinja: split(): empty separator");
      if (!from_right) {
        std::size_t p = 0;
        for (std::size_t q;
             (maxsplit < 0 || int64_t(out.size()) < maxsplit) && (q = s.find(sep->s, p)) != std::string::npos;
             p = q + sep->s.size())
          out.push_back(s.substr(p, q - p));
        out.push_back(s.substr(p));
      } else {
        std::size_t e = s.size();
        for (std::size_t q; (maxsplit < 0 || int64_t(out.size()) < maxsplit) && e >= sep->s.size() &&
                            (q = s.rfind(sep->s, e - sep->s.size())) != std::string::npos;
             e = q)
          out.insert(out.begin(), s.substr(q + sep->s.size(), e - q - sep->s.size()));
        out.insert(out.begin(), s.substr(0, e));
      }
      return out;
    }
    // Whitespace split: runs of whitespace separate, empty strings dropped.
    if (from_right && maxsplit >= 0)
      fail<FormatError>("jinja: unsupported construct: rsplit() on whitespace with maxsplit");
    std::size_t k = 0, n;
    while (k < s.size()) {
      while (k < s.size() && py_space_at(s, k, n)) k += n;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.push_back(py_strip(s.substr(k), nullptr, false, true));
        break;
      }
      std::size_t e = k;
      while (e < s.size() && !py_space_at(s, e, n)) ++e;
      out.push_back(s.substr(k, e - k));
      k = e;
    }
    return out;
  }

  // Python's "fmt % args" for %s %r %d %i %f %x %% with optional flags, width and precision.
  static std::string percent_format(const std::string& fmt, const Value& args, int line) {
    const List items = args.is_list() && args.is_tuple ? *args.l : List{args};
    std::size_t next = 0;
    std::string o;
    for (std::size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] != '%') {
        o += fmt[k];
        continue;
      }
      std::size_t e = k + 1;
      while (e < fmt.size() && std::string_view("-+ 0#.0123456789").find(fmt[e]) != std::string_view::npos) ++e;
      if (e >= fmt.size()) err(line, "'%' formatting: incomplete format");
      const char conv = fmt[e];
      const std::string spec = fmt.substr(k + 1, e - k - 1);
      k = e;
      if (conv == '%') {
        o += '%';
        continue;
      }
      if (next >= items.size()) err(line, "'%' formatting: not enough arguments");
      const Value& v = items[next++];
      char buf[512];
      if (conv == 's' || conv == 'r') {
        const std::string x = conv == 's' ? py_str(v) : py_repr(v);
        std::snprintf(buf, sizeof buf, ("%" + spec + "s").c_str(), x.c_str());
        o += std::string_view(buf).size() + 1 >= sizeof buf ? x : std::string(buf);
      } else if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X') {
        if (!v.is_number())
          err(line, "'%' formatting: %", std::string(1, conv), " needs a number, not ", v.type_name());
        std::snprintf(buf, sizeof buf, ("%" + spec + "ll" + std::string(1, conv == 'i' ? 'd' : conv)).c_str(),
                      static_cast<long long>(v.kind == Value::Kind::floating  ? int64_t(v.f)
                                             : v.kind == Value::Kind::boolean ? int64_t(v.b)
                                                                              : v.i));
        o += buf;
      } else if (conv == 'f' || conv == 'e' || conv == 'g') {
        if (!v.is_number())
          err(line, "'%' formatting: %", std::string(1, conv), " needs a number, not ", v.type_name());
        std::snprintf(buf, sizeof buf, ("%" + spec + std::string(1, conv)).c_str(), v.num());
        o += buf;
      } else {
        err(line, "unsupported construct: '%", std::string(1, conv), "' in '%' formatting");
      }
    }
    if (next < items.size()) err(line, "'%' formatting: not all arguments converted during string formatting");
    return o;
  }

  static std::string title(const std::string& s) {  // Jinja's title filter: words split at whitespace - ( ) [ ] { }
    std::string o = s;
    bool start = true;
    for (char& c : o) {
      const bool sep = std::string_view(" \t\n\r\f\v-()[]{}").find(c) != std::string_view::npos;
      if (sep) {
        start = true;
        continue;
      }
      if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
      start = false;
    }
    return o;
  }

  static std::string format(const std::string& fmt, const List& a, const KwArgs& kw, int line) {  // str.format
    std::string o;
    std::size_t auto_idx = 0;
    for (std::size_t k = 0; k < fmt.size(); ++k) {
      if (fmt[k] == '{' && k + 1 < fmt.size() && fmt[k + 1] == '{') {
        o += '{';
        ++k;
        continue;
      }
      if (fmt[k] == '}' && k + 1 < fmt.size() && fmt[k + 1] == '}') {
        o += '}';
        ++k;
        continue;
      }
      if (fmt[k] != '{') {
        o += fmt[k];
        continue;
      }
      const std::size_t e = fmt.find('}', k);
      if (e == std::string::npos) err(line, "str.format(): unmatched '{'");
      const std::string field = fmt.substr(k + 1, e - k - 1);
      if (field.find_first_of(":!.[") != std::string::npos)
        err(line, "unsupported construct: str.format field '{", field, "}'");
      const Value* v = nullptr;
      if (field.empty()) v = auto_idx < a.size() ? &a[auto_idx++] : nullptr;
      else if (std::isdigit(static_cast<unsigned char>(field[0])))
        v = std::stoul(field) < a.size() ? &a[std::stoul(field)] : nullptr;
      else v = kwarg(kw, field);
      if (!v) err(line, "str.format(): no argument for '{", field, "}'");
      o += py_str(*v);
      k = e;
    }
    return o;
  }

  /// obj.name(args) for str, dict and list; nullopt: no such method (then the attribute is called).
  static std::optional<Value> method(const Value& o, const std::string& name, const List& a, const KwArgs& kw,
                                     int line) {
    if (o.is_string()) {
      const std::string& s = o.s;
      if (name == "startswith" || name == "endswith") {
        const Value* p = arg(a, kw, 0, "prefix");
        if (!p) err(line, "str.", name, "() needs an argument");
        List cands = p->is_list() ? *p->l : List{*p};
        for (const auto& c : cands) {
          if (!c.is_string()) err(line, "str.", name, "() takes strings");
          if (name == "startswith" ? s.starts_with(c.s) : s.ends_with(c.s)) return Value(true);
        }
        return Value(false);
      }
      if (name == "strip") return stripped(o, py_strip(s, arg(a, kw, 0, "chars"), true, true));
      if (name == "lstrip") return stripped(o, py_strip(s, arg(a, kw, 0, "chars"), true, false));
      if (name == "rstrip") return stripped(o, py_strip(s, arg(a, kw, 0, "chars"), false, true));
      if (name == "split" || name == "rsplit") {
        const Value* ms = arg(a, kw, 1, "maxsplit");
        const Value* sep = arg(a, kw, 0, "sep");
        const bool by_sep = sep && sep->is_string();
        List l;
        std::size_t at = 0;  // where the next part starts: parts around a separator are contiguous
        for (auto& x : split(s, by_sep ? sep : nullptr, ms ? ms->i : -1, name == "rsplit")) {
          if (!by_sep) at = s.find(x, at);  // whitespace runs between parts hold no part's text
          l.push_back(o.marks ? o.substr(at, x.size()) : Value(std::move(x)));
          at += l.back().s.size() + (by_sep ? sep->s.size() : 0);
        }
        return Value(std::move(l));
      }
      if (name == "splitlines") {
        List l;
        std::size_t p = 0;
        while (p < s.size()) {
          std::size_t q = s.find('\n', p);
          if (q == std::string::npos) q = s.size();
          l.emplace_back(s.substr(p, q - p));
          p = q + 1;
        }
        return Value(std::move(l));
      }
      if (name == "replace") return replace(o, a, kw, line);
      if (name == "upper") return Value(ascii_map(s, [](int c) { return std::toupper(c); }));
      if (name == "lower") return Value(ascii_map(s, [](int c) { return std::tolower(c); }));
      if (name == "title") return Value(title(s));
      if (name == "capitalize") return Value(capitalize(s));
      if (name == "format") return Value(format(s, a, kw, line));
      if (name == "find" || name == "rfind" || name == "count" || name == "index") {
        const Value* x = arg(a, kw, 0, "sub");
        if (!x || !x->is_string()) err(line, "str.", name, "() needs a string");
        if (name == "count") {
          int64_t n = 0;
          if (x->s.empty()) return Value(int64_t(cp_count(s) + 1));
          for (std::size_t p = s.find(x->s); p != std::string::npos; p = s.find(x->s, p + x->s.size())) ++n;
          return Value(n);
        }
        const std::size_t p = name == "rfind" ? s.rfind(x->s) : s.find(x->s);
        if (p == std::string::npos) {
          if (name == "index") err(line, "str.index(): substring not found");
          return Value(int64_t(-1));
        }
        return Value(int64_t(cp_count(s.substr(0, p))));
      }
      if (name == "join") {
        const Value* l = arg(a, kw, 0, "iterable");
        std::string out;
        bool first = true;
        for (const auto& x : iterate(l ? *l : Value(), line)) out += (first ? "" : s) + py_str(x), first = false;
        return Value(out);
      }
      if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
          name == "isupper") {
        if (s.empty()) return Value(false);
        bool ok = true, cased = false;
        for (unsigned char c : s) {
          if (name == "isdigit") ok &= std::isdigit(c) != 0;
          else if (name == "isalpha") ok &= std::isalpha(c) != 0;
          else if (name == "isalnum") ok &= std::isalnum(c) != 0;
          else if (name == "isspace") ok &= std::isspace(c) != 0;
          else if (name == "islower") ok &= !std::isupper(c), cased |= std::islower(c) != 0;
          else ok &= !std::islower(c), cased |= std::isupper(c) != 0;
        }
        return Value(ok && (name.substr(0, 3) != "isl" && name != "isupper" ? true : cased));
      }
      return std::nullopt;
    }
    if (o.is_dict()) {
      if (name == "items") {
        List l;
        for (const auto& [k, v] : *o.d) l.emplace_back(List{key_value(k), v});
        return Value(std::move(l));
      }
      if (name == "keys") return Value(iterate(o, line));
      if (name == "values") {
        List l;
        for (const auto& kv : *o.d) l.push_back(kv.second);
        return Value(std::move(l));
      }
      if (name == "get") {
        const Value* k = arg(a, kw, 0, "key");
        if (!k) err(line, "dict.get() needs a key");
        if (k->is_string() || k->kind == Value::Kind::integer)
          if (const Value* v = o.find(dict_key(*k))) return *v;
        const Value* d = arg(a, kw, 1, "default");
        return d ? *d : Value::none();
      }
    }
    if ((o.is_dict() || o.is_list()) &&
        (name == "append" || name == "pop" || name == "update" || name == "extend" || name == "insert" ||
         name == "remove" || name == "clear" || name == "setdefault"))
      err(line, "unsupported construct: ", o.type_name(), ".", name, "() (the sandbox forbids changing a ",
          o.type_name(), ")");
    return std::nullopt;
  }

  static std::string capitalize(const std::string& s) {
    std::string o = ascii_map(s, [](int c) { return std::tolower(c); });
    if (!o.empty() && static_cast<unsigned char>(o[0]) < 0x80) o[0] = static_cast<char>(std::toupper(o[0]));
    return o;
  }

  // str.replace / the replace filter; the text kept from src keeps its marks (the inserted text does not).
  static Value replace(const Value& src, const List& a, const KwArgs& kw, int line) {
    const std::string& s = src.s;
    const Value* old = arg(a, kw, 0, "old");
    const Value* nw = arg(a, kw, 1, "new");
    const Value* cnt = arg(a, kw, 2, "count");
    if (!old || !nw || !old->is_string()) err(line, "replace() needs (old, new)");
    const std::string n = py_str(*nw);
    int64_t left = cnt && cnt->kind == Value::Kind::integer ? cnt->i : -1;
    std::string o;
    Spans m;
    const auto keep = [&](std::size_t from, std::size_t len) {  // s[from, from + len) to the output, with marks
      if (src.marks)
        for (auto [x, y] : *src.marks) {
          const std::size_t lo = std::max(x, from), hi = std::min(y, from + len);
          if (lo < hi) m.emplace_back(lo - from + o.size(), hi - from + o.size());
        }
      o.append(s, from, len);
    };
    if (old->s.empty()) {  // Python inserts new between characters
      const auto off = cp_offsets(s);
      for (std::size_t k = 0; k + 1 < off.size(); ++k) {
        if (left != 0) o += n, --left;
        keep(off[k], off[k + 1] - off[k]);
      }
      if (left != 0) o += n;
    } else {
      std::size_t p = 0;
      for (std::size_t q; left != 0 && (q = s.find(old->s, p)) != std::string::npos; p = q + old->s.size(), --left) {
        keep(p, q - p);
        o += n;
      }
      keep(p, s.size() - p);
    }
    Value r(std::move(o));
    if (!m.empty()) r.marks = std::make_shared<const Spans>(std::move(m));
    return r;
  }

  bool test(const std::string& name, const Value& v, const List& a, int line) {
    using K = Value::Kind;
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind == K::integer;
    if (name == "float") return v.kind == K::floating;
    if (name == "boolean") return v.kind == K::boolean;
    if (name == "true") return v.kind == K::boolean && v.b;
    if (name == "false") return v.kind == K::boolean && !v.b;
    if (name == "callable") return v.kind == K::function;
    if (name == "lower") return v.is_string() && ascii_map(v.s, [](int c) { return std::tolower(c); }) == v.s;
    if (name == "upper") return v.is_string() && ascii_map(v.s, [](int c) { return std::toupper(c); }) == v.s;
    if (name == "even" || name == "odd") {
      if (v.kind != K::integer) err(line, "test '", name, "' on a ", v.type_name());
      return (v.i % 2 == 0) == (name == "even");
    }
    if (a.empty() &&
        (name == "eq" || name == "equalto" || name == "==" || name == "sameas" || name == "ne" ||
         name == "divisibleby" || name == "in" || name == "gt" || name == "lt" || name == "ge" || name == "le"))
      err(line, "test '", name, "' needs an argument");
    if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, a[0]);
    if (name == "ne" || name == "!=") return !py_eq(v, a[0]);
    // Python's "is": None, booleans and (CPython's cached) small integers are identical when equal.
    if (name == "sameas")
      return v.kind == a[0].kind &&
             (v.is_none() || v.kind == K::boolean || (v.kind == K::integer && v.i >= -5 && v.i <= 256)) &&
             py_eq(v, a[0]);
    if (name == "divisibleby") return a[0].i != 0 && v.kind == K::integer && v.i % a[0].i == 0;
    if (name == "in") return contains(a[0], v, line);
    if (name == "gt" || name == ">") return less(a[0], v, line);
    if (name == "lt" || name == "<") return less(v, a[0], line);
    if (name == "ge" || name == ">=") return !less(v, a[0], line);
    if (name == "le" || name == "<=") return !less(a[0], v, line);
    err(line, "unsupported test '", name, "'");
  }

  Value filter(const std::string& name, Value v, const List& a, const KwArgs& kw, int line);
};

}  // namespace kiln::jinja::detail

#include "kiln/text/jinja_filters.hpp"
