// serve/response_format.hpp: a forced call's grammar accepts, in each template format, the call text that
// serve/tool_calls.hpp's parser reads back as that call; response_format's shapes and refusals.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/serve/openai.hpp"
#include "test_util.hpp"

namespace kiln::test::response_format_test {

using ojson = nlohmann::ordered_json;

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"],
    "additionalProperties": false}}},
  {"type": "function", "function": {"name": "now"}}])");

struct Refused {
  std::string message, param;
};
auto thrower = [](std::string m, std::string p, std::string) { throw Refused{std::move(m), std::move(p)}; };

bool takes(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.complete();
}

TEST_CASE("response_format: a forced call's grammar takes what the parser reads as that call, per format") {
  struct Case {
    serve::ToolFormat f;
    std::string source, text, name, args;
  };
  const std::vector<Case> cases = {
      {serve::ToolFormat::hermes, "<tool_call>",
       "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>", "add",
       R"({"a":1,"b":2})"},
      {serve::ToolFormat::hermes, "<tool_call>[", "<tool_call>[{\"name\": \"now\", \"arguments\": {}}]</tool_call>",
       "now", "{}"},
      {serve::ToolFormat::llama3, "ipython", "{\"name\": \"add\", \"parameters\": {\"a\": -3, \"b\": 0}}", "add",
       R"({"a":-3,"b":0})"},
      {serve::ToolFormat::mistral, "[TOOL_CALLS]",
       "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 5, \"b\": 6}}]", "add", R"({"a":5,"b":6})"},
      {serve::ToolFormat::mistral, "[TOOL_CALLS] [ARGS]", "[TOOL_CALLS]add[ARGS]{\"a\": 7, \"b\": 8}", "add",
       R"({"a":7,"b":8})"},
  };
  const std::vector<std::size_t> both = {0, 1};
  for (const auto& c : cases) {
    INFO(serve::tool_format_name(c.f), ": ", c.text);
    const auto g = serve::tool_call_grammar(c.f, c.source, kTools, both, thrower);
    CHECK(takes(g, c.text));
    const auto parsed = serve::parse_tool_calls(c.text, c.f);
    REQUIRE(parsed.calls.size() == 1);
    CHECK(parsed.calls[0].name == c.name);
    CHECK(ojson::parse(parsed.calls[0].arguments) == ojson::parse(c.args));
    CHECK(parsed.content.empty());
  }
  // named: only that tool; arguments must follow its parameters
  const std::vector<std::size_t> only_now = {1};
  const auto g = serve::tool_call_grammar(serve::ToolFormat::hermes, "<tool_call>", kTools, only_now, thrower);
  CHECK_FALSE(takes(g, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>"));
  const std::vector<std::size_t> only_add = {0};
  const auto ga = serve::tool_call_grammar(serve::ToolFormat::hermes, "<tool_call>", kTools, only_add, thrower);
  CHECK_FALSE(takes(ga, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>"));
  CHECK_FALSE(takes(ga, "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1.5, \"b\": 2}}\n</tool_call>"));
  // a tool schema kiln cannot follow: refused naming the tool's parameters
  const ojson bad = ojson::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "x"}}}])");
  const std::vector<std::size_t> first = {0};
  try {
    (void)serve::tool_call_grammar(serve::ToolFormat::hermes, "", bad, first, thrower);
    FAIL("accepted");
  } catch (const Refused& r) {
    CHECK(r.param == "tools[0].function.parameters");
    CHECK(r.message.find("'pattern'") != std::string::npos);
  }
}

TEST_CASE("response_format: text, json_object, json_schema and the refusals") {
  CHECK(serve::response_format_grammar(ojson::object(), thrower) == nullptr);
  CHECK(serve::response_format_grammar(ojson{{"response_format", {{"type", "text"}}}}, thrower) == nullptr);
  const auto obj = serve::response_format_grammar(ojson{{"response_format", {{"type", "json_object"}}}}, thrower);
  CHECK(takes(obj, R"({"x": [1, {"y": null}]})"));
  CHECK_FALSE(takes(obj, "[1]"));
  const auto s = serve::response_format_grammar(
      ojson::parse(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true,
                      "schema": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}})"),
      thrower);
  CHECK(takes(s, "[true, false]"));
  CHECK_FALSE(takes(s, "[true, false, true]"));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"response_format": "json"})", "response_format"},
      {R"({"response_format": {"type": "yaml"}})", "response_format.type"},
      {R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}})",
       "response_format.json_schema.name"},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 0}}}})",
       "response_format.json_schema.schema"},
  };
  for (const auto& item : refused) {  // (no structured binding: clang 14 cannot capture one in INFO)
    const std::string &body = item.first, &param = item.second;
    INFO(body);
    try {
      (void)serve::response_format_grammar(ojson::parse(body), thrower);
      FAIL("accepted");
    } catch (const Refused& r) {
      CHECK(r.param == param);
    }
  }
}

TEST_CASE("response_format: gpt-oss's forced call: markers as whole tokens, read back by the harmony parser") {
  const Tokenizer tok =
      Tokenizer::from_gguf(io::GGUFFile(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/gpt_oss_tiny_vocab.gguf"));
  const ReasoningFormat harmony{.syntax = ReasoningSyntax::harmony, .open = {}, .close = {}};
  std::vector<int32_t> render;  // as kiln-server: the harmony markers keep their text in the reply
  for (auto m : reasoning_markers(harmony)) render.push_back(tok.find(m));
  const auto trie = TokenTrie::of(tok, render);
  const std::vector<std::size_t> both = {0, 1}, only_now = {1};
  const auto g = serve::harmony_call_grammar(tok, kTools, both, thrower);
  // The reply's tokens (markers as control tokens, or as text when `forged`) through the constraint.
  const auto takes_reply = [&](const std::shared_ptr<const Grammar>& gr, const std::string& text, bool forged) {
    Constraint c(gr, trie);
    for (int32_t t : tok.encode(text, {.add_special = false, .parse_special = !forged}))
      if (!c.accept(t)) return false;
    return c.complete();
  };
  struct Case {
    std::string text, name, args, reasoning;
  };
  const std::vector<Case> cases = {
      {R"(<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>)", "add",
       R"({"a":1,"b":2})", ""},
      {R"(<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant)"
       R"(<|channel|>commentary to=functions.now<|message|>{}<|call|>)",
       "now", "{}", "Add them."},
      {R"( to=functions.add<|channel|>commentary json<|message|>{"a": 0, "b": -4}<|call|>)", "add", R"({"a":0,"b":-4})",
       ""},
      {R"(<|channel|>commentary<|message|>Calling.<|end|><|start|>assistant)"
       R"(<|channel|>analysis to=functions.now <|constrain|>json<|message|>{}<|call|>)",
       "now", "{}", ""},
  };
  for (const auto& c : cases) {
    INFO(c.text);
    CHECK(takes_reply(g, c.text, false));
    CHECK_FALSE(takes_reply(g, c.text, true));  // the markers' text is never a marker
    // the reply as the server reads it: <|call|> is a stop token, not in the text
    const std::string reply = c.text.substr(0, c.text.size() - std::string_view("<|call|>").size());
    const auto split = split_reasoning(reply, harmony);
    REQUIRE(split.calls.size() == 1);
    CHECK(split.calls[0].first == c.name);
    CHECK(ojson::parse(split.calls[0].second) == ojson::parse(c.args));
    CHECK(split.reasoning == c.reasoning);
  }
  const auto gn = serve::harmony_call_grammar(tok, kTools, only_now, thrower);
  CHECK_FALSE(takes_reply(gn, cases[0].text, false));  // named: only that tool
  CHECK(takes_reply(gn, cases[1].text, false));
  CHECK_FALSE(
      takes_reply(g, R"(<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1}<|call|>)", false));
  CHECK_FALSE(takes_reply(g, R"(<|channel|>final<|message|>No call.<|end|>)", false));
  // a vocabulary without the markers has them as text (bodies then exclude '<')
  const auto text_g = serve::harmony_call_grammar(Tokenizer{}, kTools, both, thrower);
  CHECK(takes(text_g, cases[1].text));
  CHECK_FALSE(takes(text_g, "<|channel|>analysis<|message|>a<b<|end|><|start|>assistant" + cases[0].text));
}

}  // namespace kiln::test::response_format_test
