// serve/scheduler.hpp: continuous batching gives every request what it gives alone (kiln::Session fed
// the same prompt, greedy), whatever ran beside it; cancellation frees the slot; prompt caching reuses a
// slot's tokens and counts them; bad requests are refused naming what is wrong.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
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
    const auto ids = tok.encode(prompts[i], {.add_special = true});
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
    const auto ids =
        tok.encode_chat(tmpl.render_marked(std::vector<ChatMessage>{{"user", q}}, {.add_generation_prompt = true}));
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
  auto a = sched.submit(tok.encode("Once upon a time", {.add_special = true}), long_run);
  const RequestOptions o{.max_tokens = 20, .sampling = {.temperature = 0}};
  const auto b_ids = tok.encode("The dog ran", {.add_special = true});
  auto b = sched.submit(b_ids, o);
  auto c = sched.submit(tok.encode("A bird sang", {.add_special = true}), o);
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
  const auto p = tok.encode("Once upon a time there was a little girl", {.add_special = true});
  auto a = sched.submit(p, o);
  a->wait();
  REQUIRE(a->finish() == Finish::length);
  CHECK(a->usage().cached == 0);
  CHECK(a->usage().evaluated == p.size());
  // The next turn: a's prompt and reply, then new text. The slot holds the prompt and every generated
  // token but the last (sampled, never run).
  auto next = p;
  const auto gen = a->tokens();
  REQUIRE(gen.size() == 8);
  next.insert(next.end(), gen.begin(), gen.end());
  const auto more = tok.encode(" She liked", {.add_special = false});
  next.insert(next.end(), more.begin(), more.end());
  auto b = sched.submit(next, o);
  const std::string b_text = b->wait();
  CHECK(b->slot() == a->slot());
  CHECK(b->usage().cached == p.size() + gen.size() - 1);
  CHECK(b->usage().prompt == next.size());
  // Only the new tokens ran: the last generated token (sampled, never run) and " She liked".
  CHECK(b->usage().evaluated == 1 + more.size());
  const Alone want = run_alone(model, next, o, ctx);
  CHECK(b->tokens() == want.ids);
  CHECK(b_text == want.text);
  // A prompt that shares only the BOS goes to the least recently used slot (the empty one), not to the
  // conversation's; its next turn goes back to it by its prefix although the other slot is older.
  const auto c_ids = tok.encode("Zebras", {.add_special = true});
  auto c = sched.submit(c_ids, o);
  c->wait();
  CHECK(c->slot() != a->slot());
  CHECK(c->usage().cached == 0);
  auto d_ids = c_ids;
  const auto c_gen = c->tokens();
  d_ids.insert(d_ids.end(), c_gen.begin(), c_gen.end());
  const auto d_more = tok.encode(" and cats", {.add_special = false});
  d_ids.insert(d_ids.end(), d_more.begin(), d_more.end());
  auto d = sched.submit(d_ids, o);
  d->wait();
  CHECK(d->slot() == c->slot());
  CHECK(d->usage().cached == c_ids.size() + c_gen.size() - 1);
  CHECK(d->tokens() == run_alone(model, d_ids, o, ctx).ids);
  CHECK(d->usage().evaluated == d_ids.size() - d->usage().cached);
  CHECK(sched.metrics().cached_tokens == b->usage().cached + d->usage().cached);
  CHECK(sched.metrics().prompt_tokens_evaluated ==
        a->usage().evaluated + b->usage().evaluated + c->usage().evaluated + d->usage().evaluated);
  CHECK(c->usage().evaluated == c_ids.size());
}

TEST_CASE("scheduler: a conversation's second turn runs only its new tokens (SmolLM2 chat template)") {
  // The client sends the whole conversation again, the first answer as text: rendered by the template and
  // tokenized, its tokens are the ones the slot ran (the answer re-tokenizes to the tokens generated), so
  // the second turn computes only what follows the first answer, and still gives what it gives alone.
  const io::GGUFFile f(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const ChatTemplate tmpl = ChatTemplate::from_gguf(f);
  const Model model = load(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::size_t ctx = 256;
  Scheduler sched(model, {.slots = 2, .ctx = ctx, .threads = 1, .batch = 64});
  const RequestOptions o{.max_tokens = 24, .sampling = {.temperature = 0}, .stop_tokens = tmpl.stop_tokens(tok)};
  std::vector<ChatMessage> msgs = {{"user", "What is the capital of France?"}};
  const auto p1 = tok.encode_chat(tmpl.render_marked(msgs, {.add_generation_prompt = true}));
  auto a = sched.submit(p1, o);
  const std::string answer = a->wait();
  REQUIRE(a->finish() == Finish::stop);  // the answer ended with the template's end token (not run)
  const auto gen = a->tokens();
  REQUIRE(tok.encode(answer, {.add_special = false, .parse_special = false}) == gen);
  msgs.push_back({"assistant", answer});
  msgs.push_back({"user", "And of Italy?"});
  const auto p2 = tok.encode_chat(tmpl.render_marked(msgs, {.add_generation_prompt = true}));
  REQUIRE(std::equal(p1.begin(), p1.end(), p2.begin()));
  const auto evaluated0 = sched.metrics().prompt_tokens_evaluated;
  auto b = sched.submit(p2, o);
  const std::string b_text = b->wait();
  CHECK(b->slot() == a->slot());
  CHECK(b->usage().cached == p1.size() + gen.size());  // the slot's whole first turn
  CHECK(b->usage().evaluated == p2.size() - p1.size() - gen.size());
  CHECK(sched.metrics().prompt_tokens_evaluated - evaluated0 == b->usage().evaluated);
  const Alone want = run_alone(model, p2, o, ctx);
  CHECK(b->tokens() == want.ids);
  CHECK(b_text == want.text);
}

TEST_CASE("scheduler: memory() is the KV caches, one pass's buffers and one sampler scratch, within 10% of the model") {
  // kiln-server's default shape: -np 4 -c 4096 (4 slots of 1,024 positions), -b 256. The target:
  // peak memory <= model + N x KV + 10%. What the scheduler allocates besides the KV caches (activations,
  // RoPE tables, logits, the sampler) must then fit in the 10%, beside the
  // tokenizer and the program: computed here from the model's sizes, independently of the code.
  for (const char* name : {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}) {
    CAPTURE(name);
    const Model model = load(real_model(name));
    const HParams& hp = model.hparams();
    const std::size_t slots = 4, ctx = 1024, batch = 256, threads = 2;
    Scheduler sched(model, {.slots = slots, .ctx = ctx, .threads = threads, .batch = batch});
    const serve::MemoryUse m = sched.memory();
    // f16 keys and values (Precision::fast's KV type) of every layer, KV head and position, per slot.
    CHECK(m.kv == slots * 2 * hp.n_layers * hp.n_kv_heads * hp.head_dim * ctx * 2);
    // One sampler scratch for all slots, taken as requests need it (greedy and top-k without penalties: k
    // candidates; the penalties: a logits copy and counts, vocab x 8 bytes): none before the first request.
    CHECK(m.sampler == 0);
    // Work: the logits of `slots` rows, cos and sin tables, and one pass's activations: per row the
    // residual, normed input, q, k, v, attention output, projection and the MLP's gate and up (f32).
    const std::size_t logits = slots * hp.vocab * 4;
    const std::size_t rope_tables = hp.rope_theta_swa > 0 && hp.rope_theta_swa != hp.rope_theta ? 4 : 2;
    const std::size_t rope = rope_tables * ctx * (hp.rope_dim / 2) * 4;
    const std::size_t row = (3 * hp.dim + 2 * hp.q_dim() + 2 * hp.kv_dim() + 2 * hp.ffn_dim) * 4;
    CHECK(m.work >= logits + rope + batch * row);
    // ... plus the attention scratch: per thread, what kiln::attention documents it needs (its AMX tiles'
    // arrays included), and per row, head and 1,024 positions the decode parts; each buffer aligned: a few
    // percent more at most.
    const std::size_t attention = threads * attention_scratch_floats(hp.head_dim) * 4;
    CHECK(m.work <= logits + rope + attention + batch * row * 11 / 10 + (1 << 20));
    const double file = double(std::filesystem::file_size(real_model(name)));
    CHECK(double(m.work + m.sampler) <= 0.1 * (file + double(m.kv)));
  }
}

// Pages of `path`'s mappings in this process that hold file bytes [0, end) and are resident
// (/proc/self/maps for the mappings, /proc/self/pagemap's present bit for each page).
std::size_t resident_file_pages(const std::string& path, std::size_t end) {
  const std::string want = std::filesystem::canonical(path).string();
  const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
  std::ifstream maps("/proc/self/maps");
  const int pagemap = ::open("/proc/self/pagemap", O_RDONLY);
  REQUIRE(maps);
  REQUIRE(pagemap >= 0);
  std::size_t present = 0, mapped = 0;
  for (std::string line; std::getline(maps, line);) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, file;
    in >> range >> perms >> offset >> dev >> inode >> file;
    if (file != want) continue;
    const std::size_t dash = range.find('-');
    const std::size_t a = std::stoull(range.substr(0, dash), nullptr, 16);
    const std::size_t b = std::stoull(range.substr(dash + 1), nullptr, 16);
    const std::size_t off = std::stoull(offset, nullptr, 16);
    for (std::size_t v = a; v < b && off + (v - a) + page <= end; v += page) {
      uint64_t e = 0;
      const bool read = ::pread(pagemap, &e, sizeof e, off_t(v / page * sizeof e)) == off_t(sizeof e);
      if (!read) ::close(pagemap);
      REQUIRE(read);
      ++mapped;
      present += (e >> 63) & 1;
    }
  }
  ::close(pagemap);
  REQUIRE(mapped > 0);  // the model's mapping was found
  return present;
}

TEST_CASE("scheduler: a loaded GGUF's metadata pages leave the resident set once read (SmolLM2: 1.8 MB of them)") {
  const std::string path = real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
  const std::size_t metadata = std::size_t(io::GGUFFile(path).data_offset());  // that mapping is gone again
  REQUIRE(metadata > (std::size_t{1} << 20));  // the tokenizer's 49,152 pieces and merges: many pages
  const Model m = load(path);
  CHECK(m.tokenizer().size() == 49152);  // read from those pages
  // None but the last 64 KiB: a read of the first tensors maps the pages around it that the page cache holds
  // (the kernel's fault-around, 16 pages by default), the metadata's last ones among them.
  CHECK(resident_file_pages(path, metadata - (std::size_t{64} << 10)) == 0);
  // A second mapping of the file, its metadata parsed, holds those pages: the count sees them (it can fail).
  const io::GGUFFile again(path);
  CHECK(again.get<std::string>("tokenizer.chat_template").size() > 100);
  CHECK(resident_file_pages(path, metadata) > 0);
}

TEST_CASE("scheduler: logprobs are the log-softmax of the logits a Session alone gives, with the top tokens") {
  const Model model = load(shared_model("stories260K.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::size_t ctx = 64, vocab = model.hparams().vocab;
  Scheduler sched(model, {.slots = 2, .ctx = ctx, .threads = 1, .batch = 8});
  const auto p = tok.encode("Once upon a time", {.add_special = true});
  const RequestOptions o{
      .max_tokens = 6, .sampling = {.temperature = 0}, .ignore_eos = true, .logprobs = true, .top_logprobs = 4};
  auto a = sched.submit(p, o);
  auto plain = sched.submit(p, {.max_tokens = 2, .sampling = {.temperature = 0}});  // none asked for
  a->wait();
  plain->wait();
  CHECK(plain->logprobs().empty());
  const auto ids = a->tokens();
  const auto lps = a->logprobs();
  REQUIRE(ids.size() == 6);
  REQUIRE(lps.size() == ids.size());
  CHECK(a->logprobs(4).size() == 2);
  // The reference: a Session fed the prompt, then each generated token; log-softmax in long double.
  Session ref(model, {.ctx = ctx, .threads = 1});
  auto logits = ref.eval(p);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    CAPTURE(i);
    std::vector<long double> ls(logits.begin(), logits.end());
    const long double m = *std::max_element(ls.begin(), ls.end());
    long double sum = 0;
    for (auto x : ls) sum += std::exp(x - m);
    const long double lse = m + std::log(sum);
    std::vector<int32_t> order(vocab);
    for (std::size_t t = 0; t < vocab; ++t) order[t] = int32_t(t);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return ls[x] > ls[y]; });
    // Both sides' logits are f32 products over the same weights, batched (the scheduler) or not (the
    // Session): they may differ in the last bits of each dot (dim 64 here: < 1e-5 relative), and a
    // log-softmax moves by at most twice the largest logit change. Greedy: the chosen token is the top one.
    const double tol = 1e-4;
    CHECK(lps[i].token == ids[i]);
    CHECK(ids[i] == order[0]);
    CHECK(std::fabs(double(lps[i].logprob) - double(ls[std::size_t(ids[i])] - lse)) <= tol);
    REQUIRE(lps[i].top.size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(lps[i].top[k].first == order[k]);
      CHECK(std::fabs(double(lps[i].top[k].second) - double(ls[std::size_t(order[k])] - lse)) <= tol);
    }
    logits = ref.eval(ids[i]);
  }
}

TEST_CASE("scheduler: n choices of one prompt compute it once and each gives what its seed gives alone") {
  const Model model = load(shared_model("stories260K.gguf"));
  const Tokenizer& tok = model.tokenizer();
  const std::size_t ctx = 96;
  // 2 slots for 3 choices: the third waits for a free slot, and copies the prompt from whichever holds it.
  Scheduler sched(model, {.slots = 2, .ctx = ctx, .threads = 1, .batch = 8});
  const auto p = tok.encode("Lily and Tom went to the park to play with a ball", {.add_special = true});
  const RequestOptions o{.max_tokens = 10,
                         .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0, .seed = 42}};
  const auto choices = sched.submit_choices(p, o, 3);
  REQUIRE(choices.size() == 3);
  for (std::size_t i = 0; i < choices.size(); ++i) {
    CAPTURE(i);
    const std::string text = choices[i]->wait();
    RequestOptions oi = o;
    oi.sampling.seed = 42 + i;
    const Alone want = run_alone(model, p, oi, ctx);
    CHECK(choices[i]->tokens() == want.ids);
    CHECK(text == want.text);
    CHECK(choices[i]->usage().prompt == p.size());
  }
  // The first choice ran the whole prompt (batch 8: in chunks); the others only its last token.
  CHECK(choices[0]->usage().evaluated == p.size());
  CHECK(choices[1]->usage().evaluated == 1);
  CHECK(choices[2]->usage().evaluated == 1);
  CHECK(choices[1]->usage().cached == p.size() - 1);
  CHECK(sched.metrics().prompt_tokens_evaluated == p.size() + 2);
  CHECK(sched.metrics().requests == 3);
  CHECK_THROWS_WITH_AS(sched.submit_choices(p, o, 0), doctest::Contains("n is 0"), Error);
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
