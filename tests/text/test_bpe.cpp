// Byte-level BPE (text/bpe.hpp, text/pretokenize.hpp, text/hf_tokenizer.hpp) and the Gemma 3 SentencePiece
// vocabulary against Hugging Face tokenizers: tests/fixtures/text/*_ids.json hold HF's ids and decodings
// of ~380 strings (scripts/fixtures/make_tokenizer_fixtures.py; o200k, Tekken and the GGUF pre-tokenizer
// aliases: scripts/fixtures/make_pretokenizer_fixtures.py). The real SmolLM2 and Gemma 3 GGUFs come
// from scripts/fetch_models.sh; a missing file fails the test.
#include <chrono>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/io/json.hpp"
#include "kiln/text/hf_tokenizer.hpp"
#include "test_util.hpp"

namespace kiln::test {
namespace {

using Ids = std::vector<int32_t>;
using io::json;

std::string fixture_path(const std::string& name) {
  return std::string(KILN_SOURCE_DIR) + "/tests/fixtures/text/" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) FAIL("missing fixture '", path, "' (scripts/fixtures/make_tokenizer_fixtures.py makes it)");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

json read_json(const std::string& name) { return json::parse(read_text(fixture_path(name))); }

std::string show(const Ids& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s + "]";
}

/// Every case of an _ids.json fixture: encode with special tokens split out and as plain text, and both
/// decodings. Returns the number of cases checked.
std::size_t check_against_hf(const Tokenizer& tok, const std::string& fixture, std::size_t min_cases = 200) {
  const json fx = read_json(fixture);
  std::size_t n = 0, bad = 0;
  std::string report;
  auto miss = [&](const std::string& what, const std::string& text, const std::string& want, const std::string& got) {
    if (++bad <= 8) report += what + " of " + json(text).dump() + ":\n  HF   " + want + "\n  kiln " + got + "\n";
  };
  for (const json& c : fx.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const Ids ids = c.at("ids").get<Ids>();
    const Ids plain = c.contains("ids_plain") ? c["ids_plain"].get<Ids>() : ids;
    const std::string dec = c.contains("decoded") ? c["decoded"].get<std::string>() : text;
    const std::string dec_sp = c.contains("decoded_special") ? c["decoded_special"].get<std::string>() : text;
    ++n;
    if (const Ids got = tok.encode(text, {.add_special = false, .parse_special = true}); got != ids)
      miss("encode (parse_special)", text, show(ids), show(got));
    if (const Ids got = tok.encode(text, {.add_special = false, .parse_special = false}); got != plain)
      miss("encode (plain)", text, show(plain), show(got));
    if (const std::string got = tok.decode(ids); got != dec) miss("decode", text, json(dec).dump(), json(got).dump());
    if (const std::string got = tok.decode(ids, {.render_special = true}); got != dec_sp)
      miss("decode (special)", text, json(dec_sp).dump(), json(got).dump());
  }
  INFO(fixture, ": ", bad, " mismatches in ", n, " strings\n", report);
  CHECK(bad == 0);
  CHECK(n >= min_cases);
  return n;
}

Tokenizer tiny(const std::string& name) { return Tokenizer::from_hf_json(fixture_path(name + ".tokenizer.json")); }

TEST_CASE("bpe: Qwen2-style tokenizer.json (Split regex + ByteLevel) matches HF tokenizers") {
  const Tokenizer t = tiny("qwen2_tiny");
  CHECK(t.model() == TokenizerModel::bpe);
  CHECK(t.vocabulary().pre == PreTokenizer::qwen2);
  CHECK(t.vocabulary().nfc);
  CHECK(!t.add_bos());
  check_against_hf(t, "qwen2_tiny_ids.json");
}

TEST_CASE("bpe: Llama 3-style tokenizer.json (digit triples, ignore_merges, BOS) matches HF tokenizers") {
  const Tokenizer t = tiny("llama3_tiny");
  CHECK(t.vocabulary().pre == PreTokenizer::llama3);
  CHECK(t.vocabulary().ignore_merges);
  check_against_hf(t, "llama3_tiny_ids.json");
  // The post-processor's BOS.
  REQUIRE(t.add_bos());
  CHECK(t.piece(t.bos()) == "<|begin_of_text|>");
  const Ids with = t.encode("Hello world");
  CHECK(with.front() == t.bos());
  CHECK(Ids(with.begin() + 1, with.end()) == t.encode("Hello world", {.add_special = false}));
}

TEST_CASE("bpe: SmolLM-style tokenizer.json (Digits + ByteLevel, string-form merges) matches HF tokenizers") {
  const Tokenizer t = tiny("smollm_tiny");
  CHECK(t.vocabulary().pre == PreTokenizer::smollm);
  check_against_hf(t, "smollm_tiny_ids.json");
}

TEST_CASE("bpe: GPT-2-style tokenizer.json (ByteLevel regex) matches HF tokenizers") {
  const Tokenizer t = tiny("gpt2_tiny");
  CHECK(t.vocabulary().pre == PreTokenizer::gpt2);
  check_against_hf(t, "gpt2_tiny_ids.json");
}

// ---- o200k (gpt-oss) and Tekken (Mistral Nemo), and the GGUF aliases of every regex ----

/// Piece ends (code point indices) of kiln's pre-tokenizer over s.
std::vector<std::size_t> piece_ends(PreTokenizer p, const std::string& s) {
  text::CodePoints cps;
  cps.assign(s);
  std::vector<std::size_t> ends;
  text::pre_tokenize(p, cps, ends);
  return ends;
}

TEST_CASE("bpe: o200k and Tekken pre-tokenizers cut every string where Oniguruma's regex does") {
  const json fx = read_json("pretokenize_pieces.json");
  for (const PreTokenizer p : {PreTokenizer::o200k, PreTokenizer::tekken}) {
    const std::string key = pre_tokenizer_name(p);  // the fixture's key
    std::size_t bad = 0, pieces = 0;
    std::string report;
    for (const json& c : fx) {
      const std::string text = c.at("text").get<std::string>();
      const auto want = c.at(key).get<std::vector<std::size_t>>();
      pieces += want.size();
      if (const auto got = piece_ends(p, text); got != want && ++bad <= 8) {
        std::string w, g;
        for (auto e : want) w += std::to_string(e) + ",";
        for (auto e : got) g += std::to_string(e) + ",";
        report += json(text).dump() + "\n  HF   " + w + "\n  kiln " + g + "\n";
      }
    }
    INFO(key, ": ", bad, " of ", fx.size(), " strings cut differently\n", report);
    CHECK(bad == 0);
    CHECK(fx.size() >= 400);
    CHECK(pieces > 2 * fx.size());
  }
}

TEST_CASE("bpe: o200k treats an invalid byte as the non-letter U+FFFD is") {
  // HF cannot take invalid UTF-8; kiln's invalid byte is a character of no class, as U+FFFD is, so the cuts
  // of "x<bad>y" are those of "x\uFFFDy" (which the fixture checks against HF), one character per bad byte.
  for (const std::string& bad : {std::string("\xFF"), std::string("\xC3"), std::string("\x80\x80")}) {
    for (const std::string& frame : {std::string("abc#def"), std::string("ABC#Def"), std::string(" #'s"),
                                     std::string("1#/\n"), std::string("#\xCC\x81x")}) {
      const std::size_t at = frame.find('#');
      std::string with_bad = frame, with_fffd = frame;
      with_bad.replace(at, 1, bad);
      std::string fffd;
      for (std::size_t i = 0; i < bad.size(); ++i) fffd += "\xEF\xBF\xBD";
      with_fffd.replace(at, 1, fffd);
      CAPTURE(json(with_fffd).dump());
      CHECK(piece_ends(PreTokenizer::o200k, with_bad) == piece_ends(PreTokenizer::o200k, with_fffd));
    }
  }
  const Tokenizer t = tiny("o200k_tiny");
  const std::string text =
      "ABC\xFF\xFE"
      "def\xC3 \xE2\x82/";
  std::string bytes;
  for (int32_t id : t.encode(text, {.add_special = false})) bytes += t.token_bytes(id);
  CHECK(bytes == text);  // the raw bytes survive
}

TEST_CASE("bpe: gpt-oss-style tokenizer.json (o200k Split + ByteLevel) and its GGUF (\"gpt-4o\") match HF") {
  const Tokenizer j = tiny("o200k_tiny");
  CHECK(j.vocabulary().pre == PreTokenizer::o200k);
  CHECK(!j.add_bos());
  check_against_hf(j, "o200k_tiny_ids.json");
  const Tokenizer g = Tokenizer::from_gguf(io::GGUFFile(fixture_path("o200k_tiny.gguf")));
  CHECK(g.vocabulary().pre == PreTokenizer::o200k);
  CHECK(!g.vocabulary().ignore_merges);  // llama.cpp's "gpt-4o"
  CHECK(!g.add_bos());
  CHECK(g.piece(g.eos()) == "<|return|>");
  CHECK(g.size() == j.size());
  check_against_hf(g, "o200k_tiny_ids.json");
}

TEST_CASE("bpe: Mistral Nemo-style Tekken tokenizer.json and its GGUF (\"tekken\", BOS by default) match HF") {
  const Tokenizer j = tiny("tekken_tiny");
  CHECK(j.vocabulary().pre == PreTokenizer::tekken);
  CHECK(j.vocabulary().ignore_merges);
  check_against_hf(j, "tekken_tiny_ids.json");
  const Tokenizer g = Tokenizer::from_gguf(io::GGUFFile(fixture_path("tekken_tiny.gguf")));
  CHECK(g.vocabulary().pre == PreTokenizer::tekken);
  CHECK(g.vocabulary().ignore_merges);  // as llama.cpp sets for "tekken"
  check_against_hf(g, "tekken_tiny_ids.json");
  // No tokenizer.ggml.add_bos_token in the file: BOS is added, as llama.cpp does for "tekken" and as the
  // tokenizer.json's post-processor does.
  REQUIRE(g.add_bos());
  REQUIRE(j.add_bos());
  CHECK(g.piece(g.bos()) == "<s>");
  CHECK(g.encode("Hello world") == j.encode("Hello world"));
  CHECK(g.encode("Hello world").front() == g.bos());
}

TEST_CASE("bpe: llama.cpp's other names for kiln's regexes load as those regexes with llama.cpp's settings") {
  // pre_alias_<pre>.gguf: a tiny tokenizer's vocabulary and merges under another tokenizer.ggml.pre; the ids
  // are HF's with that regex, no normalizer and the alias's ignore_merges.
  struct Alias {
    const char* pre;
    PreTokenizer want;
    bool ignore_merges, add_bos;
  };
  for (const Alias& a :
       {Alias{"stablelm2", PreTokenizer::qwen2, false, false}, Alias{"falcon3", PreTokenizer::llama3, true, true},
        Alias{"dbrx", PreTokenizer::llama3, false, false}, Alias{"starcoder", PreTokenizer::smollm, false, false},
        Alias{"olmo", PreTokenizer::gpt2, false, false}}) {
    const std::string name = std::string("pre_alias_") + a.pre;
    CAPTURE(name);
    const Tokenizer t = Tokenizer::from_gguf(io::GGUFFile(fixture_path(name + ".gguf")));
    CHECK(t.vocabulary().pre == a.want);
    CHECK(t.vocabulary().ignore_merges == a.ignore_merges);
    CHECK(t.add_bos() == a.add_bos);
    check_against_hf(t, name + "_ids.json", 80);
  }
  // Every name in the table resolves to its entry; "gpt-4o" and its aliases to o200k.
  for (const auto& e : text::gguf_pre_tokenizers) CHECK(Tokenizer::gguf_pre_tokenizer(e.name) == e.pre);
  for (const char* n : {"gpt-4o", "llama4", "minimax-m2", "kanana2"})
    CHECK(Tokenizer::gguf_pre_tokenizer(n) == PreTokenizer::o200k);
  CHECK(!Tokenizer::gguf_pre_tokenizer("deepseek-v3"));
}

TEST_CASE("bpe: SmolLM2-135M GGUF encodes and decodes as HF tokenizers with SmolLM2's pre-tokenizer") {
  const io::GGUFFile f(real_model("SmolLM2-135M-Instruct.Q4_1.gguf"));
  const Tokenizer t = Tokenizer::from_gguf(f);
  CHECK(t.model() == TokenizerModel::bpe);
  CHECK(t.vocabulary().pre == PreTokenizer::smollm);
  CHECK(t.size() == 49152);
  CHECK(!t.add_bos());  // tokenizer.ggml.add_bos_token = false
  CHECK(t.piece(t.eos()) == "<|im_end|>");
  CHECK(t.is_eog(t.eos()));
  check_against_hf(t, "smollm2_ids.json");
  // Chat markup: control tokens only with parse_special; rendered only when asked.
  const Ids ids = t.encode("<|im_start|>user\nHi<|im_end|>", {.add_special = false, .parse_special = true});
  CHECK(ids.front() == t.find("<|im_start|>"));
  CHECK(ids.back() == t.find("<|im_end|>"));
  CHECK(t.decode(ids) == "user\nHi");
  CHECK(t.decode(ids, {.render_special = true}) == "<|im_start|>user\nHi<|im_end|>");
  CHECK(t.token_bytes(ids.front()).empty());
  // Throughput (reported, not checked): the corpus repeated to ~400 KB.
  std::string big;
  const json fx = read_json("smollm2_ids.json");
  for (const json& c : fx.at("cases")) big += c.at("text").get<std::string>() + "\n";
  const std::string one = big;
  while (big.size() < 400000) big += one;
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t n = t.encode(big, {.add_special = false}).size();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("SmolLM2 encode: ", big.size() / 1e6 / s, " MB/s (", n / s / 1e6, " M tokens/s)");
}

TEST_CASE("tokenizer: Gemma 3 GGUF (SentencePiece, 262144 tokens) matches HF's conversion and loads fast") {
  const io::GGUFFile f(real_model("gemma-3-270m-q4_k_m.gguf"));
  const auto t0 = std::chrono::steady_clock::now();
  const Tokenizer t = Tokenizer::from_gguf(f);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("Gemma 3 tokenizer (", t.size(), " tokens) built in ", ms, " ms");
  CHECK(ms < 5000);  // linear setup is ~100 ms in release; a quadratic one would take hours
  CHECK(t.model() == TokenizerModel::spm);
  CHECK(t.size() == 262144);
  const json fx = read_json("gemma3_ids.json");
  REQUIRE(t.add_bos());
  CHECK(t.bos() == fx.at("bos").get<int32_t>());
  CHECK(t.encode("Hi").front() == t.bos());
  check_against_hf(t, "gemma3_ids.json");
}

TEST_CASE("tokenizer: a copied or moved Tokenizer works after the original is gone (HF fixtures)") {
  // The piece index holds token ids into the Tokenizer's own pieces, so copies share nothing with their
  // source; under ASan a dangling reference into a destroyed original would be a use-after-free here.
  std::optional<Tokenizer> bpe(tiny("qwen2_tiny"));
  std::optional<Tokenizer> spm(Tokenizer::from_gguf(io::GGUFFile(real_model("gemma-3-270m-q4_k_m.gguf"))));
  Tokenizer bpe_copy = *bpe;  // copy construction
  Tokenizer spm_copy;
  spm_copy = *spm;                        // copy assignment
  Tokenizer bpe_moved = std::move(*bpe);  // move construction
  Tokenizer spm_moved;
  spm_moved = std::move(*spm);  // move assignment
  bpe.reset();
  spm.reset();
  check_against_hf(bpe_copy, "qwen2_tiny_ids.json");
  check_against_hf(bpe_moved, "qwen2_tiny_ids.json");
  check_against_hf(spm_copy, "gemma3_ids.json");
  check_against_hf(spm_moved, "gemma3_ids.json");
  for (const Tokenizer* t : {&bpe_copy, &spm_copy}) {  // every piece finds itself or its first duplicate
    std::size_t bad = 0;
    for (int32_t i = 0; i < int32_t(t->size()); ++i) {
      if (t->piece(i).empty() && t->type(i) == TokenType::unused) continue;  // unused and empty: not indexed
      const int32_t j = t->find(t->piece(i));
      bad += j < 0 || j > i || t->piece(j) != t->piece(i);
    }
    CHECK(bad == 0);
  }
  const Tokenizer empty;  // a default-constructed Tokenizer finds nothing
  CHECK(empty.find("a") == -1);
}

TEST_CASE("bpe: NFC normalization matches HF tokenizers' NFC normalizer") {
  const json fx = read_json("nfc.json");
  std::size_t bad = 0, changed = 0;
  std::string report;
  for (const json& c : fx) {
    const std::string in = c.at(0).get<std::string>(), want = c.at(1).get<std::string>();
    changed += in != want;
    if (const std::string got = text::nfc(in); got != want && ++bad <= 8)
      report += json(in).dump() + ": HF " + json(want).dump() + ", kiln " + json(got).dump() + "\n";
  }
  INFO(bad, " of ", fx.size(), " differ\n", report);
  CHECK(bad == 0);
  CHECK(changed >= 100);  // the fixture does exercise composition, reordering and decomposition
  CHECK(text::nfc("caf\xC3\xA9 \xFF ok") == "caf\xC3\xA9 \xFF ok");  // invalid bytes pass through
  CHECK(text::nfc("e\xCC\x81\xFF") == "\xC3\xA9\xFF");
}

// ---- behaviour HF cannot show: streaming, invalid UTF-8, errors ----

TEST_CASE("bpe: token bytes split inside UTF-8 characters stream back to the text") {
  const Tokenizer t = tiny("qwen2_tiny");
  const std::string text = "emoji 😀👍🏽 and 中文 with ſ and ½ — done";
  const Ids ids = t.encode(text, {.add_special = false});
  text::Utf8Stream s;
  std::string out;
  bool split_char = false;
  for (int32_t id : ids) {
    out += s.push(t.token_bytes(id));
    split_char |= s.pending() > 0;
  }
  out += s.flush();
  CHECK(split_char);  // some token ended inside a character (the tiny vocabulary has few multi-byte tokens)
  CHECK(out == text);
  CHECK(t.decode(ids) == text);
}

TEST_CASE("bpe: invalid UTF-8 is tokenized losslessly, each bad byte a non-letter character") {
  // Each byte of an ill-formed sequence is one character of no class (as U+FFFD would be after HF's
  // lossy decoding), so the GPT-2 regex cuts "abc", the bad bytes, "def" apart; the bytes themselves are
  // kept, not replaced by U+FFFD's three bytes.
  const Tokenizer t = tiny("gpt2_tiny");
  for (const std::string& bad :
       {std::string("\xFF"), std::string("\xC3"), std::string("\xE2\x82"), std::string("\x80\x80"),
        std::string("\xED\xA0\x80"), std::string("\xF4\x90\x80\x80"), std::string("\xC0\xAF")}) {
    const std::string text = "abc" + bad + "def";
    CAPTURE(json(text::sanitize_utf8(text)).dump());
    const Ids ids = t.encode(text, {.add_special = false});
    std::string bytes;
    for (int32_t id : ids) bytes += t.token_bytes(id);
    CHECK(bytes == text);                               // the raw bytes survive
    CHECK(t.decode(ids) == text::sanitize_utf8(text));  // decode shows U+FFFD
    Ids want = t.encode("abc", {.add_special = false});
    for (const std::string& part : {bad, std::string("def")}) {
      const Ids p = t.encode(part, {.add_special = false});
      want.insert(want.end(), p.begin(), p.end());
    }
    CHECK(ids == want);
  }
  // Qwen2's regex lets a non-letter prefix a word, U+FFFD or a bad byte alike: "abc", "\xFF" "def".
  const Tokenizer q = tiny("qwen2_tiny");
  const Ids ids = q.encode(
      "abc\xFF"
      "def",
      {.add_special = false});
  CHECK(ids.front() == q.find("abc"));
  CHECK(ids.at(1) == q.find(text::ByteAlphabet::get().spell(0xFF)));
  CHECK(q.decode(q.encode("ok\xF0\x9F\x98", {.add_special = false})) ==
        "ok\xEF\xBF\xBD");  // a truncated character at the end
}

TEST_CASE("bpe: random bytes never fail to encode and come back exactly (NFC-normalized for qwen2)") {
  std::mt19937 rng(7);
  const std::vector<Tokenizer> toks{tiny("qwen2_tiny"), tiny("llama3_tiny"), tiny("smollm_tiny"), tiny("gpt2_tiny")};
  const std::string pool = "aZ9 '\t\n\r.\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80\xCC\x81\xC2\xBD\xFF\x80<|im_end|>";
  std::size_t failures = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string s;
    const int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) s += iter % 2 ? char(rng() % 256) : pool[rng() % pool.size()];
    for (const Tokenizer& t : toks) {
      for (bool special : {false, true}) {
        std::string bytes;
        for (int32_t id : t.encode(s, {.add_special = false, .parse_special = special}))
          bytes += t.token_bytes(id, {.render_special = true});
        failures += bytes != (t.vocabulary().nfc ? text::nfc(s) : s);  // qwen2_tiny normalizes first
      }
    }
  }
  CHECK(failures == 0);
}

TEST_CASE("bpe: pre-tokenizers split as their regexes") {
  auto pieces = [](PreTokenizer p, const std::string& s) {
    text::CodePoints cps;
    cps.assign(s);
    std::vector<std::size_t> ends;
    text::pre_tokenize(p, cps, ends);
    std::vector<std::string> out;
    std::size_t b = 0;
    for (std::size_t e : ends) {
      out.push_back(s.substr(cps.offsets[b], cps.offsets[e] - cps.offsets[b]));
      b = e;
    }
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(pieces(PreTokenizer::gpt2, "Hello  world's 123!!") == V{"Hello", " ", " world", "'s", " 123", "!!"});
  CHECK(pieces(PreTokenizer::gpt2, "a \n\nb  ") == V{"a", " \n", "\n", "b", "  "});
  CHECK(pieces(PreTokenizer::smollm, "a  12") == V{"a", "  ", "1", "2"});
  CHECK(pieces(PreTokenizer::qwen2, "I'M 12345 \n\n  x") ==
        V{"I", "'M", " ", "1", "2", "3", "4", "5", " \n\n", " ", " x"});
  CHECK(pieces(PreTokenizer::llama3, "12345 'ſ") == V{"123", "45", " '", "ſ"});
  CHECK(pieces(PreTokenizer::qwen2, "'ſx") == V{"'ſ", "x"});
  CHECK(pieces(PreTokenizer::qwen2, "\thello ...\n\nx") == V{"\thello", " ...\n\n", "x"});
  // o200k: case runs, the second letter alternative, contractions after a word, "/" after punctuation.
  CHECK(pieces(PreTokenizer::o200k, "HelloWorld iPhone ÉCOLEs ABC's") ==
        V{"Hello", "World", " i", "Phone", " ÉCOLEs", " ABC's"});
  CHECK(pieces(PreTokenizer::o200k, "don't 12345 a/b !//\n") == V{"don't", " ", "123", "45", " a", "/b", " !//\n"});
  CHECK(pieces(PreTokenizer::tekken, "don't 12") == V{"don", "'t", " ", "1", "2"});
}

// ---- errors ----

json tiny_json(const std::string& name) { return json::parse(read_text(fixture_path(name + ".tokenizer.json"))); }

std::string load_error(const json& j) {
  try {
    (void)tokenizer_from_hf_json_text(j.dump(), "test.json");
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("bpe: both merge forms load the same tokenizer") {
  json j = tiny_json("qwen2_tiny");
  REQUIRE(j["model"]["merges"][0].is_array());
  const Tokenizer a = tokenizer_from_hf_json_text(j.dump(), "pairs");
  for (json& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const Tokenizer b = tokenizer_from_hf_json_text(j.dump(), "strings");
  const std::string text = "The quick brown fox's 12345 jumps\n\n  over 中文";
  CHECK(a.encode(text) == b.encode(text));
  CHECK(a.encode(text).size() < text.size() / 2);  // merges were applied
}

TEST_CASE("bpe: bad tokenizer.json files are FormatErrors naming the problem") {
  const json base = tiny_json("qwen2_tiny");
  json j = base;
  j["model"]["merges"].push_back(json::array({"Ġ", "notatoken"}));
  CHECK(load_error(j).find("'notatoken' is not in the vocabulary") != std::string::npos);
  j = base;
  j["model"]["merges"][3] = "nospace";
  CHECK(load_error(j).find("merges[3]") != std::string::npos);
  j = base;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\s+";
  CHECK(load_error(j).find("regex \"\\\\p{L}+|\\\\s+\" is not one kiln knows") != std::string::npos);
  j = base;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK(load_error(j).find("'Whitespace'") != std::string::npos);
  j = base;
  j["normalizer"] = {{"type", "Lowercase"}};
  CHECK(load_error(j).find("normalizer 'Lowercase'") != std::string::npos);
  j = base;
  j["model"]["type"] = "Unigram";
  CHECK(load_error(j).find("model type 'Unigram'") != std::string::npos);
  j = base;
  j["added_tokens"][0]["lstrip"] = true;
  CHECK(load_error(j).find("lstrip") != std::string::npos);
  CHECK_THROWS_AS((void)tokenizer_from_hf_json_text("{not json", "x.json"), FormatError);
  CHECK_THROWS_AS((void)Tokenizer::from_hf_json(fixture_path("no_such.tokenizer.json")), Error);
}

io::GGUFWriter bpe_gguf(const std::string& model, const std::string& pre) {
  io::GGUFWriter w;
  w.add("tokenizer.ggml.model", model);
  w.add("tokenizer.ggml.pre", pre);
  w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab"});
  w.add("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  return w;
}

std::string gguf_error(const io::GGUFWriter& w) {
  const auto bytes = w.to_bytes();
  try {
    (void)Tokenizer::from_gguf(io::GGUFFile(std::span<const std::byte>(bytes), "test.gguf"));
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("bpe: GGUF tokenizer models and pre-tokenizers kiln lacks are FormatErrors naming them") {
  {
    const auto bytes = bpe_gguf("gpt2", "gpt2").to_bytes();
    const Tokenizer t = Tokenizer::from_gguf(io::GGUFFile(std::span<const std::byte>(bytes), "ok.gguf"));
    CHECK(t.encode("abab", {.add_special = false}) == Ids{2, 2});
    CHECK(t.encode("ba", {.add_special = false}) == Ids{1, 0});
  }
  CHECK(gguf_error(bpe_gguf("bert", "default")).find("tokenizer.ggml.model = 'bert'") != std::string::npos);
  const std::string unknown = gguf_error(bpe_gguf("gpt2", "deepseek-v3"));
  CHECK(unknown.find("tokenizer.ggml.pre = 'deepseek-v3'") != std::string::npos);
  CHECK(unknown.find("supported: 'default', 'gpt2'") != std::string::npos);  // and lists what is
  CHECK(unknown.find("'gpt-4o'") != std::string::npos);
  CHECK(unknown.find("'tekken'") != std::string::npos);
  io::GGUFWriter w;
  w.add("tokenizer.ggml.model", std::string("gpt2"));
  w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  w.add("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  CHECK(gguf_error(w).find("'ab' is not in the vocabulary") != std::string::npos);
}

}  // namespace
}  // namespace kiln::test
