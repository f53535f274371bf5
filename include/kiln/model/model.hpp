// kiln/model/model.hpp - loading a model (kiln::load), and a Session that runs one sequence on it.
//
//   auto model = kiln::load("model.gguf");              // picks Transformer<Config> from general.architecture
//   auto hf = kiln::load("path/to/hf_model_dir");       // config.json + *.safetensors: from model_type
//   kiln::Session s(model, {.ctx = 2048, .threads = 2});
//   auto logits = s.eval(model.tokenizer().encode("Once upon a time"));   // (vocab) of the last token
//
// Model is a cheap, shareable handle (the weights stay memory-mapped, shared by every Session). A
// Session owns what one sequence needs, allocated once: KV cache, activation arena, RoPE tables, logits
// and a thread pool. eval() appends tokens to the sequence (the prompt in batches of up to .batch
// tokens, then one token per step) and never allocates; reset() starts a new sequence in the same memory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/io/llama2c.hpp"
#include "kiln/model/arch/all.hpp"
#include "kiln/model/transformer.hpp"
#include "kiln/text/tokenizer.hpp"

// Hugging Face checkpoints need nlohmann-json (config.json, safetensors headers); without it kiln::load
// reads GGUF files only.
#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#define KILN_HAS_HF_LOADER 1
#include "kiln/model/hf_model.hpp"
#else
#define KILN_HAS_HF_LOADER 0
#endif

namespace kiln {

namespace detail {
/// Builds the tuple of the X-macro's list: ArchList<>::add<A>::add<B>::tuple is std::tuple<A, B>.
template <class... Cs>
struct ArchList {
  template <class C>
  using add = ArchList<Cs..., C>;
  using tuple = std::tuple<Cs...>;
};
}  // namespace detail

/// The architectures kiln::load recognises: GGUF general.architecture == Config::name, Hugging Face
/// config.json model_type in Config::hf_model_types. The list is model/arch/all.hpp's
/// KILN_DETAIL_FOR_EACH_ARCHITECTURE: add a Config there to register it.
#define KILN_DETAIL_ADD_ARCHITECTURE(C) ::add<C>
using Architectures = detail::ArchList<> KILN_DETAIL_FOR_EACH_ARCHITECTURE(KILN_DETAIL_ADD_ARCHITECTURE)::tuple;
#undef KILN_DETAIL_ADD_ARCHITECTURE

inline std::vector<std::string_view> supported_architectures() {
  return std::apply([](auto... c) { return std::vector<std::string_view>{decltype(c)::name...}; }, Architectures{});
}

struct LoadOptions {
  /// Map the file (default) or read it into memory. Mapped, the tensors read a few bytes at a time (an
  /// untied token embedding, norm vectors) are advised MADV_NOHUGEPAGE and MADV_RANDOM (weights.hpp's
  /// advise_sparse_tensors): a row read then maps its own pages, not a 2 MiB page-cache folio.
  io::LoadMode mode = io::LoadMode::map;
  /// Repack weight matrices at load into the layouts the kernels read fastest (pack_weights,
  /// model/weights.hpp): f16/bf16 into packed rows (ops/matmul.hpp), so the decode GEMV reads each group of
  /// 8 rows as one stream (1.6x on a 1B F16 model's decode; bit-identical results); q4_0, q4_1, q5_0, q5_1,
  /// q8_0, q4_K and mxfp4 into 16-row interleaved groups (quant/interleave.hpp), so the decode GEMV needs no
  /// byte permutes or cross-lane sums and the prompt GEMM no panel decode (prompt results bit-identical;
  /// decode results as exact, f32 sums in another order). The groups only where the kernels read them
  /// (AVX3_DL, AVX2 and AVX3: all seven); other targets keep them row-major. The layout is chosen for the
  /// target dispatched at load: a model loaded under one kiln::simd::force_target and run under another
  /// still computes the same results, only slower. In place with LoadMode::read; with
  /// LoadMode::map into owned memory, their mapped pages released (a mapped file is never written). The
  /// matrices then have no row-major view (WeightRef::view fails; linear() reads them). Other types are
  /// not affected.
  bool pack = true;
};

class Model {
 public:
  Model() = default;
  explicit Model(std::shared_ptr<const detail::ModelImpl> impl) : impl_(std::move(impl)) {}

  explicit operator bool() const { return impl_ != nullptr; }
  const HParams& hparams() const { return impl().hparams(); }
  const Tokenizer& tokenizer() const { return impl().tokenizer(); }
  /// The model's own chat template (GGUF tokenizer.chat_template; for a Hugging Face checkpoint
  /// chat_template.jinja or tokenizer_config.json; Gemma 3 files without one get Gemma 3's), read at load.
  /// Throws kiln::FormatError saying why when the model has none or kiln cannot run it.
  const ChatTemplate& chat_template() const { return impl().chat_template(); }
  std::string_view architecture() const { return impl().hparams().arch; }
  const detail::ModelImpl& impl() const {
    if (!impl_) fail("kiln::Model: empty model (load one with kiln::load)");
    return *impl_;
  }
  const std::shared_ptr<const detail::ModelImpl>& shared() const { return impl_; }

 private:
  std::shared_ptr<const detail::ModelImpl> impl_;
};

namespace detail {
/// The one place a built-in loader constructs a Transformer<C> (see KILN_EXTERN_ARCHITECTURES below).
template <class C>
std::shared_ptr<const ModelImpl> make_transformer(HParams hp, ModelWeights w, Tokenizer tok,
                                                  std::shared_ptr<const void> owner) {
  return std::make_shared<Transformer<C>>(std::move(hp), std::move(w), std::move(tok), std::move(owner));
}

template <class C>
std::shared_ptr<const ModelImpl> make_gguf_model(std::shared_ptr<io::GGUFFile> f, bool pack) {
  HParams hp = read_gguf_hparams<C>(*f);
  ModelWeights w = load_gguf_weights<C>(*f, hp);
  if (io::MappedFile* mf = f->mapped_file()) {
    if (pack) pack_weights(w, *mf);
    advise_sparse_tensors(f->tensors(), w, *mf);  // mapped only
  }
  Tokenizer tok = Tokenizer::from_gguf(*f);
  if (tok.size() > hp.vocab)
    fail<FormatError>("kiln: GGUF file '", f->name(), "': the tokenizer has ", tok.size(),
                      " tokens but the embedding only ", hp.vocab, " rows");
  // The chat template is read now (a file without one, or with one kiln cannot run, still loads: the
  // reason is what Model::chat_template() throws).
  std::optional<ChatTemplate> chat;
  std::string why_not;
  try {
    chat = ChatTemplate::from_gguf(*f);
  } catch (const Error& e) {
    why_not = e.what();
  }
  // The metadata's pages (Gemma 3's 262,144 token texts, scores and types: 6 MiB) are read: they leave the
  // resident set (a later read maps them again).
  if (const io::MappedFile* mf = f->mapped_file()) mf->release(mf->data(), std::size_t(f->data_offset()));
  auto impl = std::make_shared<Transformer<C>>(std::move(hp), std::move(w), std::move(tok), std::move(f));
  impl->set_chat_template(std::move(chat), std::move(why_not));
  return impl;
}

}  // namespace detail
}  // namespace kiln

// KILN_EXTERN_ARCHITECTURES: compile kiln::load and the built-in architectures once. kiln::load compiles
// the file readers (GGUF, safetensors, config.json) and every built-in architecture's loader and forward
// pass into each translation unit that calls it: about 25 s at -O3. A program with several such files may
// define KILN_EXTERN_ARCHITECTURES in all of them (a compile definition) and include
// kiln/model/instantiate.hpp in exactly one .cpp, which then holds that code once (forgetting that file is
// a link error naming kiln::detail::load_file). kiln's own tests, benchmarks and examples are built this
// way (cmake/kiln_impl_model.cpp); a user-written Config is unaffected.
//
// Explicit instantiations (declarations with EXTERN = extern), at global scope, fully qualified, one set per
// entry of KILN_DETAIL_FOR_EACH_ARCHITECTURE (model/arch/all.hpp).
#if KILN_HAS_HF_LOADER
#define KILN_DETAIL_HF_MODEL_TEMPLATE(EXTERN, C)                                                                 \
  EXTERN template std::shared_ptr<const kiln::detail::ModelImpl> kiln::detail::make_hf_model<kiln::C>(           \
      const std::filesystem::path&, const kiln::io::HFConfig&, std::shared_ptr<kiln::io::SafetensorsCheckpoint>, \
      bool);
#else
#define KILN_DETAIL_HF_MODEL_TEMPLATE(EXTERN, C)
#endif
#define KILN_DETAIL_ARCHITECTURE_TEMPLATES(EXTERN, C)                                                     \
  EXTERN template class kiln::Transformer<kiln::C>;                                                       \
  EXTERN template std::shared_ptr<const kiln::detail::ModelImpl> kiln::detail::make_transformer<kiln::C>( \
      kiln::HParams, kiln::ModelWeights, kiln::Tokenizer, std::shared_ptr<const void>);                   \
  EXTERN template std::shared_ptr<const kiln::detail::ModelImpl> kiln::detail::make_gguf_model<kiln::C>(  \
      std::shared_ptr<kiln::io::GGUFFile>, bool);                                                         \
  KILN_DETAIL_HF_MODEL_TEMPLATE(EXTERN, C)
#if defined(KILN_EXTERN_ARCHITECTURES) && !defined(KILN_DETAIL_INSTANTIATING_ARCHITECTURES)
#define KILN_DETAIL_EXTERN_ARCHITECTURE(C) KILN_DETAIL_ARCHITECTURE_TEMPLATES(extern, C)
KILN_DETAIL_FOR_EACH_ARCHITECTURE(KILN_DETAIL_EXTERN_ARCHITECTURE)
#undef KILN_DETAIL_EXTERN_ARCHITECTURE
#endif

namespace kiln {

inline std::vector<std::string_view> supported_hf_model_types() {
  std::vector<std::string_view> out;
  std::apply(
      [&](auto... c) {
        auto add = [&](auto cfg) {
          if constexpr (requires { decltype(cfg)::hf_model_types; })
            for (std::string_view t : decltype(cfg)::hf_model_types) out.push_back(t);
        };
        (add(c), ...);
      },
      Architectures{});
  return out;
}

namespace detail {
inline std::string join_names(const std::vector<std::string_view>& v) {
  std::string s;
  for (auto a : v) s += (s.empty() ? "" : ", ") + std::string(a);
  return s;
}

/// A directory, a .safetensors file or a .safetensors.index.json: a Hugging Face checkpoint.
inline bool is_hf_path(const std::filesystem::path& p) {
  const std::string s = p.filename().string();
  auto ends = [&](std::string_view e) {
    return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
  };
  return std::filesystem::is_directory(p) || ends(".safetensors") || ends(".safetensors.index.json");
}

inline Model load_hf(const std::filesystem::path& path, const LoadOptions& opt) {
#if KILN_HAS_HF_LOADER
  namespace fs = std::filesystem;
  const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
  if (!fs::exists(dir / "config.json"))
    fail<FormatError>("kiln::load: '", path.string(), "' looks like a Hugging Face checkpoint but '",
                      (dir / "config.json").string(), "' does not exist");
  const io::HFConfig cfg = io::load_hf_config(dir / "config.json");
  auto ck = std::make_shared<io::SafetensorsCheckpoint>(path, opt.mode);
  std::shared_ptr<const ModelImpl> impl;
  std::apply(
      [&](auto... c) {
        ((!impl && hf_accepts<decltype(c)>(cfg.model_type)
              ? (impl = make_hf_model<decltype(c)>(dir, cfg, ck, opt.pack), 0)
              : 0),
         ...);
      },
      Architectures{});
  if (!impl)
    fail<FormatError>("kiln::load: '", cfg.source, "' has model_type '", cfg.model_type,
                      "', which kiln does not support (supported: ", join_names(supported_hf_model_types()), ")");
  return Model(std::move(impl));
#else
  (void)opt;
  fail("kiln::load: '", path.string(),
       "' is a Hugging Face checkpoint; reading one needs nlohmann-json "
       "(nlohmann/json.hpp was not found when kiln/model/model.hpp was compiled)");
#endif
}
}  // namespace detail

namespace detail {
// The loaders' bodies are templates (with a dummy parameter) only so that KILN_EXTERN_ARCHITECTURES can
// compile them once: kiln::load and kiln::load_llama2c below call them.
template <int = 0>
Model load_file(const std::filesystem::path& path, const LoadOptions& opt) {
  if (detail::is_hf_path(path)) return detail::load_hf(path, opt);
  auto f = std::make_shared<io::GGUFFile>(path, opt.mode);
  // A copy: the loader releases the metadata's pages, which a view would map again (compared below).
  const std::string arch(f->architecture());
  std::shared_ptr<const detail::ModelImpl> impl;
  std::apply(
      [&](auto... c) {
        ((arch == decltype(c)::name ? (impl = detail::make_gguf_model<decltype(c)>(f, opt.pack), 0) : 0), ...);
      },
      Architectures{});
  if (!impl)
    fail<FormatError>("kiln::load: '", path.string(), "' has general.architecture = '", arch,
                      "', which kiln does not support (supported: ", detail::join_names(supported_architectures()),
                      ")");
  return Model(std::move(impl));
}

template <int = 0>
Model load_llama2c_files(const std::filesystem::path& checkpoint, const std::filesystem::path& tokenizer,
                         const LoadOptions& opt) {
  auto ck = std::make_shared<const io::Llama2cCheckpoint>(checkpoint, opt.mode);
  const auto& c = ck->config();
  HParams hp;
  hp.arch = "llama";
  hp.dim = c.dim;
  hp.n_layers = c.n_layers;
  hp.n_heads = c.n_heads;
  hp.n_kv_heads = c.n_kv_heads;
  hp.head_dim = c.head_dim();
  hp.ffn_dim = c.hidden_dim;
  hp.vocab = c.vocab_size;
  hp.ctx_train = c.seq_len;
  hp.rope_dim = hp.head_dim;
  hp.rope_theta = 10000.0f;  // run.c's constants
  hp.norm_eps = 1e-5f;
  hp.attn_scale = 1.0f / std::sqrt(float(hp.head_dim));
  hp.validate(ck->file().path());
  const std::size_t d = c.dim, kv = hp.kv_dim(), f = c.hidden_dim;
  ModelWeights w;
  w.tok_embd = WeightRef::f32(ck->token_embedding(), c.vocab_size, d, "token_embedding");
  w.output = WeightRef::f32(ck->classifier(), c.vocab_size, d, "wcls");
  w.output_norm = {ck->rms_final(), d};
  w.layers.resize(c.n_layers);
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    auto& L = w.layers[l];
    const std::string s = "[" + std::to_string(l) + "]";
    L.attn_norm = {ck->rms_att(l), d};
    L.ffn_norm = {ck->rms_ffn(l), d};
    L.wq = WeightRef::f32(ck->wq(l), d, d, "wq" + s);
    L.wk = WeightRef::f32(ck->wk(l), kv, d, "wk" + s);
    L.wv = WeightRef::f32(ck->wv(l), kv, d, "wv" + s);
    L.wo = WeightRef::f32(ck->wo(l), d, d, "wo" + s);
    L.w_gate = WeightRef::f32(ck->w1(l), f, d, "w1" + s);
    L.w_down = WeightRef::f32(ck->w2(l), d, f, "w2" + s);
    L.w_up = WeightRef::f32(ck->w3(l), f, d, "w3" + s);
  }
  Tokenizer tok = Tokenizer::from_llama2c(io::read_llama2c_vocab(tokenizer, c.vocab_size));
  return Model(detail::make_transformer<Llama>(std::move(hp), std::move(w), std::move(tok), std::move(ck)));
}
}  // namespace detail

#define KILN_DETAIL_LOADER_TEMPLATES(EXTERN)                                                                      \
  EXTERN template kiln::Model kiln::detail::load_file<0>(const std::filesystem::path&, const kiln::LoadOptions&); \
  EXTERN template kiln::Model kiln::detail::load_llama2c_files<0>(                                                \
      const std::filesystem::path&, const std::filesystem::path&, const kiln::LoadOptions&);
#if defined(KILN_EXTERN_ARCHITECTURES) && !defined(KILN_DETAIL_INSTANTIATING_ARCHITECTURES)
}  // namespace kiln
KILN_DETAIL_LOADER_TEMPLATES(extern)
namespace kiln {
#endif

/// Loads a model: a GGUF file (the architecture from general.architecture), or a Hugging Face
/// checkpoint: a directory with config.json and model.safetensors (or model.safetensors.index.json and
/// its shards), or one of those files beside config.json (the architecture from model_type). The
/// architecture must be one of supported_architectures() / supported_hf_model_types().
inline Model load(const std::filesystem::path& path, const LoadOptions& opt = {}) {
  return detail::load_file<0>(path, opt);
}

namespace detail {
/// Whether a Config's traits are ones the Hugging Face loader reads (Llama-style tensor names); the GPT-2-style
/// traits (rope = false, gated_mlp = false, learned_positions) are read from GGUF files only.
template <class C>
constexpr bool hf_loadable() {
  return uses_rope<C>() && gated_mlp<C>() && !learned_positions<C>();
}

template <ArchConfig... User>
Model load_user(const std::filesystem::path& path, const LoadOptions& opt) {
  std::shared_ptr<const ModelImpl> impl;
  const std::string names = join_names({std::string_view(User::name)...});
  if (is_hf_path(path)) {
#if KILN_HAS_HF_LOADER
    namespace fs = std::filesystem;
    const fs::path dir = fs::is_directory(path) ? path : path.parent_path();
    if (!fs::exists(dir / "config.json")) return load_file<0>(path, opt);  // its error names the missing file
    const io::HFConfig cfg = io::load_hf_config(dir / "config.json");
    auto try_one = [&]<class U>() {
      if (impl || !hf_accepts<U>(cfg.model_type)) return;
      if constexpr (!hf_loadable<U>())
        fail<FormatError>("kiln::load: '", cfg.source, "' has model_type '", cfg.model_type, "' of the Config '",
                          U::name,
                          "', whose GPT-2-style traits (rope = false, gated_mlp = false or learned_positions) kiln "
                          "reads from GGUF files only");
      else impl = make_hf_model<U>(dir, cfg, std::make_shared<io::SafetensorsCheckpoint>(path, opt.mode), opt.pack);
    };
    (try_one.template operator()<User>(), ...);
    if (impl) return Model(std::move(impl));
    const auto builtin = supported_hf_model_types();
    if (std::find(builtin.begin(), builtin.end(), cfg.model_type) == builtin.end())
      fail<FormatError>("kiln::load: '", cfg.source, "' has model_type '", cfg.model_type,
                        "', which neither the given Configs (", names, ") nor kiln's built-ins (", join_names(builtin),
                        ") load");
#endif
    return load_file<0>(path, opt);  // a built-in architecture (or load_hf's error without nlohmann-json)
  }
  auto f = std::make_shared<io::GGUFFile>(path, opt.mode);
  const std::string arch(f->architecture());
  ((!impl && arch == User::name ? (impl = make_gguf_model<User>(f, opt.pack), 0) : 0), ...);
  if (impl) return Model(std::move(impl));
  const auto builtin = supported_architectures();
  if (std::find(builtin.begin(), builtin.end(), arch) == builtin.end())
    fail<FormatError>("kiln::load: '", path.string(), "' has general.architecture = '", arch,
                      "', which is none of the given Configs (", names, ") nor of kiln's built-ins (",
                      join_names(builtin), ")");
  f.reset();
  return load_file<0>(path, opt);
}
}  // namespace detail

/// kiln::load<MyArch, ...>(path, options): as kiln::load, with user Configs (any ArchConfig: a struct deriving
/// from ArchDefaults with its own `name`, optionally `hf_model_types`; docs/adding-an-architecture.md) tried
/// before the built-ins. A GGUF file whose general.architecture is a Config's name, or a Hugging Face
/// checkpoint whose model_type is in its hf_model_types, loads as a Transformer<Config> compiled in the
/// caller's translation unit, with the same Model, Session, SessionGroup, generate(), KV cache, loaders, chat
/// template and errors as a built-in; any other file loads as kiln::load(path) would. A user Config whose name
/// (or model type) is also a built-in's wins: kiln::load<MyLlama>(p) runs every "llama" file as MyLlama.
template <ArchConfig First, ArchConfig... Rest>
Model load(const std::filesystem::path& path, const LoadOptions& opt = {}) {
  return detail::load_user<First, Rest...>(path, opt);
}

/// Loads a llama2.c checkpoint (legacy .bin) and its tokenizer file as a Transformer<Llama>.
inline Model load_llama2c(const std::filesystem::path& checkpoint, const std::filesystem::path& tokenizer,
                          const LoadOptions& opt = {}) {
  return detail::load_llama2c_files<0>(checkpoint, tokenizer, opt);
}

struct SessionOptions {
  /// Positions the sequence may hold; 0: the model's trained context (its context_length, however large:
  /// the CLIs default to min(4096, that) instead). A KV cache that needs more than the machine's available
  /// memory (MemAvailable) fails at construction, naming the size.
  std::size_t ctx = 0;
  std::size_t threads = 1;  ///< threads of the session's pool, the caller included; 0: all cores
  std::size_t batch = 512;  ///< the most prompt tokens one forward pass takes (longer prompts are split)
  /// Quantized weights: integer dot products on 8-bit activations (fast, llama.cpp's scheme) or f32
  /// products with the dequantized weights (exact, what HF transformers computes). See kiln::Precision.
  Precision precision = Precision::fast;
  /// Element type of the KV cache: f16 (half the memory and the bytes attention reads per decoded token;
  /// keys and values rounded to nearest even, relative 2^-11), f32, or q8_0 (0.53x f16's memory: Q8_0 blocks of
  /// 32 along head_dim, each value within half a step of max|block| / 127; head_dim a multiple of 32; never
  /// chosen automatically). automatic: f32 with Precision::exact (HF's f32 numerics), f16 otherwise (llama.cpp's
  /// default).
  KVType kv_type = KVType::automatic;
  /// How the KV cache's memory becomes resident: upfront (huge pages; a short context is resident whole)
  /// or on_use (4 KiB pages faulted as positions are stored). See kiln::KVPages.
  KVPages kv_pages = KVPages::upfront;
};

namespace detail {
/// Bytes as GiB with two decimals, for messages.
inline std::string gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", bytes / double(1ull << 30));
  return buf;
}
}  // namespace detail

/// The KV cache element type SessionOptions ask for (automatic resolved by the precision).
inline KVType resolve_kv_type(const SessionOptions& opt) {
  if (opt.kv_type != KVType::automatic) return opt.kv_type;
  return opt.precision == Precision::exact ? KVType::f32 : KVType::f16;
}

class Session {
 public:
  explicit Session(const Model& model, const SessionOptions& opt = {}) : model_(model) {
    const HParams& hp = model_.hparams();
    const std::size_t ctx = opt.ctx ? opt.ctx : hp.ctx_train;
    if (ctx == 0) fail("kiln::Session: the context size is 0");
    if (ctx > hp.ctx_train && hp.ctx_train > 0)
      warn("context size ", ctx, " exceeds the ", hp.ctx_train,
           " positions the model was trained with; quality "
           "may degrade past them");
    // Before allocating: a KV cache larger than the machine's free memory fails here, naming the context
    // and where it came from, instead of as an allocation failure (or the OOM killer) later.
    const double kv_need = kv_cache_bytes(hp.n_layers, hp.n_kv_heads, hp.head_dim, ctx, resolve_kv_type(opt));
    if (const auto avail = available_memory_bytes(); avail && kv_need > *avail)
      fail("kiln::Session: the KV cache for a context of ", ctx, " positions (",
           opt.ctx ? "SessionOptions::ctx" : "the model's context_length", ") needs ", detail::gib(kv_need), " GiB, ",
           detail::gib(*avail), " GiB available (MemAvailable): ask for a smaller context");
    const std::size_t batch = std::max<std::size_t>(1, std::min(opt.batch ? opt.batch : 512, ctx));
    st_ = model_.impl().make_state(ctx, batch, opt.threads, resolve_kv_type(opt), opt.kv_pages);
    st_->precision = opt.precision;
    logits_ = Buffer<float>(hp.vocab);
    history_.reserve(ctx);
  }

  const Model& model() const { return model_; }
  std::size_t ctx() const { return st_->ctx; }
  std::size_t n_past() const { return history_.size(); }
  std::size_t threads() const { return st_->pool->size(); }
  /// The most prompt tokens one forward pass takes (SessionOptions::batch, at most ctx()).
  std::size_t batch() const { return st_->max_batch; }
  /// The tokens of the sequence so far (those already run through the model).
  std::span<const int32_t> tokens() const { return history_; }
  /// The last token's logits from the latest eval().
  std::span<const float> logits() const { return {logits_.data(), logits_.size()}; }
  ThreadPool& pool() { return *st_->pool; }
  Precision precision() const { return st_->precision; }
  /// Switches the weight path for the following evals (the KV cache keeps what earlier ones computed,
  /// and its element type).
  void set_precision(Precision p) { st_->precision = p; }
  /// The KV cache's element type (f32 or f16) and size in bytes.
  KVType kv_type() const { return st_->kv.type(); }
  std::size_t kv_bytes() const { return st_->kv.bytes(); }

  /// Appends tokens to the sequence and returns the logits of the last one (vocab floats, valid until
  /// the next eval). Throws kiln::Error, changing nothing, when they do not fit in the context.
  std::span<const float> eval(std::span<const int32_t> tokens) {
    if (tokens.empty()) fail("kiln::Session::eval: no tokens");
    if (tokens.size() > ctx() - n_past())
      fail("kiln::Session::eval: context full: ", n_past(), " positions used + ", tokens.size(), " new tokens > ctx ",
           ctx(), " (create the Session with a larger .ctx, or reset() it)");
    const std::size_t vocab = model_.hparams().vocab;
    for (int32_t t : tokens)
      if (t < 0 || std::size_t(t) >= vocab)
        fail("kiln::Session::eval: token id ", t, " is outside the vocabulary of ", vocab);
    for (std::size_t i = 0; i < tokens.size(); i += st_->max_batch) {
      const auto chunk = tokens.subspan(i, std::min(st_->max_batch, tokens.size() - i));
      const bool last = i + chunk.size() == tokens.size();
      model_.impl().forward(*st_, chunk, n_past(), last ? logits_.data() : nullptr);
      history_.insert(history_.end(), chunk.begin(), chunk.end());  // capacity reserved: no allocation
    }
    return logits();
  }
  std::span<const float> eval(int32_t token) { return eval(std::span<const int32_t>(&token, 1)); }

  /// A token sampled but not yet run through the model (generate() leaves its last token here and the
  /// next generate() runs it first), or -1.
  int32_t pending() const { return pending_; }
  void set_pending(int32_t token) { pending_ = token; }

  /// Forgets the sequence (the memory is kept for the next one).
  void reset() { rewind(0); }

  /// Keeps the first n tokens of the sequence and drops the rest (their K/V entries are overwritten by
  /// the next eval), and forgets a pending token. Throws kiln::Error, changing nothing, when n > n_past().
  void rewind(std::size_t n) {
    if (n > n_past()) fail("kiln::Session::rewind: cannot keep ", n, " tokens, the sequence holds ", n_past());
    history_.resize(n);
    pending_ = -1;
  }

  /// How many leading tokens of `tokens` the sequence already holds: the length of their common prefix,
  /// at most tokens.size() - 1 (the last token must run again for its logits).
  std::size_t common_prefix(std::span<const int32_t> tokens) const {
    const std::size_t limit = std::min(history_.size(), tokens.empty() ? std::size_t(0) : tokens.size() - 1);
    std::size_t k = 0;
    while (k < limit && history_[k] == tokens[k]) ++k;
    return k;
  }

  /// Prompt caching: rewinds the sequence to its common prefix with `tokens` and returns that prefix's
  /// length k; eval(tokens.subspan(k)) next gives the logits of `tokens` run from scratch (up to the
  /// rounding differences between the prompt and the one-token kernels, where the kept tokens were run
  /// one at a time) at the cost of the new tokens only: a new conversation with the same system prompt,
  /// or a request that repeats an earlier one's start.
  std::size_t reuse_prefix(std::span<const int32_t> tokens) {
    const std::size_t k = common_prefix(tokens);
    rewind(k);
    return k;
  }

 private:
  Model model_;
  std::unique_ptr<ForwardState> st_;
  Buffer<float> logits_;
  std::vector<int32_t> history_;
  int32_t pending_ = -1;
};

}  // namespace kiln
