// kiln/text/jinja.hpp - a Jinja2 interpreter for chat templates: the subset real Hugging Face chat
// templates use, rendering byte for byte what Python's jinja2 renders with HF's settings
// (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]), HF's
// tojson). tests/text/test_jinja.cpp checks it against jinja2 on llama.cpp's corpus of real templates.
//
//   kiln::jinja::Template t(source);                       // parses; throws kiln::FormatError
//   kiln::jinja::Value ctx = kiln::jinja::Dict{{"messages", msgs}, {"add_generation_prompt", true}};
//   std::string text = t.render(ctx);                       // throws kiln::FormatError (raise_exception too)
//
// Supported: text with whitespace control ({%- -%} {{- -}} {%+ +%}, trim/lstrip blocks), comments, raw;
// expressions (literals, lists, dicts with string or integer keys, tuples, attribute and subscript
// access, slices, calls with keyword arguments, + - * / // % ** ~, '%' string formatting, comparisons,
// in / not in, and/or/not, ternaries, filters, "is" tests); statements if/elif/else, for
// (loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/cycle, else, "if" filter,
// break/continue), set (names, tuples, ns.attr, block set with filters), with, macro (defaults,
// keyword arguments, caller), call blocks, filter blocks, generation (HF's: renders its body).
// Globals: range (the sandbox's 100000 limit), namespace, dict, raise_exception, strftime_now.
// Filters and tests: jinja_filters.hpp / jinja_builtins.hpp; str methods (startswith, endswith, strip,
// lstrip, rstrip, split, rsplit, splitlines, replace, upper, lower, title, capitalize, format, find,
// rfind, count, index, join, is*) and dict methods (items, keys, values, get). Python semantics where
// templates depend on them: truthiness, None/True/1.0 printing, repr() of lists and dicts, insertion
// order, code-point string indexing, Markup escaping after | safe, map/select results being generators
// (tojson refuses them), the sandbox refusing list.append and friends.
// Not supported (an error naming it when reached): recursive loops, include/extends/import/block,
// filters such as groupby, batch, slice, truncate, wordwrap, format, pprint, urlencode, xmlattr;
// upper/lower/title change ASCII letters only.
// Strings marked with Value::mark_content() are traced to the output (render's marks argument).
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "kiln/text/jinja_eval.hpp"
#include "kiln/text/jinja_lexer.hpp"
#include "kiln/text/jinja_parse.hpp"
#include "kiln/text/jinja_value.hpp"

namespace kiln::jinja {

/// A parsed template; render() may be called many times (the tree is read-only while rendering).
class Template {
 public:
  Template() = default;
  explicit Template(std::string_view source)
      : body_(std::make_shared<Body>(detail::Parser(detail::split_source(source)).parse_template())) {}

  /// Renders with the variables of ctx (a dict). now: what strftime_now formats (default: the current
  /// local time). marks: where to put the output byte ranges that came from strings marked with
  /// Value::mark_content() (ChatTemplate marks message contents), or null.
  std::string render(const Value& ctx, const std::tm* now = nullptr, Spans* marks = nullptr) const {
    if (!body_) fail<FormatError>("jinja: render() on an empty Template");
    detail::Interpreter in(ctx, now);
    return in.run(*body_, marks);
  }

 private:
  std::shared_ptr<Body> body_;
};

}  // namespace kiln::jinja
