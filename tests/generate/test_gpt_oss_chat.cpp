// gpt-oss end to end with the released files' tokenizer settings and chat template: the tiny random gpt-oss
// checkpoint (tests/fixtures/models/gpt-oss/model.gguf) joined to a 256-token byte-level BPE vocabulary with
// the o200k pre-tokenizer (tokenizer.ggml.pre "gpt-4o"), the harmony special tokens and the harmony template
// (tests/fixtures/text/gpt_oss_tiny_vocab.gguf). Against scripts/fixtures/make_gpt_oss_chat_fixture.py's
// jinja2 renderings, HF tokenizers' ids and transformers' greedy tokens (gpt_oss_chat.json).
#include <ctime>
#include <string>
#include <vector>

#include "kiln/generate/generate.hpp"
#include "kiln/io/json.hpp"
#include "kiln/text/chat.hpp"
#include "model/model_test_util.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

std::string gpt_oss_fixture(const std::string& rel) { return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/" + rel; }

/// model.gguf's metadata (less its placeholder tokenizer.*) and tensors, with the vocabulary file's metadata.
void join_vocabulary(const std::string& model, const std::string& vocab, const std::filesystem::path& out) {
  const io::GGUFFile m(model), v(vocab);
  io::GGUFWriter w;
  for (const auto& kv : m.metadata())
    if (!kv.key().starts_with("tokenizer.") && kv.key() != "general.alignment") w.add(kv.key(), kv);
  for (const auto& kv : v.metadata())
    if (kv.key().starts_with("tokenizer.")) w.add(kv.key(), kv);
  for (const auto& t : m.tensors())
    w.add_tensor(std::string(t.name), t.type, std::vector<uint64_t>(t.ne.begin(), t.ne.begin() + t.n_dims), t.data);
  w.write(out);
}

std::tm fixture_time() {  // make_jinja_fixtures.py's NOW: 2024-07-26 14:05:09
  std::tm t{};
  t.tm_year = 2024 - 1900;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 14;
  t.tm_min = 5;
  t.tm_sec = 9;
  t.tm_wday = 5;
  t.tm_yday = 207;
  return t;
}

TEST_CASE(
    "gpt-oss: a GGUF with o200k and the harmony template loads, renders as jinja2, encodes as HF, "
    "generates as transformers") {
  TempFile tmp("kiln-test-gpt-oss-chat");
  join_vocabulary(gpt_oss_fixture("models/gpt-oss/model.gguf"), gpt_oss_fixture("text/gpt_oss_tiny_vocab.gguf"),
                  tmp.path);
  const Model m = load(tmp.path);
  const Tokenizer& tok = m.tokenizer();
  CHECK(tok.model() == TokenizerModel::bpe);
  CHECK(tok.vocabulary().pre == PreTokenizer::o200k);
  CHECK(tok.size() == 256);
  CHECK(tok.piece(tok.eos()) == "<|return|>");
  CHECK(!tok.add_bos());  // no tokenizer.ggml.add_bos_token: llama.cpp adds none for "gpt-4o"

  ChatTemplate tmpl = ChatTemplate::from_gguf(io::GGUFFile(tmp.path.string()));
  CHECK(tmpl.format() == ChatFormat::jinja);
  tmpl.set_time(fixture_time());
  // A reply ends at <|return|> (final answer) or <|call|> (tool call), not at <|end|>, which closes each
  // message of the reply (the analysis channel before the final one), as llama.cpp decides for harmony.
  const std::vector<int32_t> stops = tmpl.stop_tokens(tok);
  CHECK(std::find(stops.begin(), stops.end(), tok.find("<|return|>")) != stops.end());
  CHECK(std::find(stops.begin(), stops.end(), tok.find("<|call|>")) != stops.end());
  CHECK(std::find(stops.begin(), stops.end(), tok.find("<|end|>")) == stops.end());

  const io::json fx = io::json::parse(read_text(gpt_oss_fixture("text/gpt_oss_chat.json")));
  REQUIRE(fx.at("cases").size() >= 3);
  for (const io::json& c : fx.at("cases")) {
    CAPTURE(c.at("name").get<std::string>());
    std::vector<ChatMessage> conv;
    for (const io::json& msg : c.at("messages"))
      conv.push_back({msg.at("role").get<std::string>(), msg.at("content").get<std::string>()});
    ChatTemplate t = tmpl;
    for (const auto& [k, v] : c.at("vars").items()) t.set_variable(k, jinja::Value(v.get<std::string>()));
    const std::string text = t.render(conv, {.add_generation_prompt = c.at("add_generation_prompt").get<bool>()});
    CHECK(text == c.at("text").get<std::string>());
    const auto ids = tok.encode(text, {.add_special = false, .parse_special = true});
    CHECK(ids == c.at("ids").get<std::vector<int32_t>>());
    Session s(m, {.ctx = 512});
    const auto want = c.at("greedy").get<std::vector<int32_t>>();
    const GenerateResult r = generate(s, text,
                                      {.max_tokens = int(want.size()),
                                       .sampling = {.temperature = 0},
                                       .ignore_eos = true,
                                       .add_bos = false,
                                       .parse_special = true},
                                      [](std::string_view) {});
    CHECK(r.n_prompt == ids.size());
    CHECK(r.tokens == want);
  }
}

}  // namespace
}  // namespace kiln::test
