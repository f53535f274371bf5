// kiln/text/chat.hpp - chat templates: a conversation -> the exact prompt text Hugging Face's
// tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...) produces.
//
//   auto tmpl = kiln::ChatTemplate::from_gguf(gguf_file);       // or ::builtin("chatml"), ::from_string(jinja)
//   std::vector<kiln::ChatMessage> conv{{"user", "Hello!"}};
//   std::string prompt = tmpl.render(conv, {.add_generation_prompt = true});
//   auto ids = tokenizer.encode(prompt, {.add_special = false, .parse_special = true});
//
// Two ways to render. The template families of the built-in instruct models are recognised by their
// text and rendered with C++ that mirrors each template line by line; every other template runs on
// kiln's Jinja interpreter (kiln/text/jinja.hpp, checked byte for byte against Python's jinja2 on
// llama.cpp's corpus of 71 real templates: Llama 3.x, Mistral, Qwen2.5/3, Gemma 2/3/4, Phi, SmolLM3,
// DeepSeek, Granite, Kimi, GLM, gpt-oss, ...) with HF's variables: messages, bos_token, eos_token,
// add_generation_prompt, tools (None unless set_variable("tools", ...)), documents (None),
// enable_thinking (passed only when false: HF's default leaves it undefined) and any set_variable().
// The hand-written renderers still serve two purposes: render_marked() there knows exactly which bytes
// came from a message (the interpreter marks what it can trace: copies, concatenation, slices, strip,
// split, replace's kept text), and they are about 10x faster (no interpreter allocations; both are far
// below tokenization cost). tests/text/test_chat.cpp renders their fixtures through both paths and
// compares the bytes and the marks.
// The recognised families:
//   chatml   "<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" as the
//            generation prompt; optionally a default system turn when the first message is not a system
//            message (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
//            Qwen2-Instruct: "You are a helpful assistant.").
//   qwen2.5  ChatML, always a system turn (default "You are Qwen, created by Alibaba Cloud. You are a
//            helpful assistant."), tool messages wrapped in <tool_response> inside a user turn.
//   qwen3    ChatML, no default system turn; assistant turns after the last user query carry a
//            "<think>\n...\n</think>\n\n" block (reasoning split off the content at "</think>"), earlier
//            ones lose it; enable_thinking = false appends "<think>\n\n</think>\n\n" to the generation
//            prompt (HF's default, enable_thinking undefined, is kiln's enable_thinking = true).
//   gemma3   "<bos>" first; "<start_of_turn>user\n" / "<start_of_turn>model\n" ... "<end_of_turn>\n"; a
//            system message becomes a prefix (content + "\n\n") of the first user turn; contents are
//            trimmed (Python str.strip(): Unicode whitespace); roles must alternate user/assistant.
// A template is recognised by its exact text, up to what Jinja ignores (whitespace inside {{ }} / {% %}
// tags, how a string literal is quoted and escaped, one trailing newline): the official texts of Qwen2.5,
// Qwen3 and Gemma 3 by hash, the ChatML ones by structure (any default system prompt). Anything else
// (including variants of those texts) renders with the Jinja interpreter. A template it cannot parse is
// a kiln::FormatError from from_string (naming the construct and line); a construct it lacks is one when
// rendering reaches it ("jinja: unsupported filter 'xyz' at line 3"), as in jinja2.
//
// BOS: the rendered text holds every special token the model expects (Gemma's template writes "<bos>"
// itself, as do Jinja templates that print {{ bos_token }}; the ChatML families use no BOS). Encode it
// with add_special = false and parse_special = true, exactly as HF's apply_chat_template(tokenize=True)
// does (add_special_tokens=False); adding the vocabulary's BOS as well would give Gemma two.
//
// Stop tokens: a reply ends at stop_texts() ("<|im_end|>", "<end_of_turn>"; for a Jinja template the
// end-of-turn markers of kStopMarkers that its text contains, less <|end|> in a harmony template (gpt-oss:
// it ends each message of a reply, which ends at <|return|> or <|call|>), and its eos_token); stop_tokens(tokenizer)
// gives their ids (and the tokenizer's EOS) for the generation loop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/text/chat_recognize.hpp"
#include "kiln/text/jinja.hpp"
#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#include "kiln/io/json.hpp"
#define KILN_CHAT_HAS_JSON 1
#endif

namespace kiln {

/// One turn of a conversation. role: "system", "user", "assistant" or "tool".
struct ChatMessage {
  std::string role, content;
};

/// A rendered conversation whose message texts are marked: content[i] is a byte range [first, second) of
/// text that came from a message (not from the template). Tokenizer::encode_chat(prompt) honours control
/// tokens only outside them, so a message that spells "<|im_start|>" gets text tokens, not the control token.
struct ChatPrompt {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> content;
};

enum class ChatFormat { chatml, qwen2_5, qwen3, gemma3, jinja };

/// How ChatTemplate::render shows a conversation (HF's apply_chat_template arguments).
struct ChatRenderOptions {
  bool add_generation_prompt = false;  ///< end with the opening of the assistant's reply
  /// false: qwen3 appends an empty thinking block to the generation prompt, Jinja templates get
  /// enable_thinking = false; true (HF's default) leaves enable_thinking undefined for them.
  bool enable_thinking = true;
};

class ChatTemplate {
 public:
  ChatTemplate() = default;

  /// The names builtin() takes.
  static std::vector<std::string_view> builtin_names() { return {"chatml", "smollm2", "qwen2.5", "qwen3", "gemma3"}; }

  /// A family chosen by name: "chatml" (no default system turn), "smollm2" (ChatML with SmolLM2's
  /// default system turn), "qwen2.5", "qwen3", "gemma3" (bos_token: the text the template starts with).
  static ChatTemplate builtin(std::string_view name, std::string_view bos_token = "<bos>") {
    ChatTemplate t;
    t.name_ = std::string(name);
    if (name == "chatml") {
      t.format_ = ChatFormat::chatml;
    } else if (name == "smollm2") {
      t.format_ = ChatFormat::chatml;
      t.default_system_ = std::string(detail::chat::kSmolLM2System);
    } else if (name == "qwen2.5" || name == "qwen2_5") {
      t.format_ = ChatFormat::qwen2_5;
      t.name_ = "qwen2.5";
      t.default_system_ = std::string(detail::chat::kQwen25System);
    } else if (name == "qwen3") {
      t.format_ = ChatFormat::qwen3;
    } else if (name == "gemma3") {
      t.format_ = ChatFormat::gemma3;
      t.bos_ = std::string(bos_token);
    } else {
      std::string list;
      for (auto n : builtin_names()) list += (list.empty() ? "" : ", ") + std::string(n);
      fail("kiln::ChatTemplate: unknown chat template name '", name, "' (built in: ", list, ")");
    }
    return t;
  }

  /// A Jinja chat template: a recognised family (see the top of this file) or else the Jinja interpreter.
  /// Throws kiln::FormatError when the template does not parse (naming the construct and line) or is
  /// empty. bos_token / eos_token: the texts of {{ bos_token }} / {{ eos_token }}.
  static ChatTemplate from_string(std::string_view jinja, std::string_view bos_token = "<bos>",
                                  std::string_view eos_token = "") {
    using namespace detail::chat;
    const std::string norm = normalize(jinja);
    const uint64_t h = fnv1a(norm);
    std::optional<ChatTemplate> t;
    for (const auto& k : kKnownTemplates)
      if (h == k.hash) t = builtin(k.family, bos_token);
    if (!t) t = match_chatml(norm);
    if (!t) return from_jinja(jinja, bos_token, eos_token);
    t->origin_ =
        std::make_shared<const Origin>(Origin{std::string(jinja), std::string(bos_token), std::string(eos_token)});
    return *t;
  }

  /// This template on the Jinja interpreter: itself when it already is, else from_jinja of the text a
  /// recognised family was made from (same bos/eos), for what the hand-written renderers cannot show
  /// (tools, tool calls); nullopt for a family chosen by name (no text).
  std::optional<ChatTemplate> interpreted() const {
    if (format_ == ChatFormat::jinja) return *this;
    if (!origin_) return std::nullopt;
    ChatTemplate t = from_jinja(origin_->text, origin_->bos, origin_->eos);
    t.vars_ = vars_;
    t.now_ = now_;
    return t;
  }

  /// What kiln-chat's and kiln-server's --chat-template take: a builtin family's name (builtin_names()), or
  /// else the path of a file holding a Jinja chat template (from_string: a recognised family, or the Jinja
  /// interpreter), its bos_token / eos_token the texts of tok's BOS and EOS tokens. Throws naming the value
  /// when it is neither a builtin name nor a readable file, and naming the file when it does not parse.
  template <class Tok>
  static ChatTemplate from_name_or_file(std::string_view name_or_path, const Tok& tok) {
    auto text = [&](int32_t id, std::string_view none) {
      return id >= 0 ? std::string(tok.token_bytes(id, {.render_special = true})) : std::string(none);
    };
    const std::string bos = text(tok.bos(), "<bos>");
    for (auto n : builtin_names())
      if (n == name_or_path || name_or_path == "qwen2_5") return builtin(name_or_path, bos);
    const std::filesystem::path p(name_or_path);
    if (std::error_code ec; !std::filesystem::is_regular_file(p, ec)) {
      std::string list;
      for (auto n : builtin_names()) list += (list.empty() ? "" : ", ") + std::string(n);
      fail("kiln::ChatTemplate: '", name_or_path, "' is neither a builtin chat template (", list,
           ") nor a template file");
    }
    try {
      return from_string(read_file(p), bos, text(tok.eos(), ""));
    } catch (const FormatError& e) {
      fail<FormatError>("chat template file '", p.string(), "': ", e.what());
    }
  }

  /// The template on the Jinja interpreter, without recognising a family (name() "jinja").
  static ChatTemplate from_jinja(std::string_view jinja, std::string_view bos_token = "<bos>",
                                 std::string_view eos_token = "") {
    if (detail::chat::py_strip(jinja).empty()) fail<FormatError>("kiln::ChatTemplate: empty chat template");
    ChatTemplate t;
    t.format_ = ChatFormat::jinja;
    t.name_ = "jinja";
    t.bos_ = std::string(bos_token);
    t.eos_ = std::string(eos_token);
    t.source_ = std::make_shared<const std::string>(jinja);
    try {
      t.jinja_ = std::make_shared<const jinja::Template>(jinja);
    } catch (const FormatError& e) {
      fail<FormatError>("kiln::ChatTemplate: unsupported chat template: ", e.what());
    }
    return t;
  }

  /// An extra variable for Jinja templates (HF's apply_chat_template keyword arguments: "tools",
  /// "documents", "reasoning_effort", ...); the hand-written families ignore them.
  ChatTemplate& set_variable(std::string name, jinja::Value v) {
    for (auto& [k, x] : vars_)
      if (k == name) {
        x = std::move(v);
        return *this;
      }
    vars_.emplace_back(std::move(name), std::move(v));
    return *this;
  }
  /// The time strftime_now() formats in Jinja templates (default: the local time at each render).
  ChatTemplate& set_time(const std::tm& now) {
    now_ = now;
    return *this;
  }

  /// From a GGUF file's tokenizer.chat_template; without one, from general.architecture (gemma3 only:
  /// its GGUF conversions may lack the template). Throws naming the file when neither is known.
  static ChatTemplate from_gguf(const io::GGUFFile& f) {
    const std::string bos = gguf_bos_text(f);
    if (const auto text = f.find<std::string>("tokenizer.chat_template")) {
      try {
        return from_string(*text, bos, gguf_token_text(f, "tokenizer.ggml.eos_token_id", ""));
      } catch (const FormatError& e) {
        fail<FormatError>("GGUF file '", f.name(), "': ", e.what());
      }
    }
    const auto arch = f.get_or<std::string>("general.architecture", "");
    if (arch == "gemma3") return builtin("gemma3", bos);
    fail<FormatError>("kiln::ChatTemplate: GGUF file '", f.name(),
                      "' has no tokenizer.chat_template and its "
                      "architecture '",
                      arch,
                      "' has no known default; choose a family explicitly with "
                      "ChatTemplate::builtin(\"chatml\") (kiln-chat: --chat-template chatml)");
  }

#ifdef KILN_CHAT_HAS_JSON
  /// From a Hugging Face checkpoint folder: chat_template.jinja if present, else tokenizer_config.json's
  /// "chat_template" (a string, or a list of {name, template} whose "default" is taken); without either,
  /// config.json's model_type gemma3 / gemma3_text gives gemma3. bos_token from tokenizer_config.json.
  static ChatTemplate from_hf_dir(const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    std::string bos = "<bos>", eos;
    std::optional<std::string> text;
    const fs::path cfg = dir / "tokenizer_config.json";
    if (fs::exists(cfg)) {
      const auto j = io::detail::parse_json(read_file(cfg), "tokenizer_config.json", cfg.string());
      for (auto [key, out] : {std::pair{"bos_token", &bos}, std::pair{"eos_token", &eos}})
        if (const auto b = j.find(key); b != j.end()) {
          if (b->is_string()) *out = b->get<std::string>();
          else if (b->is_object() && b->contains("content") && (*b)["content"].is_string()) *out = (*b)["content"];
        }
      if (const auto c = j.find("chat_template"); c != j.end()) {
        if (c->is_string()) {
          text = c->get<std::string>();
        } else if (c->is_array()) {
          for (const auto& e : *c)
            if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
                e["template"].is_string())
              text = e["template"].get<std::string>();
          if (!text) fail<FormatError>("'", cfg.string(), "': chat_template is a list without a \"default\" entry");
        }
      }
    }
    if (const fs::path jt = dir / "chat_template.jinja"; fs::exists(jt)) text = read_file(jt);
    if (text) {
      try {
        return from_string(*text, bos, eos);
      } catch (const FormatError& e) {
        fail<FormatError>("'", dir.string(), "': ", e.what());
      }
    }
    if (const fs::path cj = dir / "config.json"; fs::exists(cj)) {
      const auto j = io::detail::parse_json(read_file(cj), "config.json", cj.string());
      const std::string mt = j.value("model_type", "");
      if (mt == "gemma3" || mt == "gemma3_text") return builtin("gemma3", bos);
    }
    fail<FormatError>("kiln::ChatTemplate: '", dir.string(),
                      "' has no chat template (chat_template.jinja or "
                      "tokenizer_config.json's chat_template); choose a family explicitly with "
                      "ChatTemplate::builtin(\"chatml\")");
  }
#endif

  ChatFormat format() const { return format_; }
  /// "chatml", "smollm2", "qwen2.5", "qwen3", "gemma3", or "jinja" (the interpreter).
  const std::string& name() const { return name_; }
  /// The system turn used when the conversation has no system message (empty optional: none).
  const std::optional<std::string>& default_system() const { return default_system_; }
  /// Whether the rendered text starts with the BOS token's text (gemma3; a Jinja template that prints
  /// bos_token): never add another one.
  bool writes_bos() const {
    return format_ == ChatFormat::gemma3 || (source_ && detail::chat::contains(*source_, "bos_token"));
  }
  /// The Jinja source (empty for a builtin family).
  std::string_view source() const { return source_ ? std::string_view(*source_) : std::string_view(); }

  /// The texts that end an assistant turn (the reply stops at them).
  std::vector<std::string> stop_texts() const {
    if (format_ == ChatFormat::gemma3) return {"<end_of_turn>"};
    if (format_ == ChatFormat::jinja) {
      std::vector<std::string> s;
      // Harmony (gpt-oss) closes every message with <|end|>, the analysis before the final answer too; its
      // reply ends at <|return|> or <|call|> (llama.cpp drops <|end|> from the end-of-generation tokens when
      // the vocabulary has both).
      const bool harmony =
          detail::chat::contains(*source_, "<|return|>") && detail::chat::contains(*source_, "<|call|>");
      for (auto m : detail::chat::kStopMarkers)
        if (detail::chat::contains(*source_, m) && !(harmony && m == "<|end|>")) s.emplace_back(m);
      if (!eos_.empty() && std::find(s.begin(), s.end(), eos_) == s.end()) s.push_back(eos_);
      return s;
    }
    return {"<|im_end|>"};
  }

  /// Token ids that end a reply: stop_texts() found in the vocabulary (tok.find(text) >= 0), then the
  /// tokenizer's EOS. Tok: kiln::Tokenizer or anything with find(string_view) and eos().
  template <class Tok>
  std::vector<int32_t> stop_tokens(const Tok& tok) const {
    std::vector<int32_t> ids;
    for (const auto& s : stop_texts())
      if (const int32_t id = tok.find(s); id >= 0) ids.push_back(id);
    if (const int32_t e = tok.eos(); e >= 0 && std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    return ids;
  }

  /// The prompt text for a conversation, byte for byte what HF's apply_chat_template(messages,
  /// tokenize=False, add_generation_prompt=..., enable_thinking=...) gives with this family's template.
  /// Throws kiln::Error for an empty conversation, a role other than system/user/assistant/tool, or
  /// (gemma3) roles that do not alternate user/assistant.
  std::string render(std::span<const ChatMessage> messages, ChatRenderOptions o = {}) const {
    return render_impl(messages, o.add_generation_prompt, o.enable_thinking, nullptr);
  }
  /// render(), with the byte ranges that came from message contents marked (for Tokenizer::encode_chat:
  /// message contents are text, never control tokens).
  ChatPrompt render_marked(std::span<const ChatMessage> messages, ChatRenderOptions o = {}) const {
    ChatPrompt p;
    p.text = render_impl(messages, o.add_generation_prompt, o.enable_thinking, &p.content);
    return p;
  }
  /// Messages with more than role and content (OpenAI's tool_calls, tool_call_id, name,
  /// reasoning_content, content lists, ...) as a jinja::Value list of dicts, marked like render_marked (the
  /// strings content, reasoning_content and thinking: message text).
  /// Jinja templates see them as they are; the hand-written families take role and a string content and
  /// throw kiln::Error for anything they cannot show.
  ChatPrompt render_marked(const jinja::Value& messages, ChatRenderOptions o = {}) const {
    if (!messages.is_list()) fail("kiln::ChatTemplate::render: messages must be a list of dicts");
    if (format_ != ChatFormat::jinja) {
      std::vector<ChatMessage> plain;
      for (std::size_t i = 0; i < messages.l->size(); ++i) {
        const jinja::Value& m = (*messages.l)[i];
        const jinja::Value* role = m.is_dict() ? m.find("role") : nullptr;
        const jinja::Value* content = m.is_dict() ? m.find("content") : nullptr;
        if (!role || !role->is_string() || !content || !content->is_string())
          fail("kiln::ChatTemplate::render (", name_, "): message ", i, " needs a string role and a string content");
        for (const auto& [k, v] : *m.d)
          if (k != "role" && k != "content" && !v.is_none())
            fail("kiln::ChatTemplate::render (", name_, "): message ", i, " has '", k,
                 "', which the hand-written template cannot show (load the template with from_jinja)");
        plain.push_back({role->s, content->s});
      }
      return render_marked(plain, o);
    }
    jinja::List msgs;
    for (const auto& m : *messages.l) {  // a copy whose texts (content, reasoning) are marked
      if (!m.is_dict()) fail("kiln::ChatTemplate::render: messages must be a list of dicts");
      jinja::Value c(jinja::Dict(*m.d));
      for (const char* key : {"content", "reasoning_content", "thinking"})
        if (const jinja::Value* x = c.find(key); x && x->is_string()) {
          jinja::Value marked = *x;
          marked.mark_content();
          c.set(key, std::move(marked));
        }
      msgs.push_back(std::move(c));
    }
    ChatPrompt p;
    p.text = render_context(jinja::Value(std::move(msgs)), o.add_generation_prompt, o.enable_thinking, &p.content);
    return p;
  }
  std::string render(std::initializer_list<ChatMessage> messages, ChatRenderOptions o = {}) const {
    return render(std::span<const ChatMessage>(messages.begin(), messages.size()), o);
  }

 private:
  using Msgs = std::span<const ChatMessage>;
  using Spans = std::vector<std::pair<std::size_t, std::size_t>>;  // content byte ranges, or null: not marked

  std::string render_impl(Msgs messages, bool agp, bool thinking, Spans* sp) const {
    if (messages.empty()) fail("kiln::ChatTemplate::render: no messages");
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const auto& r = messages[i].role;
      if (r != "system" && r != "user" && r != "assistant" && r != "tool")
        fail("kiln::ChatTemplate::render: message ", i, " has role '", r,
             "'; supported roles: system, user, assistant, tool");
    }
    switch (format_) {
      case ChatFormat::chatml:
        return render_chatml(messages, agp, sp);
      case ChatFormat::qwen2_5:
        return render_qwen25(messages, agp, sp);
      case ChatFormat::qwen3:
        return render_qwen3(messages, agp, thinking, sp);
      case ChatFormat::gemma3:
        return render_gemma3(messages, agp, sp);
      case ChatFormat::jinja:
        return render_jinja(messages, agp, thinking, sp);
    }
    fail("kiln::ChatTemplate::render: no template (default-constructed ChatTemplate)");
  }

  // Appends text that came from a message, marking its range.
  static void put(std::string& o, std::string_view content, Spans* sp) {
    if (sp && !content.empty()) sp->emplace_back(o.size(), o.size() + content.size());
    o.append(content);
  }
  static void turn(std::string& o, std::string_view role, std::string_view content, Spans* sp) {
    o.append("<|im_start|>").append(role).append("\n");
    put(o, content, sp);
    o.append("<|im_end|>\n");
  }
  // Qwen's tool messages: consecutive ones share one user turn.
  static void tool_turn(std::string& o, Msgs m, std::size_t i, Spans* sp) {
    if (i == 0 || m[i - 1].role != "tool") o += "<|im_start|>user";
    o.append("\n<tool_response>\n");
    put(o, m[i].content, sp);
    o.append("\n</tool_response>");
    if (i + 1 == m.size() || m[i + 1].role != "tool") o += "<|im_end|>\n";
  }

  std::string render_chatml(Msgs m, bool agp, Spans* sp) const {
    std::string o;
    for (std::size_t i = 0; i < m.size(); ++i) {
      if (i == 0 && m[0].role != "system" && default_system_) turn(o, "system", *default_system_, nullptr);
      turn(o, m[i].role, m[i].content, sp);
    }
    if (agp) o += "<|im_start|>assistant\n";
    return o;
  }

  std::string render_qwen25(Msgs m, bool agp, Spans* sp) const {
    std::string o;
    if (m[0].role == "system") turn(o, "system", m[0].content, sp);
    else turn(o, "system", *default_system_, nullptr);
    for (std::size_t i = 0; i < m.size(); ++i) {
      const auto& r = m[i].role;
      if (r == "user" || (r == "system" && i != 0) || r == "assistant") turn(o, r, m[i].content, sp);
      else if (r == "tool") tool_turn(o, m, i, sp);
    }
    if (agp) o += "<|im_start|>assistant\n";
    return o;
  }

  static std::string render_qwen3(Msgs m, bool agp, bool thinking, Spans* sp) {
    using namespace detail::chat;
    std::string o;
    if (m[0].role == "system") turn(o, "system", m[0].content, sp);
    std::size_t last_query = m.size() - 1;  // the last user message that is not a wrapped tool response
    for (std::size_t i = m.size(); i-- > 0;) {
      const std::string_view c = m[i].content;
      if (m[i].role == "user" && !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
        last_query = i;
        break;
      }
    }
    for (std::size_t i = 0; i < m.size(); ++i) {
      const auto& r = m[i].role;
      if (r == "user" || (r == "system" && i != 0)) {
        turn(o, r, m[i].content, sp);
      } else if (r == "assistant") {
        std::string_view content = m[i].content, reasoning;
        if (const auto close = content.find("</think>"); close != std::string_view::npos) {
          const std::string_view full = content;
          content = lstrip_nl(full.substr(full.rfind("</think>") + 8));  // split('</think>')[-1]
          std::string_view before = rstrip_nl(full.substr(0, close));    // split('</think>')[0]
          if (const auto open = before.rfind("<think>"); open != std::string_view::npos)
            before = before.substr(open + 7);
          reasoning = lstrip_nl(before);
        }
        o += "<|im_start|>assistant\n";
        if (i > last_query && (i + 1 == m.size() || !reasoning.empty())) {
          o.append("<think>\n");
          put(o, strip_nl(reasoning), sp);
          o.append("\n</think>\n\n");
          put(o, lstrip_nl(content), sp);
        } else {
          put(o, content, sp);
        }
        o += "<|im_end|>\n";
      } else if (r == "tool") {
        tool_turn(o, m, i, sp);
      }
    }
    if (agp) {
      o += "<|im_start|>assistant\n";
      if (!thinking) o += "<think>\n\n</think>\n\n";
    }
    return o;
  }

  std::string render_gemma3(Msgs m, bool agp, Spans* sp) const {
    std::string o = bos_;
    std::string_view system;
    if (m[0].role == "system") {
      system = m[0].content;
      m = m.subspan(1);
    }
    for (std::size_t i = 0; i < m.size(); ++i) {
      if ((m[i].role == "user") != (i % 2 == 0))
        fail(
            "kiln::ChatTemplate::render (gemma3): Conversation roles must alternate "
            "user/assistant/user/assistant/... (after an optional first system message); message ",
            i, " is '", m[i].role, "'");
      o.append("<start_of_turn>").append(m[i].role == "assistant" ? "model" : m[i].role).append("\n");
      if (i == 0 && system.data()) {  // the system message: a prefix of the first user turn
        put(o, system, sp);
        o += "\n\n";
      }
      put(o, detail::chat::py_strip(m[i].content), sp);
      o.append("<end_of_turn>\n");
    }
    if (agp) o += "<start_of_turn>model\n";
    return o;
  }

  // HF's apply_chat_template variables. Message contents are marked where the interpreter can trace
  // them to the output (jinja::Template::render's content spans: strings copied, concatenated, sliced or
  // stripped keep their origin; replace(), format() and the like do not), so a message that spells a
  // control token stays text in those places.
  std::string render_jinja(Msgs m, bool agp, bool thinking, Spans* sp) const {
    jinja::List msgs;
    for (const auto& x : m) {
      jinja::Value content(x.content);
      content.mark_content();
      msgs.emplace_back(jinja::Dict{{"role", jinja::Value(x.role)}, {"content", std::move(content)}});
    }
    return render_context(jinja::Value(std::move(msgs)), agp, thinking, sp);
  }
  std::string render_context(jinja::Value msgs, bool agp, bool thinking, Spans* sp) const {
    jinja::Dict ctx{{"messages", std::move(msgs)},     {"bos_token", jinja::Value(bos_)},
                    {"eos_token", jinja::Value(eos_)}, {"add_generation_prompt", jinja::Value(agp)},
                    {"tools", jinja::Value::none()},   {"documents", jinja::Value::none()}};
    if (!thinking) ctx.emplace_back("enable_thinking", jinja::Value(false));
    for (const auto& kv : vars_) {  // (not a structured binding: clang 14 cannot capture one in a lambda)
      const auto& k = kv.first;
      auto it = std::find_if(ctx.begin(), ctx.end(), [&](const auto& e) { return e.first == k; });
      if (it != ctx.end()) it->second = kv.second;
      else ctx.emplace_back(k, kv.second);
    }
    try {
      return jinja_->render(jinja::Value(std::move(ctx)), now_ ? &*now_ : nullptr, sp);
    } catch (const FormatError& e) {
      fail<FormatError>("kiln::ChatTemplate::render: ", e.what());
    }
  }

  // The canonical ChatML template, with or without a default system turn (exact text up to tag
  // whitespace); the default prompt must be a plain single-quoted literal.
  static std::optional<ChatTemplate> match_chatml(std::string_view n) {  // n: a normalized template
    using namespace detail::chat;
    if (n == normalize(std::string("{% for message in messages %}").append(kChatMLLoop))) return builtin("chatml");
    // The canonical text with a placeholder inside the prompt's literal, normalized, then split there.
    const std::string canon =
        normalize(std::string(kChatMLDefaultHead).append("\x01").append(kChatMLDefaultTail).append(kChatMLLoop));
    const std::size_t at = canon.find('\x01');
    const std::string_view head = std::string_view(canon).substr(0, at), tail = std::string_view(canon).substr(at + 1);
    if (n.size() < head.size() + tail.size() || !n.starts_with(head) || !n.ends_with(tail)) return std::nullopt;
    const auto prompt = unescape_literal(std::string_view(n).substr(head.size(), n.size() - head.size() - tail.size()));
    if (!prompt) return std::nullopt;
    ChatTemplate t = builtin("chatml");
    if (*prompt == kSmolLM2System) t.name_ = "smollm2";
    t.default_system_ = *prompt;
    return t;
  }

  static std::string gguf_bos_text(const io::GGUFFile& f) {
    return gguf_token_text(f, "tokenizer.ggml.bos_token_id", "<bos>");
  }
  static std::string gguf_token_text(const io::GGUFFile& f, const char* key, const char* fallback) {
    const auto id = f.find<int64_t>(key);
    const auto tokens = f.find("tokenizer.ggml.tokens");
    if (!id || !tokens || tokens->type() != io::GGUFValueType::ARRAY || *id < 0 || uint64_t(*id) >= tokens->size())
      return fallback;
    return tokens->at(uint64_t(*id)).as<std::string>();
  }

  static std::string read_file(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("kiln::ChatTemplate: cannot read '", p.string(), "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  ChatFormat format_ = ChatFormat::chatml;
  std::string name_ = "chatml";
  std::optional<std::string> default_system_;
  std::string bos_, eos_;
  std::shared_ptr<const std::string> source_;               // Jinja templates: the text
  std::shared_ptr<const jinja::Template> jinja_;            // ... parsed once (render() is const and shareable)
  std::vector<std::pair<std::string, jinja::Value>> vars_;  // set_variable()
  std::optional<std::tm> now_;                              // set_time()
  struct Origin {
    std::string text, bos, eos;
  };
  std::shared_ptr<const Origin> origin_;  // a recognised family: the Jinja text it came from (interpreted())
};

}  // namespace kiln
