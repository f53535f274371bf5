// kiln/serve/openai.hpp - OpenAI's HTTP API on a Scheduler, without the sockets: request bodies ->
// token ids and RequestOptions (every field checked, errors as OpenAI's error JSON), results -> response
// and Server-Sent Event chunk JSON. examples/kiln-server.cpp puts it behind cpp-httplib.
//
//   POST /v1/chat/completions   messages -> the model's chat template (ChatTemplate::render_marked) ->
//                               tokens where only the template's markup may be control tokens; with
//                               tools / tool_calls / tool messages: the template on the Jinja
//                               interpreter (render_chat), the reply read for calls (tool_calls.hpp)
//   POST /v1/completions        prompt: a string (text, BOS prepended) or token ids
// Fields: max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop (string or
// list), presence_penalty, frequency_penalty, repeat_penalty, ignore_eos, stream, stream_options.include_usage,
// n (choices of one prompt, computed once: Scheduler::submit_choices), logprobs (chat: a boolean and
// top_logprobs; completions: the number of top tokens), response_format (text, json_object, json_schema:
// serve/response_format.hpp), grammar (llama-server's GBNF field: generate/gbnf.hpp), tools, tool_choice
// (auto, none, required, a named function), parallel_tool_calls (chat); others (model, user, logit_bias, ...)
// are accepted and ignored, as llama-server does. Defaults are llama-server's (kiln::SamplerOptions:
// temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), not OpenAI's temperature 1 with no filters; seed: a
// fresh random one per request unless given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <optional>
#include <span>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/core/error.hpp"
#include "kiln/serve/reply.hpp"
#include "kiln/serve/response_format.hpp"
#include "kiln/serve/scheduler.hpp"
#include "kiln/serve/tool_calls.hpp"
#include "kiln/text/chat.hpp"
#include "kiln/text/reasoning.hpp"
#include "kiln/text/tokenizer.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln::serve {

// Ordered: a request's objects keep their key order (the tools a template prints with tojson come out as the
// client wrote them, as in Python), and responses keep OpenAI's field order.
using json = nlohmann::ordered_json;

/// A request that is refused: HTTP status and OpenAI's error object.
struct ApiError {
  int status = 400;
  std::string message = {}, type = "invalid_request_error", param = {}, code = {};
  std::string retry_after = {};  // 503: seconds for the Retry-After header

  json to_json() const {
    return {{"error",
             {{"message", message},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
  }
};

[[noreturn]] inline void refuse(std::string message, std::string param = {}, std::string code = {}, int status = 400) {
  throw ApiError{.status = status, .message = std::move(message), .param = std::move(param), .code = std::move(code)};
}

/// JSON text of v: invalid UTF-8 (never expected: texts come through text::Utf8Stream) replaced.
inline std::string dump(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

/// The body as a JSON object, or an ApiError: invalid UTF-8 (before the parser, which would only say
/// "ill-formed"), malformed JSON, or another type.
inline json parse_body(std::string_view body) {
  if (!text::is_valid_utf8(body)) refuse("the request body is not valid UTF-8", "", "invalid_utf8");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    refuse(detail::concat("malformed JSON in the request body: ", e.what()), "", "invalid_json");
  }
  if (!j.is_object())
    refuse(detail::concat("the request body must be a JSON object, not ", j.type_name()), "", "invalid_json");
  return j;
}

/// Reading request fields: each checks its type and range, and a refusal names the field.
namespace fields {

using kiln::detail::concat;

inline const json* field(const json& j, const char* name) {
  const auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}
inline std::string type_error(const char* name, const char* want, const json& v) {
  return concat("'", name, "' must be ", want, ", not ", v.type_name(), " (", dump(v).substr(0, 40), ")");
}
inline std::optional<double> number(const json& j, const char* name, double lo, double hi) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) refuse(type_error(name, "a number", *v), name, "invalid_type");
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi))
    refuse(concat("'", name, "' is ", x, "; it must be in [", lo, ", ", hi, "]"), name, "invalid_value");
  return x;
}
inline std::optional<int64_t> integer(const json& j, const char* name, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return std::nullopt;
  if (!v->is_number_integer()) refuse(type_error(name, "an integer", *v), name, "invalid_type");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi)
    refuse(concat("'", name, "' is ", x, "; it must be in [", lo, ", ", hi, "]"), name, "invalid_value");
  return x;
}
inline bool boolean(const json& j, const char* name, bool dflt) {
  const json* v = field(j, name);
  if (!v) return dflt;
  if (!v->is_boolean()) refuse(type_error(name, "a boolean", *v), name, "invalid_type");
  return v->get<bool>();
}

}  // namespace fields

/// What a chat reply's reasoning becomes (llama-server's --reasoning-format and request field
/// reasoning_format): none, the raw text in content; deepseek and automatic, split off into
/// reasoning_content when the template has a reasoning syntax (text/reasoning.hpp); deepseek_legacy, split
/// off and also kept in content (streamed: the raw text in content only, as llama-server streams it).
enum class ReasoningMode { none, deepseek, deepseek_legacy, automatic };

/// A mode from llama-server's names: "none", "deepseek", "deepseek-legacy", "auto"; nullopt otherwise.
inline std::optional<ReasoningMode> reasoning_mode_of(std::string_view name) {
  if (name == "none") return ReasoningMode::none;
  if (name == "deepseek") return ReasoningMode::deepseek;
  if (name == "deepseek-legacy") return ReasoningMode::deepseek_legacy;
  if (name == "auto") return ReasoningMode::automatic;
  return std::nullopt;
}

/// What the server was started with (kiln-server's flags).
struct ApiConfig {
  std::string model_name = "kiln";
  int default_max_tokens = -1;                         ///< -n: -1 until the context ends
  ReasoningMode reasoning = ReasoningMode::automatic;  ///< --reasoning-format
};

/// A checked request: the prompt's tokens, the scheduler's options and the response format.
struct ApiRequest {
  bool chat = false;
  std::vector<int32_t> prompt;
  RequestOptions opt;
  std::size_t n = 1;  ///< choices
  bool stream = false, include_usage = false;
  std::optional<ToolFormat> tools;  ///< chat with tools: the format the reply's calls are read in
  bool parallel_tool_calls = true;
  ReplyOptions reply = {};            ///< chat: how the reply is read (reasoning, calls)
  bool reasoning_in_content = false;  ///< deepseek-legacy: content keeps the reasoning too
  /// Whether a chat reply goes through a ReplyReader (else its text is the content as it comes).
  bool reads_reply() const { return chat && (reply.reasoning || reply.tools || reply.harmony_calls); }
};

/// The chat templates of a model: `plain` renders role/content conversations (a hand-written family or the
/// interpreter), `rich` (the same template on the Jinja interpreter: ChatTemplate::interpreted()) renders
/// tools and tool calls. Either may be null.
struct ChatTemplates {
  const ChatTemplate* plain = nullptr;
  const ChatTemplate* rich = nullptr;
};

/// The most choices (`n`) one request may ask for.
inline constexpr std::size_t kMaxChoices = 16;

/// The sampling and stopping fields common to both endpoints.
inline void parse_options(const json& j, ApiRequest& r, const ApiConfig& cfg, std::size_t ctx, const Tokenizer& tok) {
  using namespace fields;
  if (const auto n = integer(j, "n", 1, int64_t(kMaxChoices))) r.n = std::size_t(*n);
  if (field(j, "best_of") && integer(j, "best_of", 1, INT64_MAX) != 1)
    refuse("'best_of' must be 1", "best_of", "unsupported_value");
  if (boolean(j, "echo", false)) refuse("'echo' is not supported", "echo", "unsupported_value");
  SamplerOptions& s = r.opt.sampling;
  s = SamplerOptions{};
  if (auto v = number(j, "temperature", 0, 2)) s.temperature = float(*v);
  if (auto v = number(j, "top_p", 0, 1)) {
    if (*v <= 0) refuse("'top_p' must be > 0", "top_p", "invalid_value");
    s.top_p = float(*v);
  }
  if (auto v = integer(j, "top_k", 0, 1 << 30)) s.top_k = int(*v);
  if (auto v = number(j, "min_p", 0, 1)) s.min_p = float(*v);
  if (auto v = number(j, "presence_penalty", -2, 2)) s.presence_penalty = float(*v);
  if (auto v = number(j, "frequency_penalty", -2, 2)) s.frequency_penalty = float(*v);
  if (auto v = number(j, "repeat_penalty", 0.01, 10)) s.repeat_penalty = float(*v);
  if (auto v = integer(j, "seed", INT64_MIN, INT64_MAX)) s.seed = uint64_t(*v);
  else s.seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ uint64_t(std::time(nullptr));
  std::optional<int64_t> max_tokens = integer(j, "max_completion_tokens", 1, INT64_MAX);
  if (!max_tokens) max_tokens = integer(j, "max_tokens", 1, INT64_MAX);
  const int64_t room = int64_t(ctx) - int64_t(r.prompt.size());
  int64_t want = max_tokens ? *max_tokens : cfg.default_max_tokens < 0 ? room : cfg.default_max_tokens;
  r.opt.max_tokens = int(std::clamp<int64_t>(want, 0, std::max<int64_t>(room, 0)));
  if (const json* v = field(j, "stop")) {
    if (v->is_string()) {
      r.opt.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_string()) refuse(type_error("stop", "a string or a list of strings", *v), "stop", "invalid_type");
        r.opt.stop.push_back(e.get<std::string>());
      }
    } else {
      refuse(type_error("stop", "a string or a list of strings", *v), "stop", "invalid_type");
    }
  }
  r.opt.ignore_eos = boolean(j, "ignore_eos", false);  // llama-server's extension (benchmarks: fixed lengths)
  if (r.chat) {                                        // chat: logprobs a boolean, top_logprobs the alternatives
    r.opt.logprobs = boolean(j, "logprobs", false);
    if (const auto k = integer(j, "top_logprobs", 0, kMaxTopLogprobs)) {
      if (!r.opt.logprobs && *k > 0) refuse("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value");
      r.opt.top_logprobs = int(*k);
    }
  } else if (const auto k = integer(j, "logprobs", 0, kMaxTopLogprobs)) {  // completions: the alternatives
    r.opt.logprobs = true;
    r.opt.top_logprobs = int(*k);
  }
  const auto refuse3 = [](std::string m, std::string p, std::string c) {
    refuse(std::move(m), std::move(p), std::move(c));
  };
  r.opt.grammar = response_format_grammar(j, refuse3);
  if (auto g = request_gbnf_grammar(j, refuse3, &tok)) {
    if (r.opt.grammar)  // (llama-server lets the schema win silently; two constraints are refused here)
      refuse("'grammar' and 'response_format' both constrain the output: give one of them", "grammar", "invalid_value");
    r.opt.grammar = std::move(g);
  }
  r.stream = boolean(j, "stream", false);
  if (const json* v = field(j, "stream_options")) {
    if (!v->is_object()) refuse(type_error("stream_options", "an object", *v), "stream_options", "invalid_type");
    r.include_usage = boolean(*v, "include_usage", false);
  }
}

inline void check_fits(const ApiRequest& r, std::size_t ctx, const char* param) {
  if (r.prompt.size() >= ctx)
    refuse(detail::concat("the prompt has ", r.prompt.size(), " tokens, but a slot's context holds ", ctx,
                          " (the prompt and at least one generated token must fit; start kiln-server with a larger -c "
                          "or fewer -np slots)"),
           param, "context_length_exceeded");
}

/// A JSON value as a Jinja value (objects keep their key order).
inline jinja::Value to_jinja(const json& j) {
  if (j.is_null()) return jinja::Value::none();
  if (j.is_boolean()) return jinja::Value(j.get<bool>());
  if (j.is_number_integer())
    return jinja::Value(j.is_number_unsigned() ? int64_t(j.get<uint64_t>()) : j.get<int64_t>());
  if (j.is_number()) return jinja::Value(j.get<double>());
  if (j.is_string()) return jinja::Value(j.get<std::string>());
  if (j.is_array()) {
    jinja::List l;
    for (const auto& x : j) l.push_back(to_jinja(x));
    return jinja::Value(std::move(l));
  }
  jinja::Dict d;
  for (const auto& [k, v] : j.items()) d.emplace_back(k, to_jinja(v));
  return jinja::Value(std::move(d));
}

}  // namespace kiln::serve

namespace kiln::detail::openai {

using serve::dump;
using serve::json;
using serve::refuse;
namespace fields = serve::fields;

/// Refuses a client string outside message contents (tools, tool calls, names) that spells a control
/// token: the template prints those with tojson and the like, where kiln cannot mark them as text, and a
/// control token there would forge the conversation's markup.
inline void refuse_control_text(const json& v, const std::string& where, const std::vector<std::string>& control) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    for (const auto& c : control)
      if (s.find(c) != std::string::npos)
        refuse(concat("'", where, "' contains '", c, "', the text of a control token of this model"), where,
               "invalid_value");
  } else if (v.is_array()) {
    for (std::size_t i = 0; i < v.size(); ++i) refuse_control_text(v[i], concat(where, "[", i, "]"), control);
  } else if (v.is_object()) {
    for (const auto& [k, x] : v.items()) refuse_control_text(x, concat(where, ".", k), control);
  }
}

/// The control tokens' texts of a vocabulary (those of at least 2 bytes).
inline std::vector<std::string> control_texts(const Tokenizer& tok) {
  std::vector<std::string> out;
  const auto& types = tok.vocabulary().types;
  for (std::size_t i = 0; i < types.size(); ++i)
    if (types[i] == TokenType::control && tok.piece(int32_t(i)).size() >= 2) out.emplace_back(tok.piece(int32_t(i)));
  return out;
}

/// `content` of a message: a string, a list of text parts (joined) or null (nullopt).
inline std::optional<std::string> message_text(const json& e, const std::string& where) {
  const json* content = fields::field(e, "content");
  if (!content) return std::nullopt;
  if (content->is_string()) return content->get<std::string>();
  if (content->is_array()) {  // content parts: text ones only
    std::string text;
    for (const auto& part : *content) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        refuse(concat("'", where,
                      ".content' parts must be {\"type\": \"text\", \"text\": string}: only text is supported"),
               where + ".content", "invalid_type");
      text += part["text"].get<std::string>();
    }
    return text;
  }
  refuse(concat("'", where, ".content' must be a string or a list of text parts, not ", content->type_name()),
         where + ".content", "invalid_type");
}

/// An assistant message's tool_calls, checked, with each call's arguments as a JSON object (a string is
/// parsed: templates print them as objects, as transformers and llama.cpp pass them).
inline json message_tool_calls(const json& calls, const std::string& where) {
  if (!calls.is_array()) refuse(concat("'", where, "' must be a list of tool calls"), where, "invalid_type");
  json out = json::array();
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string w = concat(where, "[", k, "]");
    if (!c.is_object()) refuse(concat("'", w, "' must be an object"), w, "invalid_type");
    if (c.value("type", "function") != "function")
      refuse(concat("'", w, ".type' must be \"function\""), w + ".type", "invalid_value");
    const json* f = fields::field(c, "function");
    if (!f || !f->is_object()) refuse(concat("'", w, ".function' must be an object"), w + ".function", "invalid_type");
    const json* name = fields::field(*f, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      refuse(concat("'", w, ".function.name' must be a non-empty string"), w + ".function.name", "invalid_type");
    const json* a = fields::field(*f, "arguments");
    json args = json::object();
    if (a && a->is_string()) {
      args = json::parse(a->get<std::string>(), nullptr, false);
      if (!args.is_object())
        refuse(concat("'", w, ".function.arguments' must be a JSON object (as a string), not ", dump(*a).substr(0, 40)),
               w + ".function.arguments", "invalid_value");
    } else if (a && a->is_object()) {
      args = *a;
    } else if (a) {
      refuse(concat("'", w, ".function.arguments' must be a string holding a JSON object"), w + ".function.arguments",
             "invalid_type");
    }
    if (const json* id = fields::field(c, "id"); id && !id->is_string())
      refuse(concat("'", w, ".id' must be a string"), w + ".id", "invalid_type");
    json call = c;  // as the client wrote it (key order too), the arguments an object
    call["function"]["arguments"] = std::move(args);
    out.push_back(std::move(call));
  }
  return out;
}

/// The request's tools, checked: [{"type": "function", "function": {"name", "description", "parameters"}}].
inline void check_tools(const json& tools) {
  if (!tools.is_array()) refuse(fields::type_error("tools", "a list of tools", tools), "tools", "invalid_type");
  for (std::size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string w = concat("tools[", i, "]");
    if (!t.is_object()) refuse(concat("'", w, "' must be an object"), w, "invalid_type");
    if (t.value("type", "") != "function")
      refuse(concat("'", w, ".type' must be \"function\""), w + ".type", "invalid_value");
    const json* f = fields::field(t, "function");
    if (!f || !f->is_object()) refuse(concat("'", w, ".function' must be an object"), w + ".function", "invalid_type");
    const json* name = fields::field(*f, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      refuse(concat("'", w, ".function.name' must be a non-empty string"), w + ".function.name", "invalid_type");
    if (const json* d = fields::field(*f, "description"); d && !d->is_string())
      refuse(concat("'", w, ".function.description' must be a string"), w + ".function.description", "invalid_type");
    if (const json* p = fields::field(*f, "parameters"); p && !p->is_object())
      refuse(concat("'", w, ".function.parameters' must be a JSON Schema object"), w + ".function.parameters",
             "invalid_type");
  }
}

}  // namespace kiln::detail::openai

namespace kiln::serve {

/// A chat request's conversation rendered by the model's template, and how its reply's tool calls read.
struct RenderedChat {
  ChatPrompt prompt;
  std::optional<ToolFormat> tools;
  bool parallel_tool_calls = true;
  const ChatTemplate* tmpl = nullptr;    ///< the template that rendered it
  std::vector<std::size_t> forced = {};  ///< tool_choice "required" or named: the tools the reply must call
  std::optional<ReasoningFormat> reasoning = std::nullopt;  ///< the template's reasoning syntax
  bool harmony_tools = false;  ///< tools shown by a harmony template: its calls are read from the channels
};

/// The messages, tools, tool_choice and parallel_tool_calls of a chat request through the model's chat
/// template (tools and tool calls: the interpreter, as HF's apply_chat_template(messages, tools=...)).
inline RenderedChat render_chat(const json& j, const ChatTemplates& t, const Tokenizer& tok) {
  using namespace fields;
  RenderedChat out;
  const json* m = field(j, "messages");
  if (!m) refuse("'messages' is missing", "messages", "missing_field");
  if (!m->is_array()) refuse(type_error("messages", "a list of messages", *m), "messages", "invalid_type");
  if (m->empty()) refuse("'messages' is empty: a conversation needs at least one message", "messages", "invalid_value");
  // tools: checked; tool_choice "auto" (the default with tools), "none" (the tools are not shown and the
  // reply is not read for calls), "required" (the reply is a call to one of them: constrained decoding) or
  // {"type": "function", "function": {"name": ...}} (a call to that one)
  const json* tools = field(j, "tools");
  if (tools) kiln::detail::openai::check_tools(*tools);
  std::string choice = "auto";
  if (const json* c = field(j, "tool_choice")) {
    if (c->is_object()) {
      const json* f = field(*c, "function");
      const json* name = f && f->is_object() ? field(*f, "name") : nullptr;
      if (c->value("type", "") != "function" || !name || !name->is_string())
        refuse(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": "
            "{\"name\": ...}}",
            "tool_choice", "invalid_value");
      choice = "named";
      for (std::size_t i = 0; tools && i < tools->size(); ++i)
        if ((*tools)[i]["function"]["name"] == *name) out.forced.push_back(i);
      if (out.forced.empty())
        refuse(concat("'tool_choice' names the function '", name->get<std::string>(), "', which is not in 'tools'"),
               "tool_choice", "invalid_value");
    } else {
      if (!c->is_string())
        refuse(type_error("tool_choice", "\"auto\", \"none\", \"required\" or an object", *c), "tool_choice",
               "invalid_type");
      choice = c->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        refuse(concat("'tool_choice' is \"", choice, "\"; it must be \"auto\", \"none\", \"required\" or an object"),
               "tool_choice", "invalid_value");
      if (choice == "required") {
        if (!tools || tools->empty())
          refuse("'tool_choice' \"required\" needs 'tools'", "tool_choice", "invalid_value");
        for (std::size_t i = 0; i < tools->size(); ++i) out.forced.push_back(i);
      }
    }
  }
  out.parallel_tool_calls = boolean(j, "parallel_tool_calls", true);
  const bool use_tools = tools && !tools->empty() && choice != "none";

  std::vector<ChatMessage> plain;
  json rich = json::array();
  bool is_rich = use_tools;
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string where = concat("messages[", i, "]");
    if (!e.is_object()) refuse(concat("'", where, "' must be an object, not ", e.type_name()), where, "invalid_type");
    const json* role = field(e, "role");
    if (!role || !role->is_string())
      refuse(concat("'", where, ".role' must be a string"), where + ".role", "invalid_type");
    const std::optional<std::string> text = kiln::detail::openai::message_text(e, where);
    // The message as the client wrote it (key order too) with content a string (null: "", as llama.cpp
    // passes it) and tool call arguments objects; other fields (reasoning_content, ...) pass through.
    json msg = e;
    msg["content"] = text ? *text : "";
    if (const json* calls = field(e, "tool_calls")) {
      if (*role != "assistant")
        refuse(concat("'", where, ".tool_calls' is only for assistant messages"), where + ".tool_calls",
               "invalid_value");
      msg["tool_calls"] = kiln::detail::openai::message_tool_calls(*calls, where + ".tool_calls");
    } else if (!text && *role == "assistant") {
      refuse(concat("'", where, "' needs 'content' or 'tool_calls'"), where + ".content", "missing_field");
    }
    for (const char* k : {"tool_call_id", "name"})
      if (const json* v = field(e, k); v && !v->is_string())
        refuse(concat("'", where, ".", k, "' must be a string"), concat(where, ".", k), "invalid_type");
    is_rich |= field(e, "tool_calls") || field(e, "tool_call_id");  // (other fields: shown on the interpreter only)
    // Reasoning sent back (llama-server's reasoning_content; gpt-oss's template reads it as "thinking", as
    // llama.cpp passes it): message text, shown on the interpreter (without one, the hand-written template
    // renders the content alone, as the templates do for every turn before the last user message).
    for (const char* k : {"reasoning_content", "thinking"})
      if (const json* v = field(e, k)) {
        if (!v->is_string())
          refuse(concat("'", where, ".", k, "' must be a string"), concat(where, ".", k), "invalid_type");
        is_rich |= t.rich != nullptr;
      }
    if (const json* v = field(e, "reasoning_content"); v && !field(e, "thinking")) msg["thinking"] = *v;
    if (*role == "tool" && !field(e, "tool_call_id"))
      refuse(concat("'", where, ".tool_call_id' is missing (a tool message answers a tool call)"),
             where + ".tool_call_id", "missing_field");
    plain.push_back({role->get<std::string>(), text ? *text : ""});
    rich.push_back(std::move(msg));
  }
  if (!t.plain && !t.rich)
    refuse("this model has no chat template kiln supports: use /v1/completions", "messages", "no_chat_template");
  try {
    if (!is_rich) {
      out.tmpl = t.plain ? t.plain : t.rich;
      out.prompt = out.tmpl->render_marked(plain, {.add_generation_prompt = true});
      out.reasoning = reasoning_format_of(*out.tmpl);
      return out;
    }
    if (!t.rich)
      refuse(concat("this model's chat template ('", t.plain->name(),
                    "', chosen by name) cannot show tools or tool calls: start kiln-server with --chat-template FILE"),
             use_tools ? "tools" : "messages", "unsupported_value");
    const std::string_view src = t.rich->source();
    const auto reasoning = reasoning_format_of(src);
    if (use_tools) {
      out.tools = tool_format_of(src);
      out.harmony_tools = !out.tools && reasoning && reasoning->syntax == ReasoningSyntax::harmony;
      if (src.find("tools") == std::string_view::npos || (!out.tools && !out.harmony_tools))
        refuse(
            "this model's chat template shows no tool calls in a format kiln-server reads (Hermes <tool_call>, "
            "Llama 3.x JSON, Mistral [TOOL_CALLS]): start kiln-server with --chat-template FILE",
            "tools", "unsupported_value");
    }
    // strings outside message contents (tools, calls, names) cannot spell control tokens
    const std::vector<std::string> control = kiln::detail::openai::control_texts(tok);
    if (use_tools) kiln::detail::openai::refuse_control_text(*tools, "tools", control);
    for (std::size_t i = 0; i < rich.size(); ++i)
      for (const auto& [k, v] : rich[i].items())
        if (k != "content" && k != "reasoning_content" && k != "thinking")  // (those: marked as message text)
          kiln::detail::openai::refuse_control_text(v, concat("messages[", i, "].", k), control);
    ChatTemplate tmpl = *t.rich;  // (shares the parsed template; the variables are this request's)
    if (use_tools) tmpl.set_variable("tools", to_jinja(*tools));
    out.tmpl = t.rich;
    out.prompt = tmpl.render_marked(to_jinja(rich), {.add_generation_prompt = true});
    out.reasoning = reasoning;
  } catch (const Error& e) {
    refuse(e.what(), "messages", "invalid_value");
  }
  return out;
}

/// POST /v1/chat/completions.
inline ApiRequest parse_chat(const json& j, const ChatTemplates& t, const Tokenizer& tok, const ApiConfig& cfg,
                             std::size_t ctx) {
  ApiRequest r;
  r.chat = true;
  RenderedChat c = render_chat(j, t, tok);
  r.prompt = tok.encode_chat(c.prompt);
  check_fits(r, ctx, "messages");
  parse_options(j, r, cfg, ctx, tok);
  if ((c.tools || c.harmony_tools) && r.opt.grammar && fields::field(j, "grammar"))  // (llama-server refuses it too)
    refuse("'grammar' cannot be used with 'tools' (unless 'tool_choice' is \"none\")", "grammar", "invalid_value");
  r.opt.stop_tokens = c.tmpl->stop_tokens(tok);
  r.tools = c.tools;
  r.parallel_tool_calls = c.parallel_tool_calls;
  ReasoningMode mode = cfg.reasoning;
  if (const json* v = fields::field(j, "reasoning_format")) {
    const auto m = v->is_string() ? reasoning_mode_of(v->get<std::string>()) : std::nullopt;
    if (!m)
      refuse(detail::concat("'reasoning_format' must be \"none\", \"deepseek\", \"deepseek-legacy\" or \"auto\", not ",
                            dump(*v).substr(0, 40)),
             "reasoning_format", "invalid_value");
    mode = *m;
  }
  r.reply = {.reasoning = mode == ReasoningMode::none ? std::nullopt : c.reasoning,
             .in_reasoning = c.reasoning && prompt_opens_reasoning(*c.reasoning, c.prompt.text),
             .tools = c.tools,
             .harmony_calls = c.harmony_tools,
             .parallel = c.parallel_tool_calls};
  r.reasoning_in_content = mode == ReasoningMode::deepseek_legacy;
  if (r.reasoning_in_content && r.stream) r.reply.reasoning = std::nullopt;  // (streamed: raw content only)
  r.reply.harmony_calls &= r.reply.reasoning.has_value();                    // (none: the raw text, calls included)
  if (c.reasoning)  // the reasoning markers stay in the reply text (also with none: the raw reply, as llama-server)
    for (auto marker : reasoning_markers(*c.reasoning))
      if (const int32_t id = tok.find(marker); id >= 0) r.opt.render_tokens.push_back(id);
  const auto refuse3 = [](std::string m, std::string p, std::string code) {
    refuse(std::move(m), std::move(p), std::move(code));
  };
  if (!c.forced.empty())  // tool_choice required / named: the reply is one call (response_format does not apply)
    r.opt.grammar = c.harmony_tools ? harmony_call_grammar(tok, j["tools"], c.forced, refuse3)
                                    : tool_call_grammar(*c.tools, c.tmpl->source(), j["tools"], c.forced, refuse3);
  if (r.tools)  // the call markers stay in the reply text even where they are control tokens
    for (auto marker : tool_markers(*r.tools))
      if (const int32_t id = tok.find(marker); id >= 0) r.opt.render_tokens.push_back(id);
  return r;
}

/// POST /v1/completions: prompt a string (BOS prepended as the vocabulary says; control token spellings
/// are text), a list of one string, or a list of token ids.
inline ApiRequest parse_completion(const json& j, const Tokenizer& tok, const ApiConfig& cfg, std::size_t ctx,
                                   std::size_t vocab) {
  using namespace fields;
  ApiRequest r;
  const json* p = field(j, "prompt");
  if (!p) refuse("'prompt' is missing", "prompt", "missing_field");
  const json* one = p;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) one = &(*p)[0];
  if (one->is_string()) {
    r.prompt = tok.encode(one->get<std::string>(), {.add_special = true, .parse_special = false});
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    for (const auto& t : *p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= int64_t(vocab))
        refuse(concat("'prompt' token ", dump(t), " is not a token id below the vocabulary size ", vocab), "prompt",
               "invalid_value");
      r.prompt.push_back(int32_t(t.get<int64_t>()));
    }
  } else {
    refuse(type_error("prompt", "a string, a list of one string or a list of token ids", *p), "prompt", "invalid_type");
  }
  if (r.prompt.empty()) refuse("'prompt' is empty (and the vocabulary adds no BOS)", "prompt", "invalid_value");
  check_fits(r, ctx, "prompt");
  parse_options(j, r, cfg, ctx, tok);
  return r;
}

/// The response shapes. id: "chatcmpl-N" / "cmpl-N"; created: Unix seconds.
struct ResponseHead {
  std::string id, model;
  int64_t created = 0;
  bool chat = false;
};

inline json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt},
          {"completion_tokens", u.completion},
          {"total_tokens", u.prompt + u.completion},
          {"prompt_tokens_details", {{"cached_tokens", u.cached}}}};
}

/// OpenAI's finish_reason: "tool_calls" when the reply made calls, else "length" or "stop".
inline const char* finish_reason(Finish f, bool called = false) {
  return called ? "tool_calls" : f == Finish::length ? "length" : "stop";
}

/// A call as OpenAI's message.tool_calls[i].
inline json tool_call_json(const ToolCall& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

/// OpenAI's logprobs object for generated tokens: chat {"content": [{token, logprob, bytes, top_logprobs}]};
/// completions {tokens, token_logprobs, top_logprobs (token -> logprob), text_offset} with offsets from
/// `offset` (the bytes of text before the first of them). A token's text is its bytes, a partial UTF-8
/// character replaced (its exact bytes are in "bytes" for chat).
inline json logprobs_json(bool chat, std::span<const TokenLogprob> lps, const Tokenizer& tok, std::size_t offset = 0) {
  auto text = [&](int32_t id) { return text::sanitize_utf8(tok.token_bytes(id)); };
  auto bytes = [&](int32_t id) {
    json b = json::array();
    for (unsigned char c : tok.token_bytes(id)) b.push_back(int(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (const auto& lp : lps) {
      json top = json::array();
      for (const auto& [id, l] : lp.top) top.push_back({{"token", text(id)}, {"logprob", l}, {"bytes", bytes(id)}});
      content.push_back(
          {{"token", text(lp.token)}, {"logprob", lp.logprob}, {"bytes", bytes(lp.token)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    tokens.push_back(text(lp.token));
    logprobs.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, l] : lp.top)
      if (!top.contains(text(id))) top[text(id)] = l;  // (two tokens with one text: the likelier)
    tops.push_back(top);
    offsets.push_back(offset);
    offset += tok.token_bytes(lp.token).size();
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

/// One finished choice of a non-streamed response; logprobs: null unless the request asked for them.
struct ChoiceResult {
  std::string text;            ///< with calls: the text outside them; with reasoning: the text after it
  std::string reasoning = {};  ///< chat: message.reasoning_content (omitted when empty)
  Finish finish = Finish::stop;
  json logprobs = nullptr;
  std::vector<ToolCall> calls = {};
};

/// The whole (non-streamed) response: the choices in order, their usage together (the prompt once).
inline json response_json(const ResponseHead& h, const std::vector<ChoiceResult>& choices, const Usage& u) {
  json arr = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {
        {"index", i}, {"finish_reason", finish_reason(c.finish, !c.calls.empty())}, {"logprobs", c.logprobs}};
    if (h.chat) {
      json msg = {{"role", "assistant"},
                  {"content", c.calls.empty() || !c.text.empty() ? json(c.text) : json(nullptr)}};
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
      if (!c.calls.empty()) {
        msg["tool_calls"] = json::array();
        for (const auto& call : c.calls) msg["tool_calls"].push_back(tool_call_json(call));
      }
      choice["message"] = std::move(msg);
    } else {
      choice["text"] = c.text;
    }
    arr.push_back(std::move(choice));
  }
  return {{"id", h.id},           {"object", h.chat ? "chat.completion" : "text_completion"},
          {"created", h.created}, {"model", h.model},
          {"choices", arr},       {"usage", usage_json(u)}};
}

/// One streamed chunk of choice `index`: a text delta (first: the chat's role) with the logprobs of the
/// tokens generated since the last chunk (null: none asked for), or the end (finish set), or the usage
/// chunk (usage set: no choices).
inline json chunk_json(const ResponseHead& h, std::string_view text, bool first, std::optional<Finish> finish,
                       const Usage* usage = nullptr, std::size_t index = 0, const json& logprobs = nullptr,
                       bool called = false) {
  json j = {{"id", h.id},
            {"object", h.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", h.created},
            {"model", h.model}};
  if (usage) {
    j["choices"] = json::array();
    j["usage"] = usage_json(*usage);
    return j;
  }
  json choice = {{"index", index},
                 {"logprobs", logprobs},
                 {"finish_reason", finish ? json(finish_reason(*finish, called)) : json(nullptr)}};
  if (h.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!finish) delta["content"] = std::string(text);
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(text);
  }
  j["choices"] = json::array({choice});
  return j;
}

/// A streamed chunk of choice `index`'s reasoning (llama-server's delta.reasoning_content).
inline json reasoning_chunk_json(const ResponseHead& h, std::string_view text, std::size_t index = 0,
                                 const json& logprobs = nullptr) {
  json j = {{"id", h.id}, {"object", "chat.completion.chunk"}, {"created", h.created}, {"model", h.model}};
  j["choices"] = json::array({{{"index", index},
                               {"delta", {{"reasoning_content", std::string(text)}}},
                               {"logprobs", logprobs},
                               {"finish_reason", nullptr}}});
  return j;
}

/// A whole chat reply read as the request says (ApiRequest::reply): reasoning, content and calls. With
/// deepseek-legacy the content is the raw text.
inline ChoiceResult read_reply(const ApiRequest& r, std::string text, Finish finish) {
  ChoiceResult c{.text = {}, .finish = finish};
  ReplyReader rd(r.reply);
  std::vector<ReplyEvent> ev;
  rd.push(text, ev);
  rd.finish(ev);
  for (auto& e : ev) {
    if (e.kind == ReplyEvent::Kind::reasoning) c.reasoning += e.text;
    else if (e.kind == ReplyEvent::Kind::content) c.text += e.text;
    else c.calls.push_back(std::move(*e.call));
  }
  if (r.reasoning_in_content) c.text = std::move(text);
  return c;
}

/// The streamed chunks of one call (call_index: its place among the choice's calls), as OpenAI streams
/// them: the id, type and name with empty arguments, then the arguments.
inline std::vector<json> tool_call_chunks(const ResponseHead& h, const ToolCall& c, std::size_t call_index,
                                          std::size_t index = 0) {
  auto chunk = [&](json call) {
    json j = {{"id", h.id}, {"object", "chat.completion.chunk"}, {"created", h.created}, {"model", h.model}};
    j["choices"] = json::array({{{"index", index},
                                 {"delta", {{"tool_calls", json::array({std::move(call)})}}},
                                 {"logprobs", nullptr},
                                 {"finish_reason", nullptr}}});
    return j;
  };
  return {chunk({{"index", call_index},
                 {"id", c.id},
                 {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", ""}}}}),
          chunk({{"index", call_index}, {"function", {{"arguments", c.arguments}}}})};
}

}  // namespace kiln::serve
