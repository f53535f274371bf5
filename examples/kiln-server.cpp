// kiln-server: an OpenAI-compatible HTTP server with continuous batching (kiln/serve/scheduler.hpp) on
// cpp-httplib. Flags follow llama-server's names.
//
//   kiln-server -m model.gguf [--host 127.0.0.1] [--port 8080] [-c 4096] [-np 4] [-t 2] [--api-key KEY]
//
// Endpoints: GET / (a chat page: kiln_server_page.hpp), POST /v1/chat/completions (tool calling:
// kiln/serve/tool_calls.hpp; reasoning in reasoning_content: kiln/text/reasoning.hpp), POST /v1/completions
// (JSON, or Server-Sent Events with "stream": true),
// GET /v1/models, GET /health, GET /metrics (Prometheus text), POST /tokenize, POST /detokenize,
// POST /apply-template (the prompt a chat request renders to). Errors are OpenAI's error JSON (kiln/serve/openai.hpp). -c is the context of all
// slots together (llama-server's meaning): each of the -np slots holds c / np positions. --port 0 picks a
// free port; the address is printed on stderr ("kiln-server: listening on http://HOST:PORT").
// SIGINT/SIGTERM: stop accepting, let running requests finish for up to 5 s, cancel the rest, exit 0.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/serve/openai.hpp"
#include "kiln/serve/scheduler.hpp"
#include "cli_common.hpp"
#include "kiln_server_page.hpp"

namespace {

using namespace kiln;
using namespace kiln::serve;

struct Args {
  std::string model, host = "127.0.0.1", api_key, alias, chat_template;
  int port = 8080;
  std::size_t ctx = 4096, slots = 4, threads = 2, batch = 256, max_queue = 64, http_threads = 0;
  std::size_t max_body = 1 << 20;
  int timeout = 600, n_predict = -1;
  Precision precision = Precision::fast;
  KVType kv = KVType::automatic;
  ReasoningMode reasoning = ReasoningMode::automatic;
};

const char* kUsage = R"(usage: kiln-server -m MODEL [options]

An OpenAI-compatible HTTP server (POST /v1/chat/completions with tool calling, /v1/completions, GET
/v1/models, /health, /metrics, POST /tokenize, /detokenize, /apply-template) with continuous batching over
-np slots.

  -m, --model PATH        GGUF model (or an HF safetensors directory)
      --host HOST         address to listen on (default 127.0.0.1; 0.0.0.0: every interface)
      --port N            port in [0, 65535] (default 8080; 0: a free one, printed on stderr)
  -c, --ctx-size N        context of all slots together, in [1, 1073741824]: each slot holds N / np
                          positions, at least 2 (default 4096)
  -np, --parallel N       slots: requests decoded together, in [1, 1024] (default 4)
  -t, --threads N         threads of the forward pass, in [1, 1024] (default 2)
  -b, --batch-size N      tokens per step: running streams' next tokens + prompt chunks, in [1, 65536]
                          (default 256)
  -n, --n-predict N       default max tokens of a request: -1 (until the slot's context ends; default) or
                          an integer in [1, 2147483647]
      --precision P       quantized weights: fast (int8 dot products, activations as two 8-bit parts;
                          default) or exact (f32 products with the dequantized weights, as HF)
      --kv T              slots' KV cache element type: auto (default: f32 with --precision exact, else
                          f16), f32, f16 or q8_0 (0.53x f16's memory; llama-server's -ctk/-ctv q8_0)
      --api-key KEY       require "Authorization: Bearer KEY" (every endpoint but /health)
      --timeout S         socket read/write timeout in seconds, in [1, 86400] (default 600)
      --max-queue N       requests waiting for a slot before 503, in [0, 4096] (default 64)
      --max-body N        largest request body in bytes, in [16, 1073741824] (default 1048576; larger: 413)
      --threads-http N    HTTP worker threads, in [1, 8192] (default np + max-queue + 4)
      --alias NAME        the model's name in responses and /v1/models (default: the file name)
      --chat-template T   chatml, smollm2, qwen2.5, qwen3, gemma3 or a Jinja template file's path,
                          instead of the model file's template
      --reasoning-format F
                          a chat reply's reasoning (<think> blocks, gpt-oss's analysis channel): auto
                          (default) or deepseek, in message.reasoning_content (streamed:
                          delta.reasoning_content) when the template has a reasoning syntax; none, the
                          raw reply in content; deepseek-legacy, in both (streamed: in content). A
                          request's "reasoning_format" field overrides it
  -h, --help              this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "kiln-server: %s\n(kiln-server --help lists the options)\n", msg.c_str());
  std::exit(2);
}

// The ranges of the numeric flags (also in kUsage). -np, --max-queue and --threads-http: a slot or a queued
// request holds an HTTP worker thread, and all of them start with the server. -t: kiln::ThreadPool's limit.
// -c: the KV cache (c positions) is allocated at start.
using kiln_cli::Range;
constexpr Range<int> kPort{.lo = 0, .hi = 65535};
constexpr Range<std::size_t> kCtx{.lo = 1, .hi = std::size_t(1) << 30};
constexpr Range<std::size_t> kSlots{.lo = 1, .hi = 1024};
constexpr Range<std::size_t> kThreads{.lo = 1, .hi = 1024};
constexpr Range<std::size_t> kBatch{.lo = 1, .hi = 65536};
constexpr Range<int> kNPredict{.lo = 1, .hi = std::numeric_limits<int>::max()};  // or -1
constexpr Range<int> kTimeout{.lo = 1, .hi = 86400};
constexpr Range<std::size_t> kMaxQueue{.lo = 0, .hi = 4096};
constexpr Range<std::size_t> kMaxBody{.lo = 16, .hi = std::size_t(1) << 30};
constexpr Range<std::size_t> kHttpThreads{.lo = 1, .hi = 8192};

// `v` as a number in `r`, or exit 2 naming the flag, the value and the range.
template <class T>
T num(const std::string& flag, const std::string& v, const Range<T>& r) {
  try {
    return kiln_cli::parse_num<T>(flag, v, r);
  } catch (const Error& e) {
    usage_error(e.what());
  }
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(detail::concat("unknown flag or missing value: '", f, "'"));
    const std::string v = argv[++i];
    if (f == "-m" || f == "--model") a.model = v;
    else if (f == "--host") a.host = v;
    else if (f == "--port") a.port = num(f, v, kPort);
    else if (f == "-c" || f == "--ctx-size") a.ctx = num(f, v, kCtx);
    else if (f == "-np" || f == "--parallel") a.slots = num(f, v, kSlots);
    else if (f == "-t" || f == "--threads") a.threads = num(f, v, kThreads);
    else if (f == "-b" || f == "--batch-size") a.batch = num(f, v, kBatch);
    else if (f == "-n" || f == "--n-predict") a.n_predict = v == "-1" ? -1 : num(f, v, kNPredict);
    else if (f == "--api-key") a.api_key = v;
    else if (f == "--timeout") a.timeout = num(f, v, kTimeout);
    else if (f == "--max-queue") a.max_queue = num(f, v, kMaxQueue);
    else if (f == "--max-body") a.max_body = num(f, v, kMaxBody);
    else if (f == "--threads-http") a.http_threads = num(f, v, kHttpThreads);
    else if (f == "--alias") a.alias = v;
    else if (f == "--chat-template") a.chat_template = v;
    else if (f == "--reasoning-format") {
      const auto m = reasoning_mode_of(v);
      if (!m) usage_error("--reasoning-format is none, deepseek, deepseek-legacy or auto, got '" + v + "'");
      a.reasoning = *m;
    } else if (f == "--precision") {
      if (v == "fast") a.precision = Precision::fast;
      else if (v == "exact") a.precision = Precision::exact;
      else usage_error("--precision is fast or exact, got '" + v + "'");
    } else if (f == "--kv") {
      const auto kv = kv_type_from_name(v);
      if (!kv) usage_error("--kv is auto, f32, f16 or q8_0, got '" + v + "'");
      a.kv = *kv;
    } else {
      usage_error(detail::concat("unknown flag '", f, "'"));
    }
  }
  if (a.model.empty()) usage_error("no model: -m PATH");
  if (a.ctx / a.slots < 2)
    usage_error(detail::concat("-c ", a.ctx, " over -np ", a.slots, " slots leaves fewer than 2 positions a slot"));
  if (a.port > 0 && a.host.empty()) usage_error("--host is empty");
  if (a.http_threads == 0) a.http_threads = a.slots + a.max_queue + 4;
  return a;
}

std::atomic<int> g_signal{0};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (!e.retry_after.empty()) res.set_header("Retry-After", e.retry_after);
  res.set_content(dump(e.to_json()), "application/json");
}

// The server: one model, one scheduler, the routes.
class Server {
 public:
  Server(const Args& a, Model model, std::optional<ChatTemplate> tmpl)
      : args_(a),
        model_(std::move(model)),
        tmpl_(std::move(tmpl)),
        rich_tmpl_(tmpl_ ? tmpl_->interpreted() : std::nullopt),
        sched_(model_, {.slots = a.slots,
                        .ctx = a.ctx / a.slots,
                        .threads = a.threads,
                        .batch = a.batch,
                        .max_queue = a.max_queue,
                        .precision = a.precision,
                        .kv_type = a.kv}) {
    cfg_.model_name = a.alias.empty() ? std::filesystem::path(a.model).filename().string() : a.alias;
    cfg_.default_max_tokens = a.n_predict;
    cfg_.reasoning = a.reasoning;
    created_ = int64_t(std::time(nullptr));
  }

  Scheduler& scheduler() { return sched_; }

  void routes(httplib::Server& svr) {
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      // The page (it asks for the key itself) and /health need none.
      if (args_.api_key.empty() || req.path == "/health" || req.path == "/")
        return httplib::Server::HandlerResponse::Unhandled;
      if (req.get_header_value("Authorization") == "Bearer " + args_.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      const bool given = req.has_header("Authorization");
      send_error(res, {.status = 401,
                       .message = given ? "invalid API key (Authorization: Bearer ...)"
                                        : "missing API key: send Authorization: Bearer KEY",
                       .type = "authentication_error",
                       .code = "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    });
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413)
        send_error(res, {.status = 413,
                         .message = detail::concat("the request body is larger than ", args_.max_body, " bytes"),
                         .code = "body_too_large"});
      else if (res.status == 404)
        send_error(
            res,
            {.status = 404, .message = detail::concat("no endpoint ", req.method, " ", req.path), .code = "not_found"});
      else if (res.status == 405)
        send_error(res, {.status = 405,
                         .message = detail::concat(req.method, " is not allowed on ", req.path),
                         .code = "method_not_allowed"});
      else
        send_error(res, {.status = res.status, .message = detail::concat("HTTP ", res.status), .type = "server_error"});
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, {.status = 500, .message = what, .type = "server_error"});
    });

    svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kiln_server::kChatPage, "text/html; charset=utf-8");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const bool up = !stopping_.load();
      res.status = up ? 200 : 503;
      res.set_content(up ? R"({"status":"ok"})" : R"({"status":"shutting down"})", "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(to_prometheus(sched_.metrics()), "text/plain; version=0.0.4");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const json m = {{"id", cfg_.model_name},
                      {"object", "model"},
                      {"created", created_},
                      {"owned_by", "kiln"},
                      {"meta",
                       {{"n_ctx_slot", sched_.ctx()},
                        {"n_slots", sched_.slots()},
                        {"n_vocab", model_.hparams().vocab},
                        {"chat_template", tmpl_ ? tmpl_->name() : ""}}}};
      res.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    svr.Post("/tokenize", api([this](const httplib::Request& req, httplib::Response& res) {
               const json j = parse_body(req.body);
               const json* c = fields::field(j, "content");
               if (!c || !c->is_string()) refuse("'content' must be a string", "content", "invalid_type");
               const bool add = fields::boolean(j, "add_special", false);
               const bool special = fields::boolean(j, "parse_special", false);
               res.set_content(
                   dump({{"tokens", model_.tokenizer().encode(c->get<std::string>(),
                                                              {.add_special = add, .parse_special = special})}}),
                   "application/json");
             }));
    svr.Post("/detokenize", api([this](const httplib::Request& req, httplib::Response& res) {
               const json j = parse_body(req.body);
               const json* t = fields::field(j, "tokens");
               if (!t || !t->is_array()) refuse("'tokens' must be a list of token ids", "tokens", "invalid_type");
               std::vector<int32_t> ids;
               const std::size_t vocab = model_.hparams().vocab;
               for (const auto& e : *t) {
                 if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= int64_t(vocab))
                   refuse(detail::concat("'tokens' entry ", dump(e), " is not a token id below ", vocab), "tokens",
                          "invalid_value");
                 ids.push_back(int32_t(e.get<int64_t>()));
               }
               res.set_content(dump({{"content", model_.tokenizer().decode(ids)}}), "application/json");
             }));
    svr.Post("/apply-template", api([this](const httplib::Request& req, httplib::Response& res) {
               // llama-server's endpoint: the prompt a chat request's messages (and tools) render to
               const RenderedChat c = render_chat(parse_body(req.body), templates(), model_.tokenizer());
               res.set_content(dump({{"prompt", c.prompt.text}}), "application/json");
             }));
    svr.Post("/v1/chat/completions",
             api([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); }));
    svr.Post("/v1/completions",
             api([this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); }));
  }

  // Refuses new requests (503), lets the running ones finish for up to 5 s (then cancels them), and waits
  // (bounded) until their responses are written: httplib's stop() would cut a stream short.
  void shutdown() {
    stopping_.store(true);
    sched_.stop(std::chrono::seconds(5));
    for (int i = 0; i < 100 && inflight_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

 private:
  template <class F>
  static httplib::Server::Handler api(F f) {
    return [f](const httplib::Request& req, httplib::Response& res) {
      try {
        f(req, res);
      } catch (const ApiError& e) {
        send_error(res, e);
      }
    };
  }

  // Counts a request from its submission until its response is handed to httplib (a stream: until its
  // provider is released).
  struct Inflight {
    std::atomic<int>& n;
    explicit Inflight(std::atomic<int>& c) : n(c) { ++n; }
    ~Inflight() { --n; }
  };

  // The choices' usage together: the prompt once (computed once), the generated tokens of all.
  static Usage total_usage(const std::vector<std::shared_ptr<Stream>>& ss) {
    Usage u = ss.front()->usage();
    for (std::size_t i = 1; i < ss.size(); ++i) u.completion += ss[i]->usage().completion;
    return u;
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    const json j = parse_body(req.body);
    const Tokenizer& tok = model_.tokenizer();
    ApiRequest r = chat ? parse_chat(j, templates(), tok, cfg_, sched_.ctx())
                        : parse_completion(j, tok, cfg_, sched_.ctx(), model_.hparams().vocab);
    std::vector<std::shared_ptr<Stream>> ss;
    try {
      ss = sched_.submit_choices(std::move(r.prompt), r.opt, r.n);
    } catch (const QueueFull& e) {
      throw ApiError{
          .status = 503, .message = e.what(), .type = "server_error", .code = "overloaded", .retry_after = "1"};
    } catch (const Error& e) {
      refuse(e.what());
    }
    const Inflight counted(inflight_);
    const ResponseHead head{.id = detail::concat(chat ? "chatcmpl-" : "cmpl-", ++next_id_),
                            .model = cfg_.model_name,
                            .created = int64_t(std::time(nullptr)),
                            .chat = chat};
    const bool logprobs = r.opt.logprobs;
    if (!r.stream) {
      // (A client that disconnects now is not seen until the reply is written: --timeout bounds the socket.)
      std::vector<ChoiceResult> choices;
      for (const auto& s : ss) {
        ChoiceResult c{.text = s->wait(), .finish = s->finish()};
        if (c.finish == Finish::cancelled) {
          for (const auto& o : ss) o->cancel();
          throw ApiError{
              .status = 503, .message = "the server is shutting down", .type = "server_error", .code = "shutting_down"};
        }
        if (c.finish == Finish::error) {
          for (const auto& o : ss) o->cancel();
          throw ApiError{.status = 500, .message = s->error(), .type = "server_error", .code = "internal_error"};
        }
        if (logprobs) c.logprobs = logprobs_json(chat, s->logprobs(), tok);
        if (r.reads_reply()) {  // reasoning and calls out of the text (the calls: their own ids)
          json lp = std::move(c.logprobs);
          c = read_reply(r, std::move(c.text), c.finish);
          c.logprobs = std::move(lp);
        }
        choices.push_back(std::move(c));
      }
      res.set_content(dump(response_json(head, choices, total_usage(ss))), "application/json");
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // nginx: pass events through as they come
    struct Choice {                             // a choice's progress through the stream
      bool first = true, done = false;
      std::size_t n_logprobs = 0, text_bytes = 0, n_calls = 0;
      std::optional<ReplyReader> reader;  // chat with reasoning or tools: the reply's parts
    };
    struct State {
      std::vector<Choice> choices;
      bool ended = false;
      int idle_ms = 0;
    };
    auto st = std::make_shared<State>();
    st->choices.resize(ss.size());
    if (r.reads_reply())
      for (auto& c : st->choices) c.reader.emplace(r.reply);
    auto stream_counted = std::make_shared<Inflight>(inflight_);
    const bool usage = r.include_usage;
    const Tokenizer* tk = &tok;
    res.set_chunked_content_provider(
        "text/event-stream",
        [ss, st, head, usage, logprobs, tk](std::size_t, httplib::DataSink& sink) {
          auto event = [&](const json& j) {
            const std::string e = "data: " + dump(j) + "\n\n";
            return sink.write(e.data(), e.size());
          };
          auto cancel_all = [&] {
            for (const auto& s : ss) s->cancel();
            return false;
          };
          // One choice: wait for it; several: take what each has, waiting briefly on the first unfinished
          // one when none had anything (a choice's text may then wait up to that long).
          const auto wait = std::chrono::milliseconds(ss.size() == 1 ? 100 : 20);
          bool any = false, all_done = true;
          for (std::size_t i = 0; i < ss.size(); ++i) {
            Choice& c = st->choices[i];
            if (c.done) continue;
            if (c.first && head.chat) {  // the role first, before any token (OpenAI's first chunk)
              c.first = false;
              if (!event(chunk_json(head, "", true, std::nullopt, nullptr, i))) return cancel_all();
            }
            std::string text;
            const bool done = ss[i]->next(text, ss.size() > 1 ? std::chrono::milliseconds(0) : wait);
            json lp = nullptr;
            if (logprobs) {
              const auto fresh = ss[i]->logprobs(c.n_logprobs);
              if (!fresh.empty()) {
                lp = logprobs_json(head.chat, fresh, *tk, c.text_bytes);
                c.n_logprobs += fresh.size();
                for (const auto& f : fresh) c.text_bytes += tk->token_bytes(f.token).size();
              }
            }
            if (c.reader) {  // reasoning, content and calls as the reader knows them (a possible marker held back)
              std::vector<ReplyEvent> ev;
              c.reader->push(text, ev);
              if (done) c.reader->finish(ev);
              for (const auto& e : ev) {
                any = true;
                if (e.kind == ReplyEvent::Kind::call) {
                  for (const auto& k : tool_call_chunks(head, *e.call, c.n_calls++, i))
                    if (!event(k)) return cancel_all();
                  continue;
                }
                const json k = e.kind == ReplyEvent::Kind::reasoning
                                   ? reasoning_chunk_json(head, e.text, i, lp)
                                   : chunk_json(head, e.text, false, std::nullopt, nullptr, i, lp);
                if (!event(k)) return cancel_all();
                lp = nullptr;
              }
              text.clear();
            }
            if (!text.empty() || !lp.is_null()) {
              any = true;
              c.first = false;
              if (!event(chunk_json(head, text, false, std::nullopt, nullptr, i, lp))) return cancel_all();
            }
            if (!done) {
              all_done = false;
              continue;
            }
            c.done = true;
            const Finish f = ss[i]->finish();
            if (f == Finish::cancelled || f == Finish::error) {
              const ApiError e{.status = 503,
                               .message = f == Finish::error ? ss[i]->error() : "the server is shutting down",
                               .type = "server_error",
                               .code = f == Finish::error ? "internal_error" : "shutting_down"};
              event(e.to_json());
              cancel_all();
              for (auto& o : st->choices) o.done = true;
              break;
            }
            const bool called = c.reader && c.reader->calls() > 0;
            if (!event(chunk_json(head, "", false, f, nullptr, i, nullptr, called))) return cancel_all();
          }
          if (!all_done) {
            if (!any && ss.size() > 1) {  // nothing from any choice: wait on the first unfinished one
              for (std::size_t i = 0; i < ss.size(); ++i)
                if (!st->choices[i].done) {
                  ss[i]->wait_for_more(wait);
                  break;
                }
            }
            if (!any && (st->idle_ms += int(wait.count())) >= 1000) {  // a comment: finds a client that has gone
              st->idle_ms = 0;
              if (!sink.write(":\n\n", 3)) return cancel_all();
            } else if (any) {
              st->idle_ms = 0;
            }
            return true;
          }
          bool failed = false;
          for (const auto& s : ss) failed |= s->finish() == Finish::cancelled || s->finish() == Finish::error;
          if (usage && !failed) {
            const Usage u = total_usage(ss);
            if (!event(chunk_json(head, "", false, std::nullopt, &u))) return false;
          }
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          st->ended = true;
          sink.done();
          return true;
        },
        [ss, stream_counted](bool) {  // the response ended (or the client went): nothing left to run
          for (const auto& s : ss) s->cancel();
        });
  }

  ChatTemplates templates() const {
    return {.plain = tmpl_ ? &*tmpl_ : nullptr, .rich = rich_tmpl_ ? &*rich_tmpl_ : nullptr};
  }

  Args args_;
  Model model_;
  std::optional<ChatTemplate> tmpl_;
  std::optional<ChatTemplate> rich_tmpl_;  // tmpl_ on the Jinja interpreter: tools and tool calls
  ApiConfig cfg_;
  Scheduler sched_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> inflight_{0};
  std::atomic<uint64_t> next_id_{0};
  int64_t created_ = 0;
};

int run(const Args& a) {
  // SIGINT/SIGTERM blocked in every thread (those started below inherit the mask) and taken by the watcher
  // with sigtimedwait: a handler would interrupt whichever thread it lands on (a socket write mid-stream).
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client that went away: the write fails, the stream is cancelled
  Model model = load(a.model, {});
  std::optional<ChatTemplate> tmpl;
  try {
    if (!a.chat_template.empty()) tmpl = ChatTemplate::from_name_or_file(a.chat_template, model.tokenizer());
    else if (std::filesystem::is_regular_file(a.model)) tmpl = ChatTemplate::from_gguf(io::GGUFFile(a.model));
    else tmpl = ChatTemplate::from_hf_dir(a.model);
  } catch (const Error& e) {
    std::fprintf(stderr, "kiln-server: no chat template (/v1/chat/completions refuses requests): %s\n", e.what());
  }
  const std::size_t vocab = model.hparams().vocab;
  Server server(a, std::move(model), std::move(tmpl));
  httplib::Server svr;
  const std::size_t http_threads = a.http_threads;
  svr.new_task_queue = [http_threads] { return new httplib::ThreadPool(http_threads); };
  svr.set_payload_max_length(a.max_body);
  svr.set_read_timeout(a.timeout, 0);
  svr.set_write_timeout(a.timeout, 0);
  svr.set_keep_alive_timeout(2);
  // Each SSE event is a small write: with Nagle's algorithm a token's event waits for the client's
  // (delayed) ACK of the one before it (the chat's role event, then every token), adding up to its delayed-
  // ACK time to the time to first token and to inter-token latency.
  svr.set_tcp_nodelay(true);
  server.routes(svr);

  int port = a.port;
  if (port == 0) port = svr.bind_to_any_port(a.host);
  else if (!svr.bind_to_port(a.host, port)) port = -1;
  if (port < 0) {
    std::fprintf(stderr, "kiln-server: cannot listen on %s:%d (in use, or not an address of this machine)\n",
                 a.host.c_str(), a.port);
    return 1;
  }
  std::atomic<bool> done{false};
  std::thread watcher([&] {  // signals: stop accepting, finish (5 s) or cancel the running requests
    const timespec tick = {0, 100'000'000};
    while (!done.load()) {
      if (const int sig = sigtimedwait(&stop_signals, nullptr, &tick); sig > 0) {
        g_signal.store(sig);
        break;
      }
    }
    if (done.load()) return;
    std::fprintf(stderr, "kiln-server: signal %d: stopping\n", g_signal.load());
    server.shutdown();  // new requests get 503 (and /health 503) while the running ones finish
    svr.stop();
  });
  {
    const MemoryUse m = server.scheduler().memory();
    const double mib = 1.0 / (1 << 20);
    std::error_code ec;
    const auto file = std::filesystem::is_regular_file(a.model, ec) ? std::filesystem::file_size(a.model, ec) : 0;
    std::fprintf(stderr,
                 "kiln-server: memory: model file %.1f MiB, KV caches up to %.1f MiB (%zu slots, taken as positions "
                 "are stored), activations and logits up to %.1f MiB, sampler up to %.1f MiB (as requests need it)\n",
                 double(file) * mib, double(m.kv) * mib, server.scheduler().slots(), double(m.work) * mib,
                 double(SamplerScratch::max_bytes(vocab)) * mib);
  }
  std::fprintf(stderr, "kiln-server: listening on http://%s:%d (%zu slots of %zu positions, model %s)\n",
               a.host.c_str(), port, server.scheduler().slots(), server.scheduler().ctx(), a.model.c_str());
  std::fflush(stderr);
  const bool ok = svr.listen_after_bind();
  done.store(true);
  watcher.join();
  server.shutdown();
  std::fprintf(stderr, "kiln-server: stopped\n");
  return ok || g_signal.load() != 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Two malloc arenas, not glibc's 8 per core: the HTTP threads' request and reply buffers would otherwise
  // each keep an arena of freed memory resident (the engine thread allocates nothing per token).
  mallopt(M_ARENA_MAX, 2);
  const Args a = parse_args(argc, argv);
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln-server: %s\n", e.what());
    return 1;
  }
}
