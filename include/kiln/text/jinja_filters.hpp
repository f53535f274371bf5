// kiln/text/jinja_filters.hpp - Jinja's filters for kiln's Jinja interpreter (kiln/text/jinja.hpp), with
// Jinja 3.1's defaults (sort/unique/dictsort/min/max compare strings case-insensitively; tojson is HF's:
// json.dumps with ensure_ascii=False). An unknown filter or test is an error when it is reached (jinja2
// raises at compile time, except inside conditional blocks, where it too raises when reached).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "kiln/text/jinja_builtins.hpp"

namespace kiln::jinja::detail {

// A sort key: strings lowercased unless case_sensitive (Jinja's ignore_case).
inline Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value(ascii_map(v.s, [](int c) { return std::tolower(c); }));
  return v;
}

// item.attr for map/selectattr/sort(attribute=): dotted paths, integer parts index lists.
inline Value attr_path(const Value& item, const std::string& path, int line) {
  Value cur = item;
  std::size_t p = 0;
  while (p <= path.size()) {
    std::size_t q = path.find('.', p);
    if (q == std::string::npos) q = path.size();
    const std::string part = path.substr(p, q - p);
    if (!part.empty() &&
        std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      cur = cur.is_list() || cur.is_string() ? Builtins::item_at(cur, std::stoll(part)) : Value::undefined(part);
    else if (cur.is_dict()) {
      const Value* v = cur.find(part);
      cur = v ? *v : Value::undefined(part);
    } else {
      cur = Value::undefined(part);
    }
    p = q + 1;
  }
  (void)line;
  return cur;
}

inline Value generator(List l) {
  Value v(std::move(l));
  v.is_generator = true;
  return v;
}

inline Value Builtins::filter(const std::string& name, Value v, const List& a, const KwArgs& kw, int line) {
  using K = Value::Kind;
  const auto str_arg = [&](std::size_t k, std::string_view n, std::string def) {
    const Value* x = arg(a, kw, k, n);
    return x ? py_str(*x) : def;
  };
  const auto bool_arg = [&](std::size_t k, std::string_view n) {
    const Value* x = arg(a, kw, k, n);
    return x && x->truthy();
  };
  if (name == "safe") {
    if (!v.is_string()) v = Value(py_str(v));
    v.is_safe = true;
    return v;
  }
  if (name == "string") return v.is_string() ? v : Value(py_str(v));
  if (name == "default" || name == "d") {
    if (v.is_undefined() || (bool_arg(1, "boolean") && !v.truthy())) {
      const Value* d = arg(a, kw, 0, "default_value");
      return d ? *d : Value("");
    }
    return v;
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(cp_count(v.s));
    if (v.is_list()) return Value(v.l->size());
    if (v.is_dict()) return Value(v.d->size());
    if (v.is_undefined()) return Value(0);
    err(line, "filter '", name, "': object of type '", v.type_name(), "' has no len()");
  }
  if (name == "trim") {
    if (v.is_undefined()) return Value("");
    const Value* chars = arg(a, kw, 0, "chars");
    if (v.is_string()) return stripped(v, py_strip(v.s, chars, true, true));
    return Value(py_strip(py_str(v), chars, true, true));
  }
  if (name == "upper") return Value(ascii_map(py_str(v), [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value(ascii_map(py_str(v), [](int c) { return std::tolower(c); }));
  if (name == "title") return Value(title(py_str(v)));
  if (name == "capitalize") return Value(capitalize(py_str(v)));
  if (name == "replace") return replace(v.is_string() ? v : Value(py_str(v)), a, kw, line);
  if (name == "e" || name == "escape" || name == "forceescape") {
    if (v.is_safe && name != "forceescape") return v;
    Value r(html_escape(py_str(v)));
    r.is_safe = true;
    return r;
  }
  if (name == "tojson") {
    JsonStyle st;
    if (const Value* x = arg(a, kw, 1, "indent"); x && !x->is_none()) st.indent = int(x->i), st.item_sep = ",";
    if (const Value* x = kwarg(kw, "ensure_ascii")) st.ensure_ascii = x->truthy();
    if (const Value* x = kwarg(kw, "sort_keys")) st.sort_keys = x->truthy();
    if (const Value* x = kwarg(kw, "separators"); x && x->is_list() && x->l->size() == 2)
      st.item_sep = py_str((*x->l)[0]), st.key_sep = py_str((*x->l)[1]);
    if (!a.empty() && kw.empty() && a[0].kind == K::integer) st.indent = int(a[0].i), st.item_sep = ",";
    std::string o;
    to_json(o, v, st, 0);
    return Value(o);
  }
  if (name == "int") {
    const Value* d = arg(a, kw, 0, "default");
    if (v.kind == K::integer) return v;
    if (v.kind == K::boolean) return Value(int64_t(v.b));
    if (v.kind == K::floating) return Value(int64_t(v.f));
    if (v.is_string()) {
      try {
        std::size_t used = 0;
        const std::string t = py_strip(v.s, nullptr, true, true);
        const double x = std::stod(t, &used);
        if (used == t.size()) return Value(int64_t(x));
      } catch (const std::exception&) {
      }
    }
    return d ? *d : Value(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.num());
    if (v.is_string()) {
      try {
        return Value(std::stod(v.s));
      } catch (const std::exception&) {
      }
    }
    const Value* d = arg(a, kw, 0, "default");
    return d ? *d : Value(0.0);
  }
  if (name == "abs") {
    if (v.kind == K::integer) return Value(v.i < 0 ? -v.i : v.i);
    return Value(std::fabs(v.num()));
  }
  if (name == "round") {
    const Value* p = arg(a, kw, 0, "precision");
    const double m = std::pow(10.0, p ? double(p->i) : 0.0);
    return Value(std::nearbyint(v.num() * m) / m);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) err(line, "filter 'items' on a ", v.type_name());
    return *method(v, "items", {}, {}, line);
  }
  if (name == "list") return Value(iterate(v, line));  // also turns a map/select result into a list
  if (name == "first" || name == "last") {
    const List l = iterate(v, line);
    if (l.empty()) return Value::undefined(name);
    return name == "first" ? l.front() : l.back();
  }
  if (name == "reverse") {
    if (v.is_string()) return slice(v, Value(), Value(), Value(-1), line);
    List l = iterate(v, line);
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "join") {
    const std::string sep = str_arg(0, "d", "");
    const Value* at = arg(a, kw, 1, "attribute");
    Value o("");
    bool first = true;
    for (const auto& x : iterate(v, line)) {
      const Value item = at ? attr_path(x, py_str(*at), line) : x;
      if (!first) o = concat_marked(o, Value(sep));
      o = concat_marked(o, item.is_string() ? item : Value(py_str(item)));
      first = false;
    }
    return o;
  }
  if (name == "indent") {
    const Value* w = arg(a, kw, 0, "width");
    const std::string ind = w && w->is_string() ? w->s : std::string(std::size_t(w ? w->i : 4), ' ');
    const bool first = bool_arg(1, "first"), blank = bool_arg(2, "blank");
    std::string s = py_str(v) + "\n";
    List lines = *method(Value(s), "splitlines", {}, {}, line)->l;
    std::string o;
    for (std::size_t k = 0; k < lines.size(); ++k) {
      const std::string& ln = lines[k].s;
      if (k == 0) o = ln;
      else o += "\n" + ((blank || !ln.empty()) ? ind + ln : ln);
    }
    return Value(first ? ind + o : o);
  }
  if (name == "attr") return get_attr(v, str_arg(0, "name", ""), line);
  if (name == "map") {
    List out;
    if (!v.truthy()) return generator(std::move(out));  // jinja2: "if value:" before iterating
    if (const Value* at = kwarg(kw, "attribute")) {
      const Value* def = kwarg(kw, "default");
      for (const auto& x : iterate(v, line)) {
        Value r = attr_path(x, py_str(*at), line);
        out.push_back(r.is_undefined() && def ? *def : r);
      }
      return generator(std::move(out));
    }
    if (a.empty()) err(line, "filter 'map' needs a filter name or attribute=");
    const List rest(a.begin() + 1, a.end());
    for (const auto& x : iterate(v, line)) out.push_back(filter(py_str(a[0]), x, rest, kw, line));
    return generator(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name.ends_with("attr");
    const bool want = name.starts_with("select");
    const std::size_t t0 = by_attr ? 1 : 0;
    if (by_attr && a.empty()) err(line, "filter '", name, "' needs an attribute name");
    List out;
    if (!v.truthy()) return generator(std::move(out));  // jinja2: "if value:" before iterating
    for (const auto& x : iterate(v, line)) {
      const Value subject = by_attr ? attr_path(x, py_str(a[0]), line) : x;
      bool ok;
      if (a.size() <= t0) ok = subject.truthy();
      else ok = test(py_str(a[t0]), subject, List(a.begin() + std::ptrdiff_t(t0) + 1, a.end()), line);
      if (ok == want) out.push_back(x);
    }
    return generator(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max" || name == "dictsort") {
    const bool cs = kwarg(kw, "case_sensitive") && kwarg(kw, "case_sensitive")->truthy();
    const Value* at = kwarg(kw, "attribute");
    List l;
    if (name == "dictsort") {
      if (!v.is_dict()) err(line, "filter 'dictsort' on a ", v.type_name());
      l = method(v, "items", {}, {}, line)->l ? *method(v, "items", {}, {}, line)->l : List{};
    } else {
      l = iterate(v, line);
    }
    const auto key = [&](const Value& x) {
      if (name == "dictsort") return sort_key((*x.l)[0], cs);
      return sort_key(at ? attr_path(x, py_str(*at), line) : x, cs);
    };
    if (name == "unique") {
      List out, keys;
      for (const auto& x : l) {
        Value k = key(x);
        if (std::none_of(keys.begin(), keys.end(), [&](const Value& y) { return py_eq(y, k); }))
          keys.push_back(k), out.push_back(x);
      }
      return Value(std::move(out));
    }
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) { return less(key(x), key(y), line); });
    if (name == "min" || name == "max") {
      if (l.empty()) return Value::undefined(name);
      return name == "min" ? l.front() : l.back();
    }
    if (bool_arg(0, "reverse")) std::reverse(l.begin(), l.end());
    return Value(std::move(l));
  }
  if (name == "sum") {
    const Value* at = kwarg(kw, "attribute");
    const Value* start = kwarg(kw, "start");
    Value acc = start ? *start : Value(0);
    for (const auto& x : iterate(v, line)) acc = binary("+", acc, at ? attr_path(x, py_str(*at), line) : x, line);
    return acc;
  }
  err(line, "unsupported filter '", name, "'");
}

}  // namespace kiln::jinja::detail
