// text/reasoning.hpp: replies of reasoning models split into reasoning and content (think tags of each
// spelling, gpt-oss's harmony channels and calls), the same whichever pieces the reply arrives in (every
// split point, byte by byte, and token by token through real tokenizers, where a marker is cut across
// tokens), never a marker's beginning in an event; unclosed blocks and cut headers at the end; the think-tag
// split checked against a plain whole-string reference on many generated replies.
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "kiln/io/gguf.hpp"
#include "kiln/text/reasoning.hpp"
#include "kiln/text/tokenizer.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace reasoning_tests {

using Kind = ReasoningEvent::Kind;

std::string fixture(const std::string& rel) { return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/" + rel; }

std::string read_template(const char* file) {
  std::ifstream in(fixture(std::string("templates/") + file), std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

const ReasoningFormat kThink{};
const ReasoningFormat kHarmony{.syntax = ReasoningSyntax::harmony, .open = {}, .close = {}};

// A reply fed in the given pieces, joined by kind; no event but a call is empty, and no reasoning or content
// event ends with a proper prefix of a marker that the rest of the reply completes.
ReasoningSplit feed(const std::vector<std::string>& pieces, const ReasoningFormat& f, ReasoningOptions o = {}) {
  ReasoningParser p(f, o);
  std::vector<ReasoningEvent> ev;
  for (const auto& s : pieces) p.push(s, ev);
  p.finish(ev);
  ReasoningSplit r;
  for (auto& e : ev) {
    if (e.kind != Kind::call) CHECK(!e.text.empty());
    if (e.kind == Kind::reasoning) r.reasoning += e.text;
    else if (e.kind == Kind::content) r.content += e.text;
    else r.calls.emplace_back(e.name, e.text);
  }
  return r;
}

void check_split(const ReasoningSplit& got, const ReasoningSplit& want) {
  CHECK(got.reasoning == want.reasoning);
  CHECK(got.content == want.content);
  CHECK(got.calls == want.calls);
}

// The reply whole, split at every byte into two pieces and into three around each marker, and byte by byte.
void check_all_splits(const std::string& reply, const ReasoningFormat& f, const ReasoningSplit& want,
                      ReasoningOptions o = {}) {
  INFO("reply: ", reply);
  check_split(feed({reply}, f, o), want);
  check_split(split_reasoning(reply, f, o), want);
  for (std::size_t k = 1; k < reply.size(); ++k) check_split(feed({reply.substr(0, k), reply.substr(k)}, f, o), want);
  for (std::size_t k = 1; k + 2 < reply.size(); ++k)
    check_split(feed({reply.substr(0, k), reply.substr(k, 2), reply.substr(k + 2)}, f, o), want);
  std::vector<std::string> bytes;
  for (char c : reply) bytes.emplace_back(1, c);
  check_split(feed(bytes, f, o), want);
}

TEST_CASE("reasoning: the syntax a chat template teaches") {
  const auto fmt = [](const char* file) { return reasoning_format_of(std::string_view(read_template(file))); };
  for (const char* f :
       {"Qwen-Qwen3-0.6B.jinja", "Qwen-QwQ-32B.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        "HuggingFaceTB-SmolLM3-3B.jinja", "GLM-4.6.jinja", "MiniMax-M2.jinja", "deepseek-ai-DeepSeek-V3.1.jinja"}) {
    CAPTURE(f);
    const auto r = fmt(f);
    REQUIRE(r);
    CHECK(r->syntax == ReasoningSyntax::think_tags);
    CHECK(r->open == "<think>");
    CHECK(r->close == "</think>");
  }
  const auto m = fmt("mistralai-Ministral-3-14B-Reasoning-2512.jinja");
  REQUIRE(m);
  CHECK(m->open == "[THINK]");
  const auto c = fmt("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja");
  REQUIRE(c);
  CHECK(c->close == "<|END_THINKING|>");
  const auto s = fmt("ByteDance-Seed-OSS.jinja");
  REQUIRE(s);
  CHECK(s->open == "<seed:think>");
  const auto g = fmt("openai-gpt-oss-120b.jinja");
  REQUIRE(g);
  CHECK(g->syntax == ReasoningSyntax::harmony);
  for (const char* f : {"Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                        "google-gemma-2-2b-it.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"}) {
    CAPTURE(f);
    CHECK(!fmt(f));
  }
  // the hand-written families: qwen3 has <think> tags, the others none
  CHECK(reasoning_format_of(ChatTemplate::builtin("qwen3")));
  CHECK(!reasoning_format_of(ChatTemplate::builtin("chatml")));
  CHECK(!reasoning_format_of(ChatTemplate::builtin("gemma3")));
  CHECK(reasoning_format_of(ChatTemplate::from_string(read_template("Qwen-Qwen3-0.6B.jinja"))));
}

TEST_CASE("reasoning: the generation prompts that open a block (rendered by the templates)") {
  const std::vector<ChatMessage> conv{{"user", "Hi"}};
  const auto opens = [&](const char* file, bool thinking) {
    const ChatTemplate t = ChatTemplate::from_string(read_template(file), "<s>", "</s>");
    const auto f = reasoning_format_of(t);
    REQUIRE(f);
    return prompt_opens_reasoning(*f, t.render(conv, {.add_generation_prompt = true, .enable_thinking = thinking}));
  };
  CHECK(opens("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", true));  // ...<｜Assistant｜><think>\n
  CHECK(
      !opens("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", true));  // enable_thinking undefined: <think>\n</think>
  CHECK(!opens("Qwen-Qwen3-0.6B.jinja", true));                         // the model writes <think> itself
  CHECK(!opens("Qwen-Qwen3-0.6B.jinja", false));                        // <think>\n\n</think>\n\n: closed
  CHECK(!opens("openai-gpt-oss-120b.jinja", true));                     // <|start|>assistant
  CHECK(prompt_opens_reasoning(kHarmony, "<|start|>assistant<|channel|>analysis<|message|>"));
}

TEST_CASE("reasoning: think tags") {
  check_all_splits("<think>\nLet me add: 1 + 2 = 3.\n</think>\n\nThe answer is 3.", kThink,
                   {"Let me add: 1 + 2 = 3.", "The answer is 3.", {}});
  // whitespace before the block; reasoning with inner newlines; content keeps its own trailing whitespace
  check_all_splits(" \n<think>a\n\nb </think>c d \n", kThink, {"a\n\nb", "c d \n", {}});
  // no block: all content, verbatim (a tag later on is text; '<' that starts no tag)
  check_all_splits("Hi <think>x</think> there", kThink, {"", "Hi <think>x</think> there", {}});
  check_all_splits("<b>bold</b> \xC3\xA9t\xC3\xA9", kThink, {"", "<b>bold</b> \xC3\xA9t\xC3\xA9", {}});
  check_all_splits("<thin", kThink, {"", "<thin", {}});
  check_all_splits("  ", kThink, {"", "  ", {}});
  // an empty block (Qwen3 without thinking writes one), and only a block
  check_all_splits("<think>\n\n</think>\n\nHello", kThink, {"", "Hello", {}});
  check_all_splits("<think>why</think>", kThink, {"why", "", {}});
  // unclosed at the end of the reply (max_tokens): all reasoning, as llama-server reports it, a partial close
  // tag included as text
  check_all_splits("<think>\nstill thinking \n", kThink, {"still thinking", "", {}});
  check_all_splits("<think>a </thi", kThink, {"a </thi", "", {}});
  // the prompt opened the block (DeepSeek-R1): reasoning from the first byte
  check_all_splits("\nfirst</think>\n\nthen", kThink, {"first", "then", {}}, {.in_reasoning = true});
  check_all_splits("no close", kThink, {"no close", "", {}}, {.in_reasoning = true});
  // a second close tag is content
  check_all_splits("<think>r</think>a</think>b", kThink, {"r", "a</think>b", {}});
  // the other spellings
  const ReasoningFormat magistral{.syntax = ReasoningSyntax::think_tags, .open = "[THINK]", .close = "[/THINK]"};
  check_all_splits("[THINK]plan[/THINK]Answer [x]", magistral, {"plan", "Answer [x]", {}});
  const ReasoningFormat cohere{
      .syntax = ReasoningSyntax::think_tags, .open = "<|START_THINKING|>", .close = "<|END_THINKING|>"};
  check_all_splits("<|START_THINKING|>p<|END_THINKING|>\n<|START_RESPONSE|>", cohere, {"p", "<|START_RESPONSE|>", {}});
}

// A plain whole-string reading of llama.cpp's deepseek format, for the generated replies below.
ReasoningSplit think_reference(const std::string& s, bool in_reasoning) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  const auto strip = [&](std::string x) {
    while (!x.empty() && ws(x.front())) x.erase(0, 1);
    while (!x.empty() && ws(x.back())) x.pop_back();
    return x;
  };
  std::size_t i = 0;
  if (!in_reasoning) {
    while (i < s.size() && ws(s[i])) ++i;
    if (s.compare(i, 7, "<think>") != 0) return {"", s, {}};
    i += 7;
  }
  const std::size_t close = s.find("</think>", i);
  if (close == std::string::npos) return {strip(s.substr(i)), "", {}};
  std::size_t c = close + 8;
  while (c < s.size() && ws(s[c])) ++c;
  return {strip(s.substr(i, close - i)), s.substr(c), {}};
}

TEST_CASE("reasoning: think tags against a whole-string reference, random replies in random pieces") {
  const std::vector<std::string> atoms = {"<think>", "</think>", "<thi", "</th", "<",  ">",
                                          "/",       " ",        "\n",   "a",    "bc", "think"};
  std::mt19937 rng(7);
  for (int n = 0; n < 3000; ++n) {
    std::string reply;
    for (int k = int(rng() % 9); k > 0; --k) reply += atoms[rng() % atoms.size()];
    const bool in = rng() % 3 == 0;
    std::vector<std::string> pieces;
    for (std::size_t i = 0; i < reply.size();) {
      const std::size_t len = 1 + rng() % 4;
      pieces.push_back(reply.substr(i, len));
      i += len;
    }
    INFO("reply: ", reply, " in_reasoning: ", in);
    check_split(feed(pieces, kThink, {.in_reasoning = in}), think_reference(reply, in));
  }
}

TEST_CASE("reasoning: harmony channels and calls") {
  // the analysis channel, then the final answer (the reply ends at <|return|>, a stop token: not in the text)
  check_all_splits(
      "<|channel|>analysis<|message|>User says hi. Reply politely.<|end|><|start|>assistant<|channel|>final<|message|>"
      "Hello! How can I help?",
      kHarmony, {"User says hi. Reply politely.", "Hello! How can I help?", {}});
  // a call in the channel header, with a constraint; a call in the role header; a preamble is content
  check_all_splits(
      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
      "<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"city\": \"Paris\"}",
      kHarmony, {"Need weather.", "Checking.", {{"get_weather", "{\"city\": \"Paris\"}"}}});
  check_all_splits("<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}<|call|>",
                   kHarmony, {"", "", {{"add", "{\"a\": 1}"}}});
  // a built-in tool's message is dropped; several analysis messages join
  check_all_splits(
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>"
      "{\"q\": 1}<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|><|start|>assistant<|channel|>final"
      "<|message|>done",
      kHarmony, {"ab", "done", {}});
  // text before any header is content; bodies keep their whitespace and '<' that starts no marker
  check_all_splits("plain text <b>", kHarmony, {"", "plain text <b>", {}});
  check_all_splits("<|channel|>final<|message|> x <y> \n", kHarmony, {"", " x <y> \n", {}});
  // cut short (max_tokens): in the analysis body, inside a header, before the final body
  check_all_splits("<|channel|>analysis<|message|>thinking <|en", kHarmony, {"thinking <|en", "", {}});
  check_all_splits("<|channel|>analysis<|message|>t<|end|><|start|>assistant<|chan", kHarmony, {"t", "", {}});
  check_all_splits("<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>final<|message|>", kHarmony,
                   {"t", "", {}});
  // the prompt opened the analysis body
  check_all_splits("more<|end|><|start|>assistant<|channel|>final<|message|>ok", kHarmony, {"more", "ok", {}},
                   {.in_reasoning = true});
}

// Token by token through a real tokenizer: the markers as the model emits them (control tokens rendered as
// their text, or a tag cut across ordinary tokens).
void check_tokens(const Tokenizer& tok, const std::string& reply, const ReasoningFormat& f,
                  const ReasoningSplit& want) {
  const std::vector<int32_t> ids = tok.encode(reply, {.add_special = false, .parse_special = true});
  std::vector<std::string> pieces;
  std::string joined;
  for (int32_t id : ids) {
    pieces.emplace_back(tok.token_bytes(id, {.render_special = true}));
    joined += pieces.back();
  }
  REQUIRE(joined == reply);
  INFO("reply: ", reply, " in ", ids.size(), " tokens");
  check_split(feed(pieces, f), want);
}

TEST_CASE(
    "reasoning: token by token, gpt-oss's vocabulary (harmony control tokens), vocabularies with and without "
    "think tokens") {
  const Tokenizer g = Tokenizer::from_gguf(io::GGUFFile(fixture("gpt_oss_tiny_vocab.gguf")));
  REQUIRE(g.find("<|channel|>") >= 0);
  REQUIRE(g.vocabulary().types[std::size_t(g.find("<|channel|>"))] == TokenType::control);
  check_tokens(g, "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Answer: 4.",
               kHarmony, {"Think.", "Answer: 4.", {}});
  check_tokens(g,
               "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.f "
               "<|constrain|>json<|message|>{\"k\": [1, 2]}",
               kHarmony, {"x", "", {{"f", "{\"k\": [1, 2]}"}}});
  // Qwen2's vocabulary has <think> and </think> as tokens of their own; gpt-oss's cuts them across tokens
  const Tokenizer q = Tokenizer::from_hf_json(fixture("qwen2_tiny.tokenizer.json"));
  CHECK(q.encode("</think>", {.add_special = false, .parse_special = true}).size() == 1);
  CHECK(g.encode("</think>", {.add_special = false, .parse_special = true}).size() > 1);
  for (const Tokenizer* t : {&q, &g}) {
    check_tokens(*t, "<think>\nWe need 2+2.\n</think>\n\nIt is 4.", kThink, {"We need 2+2.", "It is 4.", {}});
    check_tokens(*t, "It is </think> 4.", kThink, {"", "It is </think> 4.", {}});
  }
}

}  // namespace reasoning_tests
}  // namespace kiln::test
