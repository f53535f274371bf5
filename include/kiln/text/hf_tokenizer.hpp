// kiln/text/hf_tokenizer.hpp - a Hugging Face tokenizer.json with a byte-level BPE model as a kiln::Tokenizer.
//
//   auto tok = kiln::Tokenizer::from_hf_json("model_dir/tokenizer.json");
//
// Read: model (type "BPE": vocab, merges as "a b" strings or ["a", "b"] pairs, ignore_merges), added_tokens
// (special -> control tokens, cut out of text only with parse_special; not special -> user-defined tokens,
// always cut out), the pre-tokenizer, and the post-processor's BOS/EOS (TemplateProcessing "single": a
// special token before $A sets BOS and add_bos, one after it EOS and add_eos). A tokenizer_config.json
// beside the file, when present, names the BOS and EOS tokens (bos_token, eos_token) for is_eog() and
// generation; it does not change what encode() adds.
//
// Pre-tokenizers recognised (anything else is a FormatError naming it, with the Split regex when there is
// one): ByteLevel(use_regex=true) -> gpt2; Sequence[Digits(individual_digits=true), ByteLevel(use_regex=true)]
// -> smollm; Sequence[Split(Regex = the Qwen2, Llama 3, GPT-2, o200k or Tekken pattern, Isolated),
// ByteLevel(use_regex=false)] -> qwen2, llama3, gpt2, o200k (gpt-oss, Phi-4-mini), tekken (Mistral Nemo).
// ByteLevel's add_prefix_space must be false.
// Normalizer: none, or NFC (Qwen2/Qwen3; text/nfc.hpp).
// Not supported (FormatError): other normalizers, byte_fallback, dropout, continuing_subword_prefix /
// end_of_word_suffix, added tokens with lstrip / rstrip / single_word, decoders other than ByteLevel.
// Needs nlohmann-json (kiln/io/json.hpp).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/mmap.hpp"
#include "kiln/text/tokenizer.hpp"

namespace kiln {
namespace text::detail {

using io::json;

inline constexpr std::string_view qwen2_split_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view llama3_split_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view o200k_split_regex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view tekken_split_regex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view gpt2_split_regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class HfJsonReader {
 public:
  explicit HfJsonReader(std::string name) : name_(std::move(name)) {}

  [[noreturn]] void bad(const auto&... parts) const {
    fail<FormatError>("kiln: tokenizer.json '", name_, "': ", parts...);
  }

  const json& member(const json& obj, const char* key, const char* where) const {
    if (!obj.is_object()) bad(where, " is not an object");
    const auto it = obj.find(key);
    if (it == obj.end()) bad(where, " has no '", key, "'");
    return *it;
  }
  std::string str(const json& j, const char* what) const {
    if (!j.is_string()) bad(what, " is a ", io::detail::json_type_name(j), ", expected a string");
    return j.get<std::string>();
  }
  bool flag(const json& obj, const char* key, bool dflt) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean()) bad("'", key, "' is not a boolean");
    return it->get<bool>();
  }
  static std::string type_of(const json& j) {
    if (j.is_null()) return "null";
    const auto it = j.is_object() ? j.find("type") : j.end();
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string("?");
  }

  void byte_level(const json& bl, bool want_regex) const {
    if (flag(bl, "add_prefix_space", true))
      bad("pre_tokenizer ByteLevel has add_prefix_space = true, which kiln does not support");
    if (flag(bl, "use_regex", true) != want_regex)
      bad("pre_tokenizer ByteLevel has use_regex = ", want_regex ? "false" : "true",
          want_regex ? " without a Split before it" : " after a Split");
  }

  PreTokenizer pre_tokenizer(const json& pt) const {
    const std::string t = type_of(pt);
    if (t == "ByteLevel") {
      byte_level(pt, true);
      return PreTokenizer::gpt2;
    }
    if (t != "Sequence") bad("pre_tokenizer of type '", t, "' is not one kiln has (byte-level BPE needs ByteLevel)");
    const json& seq = member(pt, "pretokenizers", "pre_tokenizer Sequence");
    if (!seq.is_array() || seq.size() != 2)
      bad("pre_tokenizer Sequence of ", seq.size(), " steps is not one kiln has (",
          "Digits + ByteLevel, or Split + ByteLevel)");
    const std::string t0 = type_of(seq[0]), t1 = type_of(seq[1]);
    if (t1 != "ByteLevel") bad("pre_tokenizer Sequence ends with '", t1, "', not ByteLevel");
    if (t0 == "Digits") {
      if (!flag(seq[0], "individual_digits", false))
        bad("pre_tokenizer Digits with individual_digits = false is not supported");
      byte_level(seq[1], true);
      return PreTokenizer::smollm;
    }
    if (t0 != "Split") bad("pre_tokenizer Sequence starts with '", t0, "', not Digits or Split");
    const json& pat = member(seq[0], "pattern", "pre_tokenizer Split");
    if (!pat.is_object() || !pat.contains("Regex")) bad("pre_tokenizer Split pattern is not a regex: ", pat.dump());
    const std::string rx = str(pat["Regex"], "pre_tokenizer Split pattern Regex");
    const std::string behavior = str(member(seq[0], "behavior", "pre_tokenizer Split"), "Split behavior");
    if (behavior != "Isolated" || flag(seq[0], "invert", false))
      bad("pre_tokenizer Split with behavior '", behavior, "' (invert ", flag(seq[0], "invert", false),
          ") is not supported (Isolated only)");
    byte_level(seq[1], false);
    if (rx == qwen2_split_regex) return PreTokenizer::qwen2;
    if (rx == llama3_split_regex) return PreTokenizer::llama3;
    if (rx == gpt2_split_regex) return PreTokenizer::gpt2;
    if (rx == o200k_split_regex) return PreTokenizer::o200k;
    if (rx == tekken_split_regex) return PreTokenizer::tekken;
    bad("pre_tokenizer Split regex ", json(rx).dump(),
        " is not one kiln knows (Qwen2, Llama 3, GPT-2, o200k as gpt-oss, Tekken as Mistral Nemo)");
  }

 private:
  std::string name_;
};

/// A token text named in tokenizer_config.json: a string, {"content": ...}, or null.
inline std::optional<std::string> config_token(const json& cfg, const char* key) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace text::detail

/// tokenizer.json text (and optionally tokenizer_config.json text) to a Tokenizer; `name` names the source
/// in errors.
inline Tokenizer tokenizer_from_hf_json_text(std::string_view json_text, std::string_view name,
                                             std::string_view config_text = {}) {
  using io::json;
  const text::detail::HfJsonReader r{std::string(name)};
  const json j = io::detail::parse_json(json_text, "tokenizer.json", name);
  if (!j.is_object()) r.bad("the top level is not an object");
  const json& m = r.member(j, "model", "the file");
  if (const std::string t = r.type_of(m); t != "BPE")
    r.bad("model type '", t, "': kiln reads byte-level BPE tokenizer.json files only (use the GGUF otherwise)");
  if (r.flag(m, "byte_fallback", false)) r.bad("model.byte_fallback = true (SentencePiece-style BPE) is not supported");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    r.bad("model.dropout is set (BPE dropout is not supported)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && !m[k].is_null() && !(m[k].is_string() && m[k].get<std::string>().empty()))
      r.bad("model.", k, " = ", m[k].dump(), " is not supported");
  bool nfc = false;
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    if (r.type_of(j["normalizer"]) != "NFC")
      r.bad("normalizer '", r.type_of(j["normalizer"]), "' is not supported (none, or NFC)");
    nfc = true;
  }
  if (j.contains("decoder") && !j["decoder"].is_null() && r.type_of(j["decoder"]) != "ByteLevel")
    r.bad("decoder '", r.type_of(j["decoder"]), "' is not supported (ByteLevel only)");

  Vocabulary v;
  v.model = TokenizerModel::bpe;
  v.add_bos = false;
  v.add_space_prefix = false;
  v.pre = r.pre_tokenizer(r.member(j, "pre_tokenizer", "the file"));
  v.ignore_merges = r.flag(m, "ignore_merges", false);
  v.nfc = nfc;

  auto put = [&](uint64_t id, std::string text, TokenType type) {
    if (id >= (uint64_t(1) << 31)) r.bad("token id ", id, " is too large");
    if (id >= v.pieces.size()) {
      v.pieces.resize(id + 1);
      v.types.resize(id + 1, TokenType::unused);
    }
    v.pieces[id] = std::move(text);
    v.types[id] = type;
  };
  const json& vocab = r.member(m, "vocab", "model");
  if (!vocab.is_object()) r.bad("model.vocab is not an object");
  for (const auto& [text, idj] : vocab.items()) {
    const auto id = io::detail::json_u64(idj);
    if (!id) r.bad("model.vocab['", text, "'] is not a non-negative integer");
    put(*id, text, TokenType::normal);
  }
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    if (!j["added_tokens"].is_array()) r.bad("added_tokens is not an array");
    for (const json& a : j["added_tokens"]) {
      const auto id = io::detail::json_u64(r.member(a, "id", "an added token"));
      const std::string content = r.str(r.member(a, "content", "an added token"), "added token content");
      if (!id) r.bad("added token '", content, "' has no valid id");
      for (const char* k : {"lstrip", "rstrip", "single_word"})
        if (r.flag(a, k, false)) r.bad("added token '", content, "' has ", k, " = true, which kiln does not support");
      put(*id, content, r.flag(a, "special", false) ? TokenType::control : TokenType::user_defined);
    }
  }
  const json& merges = r.member(m, "merges", "model");
  if (!merges.is_array()) r.bad("model.merges is not an array");
  v.merges.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& e = merges[i];
    if (e.is_string()) {  // "a b"
      const std::string s = e.get<std::string>();
      const std::size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        r.bad("model.merges[", i, "] = ", e.dump(), " is not two tokens separated by one space");
      v.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      v.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      r.bad("model.merges[", i, "] = ", e.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }

  auto find_id = [&](const std::string& text) -> int32_t {
    for (std::size_t i = 0; i < v.pieces.size(); ++i)
      if (v.pieces[i] == text && v.types[i] != TokenType::unused) return int32_t(i);
    return -1;
  };
  // BOS/EOS added by the post-processor (TemplateProcessing "single"; Sequence: its TemplateProcessing).
  const json* tp = nullptr;
  if (j.contains("post_processor") && !j["post_processor"].is_null()) {
    const json& pp = j["post_processor"];
    if (r.type_of(pp) == "TemplateProcessing") tp = &pp;
    else if (r.type_of(pp) == "Sequence" && pp.contains("processors") && pp["processors"].is_array())
      for (const json& p : pp["processors"])
        if (r.type_of(p) == "TemplateProcessing") tp = &p;
  }
  if (tp) {
    const json& single = r.member(*tp, "single", "post_processor TemplateProcessing");
    bool seen_seq = false;
    for (const json& item : single) {
      if (item.contains("Sequence")) {
        seen_seq = true;
      } else if (item.contains("SpecialToken")) {
        const std::string tok = r.str(r.member(item["SpecialToken"], "id", "a SpecialToken"), "SpecialToken id");
        const int32_t id = find_id(tok);
        if (id < 0) r.bad("post_processor adds '", tok, "', which is not a token");
        (seen_seq ? v.eos : v.bos) = id;
        (seen_seq ? v.add_eos : v.add_bos) = true;
      }
    }
  }
  if (!config_text.empty()) {
    const json cfg = io::detail::parse_json(config_text, "tokenizer_config.json", name);
    if (cfg.is_object()) {
      if (const auto t = text::detail::config_token(cfg, "bos_token"); t && find_id(*t) >= 0) v.bos = find_id(*t);
      if (const auto t = text::detail::config_token(cfg, "eos_token"); t && find_id(*t) >= 0) v.eos = find_id(*t);
    }
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {  // a byte with no token becomes this one
    v.unk = find_id(m["unk_token"].get<std::string>());
    if (v.unk < 0) r.bad("model.unk_token '", m["unk_token"].get<std::string>(), "' is not a token");
  }
  if (v.pieces.empty()) r.bad("empty vocabulary");
  try {
    return Tokenizer(std::move(v));
  } catch (const FormatError& e) {
    r.bad(e.what());
  }
}

inline Tokenizer Tokenizer::from_hf_json(const std::filesystem::path& tokenizer_json) {
  const io::MappedFile f(tokenizer_json, io::LoadMode::read);
  std::string config;
  const auto cfg_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  if (std::filesystem::is_regular_file(cfg_path)) {
    const io::MappedFile c(cfg_path, io::LoadMode::read);
    config = std::string(io::detail::as_string_view(c.bytes()));
  }
  return tokenizer_from_hf_json_text(io::detail::as_string_view(f.bytes()), tokenizer_json.string(), config);
}

}  // namespace kiln
