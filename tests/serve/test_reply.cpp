// serve/reply.hpp: a chat reply read as kiln-server reads it, the reasoning split off before the content is
// read for calls: think tags with Hermes calls after the block, gpt-oss's calls from its harmony channels
// (reported only when the request has tools), parallel_tool_calls false, and the same reasoning, content and
// calls whichever pieces the reply arrives in (the stream's deltas concatenate to the unstreamed message).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/serve/reply.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace reply_tests {

using serve::ReplyEvent;
using serve::ReplyOptions;
using serve::ReplyReader;

struct Read {
  std::string reasoning, content;
  std::vector<std::pair<std::string, nlohmann::json>> calls;  // name, arguments parsed
};

Read read(const std::vector<std::string>& pieces, const ReplyOptions& o) {
  ReplyReader rd(o);
  std::vector<ReplyEvent> ev;
  for (const auto& p : pieces) rd.push(p, ev);
  rd.finish(ev);
  Read r;
  for (const auto& e : ev) {
    if (e.kind == ReplyEvent::Kind::reasoning) r.reasoning += e.text;
    else if (e.kind == ReplyEvent::Kind::content) r.content += e.text;
    else {
      REQUIRE(e.call);
      CHECK((e.call->id.starts_with("call_") && e.call->id.size() == 29));
      r.calls.emplace_back(e.call->name, nlohmann::json::parse(e.call->arguments));
    }
  }
  CHECK(rd.calls() == r.calls.size());
  return r;
}

void check_all_splits(const std::string& reply, const ReplyOptions& o, const Read& want) {
  INFO("reply: ", reply);
  const auto check = [&](const Read& got) {
    CHECK(got.reasoning == want.reasoning);
    CHECK(got.content == want.content);
    CHECK(got.calls == want.calls);
  };
  check(read({reply}, o));
  for (std::size_t k = 1; k < reply.size(); ++k) check(read({reply.substr(0, k), reply.substr(k)}, o));
  std::vector<std::string> bytes;
  for (char c : reply) bytes.emplace_back(1, c);
  check(read(bytes, o));
}

TEST_CASE("reply: think tags, then Hermes calls read from the content") {
  const ReplyOptions o{.reasoning = ReasoningFormat{}, .tools = serve::ToolFormat::hermes};
  check_all_splits(
      "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
      o, {"The user wants the weather.", "", {{"get_weather", {{"city", "Paris"}}}}});
  // a call spelled inside the reasoning is reasoning, not a call
  check_all_splits("<think>maybe <tool_call>{\"name\": \"f\"}</tool_call></think>No call.", o,
                   {"maybe <tool_call>{\"name\": \"f\"}</tool_call>", "No call.", {}});
  // parallel_tool_calls false: the first call only
  ReplyOptions one = o;
  one.parallel = false;
  check_all_splits("<think>two</think><tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>",
                   one, {"two", "", {{"a", nlohmann::json::object()}}});
}

TEST_CASE("reply: gpt-oss's calls from its harmony channels, only with tools") {
  const std::string reply =
      "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
  const ReasoningFormat harmony{.syntax = ReasoningSyntax::harmony, .open = {}, .close = {}};
  check_all_splits(reply, {.reasoning = harmony, .harmony_calls = true},
                   {"Need the weather.", "", {{"get_weather", {{"city", "Oslo"}}}}});
  check_all_splits(reply, {.reasoning = harmony}, {"Need the weather.", "", {}});
  // a reply cut inside the arguments (max_tokens): no call, the arguments so far are content
  check_all_splits(reply.substr(0, reply.size() - 3), {.reasoning = harmony, .harmony_calls = true},
                   {"Need the weather.", "{\"city\": \"Osl", {}});
}

TEST_CASE("reply: no reasoning syntax: the content as it comes, calls read as before") {
  check_all_splits("<think>not split</think> text", {}, {"", "<think>not split</think> text", {}});
  check_all_splits("Sure.\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
                   {.tools = serve::ToolFormat::hermes}, {"", "Sure.", {{"f", nlohmann::json::object()}}});
}

}  // namespace reply_tests
}  // namespace kiln::test
