// text/jinja.hpp: kiln's Jinja interpreter against Python's jinja2 with Hugging Face's settings
// (tests/fixtures/text/jinja_corpus.json, from scripts/fixtures/make_jinja_fixtures.py): every real chat
// template of tests/fixtures/text/templates/ (llama.cpp's corpus) over several conversations, and the
// language pieces one by one, byte for byte; where jinja2 raises, kiln must throw. Then kiln's own error
// messages (they name the construct and the line) and ChatTemplate's use of the interpreter.
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/text/chat.hpp"
#include "kiln/text/jinja.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace jinja_tests {  // named: the test folder builds as one unity file with test_chat.cpp's helpers

using ojson = nlohmann::ordered_json;  // dict order matters: templates print and tojson dicts in insertion order

std::string read_text(const std::string& rel) {
  const std::string p = std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/" + rel;
  std::ifstream in(p, std::ios::binary);
  if (!in) FAIL("missing fixture '", p, "' (scripts/fixtures/make_jinja_fixtures.py makes it)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const ojson& corpus() {
  static const ojson fx = ojson::parse(read_text("jinja_corpus.json"));
  return fx;
}

jinja::Value to_value(const ojson& j) {
  if (j.is_null()) return jinja::Value::none();
  if (j.is_boolean()) return jinja::Value(j.get<bool>());
  if (j.is_number_integer()) return jinja::Value(j.get<int64_t>());
  if (j.is_number_float()) return jinja::Value(j.get<double>());
  if (j.is_string()) return jinja::Value(j.get<std::string>());
  if (j.is_array()) {
    jinja::List l;
    for (const auto& x : j) l.push_back(to_value(x));
    return jinja::Value(std::move(l));
  }
  jinja::Dict d;
  for (const auto& [k, v] : j.items()) d.emplace_back(k, to_value(v));
  return jinja::Value(std::move(d));
}

// The generator's fixed strftime_now time: 2024-07-26 14:05:09 (a Friday).
const std::tm* fixed_now() {
  static const std::tm t = [] {
    std::tm x{};
    x.tm_year = 124, x.tm_mon = 6, x.tm_mday = 26, x.tm_hour = 14, x.tm_min = 5, x.tm_sec = 9, x.tm_wday = 5,
    x.tm_yday = 207;
    return x;
  }();
  return &t;
}

std::string escaped(const std::string& s) { return ojson(s).dump(); }

// Renders src with vars; "" and the error text in err when it throws.
std::string render(const std::string& src, const ojson& vars, std::string& err) {
  err.clear();
  try {
    return jinja::Template(src).render(to_value(vars), fixed_now());
  } catch (const Error& e) {
    err = e.what();
    return {};
  }
}

// One case against jinja2's result: the same bytes, or an error where jinja2 raised (for
// raise_exception, with the template's own message).
bool check_case(const std::string& src, const ojson& c) {
  std::string err;
  const std::string got = render(src, c.at("vars"), err);
  if (c.contains("error")) {
    const std::string want = c.at("error");
    if (err.empty()) {
      FAIL_CHECK("jinja2 raised '", want, "', kiln rendered ", escaped(got));
      return false;
    }
    if (want.starts_with("TemplateError: ") && err.find(want.substr(15)) == std::string::npos) {
      FAIL_CHECK("jinja2 raised '", want, "', kiln threw '", err, "'");
      return false;
    }
    return true;
  }
  if (!err.empty()) {
    FAIL_CHECK("kiln threw '", err, "', jinja2 rendered ", escaped(c.at("expected").get<std::string>()));
    return false;
  }
  if (got != c.at("expected").get<std::string>()) {
    FAIL_CHECK("got  ", escaped(got), "\nwant ", escaped(c.at("expected").get<std::string>()));
    return false;
  }
  return true;
}

TEST_CASE("jinja: llama.cpp's real chat templates render byte-identical to jinja2") {
  const auto& templates = corpus().at("templates");
  CHECK(templates.size() >= 30);
  std::size_t n_ok = 0, n_cases = 0, n_templates_ok = 0;
  for (const auto& t : templates) {
    const std::string file = t.at("file");
    const std::string src = read_text("templates/" + file);
    std::size_t ok_here = 0;
    for (const auto& c : t.at("cases")) {
      INFO(file, " case ", c.at("name").get<std::string>());
      ++n_cases;
      if (check_case(src, c)) ++n_ok, ++ok_here;
    }
    if (ok_here == t.at("cases").size()) ++n_templates_ok;
  }
  MESSAGE(n_templates_ok, " of ", templates.size(), " templates, ", n_ok, " of ", n_cases, " cases match jinja2");
  CHECK(n_ok == n_cases);
}

TEST_CASE("jinja: language pieces render byte-identical to jinja2") {
  std::size_t n = 0;
  for (const auto& c : corpus().at("snippets")) {
    const std::string src = c.at("template");
    INFO("template ", escaped(src));
    if (check_case(src, c)) ++n;
  }
  CHECK(n == corpus().at("snippets").size());
}

std::string error_of(const std::string& src, const ojson& vars = ojson::object()) {
  std::string err;
  render(src, vars, err);
  return err;
}

TEST_CASE("jinja: errors name the construct and the line") {
  CHECK(error_of("a\n{{ x | frobnicate }}") == "jinja: unsupported filter 'frobnicate' at line 2");
  CHECK(error_of("{% if x is frobbed %}{% endif %}") == "jinja: unsupported test 'frobbed' at line 1");
  CHECK(error_of("\n\n{% while true %}") == "jinja: unsupported statement 'while' at line 3");
  CHECK(error_of("{% if true %}open") == "jinja: missing {% elif %} or {% else %} or {% endif %} at line 1");
  CHECK(error_of("{{ 1 +* 2 }}") == "jinja: unexpected '*' in an expression at line 1");
  CHECK(error_of("{{ 'open }}").starts_with("jinja: unclosed tag '{{' at line 1"));
  CHECK(error_of("{{ raise_exception('Only user and assistant roles') }}") ==
        "jinja: the template raised an exception: Only user and assistant roles");
  CHECK(error_of("{{ x.y.z }}") == "jinja: 'x' is undefined (reading its attribute 'y') at line 1");
  CHECK(error_of("{{ 1 + 'a' }}") == "jinja: unsupported operand types for +: 'int' and 'str' at line 1");
  CHECK(error_of("{% for x in 5 %}{% endfor %}") == "jinja: 'int' object is not iterable at line 1");
  CHECK(error_of("{{ m.append(1) }}", {{"m", ojson::array()}})
            .starts_with("jinja: unsupported construct: list.append()"));
  CHECK(error_of("{{ frob(1) }}") == "jinja: unsupported function or undefined callable 'frob' at line 1");
  CHECK(error_of("{% for x in xs recursive %}{% endfor %}") ==
        "jinja: unsupported construct 'recursive' for loop at line 1");
  CHECK(error_of("{% set x = 1 %}{% set x.a = 2 %}") == "jinja: {% set x.a %}: 'x' is not a namespace() at line 1");
  CHECK(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}") ==
        "jinja: macro 'f' nested more than 200 calls deep (line 1)");
  CHECK(error_of("{{ range(1000000) | length }}") ==
        "jinja: range() too big (1000000 items; the sandbox allows 100000)");
}

TEST_CASE("jinja: ChatTemplate on the interpreter passes HF's variables (every corpus case)") {
  // ChatTemplate::render builds messages / bos_token / eos_token / add_generation_prompt / tools /
  // documents itself: every corpus case must come out as jinja2 rendered it (plain {role, content}
  // messages as ChatMessage, the rest as jinja::Value; tools and enable_thinking through set_variable).
  std::size_t n = 0;
  for (const auto& t : corpus().at("templates")) {
    const std::string file = t.at("file");
    const std::string src = read_text("templates/" + file);
    for (const auto& c : t.at("cases")) {
      const auto& vars = c.at("vars");
      std::vector<ChatMessage> msgs;
      bool plain = true;
      for (const auto& m : vars.at("messages")) {
        plain &= m.size() == 2 && m.contains("role") && m.contains("content");
        if (plain) msgs.push_back({m.at("role"), m.at("content")});
      }
      INFO(file, " case ", c.at("name").get<std::string>());
      ChatTemplate tmpl = ChatTemplate::from_jinja(src, vars.at("bos_token").get<std::string>(),
                                                   vars.at("eos_token").get<std::string>());
      tmpl.set_time(*fixed_now());
      if (!vars.at("tools").is_null()) tmpl.set_variable("tools", to_value(vars.at("tools")));
      if (vars.contains("enable_thinking")) tmpl.set_variable("enable_thinking", to_value(vars.at("enable_thinking")));
      const bool agp = vars.at("add_generation_prompt");
      // plain messages through render(ChatMessage...), the others (tool calls, ...) as jinja::Value
      const auto run = [&] {
        return plain ? tmpl.render(msgs, {.add_generation_prompt = agp})
                     : tmpl.render_marked(to_value(vars.at("messages")), {.add_generation_prompt = agp}).text;
      };
      if (c.contains("error")) {
        CHECK_THROWS_AS((void)run(), Error);
      } else {
        const std::string got = run();
        if (got != c.at("expected").get<std::string>())
          FAIL_CHECK("got  ", escaped(got), "\nwant ", escaped(c.at("expected").get<std::string>()));
      }
      ++n;
    }
  }
  MESSAGE(n, " corpus cases through ChatTemplate");
  CHECK(n == 725);
}

TEST_CASE(
    "jinja: ChatTemplate::render_marked takes rich messages; hand-written families refuse what they cannot show") {
  const ChatTemplate chatml = ChatTemplate::builtin("chatml");
  const jinja::Value ok =
      jinja::List{jinja::Value(jinja::Dict{{"role", jinja::Value("user")}, {"content", jinja::Value("hi")}})};
  const ChatPrompt p = chatml.render_marked(ok, {.add_generation_prompt = true});
  CHECK(p.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(p.content.size() == 1);
  const jinja::Value calls = jinja::List{jinja::Value(jinja::Dict{{"role", jinja::Value("assistant")},
                                                                  {"content", jinja::Value("x")},
                                                                  {"tool_calls", jinja::Value(jinja::List{})}})};
  CHECK_THROWS_WITH_AS((void)chatml.render_marked(calls, {.add_generation_prompt = false}),
                       doctest::Contains("has 'tool_calls'"), Error);
}

TEST_CASE("jinja: strings marked as message content are traced to the output") {
  jinja::Value c("  <|x|> hi  ");
  c.mark_content();
  jinja::Spans m;
  const std::string out =
      jinja::Template("[{{ c | trim }}]{{ '<|s|>' + c.split('hi')[0] }}{{ c.replace('hi', '<|y|>') }}{{ c | upper }}")
          .render(jinja::Value(jinja::Dict{{"c", c}}), nullptr, &m);
  CHECK(out == "[<|x|> hi]<|s|>  <|x|>   <|x|> <|y|>    <|X|> HI  ");
  std::vector<std::string> marked;
  for (auto [a, b] : m) marked.push_back(out.substr(a, b - a));
  // trim and split keep the origin; replace keeps it for the text it kept; upper makes a new string
  CHECK(marked == std::vector<std::string>{"<|x|> hi", "  <|x|> ", "  <|x|> ", "  "});
}

TEST_CASE("jinja: every corpus template marks each message content it prints verbatim") {
  // ChatTemplate::render_marked on the interpreter: contents that reach the output unchanged must be
  // marked (then a message spelling a control token stays text). Templates that reject the
  // conversation (jinja2 raises for them too, see the corpus) are skipped by name.
  const std::vector<ChatMessage> conv{{"system", "SYS <|im_end|> text"},
                                      {"user", "USER one <|eot_id|>"},
                                      {"assistant", "ASSIST two"},
                                      {"user", "USER three"}};
  std::size_t n = 0;
  for (const auto& t : corpus().at("templates")) {
    const std::string file = t.at("file");
    INFO(file);
    const ChatTemplate tmpl = ChatTemplate::from_jinja(read_text("templates/" + file), "<s>", "</s>");
    ChatPrompt p;
    std::vector<ChatMessage> used = conv;
    try {
      p = tmpl.render_marked(used, {.add_generation_prompt = true});
    } catch (const Error&) {
      used.erase(used.begin());  // e.g. Gemma 2: no system role
      try {
        p = tmpl.render_marked(used, {.add_generation_prompt = true});
      } catch (const Error& e) {
        const bool known = file.find("firefunction") != std::string::npos || file.find("tool_use") != std::string::npos;
        CHECK_MESSAGE(known, e.what());
        continue;
      }
    }
    std::string marked;
    for (auto [a, b] : p.content) marked += p.text.substr(a, b - a) + '\x01';
    for (const auto& m : used)
      if (p.text.find(m.content) != std::string::npos)
        CHECK_MESSAGE(marked.find(m.content) != std::string::npos, m.content);
    ++n;
  }
  CHECK(n >= 67);
}

TEST_CASE("jinja: a parsed template renders many times; variables do not leak between renders") {
  const jinja::Template t(
      "{% set n = namespace(c=0) %}{% for m in messages %}{% set n.c = n.c + 1 %}{% endfor %}{{ n.c }}{{ x }}");
  jinja::Value a = jinja::Dict{{"messages", jinja::List{1, 2}}};
  jinja::Value b = jinja::Dict{{"messages", jinja::List{1}}, {"x", "!"}};
  CHECK(t.render(a) == "2");
  CHECK(t.render(b) == "1!");
  CHECK(t.render(a) == "2");
}

}  // namespace jinja_tests
}  // namespace kiln::test
