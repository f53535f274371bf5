// serve/tool_calls.hpp: the tool calls of each format (Hermes, its list variant, Llama 3.x JSON, both
// Mistral forms) with text around them, several calls, malformed JSON kept as content, and the same
// result whichever pieces the reply arrives in (every split point, byte by byte, UTF-8 split inside a
// character), never a partial start marker or half a character in a content piece.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/serve/tool_calls.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace tool_call_tests {

using serve::ToolCall;
using serve::ToolCallParser;
using serve::ToolEvent;
using serve::ToolFormat;
using ojson = nlohmann::ordered_json;

struct Want {
  std::string content;
  std::vector<std::pair<std::string, ojson>> calls;  // name, arguments as a JSON object
};

// Parses a reply fed in the given pieces: content joined, calls in order; checks each call's id shape and
// that no content piece ends inside a UTF-8 character or holds a start marker's beginning at its end.
serve::ParsedReply feed(const std::vector<std::string>& pieces, ToolFormat f, bool parallel = true) {
  ToolCallParser p(f, {.parallel = parallel, .seed = 42});
  std::vector<ToolEvent> ev;
  for (const auto& s : pieces) p.push(s, ev);
  p.finish(ev);
  serve::ParsedReply r;
  for (auto& e : ev) {
    if (e.call) {
      if (f == ToolFormat::mistral) CHECK(e.call->id.size() == 9);
      else CHECK((e.call->id.starts_with("call_") && e.call->id.size() == 29));
      r.calls.push_back(*e.call);
    } else {
      CHECK(text::is_valid_utf8(e.content));
      r.content += e.content;
    }
  }
  return r;
}

void check_reply(const serve::ParsedReply& got, const Want& want) {
  CHECK(got.content == want.content);
  REQUIRE(got.calls.size() == want.calls.size());
  for (std::size_t i = 0; i < got.calls.size(); ++i) {
    CHECK(got.calls[i].name == want.calls[i].first);
    // arguments: a JSON object text equal (as JSON, keys in order) to the one the model wrote
    const ojson args = ojson::parse(got.calls[i].arguments);
    CHECK(args.is_object());
    CHECK(args.dump() == want.calls[i].second.dump());
  }
}

// The reply whole, split at every byte position into two pieces, and byte by byte: the same result.
void check_all_splits(const std::string& reply, ToolFormat f, const Want& want) {
  INFO("reply: ", reply);
  check_reply(feed({reply}, f), want);
  for (std::size_t k = 1; k < reply.size(); ++k) check_reply(feed({reply.substr(0, k), reply.substr(k)}, f), want);
  std::vector<std::string> bytes;
  for (char c : reply) bytes.emplace_back(1, c);
  check_reply(feed(bytes, f), want);
}

const ojson kParis = {{"city", "Paris"}, {"unit", "celsius"}};

TEST_CASE("tool calls: the format a chat template teaches") {
  CHECK(serve::tool_format_of("{{ '<tool_call>\\n' + tool_call | tojson }}") == ToolFormat::hermes);
  CHECK(serve::tool_format_of("<|start_header_id|>ipython<|end_header_id|>") == ToolFormat::llama3);
  CHECK(serve::tool_format_of("{{ '[TOOL_CALLS][' }}") == ToolFormat::mistral);
  CHECK(!serve::tool_format_of("<tool_call>\\n<function=name>"));  // Qwen3-Coder's XML calls
  CHECK(!serve::tool_format_of("{% for m in messages %}{{ m.content }}{% endfor %}"));
  // the real templates of llama.cpp's corpus (tests/fixtures/text/templates)
  const auto fmt = [](const char* file) {
    std::ifstream in(std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/templates/" + file, std::ios::binary);
    REQUIRE(in);
    return serve::tool_format_of(std::string(std::istreambuf_iterator<char>(in), {}));
  };
  CHECK(fmt("Qwen-Qwen2.5-7B-Instruct.jinja") == ToolFormat::hermes);
  CHECK(fmt("Qwen-Qwen3-0.6B.jinja") == ToolFormat::hermes);
  CHECK(fmt("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja") == ToolFormat::hermes);
  CHECK(fmt("meta-llama-Llama-3.1-8B-Instruct.jinja") == ToolFormat::llama3);
  CHECK(fmt("meta-llama-Llama-3.2-3B-Instruct.jinja") == ToolFormat::llama3);
  CHECK(fmt("meta-llama-Llama-3.3-70B-Instruct.jinja") == ToolFormat::llama3);
  CHECK(fmt("mistralai-Mistral-Nemo-Instruct-2407.jinja") == ToolFormat::mistral);
  CHECK(fmt("Mistral-Small-3.2-24B-Instruct-2506.jinja") == ToolFormat::mistral);
  CHECK(!fmt("Qwen3-Coder.jinja"));
  CHECK(!fmt("meetkai-functionary-medium-v3.1.jinja"));
  CHECK(!fmt("google-gemma-2-2b-it.jinja"));
}

TEST_CASE("tool calls: Hermes blocks, one or several, with text around them") {
  check_all_splits(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>",
      ToolFormat::hermes, {"", {{"get_weather", kParis}}});
  check_all_splits(
      "Let me check.\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>",
      ToolFormat::hermes, {"Let me check.", {{"add", {{"a", 1}, {"b", 2}}}, {"get_weather", {{"city", "Oslo"}}}}});
  // SmolLM2-Instruct: a list in one block; text after the calls stays content
  check_all_splits(
      "<tool_call>[{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, {\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}]</tool_call> Done.",
      ToolFormat::hermes, {"Done.", {{"add", {{"a", 1}, {"b", 2}}}, {"get_weather", kParis}}});
  // no arguments: an empty object; the reply ends before </tool_call> after complete JSON: still a call
  check_all_splits("<tool_call>\n{\"name\": \"now\"}\n", ToolFormat::hermes, {"", {{"now", ojson::object()}}});
  // text only, with characters of several bytes and a '<' that starts no marker
  check_all_splits("Température: 21 °C <b>ok</b> <tool \xF0\x9F\x98\x80", ToolFormat::hermes,
                   {"Température: 21 °C <b>ok</b> <tool \xF0\x9F\x98\x80", {}});
  check_all_splits("  spaced  \n", ToolFormat::hermes, {"  spaced  \n", {}});
}

TEST_CASE("tool calls: malformed calls are content, verbatim") {
  const std::vector<std::string> bad = {
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1,}}\n</tool_call>",  // invalid JSON
      "<tool_call>{\"arguments\": {}}</tool_call>",                                  // no name
      "<tool_call>{\"name\": 5}</tool_call>",                                        // name not a string
      "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",                // arguments not an object
      "<tool_call>{\"name\": \"f\", \"arguments\": \"not json\"}</tool_call>",       // a string, not JSON
      "<tool_call>[]</tool_call>",                                                   // no call
      "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1",                   // cut off
      "<tool_call>",                                                                 // just the marker
      "<tool_call>{\"name\": \"f\"} trailing",                                       // cut off, text after
  };
  for (const auto& b : bad) check_all_splits(b, ToolFormat::hermes, {b, {}});
  // a malformed block, then a good one: the first is content, the second a call
  check_all_splits("<tool_call>oops</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                   ToolFormat::hermes, {"<tool_call>oops</tool_call>", {{"f", ojson::object()}}});
}

TEST_CASE("tool calls: Llama 3.x JSON, bare or after <|python_tag|>") {
  check_all_splits("{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
                   ToolFormat::llama3, {"", {{"get_weather", kParis}}});
  check_all_splits(
      "<|python_tag|>{\"type\": \"function\", \"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}; "
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
      ToolFormat::llama3, {"", {{"add", {{"a", 1}, {"b", 2}}}, {"get_weather", kParis}}});
  check_all_splits("Sure.<|python_tag|>{\"name\": \"now\", \"parameters\": {}}", ToolFormat::llama3,
                   {"Sure.", {{"now", ojson::object()}}});
  // JSON that is not a call, and a '{' after text, are content
  check_all_splits("{\"answer\": 4}", ToolFormat::llama3, {"{\"answer\": 4}", {}});
  check_all_splits("The set {\"name\": \"x\"} is small", ToolFormat::llama3,
                   {"The set {\"name\": \"x\"} is small", {}});
  check_all_splits("{\"name\": \"f\", \"parameters\": {", ToolFormat::llama3,
                   {"{\"name\": \"f\", \"parameters\": {", {}});
}

TEST_CASE("tool calls: Mistral, a JSON list or name[ARGS]{...} per call") {
  check_all_splits(
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}, \"id\": \"abcDEF123\"}, {\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]",
      ToolFormat::mistral, {"", {{"get_weather", kParis}, {"add", {{"a", 1}, {"b", 2}}}}});
  check_all_splits(
      "Checking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"unit\": \"celsius\"}[TOOL_CALLS]add[ARGS]"
      "{\"a\": 1, \"b\": 2}",
      ToolFormat::mistral, {"Checking.", {{"get_weather", kParis}, {"add", {{"a", 1}, {"b", 2}}}}});
  check_all_splits("[TOOL_CALLS]get weather\n[ARGS]{}", ToolFormat::mistral, {"[TOOL_CALLS]get weather\n[ARGS]{}", {}});
  check_all_splits("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}", ToolFormat::mistral,
                   {"[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}", {}});
  check_all_splits("[1, 2] is a list", ToolFormat::mistral, {"[1, 2] is a list", {}});
}

TEST_CASE("tool calls: parallel_tool_calls = false keeps the first call") {
  const std::string two =
      "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": "
      "{}}</tool_call>";
  const auto r = feed({two}, ToolFormat::hermes, /*parallel=*/false);
  REQUIRE(r.calls.size() == 1);
  CHECK(r.calls[0].name == "a");
  CHECK(feed({two}, ToolFormat::hermes).calls.size() == 2);
}

TEST_CASE("tool calls: streaming passes text on at once and holds back only what may start a call") {
  ToolCallParser p(ToolFormat::hermes, {.seed = 1});
  std::vector<ToolEvent> ev;
  p.push("Hello wor", ev);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].content == "Hello wor");
  ev.clear();
  p.push("ld <tool", ev);  // " <tool" may start "<tool_call>"
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].content == "ld");
  ev.clear();
  p.push("s> \xC3", ev);  // not a marker after all; the first byte of "é" waits for the second
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].content == " <tools> ");
  ev.clear();
  p.push("\xA9", ev);
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].content == "\xC3\xA9");
  ev.clear();
  p.push("\n<tool_call>{\"name\": \"f\", \"argu", ev);
  CHECK(ev.empty());  // inside a call block: nothing until it is complete
  p.push("ments\": {\"x\": \"ü\"}}</tool_call>", ev);
  REQUIRE(ev.size() == 1);
  REQUIRE(ev[0].call);
  CHECK(ev[0].call->name == "f");
  CHECK(ev[0].call->arguments == "{\"x\":\"ü\"}");
  ev.clear();
  p.finish(ev);
  CHECK(ev.empty());
  CHECK(p.calls() == 1);
}

}  // namespace tool_call_tests
}  // namespace kiln::test
