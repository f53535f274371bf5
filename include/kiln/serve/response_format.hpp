// kiln/serve/response_format.hpp - OpenAI's structured outputs on kiln's constrained decoding
// (generate/json_schema.hpp): response_format and forced tool calls as grammars for RequestOptions::grammar.
//
//   response_format {"type": "text"}                 no constraint
//                   {"type": "json_object"}          any JSON object
//                   {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
//                                                    a value of the schema (kiln's subset; an unsupported
//                                                    keyword is a 400 naming it; strict or not, the output
//                                                    always follows the schema)
//   grammar         llama-server's field: a GBNF grammar (generate/gbnf.hpp; null or "": none); a 400 with
//                   param "grammar" and the parser's message (line, column, what) when malformed
//   tool_choice "required" / {"type": "function", "function": {"name"}}
//                   the reply is one call in the template's format (tool_calls.hpp reads it back): the
//                   format's markup, {"name": one of the allowed tools, "arguments": that tool's parameters};
//                   gpt-oss's harmony (harmony_call_grammar): the call's message, its markers whole tokens.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/generate/gbnf.hpp"
#include "kiln/generate/json_schema.hpp"
#include "kiln/serve/tool_calls.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln::serve {

/// The grammar of a request's response_format (null: none, or "text"); ApiError-style refusals through `refuse`
/// (a callable taking message, param, code).
template <class Refuse>
std::shared_ptr<const Grammar> response_format_grammar(const nlohmann::ordered_json& j, Refuse&& refuse) {
  const auto it = j.find("response_format");
  if (it == j.end() || it->is_null()) return nullptr;
  const auto& rf = *it;
  if (!rf.is_object()) refuse("'response_format' must be an object", "response_format", "invalid_type");
  const auto t = rf.find("type");
  if (t == rf.end() || !t->is_string())
    refuse("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type",
           "invalid_type");
  const std::string type = t->get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") {
    static const std::shared_ptr<const Grammar> any_object = json_object_grammar();
    return any_object;
  }
  if (type != "json_schema")
    refuse(detail::concat("'response_format.type' is \"", type,
                          "\"; it must be \"text\", \"json_object\" or \"json_schema\""),
           "response_format.type", "invalid_value");
  const auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object())
    refuse("'response_format.json_schema' must be an object {\"name\", \"schema\", \"strict\"}",
           "response_format.json_schema", "invalid_type");
  if (const auto n = js->find("name"); n != js->end() && !n->is_string())
    refuse("'response_format.json_schema.name' must be a string", "response_format.json_schema.name", "invalid_type");
  if (const auto s = js->find("strict"); s != js->end() && !s->is_boolean() && !s->is_null())
    refuse("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict",
           "invalid_type");
  const auto schema = js->find("schema");
  const nlohmann::ordered_json any = nlohmann::ordered_json::object();
  const nlohmann::ordered_json& s = schema == js->end() || schema->is_null() ? any : *schema;
  if (!s.is_object() && !s.is_boolean())
    refuse("'response_format.json_schema.schema' must be a JSON Schema object", "response_format.json_schema.schema",
           "invalid_type");
  try {
    auto g = std::make_shared<Grammar>();
    JsonGrammarBuilder b(*g);
    const uint32_t root = g->rule("root");
    g->alt(root, {b.schema(s, nullptr, "response_format.json_schema.schema")});
    g->finish(root);
    return g;
  } catch (const Error& e) {
    refuse(e.what(), "response_format.json_schema.schema", "invalid_schema");
  }
  return nullptr;
}

/// The grammar of a request's `grammar` field (null: none); refusals through `refuse` as above. `vocabulary`:
/// the model's (token references <text>, and ids checked against its size).
template <class Refuse>
std::shared_ptr<const Grammar> request_gbnf_grammar(const nlohmann::ordered_json& j, Refuse&& refuse,
                                                    const Tokenizer* vocabulary = nullptr) {
  const auto it = j.find("grammar");
  if (it == j.end() || it->is_null()) return nullptr;
  if (!it->is_string()) refuse("'grammar' must be a string (a GBNF grammar)", "grammar", "invalid_type");
  const std::string& text = it->get_ref<const std::string&>();
  if (text.empty()) return nullptr;  // (llama-server: an empty grammar is none)
  try {
    return gbnf_grammar(text, {.vocabulary = vocabulary});
  } catch (const Error& e) {
    refuse(e.what(), "grammar", "invalid_grammar");
  }
  return nullptr;
}

/// The grammar of one forced call in format f (template_source: the chat template, which shows the call's
/// shape) to one of `tools[which[i]]`, its arguments valid for its "parameters" schema (none: any object).
// The grammar of tools[i]'s arguments: its function's `parameters` schema (none or null: any object); a schema
// the builder cannot take is refused naming where it is.
template <class Refuse>
Grammar::Sym tool_arguments(JsonGrammarBuilder& b, const nlohmann::ordered_json& tools, std::size_t i, Refuse& refuse) {
  const auto& fn = tools[i]["function"];
  const std::string where = detail::concat("tools[", i, "].function.parameters");
  try {
    const auto p = fn.find("parameters");
    return p == fn.end() || p->is_null() ? b.schema(nlohmann::ordered_json{{"type", "object"}})
                                         : b.schema(*p, &*p, where);
  } catch (const Error& e) {
    refuse(e.what(), where, "invalid_schema");
  }
  return Grammar::Sym{};
}

template <class Refuse>
std::shared_ptr<const Grammar> tool_call_grammar(ToolFormat f, std::string_view template_source,
                                                 const nlohmann::ordered_json& tools,
                                                 std::span<const std::size_t> which, Refuse&& refuse) {
  using Sym = Grammar::Sym;
  auto g = std::make_shared<Grammar>();
  JsonGrammarBuilder b(*g);
  const bool mistral_args = f == ToolFormat::mistral && template_source.find("[ARGS]") != std::string_view::npos;
  const bool hermes_list = f == ToolFormat::hermes && template_source.find("<tool_call>[") != std::string_view::npos;
  const uint32_t call = g->rule("call");
  for (std::size_t i : which) {
    const std::string name = tools[i]["function"]["name"].get<std::string>();
    const Sym args = tool_arguments(b, tools, i, refuse);
    if (mistral_args) {  // [TOOL_CALLS]name[ARGS]{...}
      auto seq = g->literal(name + "[ARGS]");
      seq.push_back(args);
      g->alt(call, seq);
      continue;
    }
    const std::string quoted = nlohmann::ordered_json(name).dump();
    const Sym name_sym = b.one_of_texts({quoted});
    g->alt(call,
           {b.object({{"name", name_sym, true}, {f == ToolFormat::llama3 ? "parameters" : "arguments", args, true}})});
  }
  const uint32_t root = g->rule("root");
  std::vector<Sym> seq;
  auto lit = [&](std::string_view s) {
    for (const Sym& x : g->literal(s)) seq.push_back(x);
  };
  switch (f) {
    case ToolFormat::hermes:
      lit(hermes_list ? "<tool_call>[" : "<tool_call>\n");
      seq.push_back(g->ref(call));
      lit(hermes_list ? "]</tool_call>" : "\n</tool_call>");
      break;
    case ToolFormat::llama3:  // the bare JSON call the Llama 3.x templates ask for
      seq.push_back(g->ref(call));
      break;
    case ToolFormat::mistral:
      lit(mistral_args ? "[TOOL_CALLS]" : "[TOOL_CALLS][");
      seq.push_back(g->ref(call));
      if (!mistral_args) lit("]");
      break;
  }
  g->alt(root, seq);
  g->finish(root);
  return g;
}

/// The grammar of one forced call in gpt-oss's harmony format to one of `tools[which[i]]`, as llama-server
/// forces it (common/chat.cpp, gpt-oss): after the generation prompt's "<|start|>assistant", any number of
/// analysis or commentary messages, each followed by "<|start|>assistant", then the call's message
/// "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>ARGS<|call|>" (the recipient may
/// also stand before the channel, the channel may be analysis, the constraint may be absent or another type
/// word; the arguments valid for the tool's "parameters"). The markers are the vocabulary's control tokens
/// taken whole (never their text: a message cannot forge one); a vocabulary without them has them as text,
/// and message bodies then exclude '<' so that no body spells a marker.
template <class Refuse>
std::shared_ptr<const Grammar> harmony_call_grammar(const Tokenizer& tok, const nlohmann::ordered_json& tools,
                                                    std::span<const std::size_t> which, Refuse&& refuse) {
  using Sym = Grammar::Sym;
  auto g = std::make_shared<Grammar>();
  JsonGrammarBuilder b(*g);
  bool text_markers = false;
  const auto marker = [&](std::string_view m, std::vector<Sym>& seq) {
    const int32_t id = tok.find(m);
    if (id >= 0 && tok.type(id) == TokenType::control) {
      seq.push_back(g->token(id));
    } else {
      text_markers = true;
      for (const Sym& x : g->literal(m)) seq.push_back(x);
    }
  };
  const auto lit = [&](std::string_view s, std::vector<Sym>& seq) {
    for (const Sym& x : g->literal(s)) seq.push_back(x);
  };
  std::vector<Sym> probe;  // (whether the markers are text decides the bodies' bytes)
  for (std::string_view m : {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>", "<|call|>"})
    marker(m, probe);
  // body ::= byte*   (any text; no '<' where the markers are text)
  const uint32_t body = g->rule("body");
  ByteSet text = ByteSet::range(0, 255);
  if (text_markers) text = ByteSet::range(0, uint8_t('<' - 1)).add(uint8_t('<' + 1), 255);
  g->alt(body, {g->bytes(text), g->ref(body)});
  g->alt(body, std::vector<Sym>{});
  // channel ::= <|channel|> ("commentary" | "analysis")
  const uint32_t channel = g->rule("channel");
  for (std::string_view c : {"commentary", "analysis"}) {
    std::vector<Sym> seq;
    marker("<|channel|>", seq);
    lit(c, seq);
    g->alt(channel, seq);
  }
  // message ::= stray? <|channel|> "analysis" <|message|> body <|end|>
  //           | <|channel|> "commentary" <|message|> body <|end|>        (a preamble)
  // stray   ::= <|channel|> "commentary" (" to=assistant")?             (gpt-oss sometimes writes it)
  const uint32_t stray = g->rule("stray"), message = g->rule("message");
  for (bool to : {false, true}) {
    std::vector<Sym> seq;
    marker("<|channel|>", seq);
    lit(to ? "commentary to=assistant" : "commentary", seq);
    g->alt(stray, seq);
  }
  for (int k = 0; k < 3; ++k) {
    std::vector<Sym> seq;
    if (k == 1) seq.push_back(g->ref(stray));
    marker("<|channel|>", seq);
    lit(k < 2 ? "analysis" : "commentary", seq);
    marker("<|message|>", seq);
    seq.push_back(g->ref(body));
    marker("<|end|>", seq);
    g->alt(message, seq);
  }
  // constraint ::= " " <|constrain|>? type | <|constrain|> type   (type: [A-Za-z0-9_-]{1,16}); or none
  const uint32_t type = g->rule("type"), constraint = g->rule("constraint");
  {
    const Sym ch = g->bytes(ByteSet::range('a', 'z').add('A', 'Z').add('0', '9').add("_-"));
    std::vector<Sym> seq = {ch};
    for (int i = 0; i < 16; ++i) {
      g->alt(type, seq);
      seq.push_back(ch);
    }
    std::vector<Sym> a, c;
    lit(" ", a);
    a.push_back(g->ref(type));
    g->alt(constraint, a);
    lit(" ", c);
    marker("<|constrain|>", c);
    c.push_back(g->ref(type));
    g->alt(constraint, c);
    std::vector<Sym> d;
    marker("<|constrain|>", d);
    d.push_back(g->ref(type));
    g->alt(constraint, d);
    g->alt(constraint, std::vector<Sym>{});
  }
  // call ::= (channel " to=functions.NAME" | " to=functions.NAME" channel) constraint <|message|> ARGS <|call|>
  const uint32_t call = g->rule("call");
  for (std::size_t i : which) {
    const std::string name = tools[i]["function"]["name"].get<std::string>();
    const Sym args = tool_arguments(b, tools, i, refuse);
    for (bool channel_first : {true, false}) {
      std::vector<Sym> seq;
      if (channel_first) seq.push_back(g->ref(channel));
      lit(" to=functions." + name, seq);
      if (!channel_first) seq.push_back(g->ref(channel));
      seq.push_back(g->ref(constraint));
      marker("<|message|>", seq);
      seq.push_back(args);
      marker("<|call|>", seq);
      g->alt(call, seq);
    }
  }
  // root ::= (message <|start|> "assistant")* call
  const uint32_t before = g->rule("before"), root = g->rule("root");
  {
    std::vector<Sym> seq = {g->ref(message)};
    marker("<|start|>", seq);
    lit("assistant", seq);
    seq.push_back(g->ref(before));
    g->alt(before, seq);
    g->alt(before, std::vector<Sym>{});
  }
  g->alt(root, {g->ref(before), g->ref(call)});
  g->finish(root);
  return g;
}

}  // namespace kiln::serve
