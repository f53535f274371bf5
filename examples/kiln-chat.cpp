// kiln-chat: interactive chat with an instruct model. User lines come from stdin, replies stream to
// stdout, timings go to stderr after each reply.
//
//   kiln-chat                                   # ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf
//   kiln-chat -m model.gguf -sys "You are terse." --temp 0.7
//   kiln-chat -m stories260K.gguf --chat-template chatml --temp 0 < script.txt
//
// Each turn renders the whole conversation with the model's chat template (text/chat.hpp) and feeds only
// the text past what the session already holds: the KV cache is reused across turns. When the new
// rendering does not begin with that text (Qwen3 drops earlier thinking blocks, Gemma trims replies, a
// reply's bytes were not valid UTF-8), and after /reset, the rendering is encoded whole and the session
// keeps the longest common prefix of its tokens (Session::reuse_prefix: a new conversation does not run
// the system prompt again). The prompt is encoded with add_special = false and control tokens recognised
// in the template's markup only (ChatTemplate::render_marked + Tokenizer::encode_chat): the template
// writes any BOS itself, and a line that spells "<|im_start|>" is text, not a forged turn
// (--parse-special-in-messages: the old encoding, control tokens anywhere). Commands: /reset (new
// conversation, same system prompt), /quit (or end of input).
//
// Reasoning models (a template with <think> tags or gpt-oss's harmony channels: kiln/text/reasoning.hpp): the
// reply's reasoning is shown dim on a terminal (else between "[thinking]" and "[/thinking]" lines) or hidden
// (--reasoning hide), and the conversation keeps the answer alone, as the templates show earlier turns;
// --reasoning raw prints and keeps the reply as generated.
//
// On a terminal (stdin and stdout both one) lines are read with line_editor.hpp (editing, history), and
// Ctrl-C stops a running reply between two tokens: the reply so far stays in the conversation, as the user
// saw it (the KV cache holds it already; /reset drops it), and the prompt returns. Ctrl-C at the prompt
// drops the line; at an empty prompt right after another Ctrl-C (one that stopped a reply included), or
// Ctrl-D, it exits (status 0). Otherwise (input from a pipe or file) lines are read as they come, without
// escape codes, and SIGINT ends the process as by default.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cli_common.hpp"
#include "kiln/kiln.hpp"
#include "kiln/text/reasoning.hpp"
#include "line_editor.hpp"

namespace {

void usage(const char* argv0) {
  std::printf(
      "usage: %s [-m MODEL] [options]   (then type messages; /reset, /quit)\n"
      "  -m, --model PATH          GGUF model (default: ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
      "  -sys, --system-prompt T   system prompt (default: the template's own, if it has one)\n"
      "      --chat-template T     chatml, smollm2, qwen2.5, qwen3, gemma3, or the path of a Jinja chat\n"
      "                            template file (default: the model file's template)\n"
      "      --no-think            qwen3: an empty thinking block in each generation prompt (enable_thinking=false)\n"
      "      --reasoning MODE      a reply's reasoning (<think> blocks, gpt-oss's analysis channel) when the\n"
      "                            template has a reasoning syntax: show (default: dim on a terminal, else\n"
      "                            between '[thinking]' and '[/thinking]' lines), hide, or raw (the reply's text\n"
      "                            as generated); the conversation keeps only the answers\n"
      "      --parse-special-in-messages  control token texts typed in a message become control tokens (the\n"
      "                            old behaviour; default: message text is always text)\n"
      "      --verbose-prompt      print each turn's whole rendered prompt on stderr, between the lines\n"
      "                            '[kiln-chat: prompt]' and '[kiln-chat: end of prompt]'\n"
      "  -n, --n-predict N         most tokens per reply, in [-1, 2^31-1] (default 512; -1 = until the\n"
      "                            context is full)\n"
      "  -t, --threads N           threads, in [0, 1024] (default 1; 0 = all cores)\n"
      "  -c, --ctx-size N          context size, in [0, 2^30] (default 0: min(4096, the model's); fails\n"
      "                            when its KV cache needs more than the available memory)\n",
      argv0);
  std::fputs(kiln_cli::kSamplingHelp, stdout);
}

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - t).count();
}

struct ContextFull {
  std::size_t need, free;
};
struct PromptInterrupted {};  // Ctrl-C while the prompt ran: the session is back where the turn began

enum class ReasoningShow { show, hide, raw };

/// One conversation on one session: what the session holds (its tokens, plus a sampled stop token not
/// yet run) corresponds to the text `held_`.
class Chat {
 public:
  Chat(kiln::Session& s, kiln::ChatTemplate tmpl, const kiln::GenerateOptions& gen, bool enable_thinking,
       bool special_in_messages, bool verbose_prompt, ReasoningShow reasoning)
      : s_(s),
        tok_(s.model().tokenizer()),
        tmpl_(std::move(tmpl)),
        gen_(gen),
        thinking_(enable_thinking),
        special_in_messages_(special_in_messages),
        verbose_prompt_(verbose_prompt),
        sampler_(s.model().hparams().vocab, gen.sampling),
        stop_ids_(tmpl_.stop_tokens(tok_)),
        show_(reasoning),
        format_(kiln::reasoning_format_of(tmpl_)) {
    if (format_)  // the markers stay in the reply text where the vocabulary has them as control tokens
      for (auto m : kiln::reasoning_markers(*format_))
        if (const int32_t id = tok_.find(m); id >= 0) marker_ids_.push_back(id);
    if (show_ == ReasoningShow::raw && format_ && format_->syntax == kiln::ReasoningSyntax::think_tags)
      marker_ids_.clear();  // (raw: as before; harmony's markers kept, its raw text is unreadable without them)
  }

  /// The template's reasoning syntax, if it has one.
  const std::optional<kiln::ReasoningFormat>& reasoning_format() const { return format_; }

  /// A new conversation: the next reply re-encodes its whole rendering, and the session keeps what of it
  /// it already holds (the system prompt, the template's opening).
  void reset() {
    held_.clear();
    pending_ = -1;
  }

  /// Runs the conversation's new text through the model and streams the assistant's reply to out; returns
  /// the reply as the conversation keeps it (with a reasoning syntax, not raw: the answer alone, which is
  /// what the templates show of earlier turns). Throws ContextFull (changing nothing) when the new text does not fit. kiln_cli::interrupt_flag()
  /// (Ctrl-C) stops the prompt (throwing PromptInterrupted) or the reply (returning the text so far).
  std::string reply(const std::vector<kiln::ChatMessage>& conv, std::FILE* out) {
    const auto t0 = clock_type::now();
    interrupted_ = false;
    kiln_cli::interrupt_flag() = 0;  // a Ctrl-C after the last reply ended was meant for that one
    const kiln::ChatPrompt rendered =
        tmpl_.render_marked(conv, {.add_generation_prompt = true, .enable_thinking = thinking_});
    const std::string& prompt = rendered.text;
    if (verbose_prompt_) std::fprintf(stderr, "[kiln-chat: prompt]\n%s\n[kiln-chat: end of prompt]\n", prompt.c_str());
    std::vector<int32_t> feed;
    std::size_t kept = s_.n_past();  // the session's tokens this turn builds on
    const bool incremental = !held_.empty() && prompt.starts_with(held_);
    if (incremental) {
      if (pending_ >= 0) feed.push_back(pending_);
      const auto ids = encode(rendered, held_.size());
      feed.insert(feed.end(), ids.begin(), ids.end());
    } else {  // a new conversation, or one whose text changed: its whole rendering, past what the session holds
      feed = encode(rendered, 0);
      kept = s_.common_prefix(feed);
      feed.erase(feed.begin(), feed.begin() + std::ptrdiff_t(kept));
    }
    if (feed.size() > s_.ctx() - kept) throw ContextFull{feed.size(), s_.ctx() - kept};
    if (!incremental) {
      if (!held_.empty())
        std::fprintf(stderr,
                     "[kiln-chat: the conversation's text changed before the end of what the cache holds; "
                     "re-reading it from token %zu]\n",
                     kept);
      s_.rewind(kept);
    }
    const auto t_eval = clock_type::now();
    // In batches, with a progress line on stderr when the prompt takes more than a second.
    kiln_cli::PromptProgress progress;
    progress.start();
    std::span<const float> logits;
    if (feed.empty()) logits = s_.eval(feed);  // throws "no tokens", as one eval of it did
    for (std::size_t i = 0; i < feed.size(); i += s_.batch()) {
      if (kiln_cli::interrupt_flag()) {
        // Back to where the turn began; the next turn re-encodes its whole rendering (held_ cleared) and
        // takes what the session holds from the cache.
        kiln_cli::interrupt_flag() = 0;
        progress.finish();
        s_.rewind(kept);
        held_.clear();
        pending_ = -1;
        throw PromptInterrupted{};
      }
      const std::size_t m = std::min(s_.batch(), feed.size() - i);
      logits = s_.eval(std::span<const int32_t>(feed).subspan(i, m));
      progress.update(i + m, feed.size());
    }
    progress.finish();
    const double prompt_ms = ms_since(t_eval);
    held_ = prompt;
    pending_ = -1;

    kiln::text::Utf8Stream utf8(1024);
    kiln::StopMatcher stops(tmpl_.stop_texts());  // stop texts spelled out by ordinary tokens
    std::string text;
    std::optional<kiln::ReasoningParser> parser;
    if (format_ && show_ != ReasoningShow::raw)
      parser.emplace(*format_, kiln::ReasoningOptions{.in_reasoning = kiln::prompt_opens_reasoning(*format_, prompt)});
    const bool tty = isatty(fileno(out));
    bool in_reasoning = false;
    std::vector<kiln::ReasoningEvent> events;
    auto write = [&](std::string_view o) { std::fwrite(o.data(), 1, o.size(), out); };
    auto show = [&](bool end) {  // the parser's events: reasoning set apart (or hidden), content, calls
      for (const auto& e : events) {
        const bool r = e.kind == kiln::ReasoningEvent::Kind::reasoning;
        if (r && show_ == ReasoningShow::hide) continue;
        if (r != in_reasoning) {
          write(r ? (tty ? "\x1b[2m" : "[thinking]\n") : (tty ? "\x1b[0m\n\n" : "\n[/thinking]\n"));
          in_reasoning = r;
        }
        if (e.kind == kiln::ReasoningEvent::Kind::call) {
          std::fprintf(stderr, "[kiln-chat: the model calls %s(%s); kiln-chat runs no tools]\n", e.name.c_str(),
                       e.text.c_str());
          continue;
        }
        write(e.text);
        if (!r) text += e.text;
      }
      events.clear();
      if (end && in_reasoning) write(tty ? "\x1b[0m" : "\n[/thinking]");
    };
    auto emit = [&](std::string_view piece) {
      const std::string_view o = stops.push(piece);
      if (parser) {
        parser->push(o, events);
        show(false);
      } else {
        text += o;
        write(o);
      }
      std::fflush(out);
    };
    const auto t_gen = clock_type::now();
    std::size_t n = 0;
    bool full = false;
    std::string stop = "length (-n)";
    for (; n < std::size_t(std::max(0, gen_.max_tokens)); ++n) {
      if (kiln_cli::interrupt_flag()) {  // every sampled token has run: the session holds the reply so far
        kiln_cli::interrupt_flag() = 0;
        interrupted_ = true;
        stop = "interrupted (Ctrl-C)";
        break;
      }
      const int32_t next = sampler_.sample(logits, s_.tokens());
      if (is_stop(next)) {
        pending_ = next;
        held_ += tok_.token_bytes(next, {.render_special = true});
        stop = std::string(tok_.token_bytes(next, {.render_special = true}));
        break;
      }
      const bool marker = std::find(marker_ids_.begin(), marker_ids_.end(), next) != marker_ids_.end();
      const std::string_view bytes = tok_.token_bytes(next, {.render_special = marker});
      held_ += bytes;
      emit(utf8.push(bytes));
      if (stops.stopped()) {
        pending_ = next;
        stop = "stop text";
        ++n;
        break;
      }
      if (s_.n_past() >= s_.ctx()) {
        pending_ = next;
        full = true;
        stop = "context full";
        ++n;
        break;
      }
      logits = s_.eval(next);
    }
    if (!stops.stopped()) {
      emit(utf8.flush());
      const std::string_view rest = stops.flush();
      if (parser) {
        parser->push(rest, events);
      } else {
        text += rest;
        write(rest);
      }
    }
    if (parser) {
      parser->finish(events);
      show(true);
    }
    std::fputc('\n', out);
    std::fflush(out);
    const double gen_ms = ms_since(t_gen);
    std::fprintf(stderr,
                 "[kiln-chat: prompt %zu tokens in %.1f ms (%.1f tok/s; %zu earlier ones from the cache); "
                 "reply %zu tokens in %.1f ms (%.1f tok/s), stop: %s; total %.1f ms; context %zu/%zu]\n",
                 feed.size(), prompt_ms, prompt_ms > 0 ? 1000.0 * double(feed.size()) / prompt_ms : 0.0, kept, n,
                 gen_ms, gen_ms > 0 ? 1000.0 * double(n) / gen_ms : 0.0, stop.c_str(), ms_since(t0), s_.n_past(),
                 s_.ctx());
    if (full)
      std::fprintf(stderr,
                   "[kiln-chat: context full (%zu positions): the reply was cut; /reset starts a new "
                   "conversation, -c sets a larger context]\n",
                   s_.ctx());
    return text;
  }
  /// Whether Ctrl-C stopped the last reply.
  bool interrupted() const { return interrupted_; }

 private:
  bool is_stop(int32_t id) const {
    return tok_.is_eog(id) || std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end();
  }

  kiln::Session& s_;
  const kiln::Tokenizer& tok_;
  kiln::ChatTemplate tmpl_;
  kiln::GenerateOptions gen_;
  bool thinking_, special_in_messages_, verbose_prompt_;
  bool interrupted_ = false;

  // The rendering's tokens from byte `from` on: control tokens in the template's markup only (or anywhere,
  // --parse-special-in-messages).
  std::vector<int32_t> encode(const kiln::ChatPrompt& p, std::size_t from) const {
    if (special_in_messages_)
      return tok_.encode(std::string_view(p.text).substr(from), {.add_special = false, .parse_special = true});
    kiln::ChatPrompt tail{p.text.substr(from), {}};
    for (const auto& [a, b] : p.content)
      if (b > from) tail.content.emplace_back(std::max(a, from) - from, b - from);
    return tok_.encode_chat(tail);
  }
  kiln::Sampler sampler_;  // one for the whole chat: a fixed seed gives a reproducible conversation
  std::vector<int32_t> stop_ids_;
  ReasoningShow show_;
  std::optional<kiln::ReasoningFormat> format_;
  std::vector<int32_t> marker_ids_;  // reasoning markers that are control tokens: kept as text
  std::string held_;
  int32_t pending_ = -1;
};

std::string default_model() {
  const char* home = std::getenv("HOME");
  if (!home) return {};
  const std::string p = std::string(home) + "/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(p) ? p : std::string();
}

}  // namespace

int main(int argc, char** argv) {
  std::string template_name;
  std::optional<std::string> system_prompt;
  kiln_cli::Common common;
  std::string& model_path = common.model_path;
  kiln::GenerateOptions& gen = common.gen;
  gen.max_tokens = 512;
  kiln::SessionOptions& sess = common.sess;
  bool thinking = true, special_in_messages = false, verbose_prompt = false;
  ReasoningShow reasoning = ReasoningShow::show;
  kiln::io::install_map_fault_handler();  // a mapped model file truncated under us: a message, not "Bus error"
  try {
    kiln_cli::Args args(argc, argv);
    while (args.more()) {
      const std::string_view f = args.flag();
      if (common.parse(args)) continue;
      if (f == "-h" || f == "--help") {
        usage(argv[0]);
        return 0;
      } else if (f == "-sys" || f == "--system-prompt") system_prompt = args.next();
      else if (f == "--chat-template") template_name = args.next();
      else if (f == "--no-think") thinking = false;
      else if (f == "--reasoning") {
        const std::string_view v = args.next();
        if (v == "show") reasoning = ReasoningShow::show;
        else if (v == "hide") reasoning = ReasoningShow::hide;
        else if (v == "raw") reasoning = ReasoningShow::raw;
        else kiln::fail("--reasoning is show, hide or raw, not '", v, "'");
      } else if (f == "--parse-special-in-messages") special_in_messages = true;
      else if (f == "--verbose-prompt") verbose_prompt = true;
      else kiln::fail("unknown option '", f, "' (see --help)");
    }
    if (model_path.empty()) model_path = default_model();
    if (model_path.empty()) {
      usage(argv[0]);
      std::fprintf(stderr,
                   "kiln-chat: no -m given and ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf is "
                   "missing (scripts/fetch_models.sh fetches it)\n");
      return 1;
    }
    common.finish();

    const kiln::Model model = common.load_model();
    common.resolve_ctx(model);
    kiln::ChatTemplate tmpl = template_name.empty()
                                  ? kiln::ChatTemplate::from_gguf(kiln::io::GGUFFile(model_path))
                                  : kiln::ChatTemplate::from_name_or_file(template_name, model.tokenizer());
    kiln::Session session(model, sess);
    Chat chat(session, tmpl, gen, thinking, special_in_messages, verbose_prompt, reasoning);
    const auto& rf = chat.reasoning_format();
    std::fprintf(stderr,
                 "kiln-chat: %s, template %s%s, ctx %zu, %zu threads; /reset clears the conversation, /quit "
                 "exits\n",
                 model_path.c_str(), tmpl.name().c_str(),
                 !rf                                            ? ""
                 : rf->syntax == kiln::ReasoningSyntax::harmony ? ", reasoning: harmony"
                                                                : ", reasoning: think tags",
                 session.ctx(), session.threads());

    std::vector<kiln::ChatMessage> conv;
    auto start = [&] {
      conv.clear();
      if (system_prompt) conv.push_back({"system", *system_prompt});
      chat.reset();
    };
    start();
    const bool tty = isatty(STDIN_FILENO);
    const bool edit = tty && isatty(STDOUT_FILENO);
    std::optional<kiln_cli::LineEditor> editor;
    if (edit) {
      editor.emplace(STDIN_FILENO, STDOUT_FILENO);
      kiln_cli::install_terminal_signal_handlers();
    }
    bool armed = false;  // the last key was a Ctrl-C: another one at an empty prompt exits
    std::string line;
    for (;;) {
      if (editor) {
        std::fflush(stdout);
        kiln_cli::LineEditor::Result r = editor->read("> ");
        if (r.status == kiln_cli::LineEditor::Status::eof) break;
        if (r.status == kiln_cli::LineEditor::Status::interrupt) {
          if (r.text.empty() && armed) break;
          if (r.text.empty()) std::fputs("[kiln-chat: Ctrl-C again or Ctrl-D exits]\n", stderr);
          armed = r.text.empty();
          continue;
        }
        armed = false;
        line = std::move(r.text);
        editor->add_history(line);
      } else {
        if (tty) std::fputs("> ", stderr);
        if (!std::getline(std::cin, line)) break;
      }
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line == "/quit" || line == "/exit") break;
      if (line == "/reset") {
        start();
        std::fputs("[kiln-chat: new conversation]\n", stderr);
        continue;
      }
      if (line.empty()) continue;
      conv.push_back({"user", line});
      try {
        conv.push_back({"assistant", chat.reply(conv, stdout)});
        armed = chat.interrupted();
      } catch (const PromptInterrupted&) {
        conv.pop_back();
        armed = true;
        std::fputs("\n[kiln-chat: interrupted while reading the prompt; the message was dropped]\n", stderr);
      } catch (const ContextFull& f) {
        conv.pop_back();
        std::fprintf(stderr,
                     "[kiln-chat: context full: this turn needs %zu positions but %zu of %zu are free; "
                     "/reset starts a new conversation, -c sets a larger context]\n",
                     f.need, f.free, session.ctx());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-chat: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
