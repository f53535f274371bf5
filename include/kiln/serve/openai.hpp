// kiln/serve/openai.hpp - OpenAI's HTTP API on a Scheduler, without the sockets: request bodies ->
// token ids and RequestOptions (every field checked, errors as OpenAI's error JSON), results -> response
// and Server-Sent Event chunk JSON. examples/kiln-server.cpp puts it behind cpp-httplib.
//
//   POST /v1/chat/completions   messages -> the model's chat template (ChatTemplate::render_marked) ->
//                               tokens where only the template's markup may be control tokens
//   POST /v1/completions        prompt: a string (text, BOS prepended) or token ids
// Fields: max_tokens / max_completion_tokens, temperature, top_p, top_k, min_p, seed, stop (string or
// list), presence_penalty, frequency_penalty, repeat_penalty, ignore_eos, stream, stream_options.include_usage,
// n (choices of one prompt, computed once: Scheduler::submit_choices), logprobs (chat: a boolean and
// top_logprobs; completions: the number of top tokens); others (model, user, logit_bias, ...) are accepted
// and ignored, as llama-server does. Defaults
// are llama-server's (kiln::SamplerOptions: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), not
// OpenAI's temperature 1 with no filters; seed: a fresh random one per request unless given.
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
#include "kiln/serve/scheduler.hpp"
#include "kiln/text/chat.hpp"
#include "kiln/text/tokenizer.hpp"
#include "kiln/text/utf8.hpp"

namespace kiln::serve {

using json = nlohmann::json;

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

/// What the server was started with (kiln-server's flags).
struct ApiConfig {
  std::string model_name = "kiln";
  int default_max_tokens = -1;  ///< -n: -1 until the context ends
};

/// A checked request: the prompt's tokens, the scheduler's options and the response format.
struct ApiRequest {
  bool chat = false;
  std::vector<int32_t> prompt;
  RequestOptions opt;
  std::size_t n = 1;  ///< choices
  bool stream = false, include_usage = false;
};

/// The most choices (`n`) one request may ask for.
inline constexpr std::size_t kMaxChoices = 16;

/// The sampling and stopping fields common to both endpoints.
inline void parse_options(const json& j, ApiRequest& r, const ApiConfig& cfg, std::size_t ctx) {
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

/// POST /v1/chat/completions. tmpl: the model's chat template (nullptr: the model has none).
inline ApiRequest parse_chat(const json& j, const ChatTemplate* tmpl, const Tokenizer& tok, const ApiConfig& cfg,
                             std::size_t ctx) {
  using namespace fields;
  ApiRequest r;
  r.chat = true;
  const json* m = field(j, "messages");
  if (!m) refuse("'messages' is missing", "messages", "missing_field");
  if (!m->is_array()) refuse(type_error("messages", "a list of messages", *m), "messages", "invalid_type");
  if (m->empty()) refuse("'messages' is empty: a conversation needs at least one message", "messages", "invalid_value");
  std::vector<ChatMessage> msgs;
  for (std::size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string where = concat("messages[", i, "]");
    if (!e.is_object()) refuse(concat("'", where, "' must be an object, not ", e.type_name()), where, "invalid_type");
    const json* role = field(e, "role");
    if (!role || !role->is_string())
      refuse(concat("'", where, ".role' must be a string"), where + ".role", "invalid_type");
    const json* content = field(e, "content");
    std::string text;
    if (!content) {
      text = "";
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {  // content parts: text ones only
      for (const auto& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          refuse(concat("'", where,
                        ".content' parts must be {\"type\": \"text\", \"text\": string}: only text is supported"),
                 where + ".content", "invalid_type");
        text += part["text"].get<std::string>();
      }
    } else {
      refuse(concat("'", where, ".content' must be a string or a list of text parts, not ", content->type_name()),
             where + ".content", "invalid_type");
    }
    msgs.push_back({role->get<std::string>(), std::move(text)});
  }
  if (!tmpl)
    refuse("this model has no chat template kiln supports: use /v1/completions", "messages", "no_chat_template");
  ChatPrompt p;
  try {
    p = tmpl->render_marked(msgs, true);
  } catch (const Error& e) {
    refuse(e.what(), "messages", "invalid_value");
  }
  r.prompt = tok.encode_chat(p);
  check_fits(r, ctx, "messages");
  parse_options(j, r, cfg, ctx);
  r.opt.stop_tokens = tmpl->stop_tokens(tok);
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
    r.prompt = tok.encode(one->get<std::string>(), true, false);
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
  parse_options(j, r, cfg, ctx);
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

inline const char* finish_reason(Finish f) { return f == Finish::length ? "length" : "stop"; }

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
  std::string text;
  Finish finish = Finish::stop;
  json logprobs = nullptr;
};

/// The whole (non-streamed) response: the choices in order, their usage together (the prompt once).
inline json response_json(const ResponseHead& h, const std::vector<ChoiceResult>& choices, const Usage& u) {
  json arr = json::array();
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json choice = {{"index", i}, {"finish_reason", finish_reason(c.finish)}, {"logprobs", c.logprobs}};
    if (h.chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
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
                       const Usage* usage = nullptr, std::size_t index = 0, const json& logprobs = nullptr) {
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
                 {"finish_reason", finish ? json(finish_reason(*finish)) : json(nullptr)}};
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

}  // namespace kiln::serve
