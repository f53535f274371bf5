// hf_to_gguf.hpp - the Hugging Face side of kiln-quantize: a safetensors checkpoint (config.json +
// *.safetensors, sharded or not, + tokenizer files) seen as the GGUF file llama.cpp's
// convert_hf_to_gguf.py would write: llama.cpp's tensor names and metadata keys, q/k rows permuted.
//
// Supported: LlamaForCausalLM and MistralForCausalLM (llama.cpp's LLM_ARCH_LLAMA), without MoE.
// Tokenizer, as convert_hf_to_gguf.py's LlamaModel.set_vocab tries them:
//   tokenizer.model (SentencePiece)  -> tokenizer.ggml.model "llama": pieces, scores, types
//                                       (_create_vocab_sentencepiece, added_tokens_decoder overrides)
//   tokenizer.json, byte-level BPE   -> tokenizer.ggml.model "gpt2": tokens, types, merges, and
//                                       tokenizer.ggml.pre from --tokenizer-pre (llama.cpp derives it
//                                       from a hash of the tokenizer's output, which needs the tokenizer
//                                       itself; without the option "default" is written, with a warning)
// plus gguf-py's SpecialVocab: bos/eos/unk/sep/pad ids, add_bos/add_eos_token, chat_template.
// Not done (each a clear error): other architectures, MoE, rope_scaling other than "linear", and
// tokenizer.json BPE with byte_fallback (llama.cpp's LlamaHfVocab).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/gguf_writer.hpp"
#include "kiln/io/hf_config.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/mmap.hpp"
#include "kiln/io/safetensors.hpp"

namespace kiln_quantize {

using kiln::fail;
using kiln::io::GGMLType;
namespace fs = std::filesystem;

/// One input tensor as the output GGUF will name and shape it.
struct SourceTensor {
  std::string name;                 ///< the output (GGUF) name
  GGMLType type = GGMLType::F32;    ///< how the input stores it
  std::vector<uint64_t> ne;         ///< ggml order: ne[0] = row length
  std::span<const std::byte> data;  ///< the input bytes (memory-mapped)
  /// > 0: llama.cpp's LlamaModel.permute of the rows with this many heads: output row h*hd + 2i + s is
  /// input row h*hd + s*hd/2 + i (HF's rotate_half pairing back to Meta's interleaved one).
  uint64_t permute_heads = 0;

  uint64_t n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : ne) n *= d;
    return n;
  }
};

/// An opened input: its tensors and a function that writes its metadata into the output.
struct Input {
  std::string kind;  ///< "GGUF" or "safetensors"
  std::vector<SourceTensor> tensors;
  uint32_t alignment = 32;
  uint64_t bytes = 0;  ///< size on disk
  /// Adds every metadata pair; file_type is llama.cpp's LLAMA_FTYPE of the output.
  std::function<void(kiln::io::GGUFWriter&, uint32_t file_type)> add_metadata;
  std::shared_ptr<const void> keep_alive;  ///< owns the mapped files the spans point into
};

struct HFOptions {
  std::string tokenizer_pre;  ///< tokenizer.ggml.pre for a byte-level BPE tokenizer.json ("" = "default")
};

namespace detail {

using kiln::io::json;

// ---- SentencePiece tokenizer.model: a protobuf ModelProto; only field 1 (repeated SentencePiece
// {1: piece, 2: score, 3: type}) is read. Every length is checked against the bytes left.
struct SpmPiece {
  std::string piece;
  float score = 0.0f;
  int32_t type = 1;  // NORMAL=1 UNKNOWN=2 CONTROL=3 USER_DEFINED=4 UNUSED=5 BYTE=6
};

class Proto {
 public:
  Proto(std::span<const std::byte> b, const std::string& file) : b_(b), file_(file) {}
  bool done() const { return pos_ >= b_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (done()) error("truncated varint");
      const auto c = std::to_integer<uint8_t>(b_[pos_++]);
      v |= uint64_t(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    error("varint longer than 10 bytes");
  }
  std::span<const std::byte> take(uint64_t n) {
    if (n > b_.size() - pos_) error("field of ", n, " bytes but only ", b_.size() - pos_, " left");
    const auto s = b_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0:
        varint();
        return;
      case 1:
        take(8);
        return;
      case 2:
        take(varint());
        return;
      case 5:
        take(4);
        return;
      default:
        error("unsupported protobuf wire type ", wire);
    }
  }
  template <class... A>
  [[noreturn]] void error(const A&... a) const {
    fail<kiln::FormatError>("kiln-quantize: SentencePiece model '", file_, "' at byte ", pos_, ": ", a...);
  }

 private:
  std::span<const std::byte> b_;
  std::size_t pos_ = 0;
  const std::string& file_;
};

inline std::vector<SpmPiece> read_sentencepiece(const fs::path& path) {
  const kiln::io::MappedFile f(path, kiln::io::LoadMode::read);
  const std::string name = path.string();
  Proto top(f.bytes(), name);
  std::vector<SpmPiece> out;
  while (!top.done()) {
    const uint64_t key = top.varint();
    if (key >> 3 != 1 || (key & 7) != 2) {
      top.skip(uint32_t(key & 7));
      continue;
    }
    Proto p(top.take(top.varint()), name);
    SpmPiece sp;
    while (!p.done()) {
      const uint64_t k = p.varint();
      if (k == (1 << 3 | 2)) {
        const auto s = p.take(p.varint());
        sp.piece.assign(reinterpret_cast<const char*>(s.data()), s.size());
      } else if (k == (2 << 3 | 5)) {
        std::memcpy(&sp.score, p.take(4).data(), 4);
      } else if (k == (3 << 3 | 0)) {
        sp.type = int32_t(p.varint());
      } else {
        p.skip(uint32_t(k & 7));
      }
    }
    out.push_back(std::move(sp));
  }
  if (out.empty()) top.error("no pieces (is this a SentencePiece model?)");
  return out;
}

inline std::optional<json> read_json(const fs::path& p) {
  if (!fs::is_regular_file(p)) return std::nullopt;
  const kiln::io::MappedFile f(p, kiln::io::LoadMode::read);
  return kiln::io::detail::parse_json(kiln::io::detail::as_string_view(f.bytes()), "JSON", p.string());
}

// convert_hf_to_gguf.py's does_token_look_special.
inline bool looks_special(std::string_view t) {
  auto wrapped = [&](std::string_view a, std::string_view b) {
    return t.size() >= a.size() + b.size() && t.starts_with(a) && t.ends_with(b);
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xef\xbd\x9c", "\xef\xbd\x9c>");
}

inline std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  for (std::size_t i = 0; (i = s.find(from, i)) != std::string::npos; i += to.size()) s.replace(i, from.size(), to);
  return s;
}

/// The tokenizer.* metadata, collected first and written by the metadata callback.
struct Vocab {
  std::string model, pre;
  std::vector<std::string> tokens;
  std::vector<float> scores;  // llama only
  std::vector<int32_t> types;
  std::vector<std::string> merges;                            // gpt2 only
  std::vector<std::pair<std::string, uint32_t>> special_ids;  // key suffix ("bos"), id
  std::vector<std::pair<std::string, bool>> add_special;      // "bos", add
  std::optional<std::string> chat_template;
};

// convert_hf_to_gguf.py's _create_vocab_sentencepiece.
inline void sentencepiece_vocab(const fs::path& dir, int64_t vocab_size, Vocab& v) {
  const auto pieces = read_sentencepiece(dir / "tokenizer.model");
  const std::size_t n = vocab_size > 0 ? std::size_t(vocab_size) : pieces.size();
  v.model = "llama";
  v.pre = "default";
  v.tokens.resize(n);
  v.scores.assign(n, -10000.0f);
  v.types.assign(n, 5);  // UNUSED
  for (std::size_t i = 0; i < n; ++i) v.tokens[i] = "[PAD" + std::to_string(i) + "]";
  for (std::size_t i = 0; i < pieces.size() && i < n; ++i) {
    const auto& p = pieces[i];
    v.tokens[i] = p.piece;
    v.scores[i] = p.score;
    v.types[i] = (p.type == 2 || p.type == 3 || p.type == 5 || p.type == 6) ? p.type : 1;  // USER_DEFINED -> NORMAL
  }
  if (const auto added = read_json(dir / "added_tokens.json")) {
    for (const auto& [key, id] : added->items()) {
      const auto i = kiln::io::detail::json_u64(id);
      if (!i) fail<kiln::FormatError>("kiln-quantize: added_tokens.json: id of '", key, "' is not an integer");
      if (*i >= n) continue;
      v.tokens[*i] = key;
      v.scores[*i] = -1000.0f;
      v.types[*i] = 4;  // USER_DEFINED
    }
  }
  if (const auto tc = read_json(dir / "tokenizer_config.json"); tc && tc->contains("added_tokens_decoder")) {
    for (const auto& [key, data] : (*tc)["added_tokens_decoder"].items()) {
      const std::size_t id = std::stoul(key);
      if (id >= n || !data.is_object() || !data.contains("content")) continue;
      std::string tok = data["content"].get<std::string>();
      if (data.value("special", false) || looks_special(tok)) {
        v.types[id] = 3;  // CONTROL
      } else {
        tok = replace_all(tok, "\xe2\x96\x81", " ");  // pre-normalize user-defined spaces
        v.types[id] = 4;
      }
      v.scores[id] = -1000.0f;
      v.tokens[id] = tok;
    }
  }
}

// convert_hf_to_gguf.py's get_vocab_base for a byte-level BPE tokenizer.json (_set_vocab_gpt2).
inline void bpe_vocab(const json& tj, const fs::path& file, int64_t vocab_size, const HFOptions& opt, Vocab& v) {
  const auto err = [&](const auto&... a) { fail<kiln::FormatError>("kiln-quantize: '", file.string(), "': ", a...); };
  const json& m = tj.at("model");
  if (m.value("type", "") != "BPE") err("model type '", m.value("type", "?"), "' is not BPE");
  if (m.value("byte_fallback", false))
    err("a BPE tokenizer with byte_fallback (llama.cpp's LlamaHfVocab) is not supported yet; add tokenizer.model");
  std::map<uint64_t, std::string> by_id;
  for (const auto& [tok, id] : m.at("vocab").items()) by_id[id.get<uint64_t>()] = tok;
  std::map<uint64_t, std::pair<std::string, bool>> added;  // id -> content, special
  if (tj.contains("added_tokens"))
    for (const auto& a : tj["added_tokens"]) {
      const uint64_t id = a.at("id").get<uint64_t>();
      added[id] = {a.at("content").get<std::string>(), a.value("special", false)};
      by_id[id] = a.at("content").get<std::string>();
    }
  const std::size_t n = vocab_size > 0 ? std::size_t(vocab_size) : (by_id.empty() ? 0 : by_id.rbegin()->first + 1);
  v.model = "gpt2";
  v.pre = opt.tokenizer_pre.empty() ? "default" : opt.tokenizer_pre;
  if (opt.tokenizer_pre.empty())
    std::fprintf(
        stderr,
        "kiln-quantize: warning: byte-level BPE tokenizer: writing tokenizer.ggml.pre = \"default\"; llama.cpp "
        "derives it from the tokenizer's output (pass --tokenizer-pre, e.g. smollm, llama-bpe, qwen2, gpt-2)\n");
  for (std::size_t i = 0; i < n; ++i) {
    const auto it = by_id.find(i);
    if (it == by_id.end()) {
      v.tokens.push_back("[PAD" + std::to_string(i) + "]");
      v.types.push_back(4);
    } else if (const auto a = added.find(i); a != added.end()) {
      const bool special = a->second.second || looks_special(a->second.first);
      v.tokens.push_back(special ? a->second.first : replace_all(a->second.first, "\xe2\x96\x81", " "));
      v.types.push_back(special ? 3 : 4);
    } else {
      v.tokens.push_back(it->second);
      v.types.push_back(1);
    }
  }
  for (const auto& mg : m.value("merges", json::array())) {
    if (mg.is_string()) v.merges.push_back(mg.get<std::string>());
    else if (mg.is_array() && mg.size() == 2)
      v.merges.push_back(mg[0].get<std::string>() + " " + mg[1].get<std::string>());
    else err("a merge is neither \"a b\" nor [\"a\", \"b\"]");
  }
}

// gguf-py's SpecialVocab: ids from tokenizer_config.json's *_token strings (looked up in
// tokenizer.json's added_tokens), then config.json's *_token_id; add_*_token; chat_template.
inline void special_vocab(const fs::path& dir, const kiln::io::HFConfig& cfg, const std::optional<json>& tj, Vocab& v) {
  const auto tc = read_json(dir / "tokenizer_config.json");
  static constexpr std::string_view kinds[] = {"bos", "eos", "unk", "sep", "pad", "cls", "mask"};
  std::map<std::string, uint32_t, std::less<>> ids;
  const auto set = [&](std::string_view kind, uint64_t id) {
    if (id < v.tokens.size() && !ids.count(kind)) {
      ids.emplace(std::string(kind), uint32_t(id));
      v.special_ids.emplace_back(std::string(kind), uint32_t(id));
    }
  };
  if (tc) {
    for (const auto kind : kinds) {
      const std::string key = std::string(kind) + "_token";
      if (!tc->contains(key) || !tj || !tj->contains("added_tokens")) continue;
      const json& e = (*tc)[key];
      const std::string content = e.is_string()                            ? e.get<std::string>()
                                  : e.is_object() && e.contains("content") ? e["content"].get<std::string>()
                                                                           : "";
      if (content.empty()) continue;
      for (const auto& a : (*tj)["added_tokens"])
        if (a.value("content", "") == content) set(kind, a.at("id").get<uint64_t>());
    }
    for (const auto kind : {"bos", "eos", "sep"}) {
      const std::string key = std::string("add_") + kind + "_token";
      if (tc->contains(key) && (*tc)[key].is_boolean()) v.add_special.emplace_back(kind, (*tc)[key].get<bool>());
    }
    if (tc->contains("chat_template") && (*tc)["chat_template"].is_string())
      v.chat_template = (*tc)["chat_template"].get<std::string>();
  }
  if (!v.chat_template && fs::is_regular_file(dir / "chat_template.jinja")) {
    const kiln::io::MappedFile f(dir / "chat_template.jinja", kiln::io::LoadMode::read);
    v.chat_template = std::string(kiln::io::detail::as_string_view(f.bytes()));
  }
  for (const auto kind : kinds)
    if (const auto id = cfg.find<int64_t>(std::string(kind) + "_token_id"); id && *id >= 0) set(kind, uint64_t(*id));
}

inline void write_vocab(kiln::io::GGUFWriter& w, const Vocab& v) {
  w.add("tokenizer.ggml.model", v.model);
  w.add("tokenizer.ggml.pre", v.pre);
  w.add("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.add("tokenizer.ggml.scores", v.scores);
  w.add("tokenizer.ggml.token_type", v.types);
  if (!v.merges.empty()) w.add("tokenizer.ggml.merges", v.merges);
  static const std::map<std::string, std::string, std::less<>> key = {
      {"bos", "bos_token_id"},     {"eos", "eos_token_id"}, {"unk", "unknown_token_id"}, {"sep", "seperator_token_id"},
      {"pad", "padding_token_id"}, {"cls", "cls_token_id"}, {"mask", "mask_token_id"}};
  for (const auto& [kind, id] : v.special_ids) w.add("tokenizer.ggml." + key.at(kind), id);
  for (const auto& [kind, add] : v.add_special) w.add("tokenizer.ggml.add_" + kind + "_token", add);
  if (v.chat_template) w.add("tokenizer.chat_template", *v.chat_template);
}

// HF tensor name -> llama.cpp name, for LLM_ARCH_LLAMA (convert_hf_to_gguf.py + gguf-py's tensor_mapping).
struct Mapped {
  std::string name;
  int layer = -1;   // -1: not per layer
  int permute = 0;  // 1: q (n_head), 2: k (n_kv_head)
  bool skip = false;
};
inline std::optional<Mapped> map_llama_name(std::string_view n) {
  if (n.ends_with("rotary_emb.inv_freq")) return Mapped{"", -1, 0, true};
  if (n == "model.embed_tokens.weight") return Mapped{"token_embd.weight"};
  if (n == "model.norm.weight") return Mapped{"output_norm.weight"};
  if (n == "lm_head.weight") return Mapped{"output.weight"};
  constexpr std::string_view pre = "model.layers.";
  if (!n.starts_with(pre)) return std::nullopt;
  n.remove_prefix(pre.size());
  const auto dot = n.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 6) return std::nullopt;
  int layer = 0;
  for (char c : n.substr(0, dot)) {
    if (c < '0' || c > '9') return std::nullopt;
    layer = layer * 10 + (c - '0');
  }
  const auto rest = n.substr(dot + 1);
  const auto suffix_at = rest.rfind('.');
  if (suffix_at == std::string_view::npos) return std::nullopt;
  const auto stem = rest.substr(0, suffix_at), suffix = rest.substr(suffix_at);  // ".weight" / ".bias"
  static const std::pair<std::string_view, std::string_view> table[] = {
      {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},      {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},           {"mlp.down_proj", "ffn_down"}};
  for (const auto& [hf, gg] : table)
    if (stem == hf && (suffix == ".weight" || suffix == ".bias"))
      return Mapped{"blk." + std::to_string(layer) + "." + std::string(gg) + std::string(suffix), layer,
                    gg == "attn_q"   ? 1
                    : gg == "attn_k" ? 2
                                     : 0};
  return std::nullopt;
}

}  // namespace detail

/// Opens a Hugging Face checkpoint directory (or a .safetensors / index .json file inside one) as the
/// llama.cpp GGUF convert_hf_to_gguf.py would write for it.
inline Input open_hf(const fs::path& path, const HFOptions& opt = {}) {
  using detail::json;
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (!fs::is_regular_file(dir / "config.json"))
    fail<kiln::FormatError>("kiln-quantize: '", path.string(), "': a safetensors checkpoint needs config.json in '",
                            dir.string(), "'");
  const auto cfg = kiln::io::load_hf_config(dir);
  const std::string arch = cfg.architectures.empty() ? "" : cfg.architectures[0];
  if (!((arch == "LlamaForCausalLM" || arch == "MistralForCausalLM") ||
        (arch.empty() && (cfg.model_type == "llama" || cfg.model_type == "mistral"))))
    fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': architecture '", arch, "' (model_type '",
                            cfg.model_type,
                            "') is not supported yet for safetensors input; supported: "
                            "LlamaForCausalLM, MistralForCausalLM (llama.cpp's 'llama'). A GGUF of it converts fine.");
  if (cfg.contains("num_local_experts") || cfg.contains("num_experts"))
    fail<kiln::FormatError>("kiln-quantize: '", dir.string(),
                            "': mixture-of-experts checkpoints are not supported yet");
  if (cfg.rope_scaling && !(cfg.rope_scaling->type == "linear"))
    fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': rope_scaling type '", cfg.rope_scaling->type,
                            "' is not supported yet (only 'linear')");

  auto ck = std::make_shared<kiln::io::SafetensorsCheckpoint>(fs::is_directory(path) ? dir : path);
  Input in;
  in.kind = "safetensors";
  for (const auto& f : ck->files()) in.bytes += f.bytes().size();
  const uint64_t n_head = uint64_t(cfg.num_attention_heads), n_kv = uint64_t(cfg.num_key_value_heads);
  const uint64_t hd = uint64_t(cfg.head_dim), d = uint64_t(cfg.hidden_size), ff = uint64_t(cfg.intermediate_size);

  // Tensors, checked against config.json, in llama.cpp's order: token_embd, blk.0 ... blk.N-1, output_norm, output.
  std::vector<std::pair<std::tuple<int, int, std::string>, SourceTensor>> found;
  for (const auto hf_name : ck->tensor_names()) {
    const auto m = detail::map_llama_name(hf_name);
    if (!m)
      fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': tensor '", hf_name,
                              "' has no llama.cpp name (convert_hf_to_gguf.py would stop too: 'Can not map tensor')");
    if (m->skip) continue;
    const auto& t = ck->tensor(hf_name);
    SourceTensor s;
    s.name = m->name;
    switch (t.dtype) {
      case kiln::io::SafetensorsDType::F32:
        s.type = GGMLType::F32;
        break;
      case kiln::io::SafetensorsDType::F16:
        s.type = GGMLType::F16;
        break;
      case kiln::io::SafetensorsDType::BF16:
        s.type = GGMLType::BF16;
        break;
      default:
        fail<kiln::FormatError>("kiln-quantize: '", t.file, "': tensor '", hf_name, "' has dtype ",
                                kiln::io::safetensors_dtype_info(t.dtype).name, "; supported: F32, F16, BF16");
    }
    for (std::size_t r = t.rank(); r-- > 0;) s.ne.push_back(t.extent(r));
    s.data = t.data;
    const bool is_vec = m->name.find("norm") != std::string::npos || m->name.ends_with(".bias");
    uint64_t rows = 0, cols = d;  // the shape config.json implies, (rows, cols) or (rows) for vectors
    const std::string stem = m->name.substr(0, m->name.rfind('.'));
    if (m->layer >= cfg.num_hidden_layers)
      fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': tensor '", hf_name, "' is for layer ", m->layer,
                              " but config.json says num_hidden_layers = ", cfg.num_hidden_layers);
    if (stem.ends_with("attn_q")) rows = n_head * hd;
    else if (stem.ends_with("attn_k") || stem.ends_with("attn_v")) rows = n_kv * hd;
    else if (stem.ends_with("attn_output")) rows = d, cols = n_head * hd;
    else if (stem.ends_with("ffn_gate") || stem.ends_with("ffn_up")) rows = ff;
    else if (stem.ends_with("ffn_down")) rows = d, cols = ff;
    else if (stem == "token_embd" || stem == "output") rows = uint64_t(cfg.vocab_size);
    else rows = d;  // norms
    if (m->permute) s.permute_heads = m->permute == 1 ? n_head : n_kv;
    const bool ok =
        is_vec ? (s.ne.size() == 1 && s.ne[0] == rows) : (s.ne.size() == 2 && s.ne[1] == rows && s.ne[0] == cols);
    if (!ok)
      fail<kiln::FormatError>(
          "kiln-quantize: '", dir.string(), "': tensor '", hf_name, "' has shape ", t.shape.str(),
          " but config.json implies ",
          is_vec ? "(" + std::to_string(rows) + ")" : "(" + std::to_string(rows) + ", " + std::to_string(cols) + ")");
    if (s.permute_heads && rows % (s.permute_heads * 2) != 0)
      fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': tensor '", hf_name, "': ", rows,
                              " rows do not split into ", s.permute_heads, " heads of an even size");
    const int group = stem == "token_embd" ? 0 : m->layer >= 0 ? 1 : stem == "output_norm" ? 2 : 3;
    found.push_back({{group, m->layer, m->name}, std::move(s)});
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& f : found) in.tensors.push_back(std::move(f.second));
  std::vector<std::string> need = {"token_embd.weight", "output_norm.weight"};
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)
    for (const char* s :
         {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"})
      need.push_back("blk." + std::to_string(l) + "." + s + ".weight");
  for (const auto& n : need)
    if (std::none_of(in.tensors.begin(), in.tensors.end(), [&](const SourceTensor& t) { return t.name == n; }))
      fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': the checkpoint has no tensor for llama.cpp's '", n,
                              "'");

  // Tokenizer.
  auto vocab = std::make_shared<detail::Vocab>();
  try {
    const auto tj = detail::read_json(dir / "tokenizer.json");
    if (fs::is_regular_file(dir / "tokenizer.model")) detail::sentencepiece_vocab(dir, cfg.vocab_size, *vocab);
    else if (tj) detail::bpe_vocab(*tj, dir / "tokenizer.json", cfg.vocab_size, opt, *vocab);
    else fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "' has neither tokenizer.model nor tokenizer.json");
    detail::special_vocab(dir, cfg, tj, *vocab);
  } catch (const json::exception& e) {  // a field of an unexpected JSON type in the tokenizer files
    fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': unexpected tokenizer file contents: ", e.what());
  } catch (const std::logic_error& e) {  // std::stoul on an added_tokens_decoder key
    fail<kiln::FormatError>("kiln-quantize: '", dir.string(), "': unexpected tokenizer file contents: ", e.what());
  }

  // Metadata in convert_hf_to_gguf.py's order (TextModel then LlamaModel.set_gguf_parameters, vocab last).
  std::string name = cfg.find<std::string>("_name_or_path").value_or("");
  if (name.empty() || name.find('/') != std::string::npos)
    name = fs::absolute(dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::absolute(dir).lexically_normal().parent_path().filename().string();
  in.add_metadata = [cfg, vocab, name](kiln::io::GGUFWriter& w, uint32_t file_type) {
    const std::string a = "llama.";
    w.add("general.architecture", "llama");
    w.add("general.type", "model");
    w.add("general.name", name);
    w.add(a + "block_count", uint32_t(cfg.num_hidden_layers));
    if (cfg.max_position_embeddings > 0) w.add(a + "context_length", uint32_t(cfg.max_position_embeddings));
    w.add(a + "embedding_length", uint32_t(cfg.hidden_size));
    w.add(a + "feed_forward_length", uint32_t(cfg.intermediate_size));
    w.add(a + "attention.head_count", uint32_t(cfg.num_attention_heads));
    w.add(a + "attention.head_count_kv", uint32_t(cfg.num_key_value_heads));
    if (cfg.contains("rope_theta")) w.add(a + "rope.freq_base", float(cfg.rope_theta));
    w.add(a + "attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps));
    if (cfg.find<int64_t>("head_dim")) {
      w.add(a + "attention.key_length", uint32_t(cfg.head_dim));
      w.add(a + "attention.value_length", uint32_t(cfg.head_dim));
    }
    w.add("general.file_type", file_type);
    w.add(a + "vocab_size", uint32_t(cfg.vocab_size));
    w.add(a + "rope.dimension_count", uint32_t(cfg.head_dim));
    if (cfg.rope_scaling && cfg.rope_scaling->type == "linear") {
      w.add(a + "rope.scaling.type", "linear");
      w.add(a + "rope.scaling.factor", float(cfg.rope_scaling->factor));
    }
    w.add("general.quantization_version", uint32_t(2));
    detail::write_vocab(w, *vocab);
  };
  in.keep_alive = ck;
  return in;
}

}  // namespace kiln_quantize
