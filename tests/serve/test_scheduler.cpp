// serve/scheduler.hpp: continuous batching gives every request what it gives alone (kiln::Session fed
// the same prompt, greedy), whatever ran beside it; cancellation frees the slot; prompt caching reuses a
// slot's tokens and counts them; bad requests are refused naming what is wrong.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kiln/serve/scheduler.hpp"
#include "../model/model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

using serve::Finish;
using serve::RequestOptions;
using serve::Scheduler;

struct Alone {
  std::vector<int32_t> ids;
  std::string text;
  Finish finish = Finish::running;
};

// The reference: one Session, the prompt then one token at a time, greedy (what kiln::generate does),
// ending at EOS or a stop token (not emitted), a stop string (text cut before it) or max_tokens.
Alone run_alone(const Model& model, const std::vector<int32_t>& prompt, const RequestOptions& o, std::size_t ctx) {
  Session s(model, {.ctx = ctx, .threads = 1});
  Sampler sampler(model.hparams().vocab, o.sampling);
  const Tokenizer& tok = model.tokenizer();
  Alone r;
  std::string bytes;
  auto logits = s.eval(prompt);
  for (;;) {
    if (r.ids.size() >= std::size_t(o.max_tokens)) {
      r.finish = Finish::length;
      break;
    }
    const int32_t t = sampler.sample(logits, s.tokens());
    if (tok.is_eog(t) || std::find(o.stop_tokens.begin(), o.stop_tokens.end(), t) != o.stop_tokens.end()) {
      r.finish = Finish::stop;
      break;
    }
    r.ids.push_back(t);
    bytes += tok.token_bytes(t);
    std::size_t cut = std::string::npos;
    for (const auto& st : o.stop) cut = std::min(cut, bytes.find(st));
    if (cut != std::string::npos) {
      bytes.resize(cut);
      r.finish = Finish::stop;
      break;
    }
    if (r.ids.size() >= std::size_t(o.max_tokens) || s.n_past() >= ctx) {
      r.finish = Finish::length;
      break;
    }
    logits = s.eval(t);
  }
  r.text = text::sanitize_utf8(bytes);
  return r;
}

void check_same(const std::vector<std::shared_ptr<serve::Stream>>& streams, const std::vector<Alone>& want) {
  for (std::size_t i = 0; i < streams.size(); ++i) {
    CAPTURE(i);
    const std::string text = streams[i]->wait();
    CHECK(streams[i]->finish() == want[i].finish);
    CHECK(streams[i]->tokens() == want[i].ids);
    CHECK(text == want[i].text);
    CHECK(streams[i]->usage().completion == want[i].ids.size());
  }
}

TEST_CASE("scheduler: 10 concurrent greedy requests on 3 slots give what each gives alone (stories260K)") {
  const Model model = load(shared_model("stories260K.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "The little dog",
                                            "Lily went to the park and saw a big",
                                            "Tom had a red ball.",
                                            "One day, a girl named Sue",
                                            "The sun was hot",
                                            "A cat sat on the mat. It",
                                            "Ben and Mia played",
                                            "There was a tree",
                                            "Mom said, \"Let's go to the"};
  const std::size_t ctx = 128;
  // batch 8: prompts longer than the step's free rows are read in chunks beside the running streams.
  Scheduler sched(model, {.slots = 3, .ctx = ctx, .threads = 2, .batch = 8});
  std::vector<std::shared_ptr<serve::Stream>> streams;
  std::vector<Alone> want;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    RequestOptions o{.max_tokens = int(12 + 5 * i), .sampling = {.temperature = 0}};
    if (i == 3) o.stop = {"ed"};  // a stop string somewhere in the text
    const auto ids = tok.encode(prompts[i], true);
    want.push_back(run_alone(model, ids, o, ctx));
    streams.push_back(sched.submit(ids, o));
  }
  check_same(streams, want);
  const auto m = sched.metrics();
  CHECK(m.requests == prompts.size());
  CHECK(m.busy == 0);
  CHECK(m.ttft.count == prompts.size());
}

TEST_CASE("scheduler: 8 concurrent chat requests on 4 slots give what each gives alone (SmolLM2)") {
  const io::GGUFFile f(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const ChatTemplate tmpl = ChatTemplate::from_gguf(f);
  const Model model = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::vector<std::string> questions = {
      "What is the capital of France?", "Name three colors.",   "Write a haiku about rain.", "What is 12 times 12?",
      "Say hello in Spanish.",          "Why is the sky blue?", "List two fruits.",          "Who wrote Hamlet?"};
  const std::size_t ctx = 160;
  Scheduler sched(model, {.slots = 4, .ctx = ctx, .threads = 2, .batch = 32});
  std::vector<std::shared_ptr<serve::Stream>> streams;
  std::vector<Alone> want;
  for (const auto& q : questions) {
    const auto ids = tok.encode_chat(tmpl.render_marked(std::vector<ChatMessage>{{"user", q}}, true));
    RequestOptions o{.max_tokens = 12, .sampling = {.temperature = 0}, .stop_tokens = tmpl.stop_tokens(tok)};
    want.push_back(run_alone(model, ids, o, ctx));
    streams.push_back(sched.submit(ids, o));
  }
  check_same(streams, want);
}

TEST_CASE("scheduler: cancellation frees the slot for the next request, and a queued request can be cancelled") {
  // SmolLM2 (not the tiny model): the long request must still run when it is cancelled, and 500 tokens
  // of it take seconds, cancel() microseconds after its first text.
  const Model model = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::size_t ctx = 512;
  Scheduler sched(model, {.slots = 1, .ctx = ctx, .threads = 1, .batch = 16});
  const RequestOptions long_run{.max_tokens = 500, .sampling = {.temperature = 0}, .ignore_eos = true};
  auto a = sched.submit(tok.encode("Once upon a time", true), long_run);
  const RequestOptions o{.max_tokens = 20, .sampling = {.temperature = 0}};
  const auto b_ids = tok.encode("The dog ran", true);
  auto b = sched.submit(b_ids, o);
  auto c = sched.submit(tok.encode("A bird sang", true), o);
  std::string text;
  while (text.empty()) REQUIRE_FALSE(a->next(text, std::chrono::seconds(10)));  // a runs, b and c wait
  CHECK(b->slot() == -1);
  c->cancel();
  a->cancel();
  a->wait();
  CHECK(a->finish() == Finish::cancelled);
  CHECK(a->usage().completion < 500);
  const std::string b_text = b->wait();
  CHECK(b->slot() == 0);
  const Alone want = run_alone(model, b_ids, o, ctx);
  CHECK(b->tokens() == want.ids);
  CHECK(b_text == want.text);
  c->wait();
  CHECK(c->finish() == Finish::cancelled);
  CHECK(c->usage().completion == 0);
  CHECK(sched.metrics().finished[std::size_t(Finish::cancelled)] == 2);
}

TEST_CASE("scheduler: a request reuses the idle slot with the longest cached prefix and counts it") {
  const Model model = load(shared_model("stories260K.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::size_t ctx = 128;
  Scheduler sched(model, {.slots = 2, .ctx = ctx, .threads = 1, .batch = 16});
  const RequestOptions o{.max_tokens = 8, .sampling = {.temperature = 0}, .ignore_eos = true};
  const auto p = tok.encode("Once upon a time there was a little girl", true);
  auto a = sched.submit(p, o);
  a->wait();
  REQUIRE(a->finish() == Finish::length);
  CHECK(a->usage().cached == 0);
  // The next turn: a's prompt and reply, then new text. The slot holds the prompt and every generated
  // token but the last (sampled, never run).
  auto next = p;
  const auto gen = a->tokens();
  REQUIRE(gen.size() == 8);
  next.insert(next.end(), gen.begin(), gen.end());
  const auto more = tok.encode(" She liked", false);
  next.insert(next.end(), more.begin(), more.end());
  auto b = sched.submit(next, o);
  const std::string b_text = b->wait();
  CHECK(b->slot() == a->slot());
  CHECK(b->usage().cached == p.size() + gen.size() - 1);
  CHECK(b->usage().prompt == next.size());
  const Alone want = run_alone(model, next, o, ctx);
  CHECK(b->tokens() == want.ids);
  CHECK(b_text == want.text);
  // A prompt that shares only the BOS goes to the least recently used slot (the empty one), not to the
  // conversation's; its next turn goes back to it by its prefix although the other slot is older.
  const auto c_ids = tok.encode("Zebras", true);
  auto c = sched.submit(c_ids, o);
  c->wait();
  CHECK(c->slot() != a->slot());
  CHECK(c->usage().cached == 0);
  auto d_ids = c_ids;
  const auto c_gen = c->tokens();
  d_ids.insert(d_ids.end(), c_gen.begin(), c_gen.end());
  const auto d_more = tok.encode(" and cats", false);
  d_ids.insert(d_ids.end(), d_more.begin(), d_more.end());
  auto d = sched.submit(d_ids, o);
  d->wait();
  CHECK(d->slot() == c->slot());
  CHECK(d->usage().cached == c_ids.size() + c_gen.size() - 1);
  CHECK(d->tokens() == run_alone(model, d_ids, o, ctx).ids);
  CHECK(sched.metrics().cached_tokens == b->usage().cached + d->usage().cached);
}

TEST_CASE(
    "scheduler: bad requests are refused naming what is wrong, as are requests to a full queue or a stopped "
    "scheduler") {
  const Model model = load(shared_model("stories260K.gguf"));
  Scheduler sched(model, {.slots = 1, .ctx = 32, .threads = 1, .batch = 8, .max_queue = 1});
  CHECK_THROWS_WITH_AS(sched.submit({}, {}), doctest::Contains("empty prompt"), Error);
  CHECK_THROWS_WITH_AS(sched.submit(std::vector<int32_t>(33, 1), {}),
                       doctest::Contains("the prompt has 33 tokens; a slot's context holds 32"), Error);
  CHECK_THROWS_WITH_AS(sched.submit({1, 512}, {}), doctest::Contains("token id 512 is outside the vocabulary of 512"),
                       Error);
  CHECK_THROWS_WITH_AS(sched.submit({1}, {.sampling = {.top_p = 0}}), doctest::Contains("top_p"), Error);
  // One slot busy, one request waiting: the next is refused.
  const RequestOptions o{.max_tokens = 30, .sampling = {.temperature = 0}, .ignore_eos = true};
  auto a = sched.submit({1, 2}, o);
  std::shared_ptr<serve::Stream> b;
  std::size_t refused = 0;
  for (int i = 0; i < 3; ++i) {
    try {
      auto s = sched.submit({1, 3}, o);
      if (!b) b = s;
      else s->cancel();
    } catch (const serve::QueueFull& e) {
      CHECK(std::string(e.what()).find("max_queue") != std::string::npos);
      ++refused;
    }
  }
  CHECK(refused >= 1);
  sched.stop(std::chrono::milliseconds(0));  // cancels what runs and waits
  CHECK(a->finish() != Finish::running);
  CHECK_THROWS_WITH_AS(sched.submit({1}, {}), doctest::Contains("shutting down"), serve::QueueFull);
}

}  // namespace
}  // namespace kiln::test
