// kiln/generate/json_schema.hpp - JSON and a JSON Schema subset as a Grammar (generate/grammar.hpp), for
// constrained decoding: JSON mode, structured outputs and forced tool calls.
//
//   auto g = kiln::json_schema_grammar(R"({"type": "object", "properties": {"n": {"type": "integer"}},
//                                          "required": ["n"], "additionalProperties": false})");
//   auto any = kiln::json_object_grammar();   // any JSON object (OpenAI's response_format json_object)
//
// The schema subset (anything else is refused, naming the keyword and where it is: never ignored):
//   type: "object" | "array" | "string" | "number" | "integer" | "boolean" | "null", or a list of them;
//   object: properties (generated in the order given), required, additionalProperties (false; absent or true
//     with properties: only the listed properties are generated; a schema: without properties, a map of
//     any keys to values of that schema);
//   array: items, minItems, maxItems;  string: minLength, maxLength (in characters: an escape is one);
//   enum, const (any JSON values; generated as their compact JSON text), anyOf, $ref to "#", "#/$defs/..."
//   or "#/definitions/..." (recursive schemas too), true / {} (any value);
//   annotations are ignored: title, description, default, examples, $schema, $id, $comment, deprecated,
//   readOnly, writeOnly.
// Refused: pattern, format, minimum / maximum / exclusive* / multipleOf, oneOf, allOf, not, if/then/else,
// prefixItems, uniqueItems, patternProperties, minProperties, ... (a schema of `false` too).
//
// The language is a subset of the schema's valid documents: strings are UTF-8 (any escape allowed, raw
// control characters not), numbers have at most 16 integer digits, 16 fraction digits and a 3-digit
// exponent, integers no fraction or exponent, and whitespace between tokens is none, one space, or one
// newline and up to kJsonMaxIndent spaces or tabs (llama.cpp's JSON-schema grammars' rule: compact, ", "
// and indented layouts, but a model cannot loop on whitespace); none before or after the value, so
// generation ends as soon as the value is complete.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/generate/grammar.hpp"

namespace kiln {

/// Whitespace between two JSON tokens: none, one space, or a newline and at most this many spaces or tabs
/// (an indented layout of up to 10 levels of 2 spaces).
inline constexpr int kJsonMaxIndent = 20;

/// Builds JSON rules into a Grammar (several values and literal text can share one grammar: a tool call's
/// markup around its arguments).
class JsonGrammarBuilder {
 public:
  using json = nlohmann::ordered_json;
  using Sym = Grammar::Sym;

  explicit JsonGrammarBuilder(Grammar& g) : g_(g) {}

  /// Whitespace between tokens: none, one space, or a newline and up to kJsonMaxIndent spaces or tabs.
  Sym ws() {
    if (!ws_) {
      uint32_t indent = g_.rule("indent0");
      g_.alt(indent, {});
      const Sym sp = g_.bytes(ByteSet::of(" \t"));
      for (int k = 1; k <= kJsonMaxIndent; ++k) {
        const uint32_t r = g_.rule("indent" + std::to_string(k));
        g_.alt(r, {});
        g_.alt(r, {sp, g_.ref(indent)});
        indent = r;
      }
      ws_ = g_.rule("ws");
      g_.alt(*ws_, {});
      g_.alt(*ws_, g_.literal(" "));
      g_.alt(*ws_, {g_.bytes(ByteSet::of("\n")), g_.ref(indent)});
    }
    return g_.ref(*ws_);
  }
  /// One literal text.
  Sym literal(std::string_view text) {
    const uint32_t r = g_.rule("literal");
    g_.alt(r, g_.literal(text));
    return g_.ref(r);
  }
  /// Any JSON value.
  Sym value() {
    if (!value_) {
      value_ = g_.rule("value");
      const Sym obj = any_object(*value_);
      const Sym arr = array(g_.ref(*value_), 0, -1);
      for (Sym s : {obj, arr, string(0, -1), number(false), literal("true"), literal("false"), literal("null")})
        g_.alt(*value_, {s});
    }
    return g_.ref(*value_);
  }
  /// A JSON string of min_len to max_len characters (max_len < 0: unbounded).
  Sym string(int64_t min_len, int64_t max_len) {
    const Sym q = g_.bytes(ByteSet::of("\""));
    const uint32_t r = g_.rule("string");
    if (min_len == 0 && max_len < 0) {
      if (!chars_) {
        chars_ = g_.rule("chars");
        g_.alt(*chars_, {});
        g_.alt(*chars_, {character(), g_.ref(*chars_)});
      }
      g_.alt(r, {q, g_.ref(*chars_), q});
      return g_.ref(r);
    }
    // chars(k): at least min_len - k more, at most max_len - k (built from the end)
    const Sym c = character();
    uint32_t tail;
    int64_t from;
    if (max_len < 0) {  // unbounded after min_len
      tail = g_.rule("chars");
      g_.alt(tail, {});
      g_.alt(tail, {c, g_.ref(tail)});
      from = min_len;
    } else {
      tail = g_.rule("chars_end");
      g_.alt(tail, {});
      from = max_len;
    }
    for (int64_t k = from - 1; k >= 0; --k) {
      const uint32_t rk = g_.rule("chars_n");
      if (k >= min_len) g_.alt(rk, {});
      g_.alt(rk, {c, g_.ref(tail)});
      tail = rk;
    }
    g_.alt(r, {q, g_.ref(tail), q});
    return g_.ref(r);
  }
  /// A JSON number (integer: no fraction or exponent).
  Sym number(bool integer) {
    std::optional<uint32_t>& cache = integer ? int_ : num_;
    if (cache) return g_.ref(*cache);
    const Sym digit = g_.bytes(ByteSet::range('0', '9'));
    auto digits = [&](int lo, int hi) {  // lo..hi digits
      uint32_t tail = g_.rule("digits");
      g_.alt(tail, {});
      for (int k = hi - 1; k >= 0; --k) {
        const uint32_t rk = g_.rule("digits");
        if (k >= lo) g_.alt(rk, {});
        g_.alt(rk, {digit, g_.ref(tail)});
        tail = rk;
      }
      return g_.ref(tail);
    };
    const uint32_t intpart = g_.rule("int");
    g_.alt(intpart, g_.literal("0"));
    g_.alt(intpart, {g_.bytes(ByteSet::range('1', '9')), digits(0, 15)});
    const uint32_t sign = g_.rule("sign");
    g_.alt(sign, {});
    g_.alt(sign, g_.literal("-"));
    const uint32_t r = g_.rule(integer ? "integer" : "number");
    if (integer) {
      g_.alt(r, {g_.ref(sign), g_.ref(intpart)});
    } else {
      const uint32_t frac = g_.rule("frac"), exp = g_.rule("exp"), esign = g_.rule("exp_sign");
      g_.alt(frac, {});
      g_.alt(frac, {g_.bytes(ByteSet::of(".")), digits(1, 16)});
      g_.alt(esign, {});
      g_.alt(esign, {g_.bytes(ByteSet::of("+-"))});
      g_.alt(exp, {});
      g_.alt(exp, {g_.bytes(ByteSet::of("eE")), g_.ref(esign), digits(1, 3)});
      g_.alt(r, {g_.ref(sign), g_.ref(intpart), g_.ref(frac), g_.ref(exp)});
    }
    cache = r;
    return g_.ref(r);
  }
  /// "[" items "]": min_items to max_items (< 0: unbounded) of `item`.
  Sym array(Sym item, int64_t min_items, int64_t max_items) {
    const Sym w = ws(), comma = g_.bytes(ByteSet::of(","));
    // more(k): k items so far (k >= 1); unbounded past min_items: one recursive rule
    uint32_t tail;
    int64_t from;
    if (max_items < 0) {
      tail = g_.rule("items_more");
      g_.alt(tail, {});
      g_.alt(tail, {comma, w, item, w, g_.ref(tail)});
      from = std::max<int64_t>(min_items, 1);
    } else {
      tail = g_.rule("items_end");
      g_.alt(tail, {});
      from = std::max<int64_t>(max_items, 1);
    }
    for (int64_t k = from - 1; k >= 1; --k) {
      const uint32_t rk = g_.rule("items_n");
      if (k >= min_items) g_.alt(rk, {});
      g_.alt(rk, {comma, w, item, w, g_.ref(tail)});
      tail = rk;
    }
    const uint32_t r = g_.rule("array");
    const Sym open = g_.bytes(ByteSet::of("[")), close = g_.bytes(ByteSet::of("]"));
    if (min_items == 0) g_.alt(r, {open, w, close});
    if (max_items != 0) g_.alt(r, {open, w, item, w, g_.ref(tail), close});
    return g_.ref(r);
  }
  /// An object of any keys, each value `value_rule`'s.
  Sym any_object(uint32_t value_rule) {
    const Sym w = ws(), key = string(0, -1), colon = g_.bytes(ByteSet::of(":")), comma = g_.bytes(ByteSet::of(","));
    const uint32_t more = g_.rule("members_more");
    g_.alt(more, {});
    g_.alt(more, {comma, w, key, w, colon, w, g_.ref(value_rule), w, g_.ref(more)});
    const uint32_t r = g_.rule("object");
    const Sym open = g_.bytes(ByteSet::of("{")), close = g_.bytes(ByteSet::of("}"));
    g_.alt(r, {open, w, close});
    g_.alt(r, {open, w, key, w, colon, w, g_.ref(value_rule), w, g_.ref(more), close});
    return g_.ref(r);
  }
  /// An object with these properties in this order (each: key, its value's rule, required).
  struct Property {
    std::string key;
    Sym value;
    bool required;
  };
  Sym object(const std::vector<Property>& props) {
    const Sym w = ws(), colon = g_.bytes(ByteSet::of(":")), comma = g_.bytes(ByteSet::of(","));
    const std::size_t n = props.size();
    // rest(i, any): properties i.. remain, `any`: one was written already (a comma goes first)
    std::vector<std::array<uint32_t, 2>> rest(n + 1);
    for (std::size_t i = 0; i <= n; ++i)
      for (int any = 0; any < 2; ++any) rest[i][std::size_t(any)] = g_.rule("props");
    std::vector<bool> optional_from(n + 1, true);
    for (std::size_t i = n; i-- > 0;) optional_from[i] = optional_from[i + 1] && !props[i].required;
    for (std::size_t i = 0; i <= n; ++i)
      for (int any = 0; any < 2; ++any) {
        const uint32_t r = rest[i][std::size_t(any)];
        if (optional_from[i]) g_.alt(r, {});
        if (i == n) continue;
        std::vector<Sym> seq;
        if (any) seq.insert(seq.end(), {comma, w});
        const std::string key = json(props[i].key).dump(-1, ' ', false, json::error_handler_t::strict);
        const auto k = g_.literal(key);
        seq.insert(seq.end(), k.begin(), k.end());
        seq.insert(seq.end(), {w, colon, w, props[i].value, w, g_.ref(rest[i + 1][1])});
        g_.alt(r, seq);
        if (!props[i].required) g_.alt(r, {g_.ref(rest[i + 1][std::size_t(any)])});
      }
    const uint32_t r = g_.rule("object");
    g_.alt(r, {g_.bytes(ByteSet::of("{")), w, g_.ref(rest[0][0]), g_.bytes(ByteSet::of("}"))});
    return g_.ref(r);
  }
  /// One of these JSON texts.
  Sym one_of_texts(const std::vector<std::string>& texts) {
    const uint32_t r = g_.rule("enum");
    for (const auto& t : texts) g_.alt(r, g_.literal(t));
    return g_.ref(r);
  }

  /// A JSON Schema (the subset above) as a rule; `root` is what "#" refers to (the schema itself when
  /// null). Refusals are kiln::Error naming the keyword and its place ("schema.properties.x.pattern").
  Sym schema(const json& s, const json* root = nullptr, const std::string& where = "schema");

 private:
  Sym character() {
    if (!char_) {
      char_ = g_.rule("char");
      const Sym tail = g_.bytes(ByteSet::range(0x80, 0xBF));
      ByteSet plain = ByteSet::range(0x20, 0x7F);
      plain.w['"' >> 6] &= ~(uint64_t(1) << ('"' & 63));
      plain.w['\\' >> 6] &= ~(uint64_t(1) << ('\\' & 63));
      g_.alt(*char_, {g_.bytes(plain)});
      const Sym hex = g_.bytes(ByteSet::range('0', '9').add('a', 'f').add('A', 'F'));
      const uint32_t esc = g_.rule("escape");
      g_.alt(esc, {g_.bytes(ByteSet::of("\"\\/bfnrt"))});
      g_.alt(esc, {g_.bytes(ByteSet::of("u")), hex, hex, hex, hex});
      g_.alt(*char_, {g_.bytes(ByteSet::of("\\")), g_.ref(esc)});
      // well-formed UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF
      auto b = [&](uint8_t lo, uint8_t hi) { return g_.bytes(ByteSet::range(lo, hi)); };
      g_.alt(*char_, {b(0xC2, 0xDF), tail});
      g_.alt(*char_, {b(0xE0, 0xE0), b(0xA0, 0xBF), tail});
      g_.alt(*char_, {g_.bytes(ByteSet::range(0xE1, 0xEC).add(0xEE, 0xEF)), tail, tail});
      g_.alt(*char_, {b(0xED, 0xED), b(0x80, 0x9F), tail});
      g_.alt(*char_, {b(0xF0, 0xF0), b(0x90, 0xBF), tail, tail});
      g_.alt(*char_, {b(0xF1, 0xF3), tail, tail, tail});
      g_.alt(*char_, {b(0xF4, 0xF4), b(0x80, 0x8F), tail, tail});
    }
    return g_.ref(*char_);
  }

  Grammar& g_;
  std::optional<uint32_t> ws_, value_, chars_, char_, int_, num_;
  std::vector<std::tuple<const json*, std::string, uint32_t>> refs_;  // (root, $ref) -> its rule (recursion)
};

namespace detail::json_schema {

[[noreturn]] inline void refuse(const std::string& where, std::string_view what) {
  fail("kiln: JSON schema: at '", where, "': ", what);
}
inline int64_t count(const nlohmann::ordered_json& s, const char* key, const std::string& where) {
  const auto& v = s[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    refuse(where, detail::concat("'", key, "' must be a non-negative integer"));
  return v.get<int64_t>();
}

}  // namespace detail::json_schema

inline Grammar::Sym JsonGrammarBuilder::schema(const json& s, const json* root, const std::string& where) {
  using detail::json_schema::refuse;
  if (!root) root = &s;
  if (s.is_boolean()) {
    if (!s.get<bool>()) refuse(where, "the schema false matches nothing");
    return value();
  }
  if (!s.is_object()) refuse(where, detail::concat("a schema must be an object or a boolean, not ", s.type_name()));
  static constexpr std::string_view kIgnored[] = {"title",    "description", "default",  "examples",
                                                  "$schema",  "$id",         "$comment", "deprecated",
                                                  "readOnly", "writeOnly",   "$defs",    "definitions"};
  static constexpr std::string_view kKnown[] = {"type",      "properties", "required", "additionalProperties",
                                                "items",     "minItems",   "maxItems", "minLength",
                                                "maxLength", "enum",       "const",    "anyOf",
                                                "$ref"};
  for (const auto& item : s.items()) {
    const std::string& k = item.key();
    const auto in = [&](auto& list) { return std::find(std::begin(list), std::end(list), k) != std::end(list); };
    if (!in(kIgnored) && !in(kKnown))
      refuse(where,
             detail::concat("the keyword '", k, "' is not supported (kiln's JSON schema subset: docs/serving.md)"));
  }
  const auto has = [&](const char* k) { return s.contains(k); };
  std::vector<std::string> other;  // keywords besides the one that decides the shape
  if (has("$ref")) {
    if (!s["$ref"].is_string()) refuse(where, "'$ref' must be a string");
    const std::string ref = s["$ref"].get<std::string>();
    for (const auto& [at, name, rule] : refs_)
      if (at == root && name == ref) return g_.ref(rule);
    const json* target = nullptr;
    if (ref == "#") {
      target = root;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p(prefix);
        const std::string key = ref.substr(0, p.size()) == p ? ref.substr(p.size()) : std::string();
        if (key.empty() || key.find('/') != std::string::npos || key.find('~') != std::string::npos) continue;
        const auto defs = root->find(p.substr(2, p.size() - 3));
        if (defs != root->end() && defs->is_object() && defs->contains(key)) target = &(*defs)[key];
      }
    }
    if (!target)
      refuse(where, detail::concat("'$ref' \"", ref, "\" is not \"#\" or one of the schema's $defs / definitions"));
    if (s.size() > 1)
      for (const auto& [k, v] : s.items())
        if (k != "$ref" && std::find(std::begin(kIgnored), std::end(kIgnored), k) == std::end(kIgnored))
          refuse(where, detail::concat("'", k, "' next to '$ref' is not supported"));
    const uint32_t r = g_.rule("ref " + ref);
    refs_.emplace_back(root, ref, r);  // before the target: a recursive schema refers to this rule
    g_.alt(r, {schema(*target, root, where + ".$ref")});
    return g_.ref(r);
  }
  if (has("enum") || has("const")) {
    std::vector<std::string> texts;
    if (has("const")) {
      texts.push_back(s["const"].dump(-1, ' ', false, json::error_handler_t::strict));
    } else {
      if (!s["enum"].is_array() || s["enum"].empty()) refuse(where, "'enum' must be a non-empty list");
      for (const auto& e : s["enum"]) texts.push_back(e.dump(-1, ' ', false, json::error_handler_t::strict));
    }
    if (has("type"))  // keep the values of the type(s) given
      std::erase_if(texts, [&](const std::string& t) {
        const json v = json::parse(t);
        const auto types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
        for (const auto& ty : types)
          if (ty == v.type_name() || (ty == "integer" && v.is_number_integer()) || (ty == "number" && v.is_number()))
            return false;
        return true;
      });
    if (texts.empty()) refuse(where, "no value of 'enum' / 'const' has the schema's 'type'");
    return one_of_texts(texts);
  }
  if (has("anyOf")) {
    const auto& a = s["anyOf"];
    if (!a.is_array() || a.empty()) refuse(where + ".anyOf", "'anyOf' must be a non-empty list of schemas");
    for (const auto& [k, v] : s.items())
      if (k != "anyOf" && std::find(std::begin(kIgnored), std::end(kIgnored), k) == std::end(kIgnored))
        refuse(where, detail::concat("'", k, "' next to 'anyOf' is not supported (put it inside each branch)"));
    const uint32_t r = g_.rule("anyOf");
    for (std::size_t i = 0; i < a.size(); ++i)
      g_.alt(r, {schema(a[i], root, detail::concat(where, ".anyOf[", i, "]"))});
    return g_.ref(r);
  }
  if (!has("type")) {
    for (const char* k :
         {"properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength"})
      if (has(k)) refuse(where, detail::concat("'", k, "' needs a 'type'"));
    return value();
  }
  const json& t = s["type"];
  if (t.is_array()) {  // several types: one alternative each, with this schema's other keywords
    if (t.empty()) refuse(where + ".type", "'type' must not be an empty list");
    const uint32_t r = g_.rule("types");
    for (std::size_t i = 0; i < t.size(); ++i) {
      json one = s;
      one["type"] = t[i];
      g_.alt(r, {schema(one, root, where)});
    }
    return g_.ref(r);
  }
  if (!t.is_string()) refuse(where + ".type", "'type' must be a string or a list of strings");
  const std::string type = t.get<std::string>();
  const auto only = [&](std::initializer_list<const char*> allowed) {
    for (const char* k :
         {"properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength"})
      if (has(k) && std::find_if(allowed.begin(), allowed.end(),
                                 [&](const char* a) { return std::string_view(a) == k; }) == allowed.end())
        refuse(where, detail::concat("'", k, "' does not apply to type \"", type, "\""));
  };
  if (type == "string") {
    only({"minLength", "maxLength"});
    const int64_t lo = has("minLength") ? detail::json_schema::count(s, "minLength", where) : 0;
    const int64_t hi = has("maxLength") ? detail::json_schema::count(s, "maxLength", where) : -1;
    if (hi >= 0 && hi < lo) refuse(where, "'maxLength' is below 'minLength'");
    if (std::max(lo, hi) > 100000) refuse(where, "'minLength' / 'maxLength' above 100000 are not supported");
    return string(lo, hi);
  }
  if (type == "number" || type == "integer") {
    only({});
    return number(type == "integer");
  }
  if (type == "boolean") {
    only({});
    const uint32_t r = g_.rule("boolean");
    g_.alt(r, g_.literal("true"));
    g_.alt(r, g_.literal("false"));
    return g_.ref(r);
  }
  if (type == "null") {
    only({});
    return literal("null");
  }
  if (type == "array") {
    only({"items", "minItems", "maxItems"});
    const int64_t lo = has("minItems") ? detail::json_schema::count(s, "minItems", where) : 0;
    const int64_t hi = has("maxItems") ? detail::json_schema::count(s, "maxItems", where) : -1;
    if (hi >= 0 && hi < lo) refuse(where, "'maxItems' is below 'minItems'");
    if (std::max(lo, hi) > 100000) refuse(where, "'minItems' / 'maxItems' above 100000 are not supported");
    const Sym item = has("items") ? schema(s["items"], root, where + ".items") : value();
    return array(item, lo, hi);
  }
  if (type == "object") {
    only({"properties", "required", "additionalProperties"});
    const json* props = has("properties") ? &s["properties"] : nullptr;
    if (props && !props->is_object()) refuse(where + ".properties", "'properties' must be an object");
    std::vector<std::string> required;
    if (has("required")) {
      if (!s["required"].is_array()) refuse(where + ".required", "'required' must be a list of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) refuse(where + ".required", "'required' must be a list of names");
        if (!props || !props->contains(r.get<std::string>()))
          refuse(where + ".required",
                 detail::concat("'required' names \"", r.get<std::string>(), "\", which is not in 'properties'"));
        required.push_back(r.get<std::string>());
      }
    }
    const json* extra = has("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && extra->is_object() && !(props && !props->empty())) {
      const uint32_t r = g_.rule("map");
      g_.alt(r, {schema(*extra, root, where + ".additionalProperties")});
      return any_object(r);  // (the rule r is the values' schema)
    }
    if (extra && !extra->is_boolean())
      refuse(where + ".additionalProperties",
             "'additionalProperties' must be false (or true) next to 'properties', or a schema without them");
    if (!props || props->empty()) {
      if (extra && !extra->get<bool>()) return literal("{}");
      value();
      return any_object(*value_);
    }
    std::vector<Property> list;
    for (const auto& [k, v] : props->items())
      list.push_back({k, schema(v, root, where + ".properties." + k),
                      std::find(required.begin(), required.end(), k) != required.end()});
    return object(list);
  }
  refuse(where + ".type", detail::concat("unknown type \"", type, "\""));
}

/// A finished grammar of one value of `schema` (parsed JSON text), or kiln::Error naming what it refuses.
inline std::shared_ptr<const Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  auto g = std::make_shared<Grammar>();
  JsonGrammarBuilder b(*g);
  const uint32_t root = g->rule("root");
  g->alt(root, {b.schema(schema)});
  g->finish(root);
  return g;
}
inline std::shared_ptr<const Grammar> json_schema_grammar(std::string_view schema_text) {
  const auto j = nlohmann::ordered_json::parse(schema_text, nullptr, false);
  if (j.is_discarded()) fail("kiln: JSON schema: not valid JSON");
  return json_schema_grammar(j);
}
inline std::shared_ptr<const Grammar> json_schema_grammar(const char* schema_text) {
  return json_schema_grammar(std::string_view(schema_text));
}
inline std::shared_ptr<const Grammar> json_schema_grammar(const std::string& schema_text) {
  return json_schema_grammar(std::string_view(schema_text));
}
/// Any JSON object (OpenAI's response_format {"type": "json_object"}).
inline std::shared_ptr<const Grammar> json_object_grammar() {
  return json_schema_grammar(nlohmann::ordered_json{{"type", "object"}});
}

}  // namespace kiln
