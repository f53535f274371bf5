// kiln/io/hf_config.hpp - a Hugging Face config.json as a plain struct of model hyper-parameters.
//
//   auto cfg = kiln::io::load_hf_config("path/to/model_dir");   // or the config.json path itself
//   cfg.hidden_size; cfg.num_key_value_heads; cfg.rope_theta; ...
//   cfg.find<int64_t>("sliding_window");                       // any other key: optional, typed
//   cfg.get<std::vector<std::string>>("layer_types");          // typed; FormatError when absent
//   cfg.find_json("rope_scaling");                              // the raw JSON (const json*), or null
//   cfg.rope_params("sliding_attention");                       // RoPE theta and scaling of one layer type
//
// Required keys (FormatError naming the file and the key when absent or mistyped): model_type,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size. Defaults for the
// rest follow transformers: num_key_value_heads = num_attention_heads, head_dim = hidden_size /
// num_attention_heads (also when the file says null), rms_norm_eps from rms_norm_eps / layer_norm_eps /
// layer_norm_epsilon else 1e-6, rope_theta from rope_theta / rope_parameters.rope_theta else 10000,
// rope_scaling from rope_scaling or else a (transformers 5) rope_parameters whose rope_type is not "default",
// torch_dtype from torch_dtype / dtype else "", max_position_embeddings 0 when absent, and
// tie_word_embeddings false when absent (the default of LlamaConfig, Qwen2Config and MistralConfig; the
// base PretrainedConfig says true, so check find<bool>("tie_word_embeddings") if the difference
// matters). A multimodal config whose hyper-parameters sit under "text_config" (Gemma 3) is read from
// there; find/get look in text_config first, then at the top level.
//
// Integer hyper-parameters must be JSON integers in 1..2^31-1 (0 allowed for max_position_embeddings),
// num_attention_heads a multiple of num_key_value_heads, and eps and theta positive and finite.
// Needs nlohmann-json (see kiln/io/json.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/mmap.hpp"

namespace kiln::io {

/// "rope_scaling" (null in most configs), or a transformers 5 "rope_parameters" object. type comes from
/// "rope_type" or the older "type".
struct RopeScaling {
  std::string type;                                         ///< "linear", "dynamic", "yarn", "llama3", "longrope", ...
  double factor = 1.0;                                      ///< 1 when absent
  std::optional<double> low_freq_factor, high_freq_factor;  ///< llama3
  std::optional<int64_t> original_max_position_embeddings;  ///< llama3, yarn, longrope
  json raw;                                                 ///< the whole object, for other fields
};

/// The RoPE parameters of one kind of layer (HFConfig::rope_params); absent fields are nullopt.
struct RopeParams {
  std::optional<double> theta;
  std::optional<RopeScaling> scaling;  ///< type "default" included when the file says so
};

namespace detail {

template <class T>
T json_as(const json& j, std::string_view file, std::string_view key) {
  auto wrong = [&](std::string_view expected) -> T {
    fail<FormatError>("kiln: config.json file '", file, "': key ", quote_name(key), " is a JSON ", json_type_name(j),
                      ", expected ", expected);
  };
  if constexpr (std::is_same_v<T, json>) {
    return j;
  } else if constexpr (std::is_same_v<T, bool>) {
    return j.is_boolean() ? j.get<bool>() : wrong("a boolean");
  } else if constexpr (std::is_integral_v<T>) {
    if (j.is_number_unsigned()) {
      const auto v = j.get<uint64_t>();
      if (v <= static_cast<uint64_t>(std::numeric_limits<T>::max())) return static_cast<T>(v);
    } else if (j.is_number_integer()) {
      const auto v = j.get<int64_t>();
      if (std::is_signed_v<T>
              ? v >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                    v <= static_cast<int64_t>(std::numeric_limits<T>::max())
              : v >= 0 && static_cast<uint64_t>(v) <= static_cast<uint64_t>(std::numeric_limits<T>::max()))
        return static_cast<T>(v);
    } else {
      return wrong("an integer");
    }
    fail<FormatError>("kiln: config.json file '", file, "': key ", quote_name(key), " value ", j.dump(),
                      " is out of range for its type");
  } else if constexpr (std::is_floating_point_v<T>) {
    return j.is_number() ? j.get<T>() : wrong("a number");
  } else if constexpr (std::is_same_v<T, std::string>) {
    return j.is_string() ? j.get<std::string>() : wrong("a string");
  } else if constexpr (is_std_vector<T>::value) {
    if (!j.is_array()) return wrong("an array");
    T out;
    out.reserve(j.size());
    for (std::size_t i = 0; i < j.size(); ++i)
      out.push_back(json_as<typename T::value_type>(j[i], file, std::string(key) + "[" + std::to_string(i) + "]"));
    return out;
  } else {
    static_assert(sizeof(T) == 0,
                  "kiln::io::HFConfig: unsupported type (use bool, an integer, float, double, "
                  "std::string, json or std::vector of those)");
  }
}

/// A rope_scaling / rope_parameters object; `key` names it in errors.
inline RopeScaling parse_rope_scaling(const json& rs, std::string_view file, std::string_view key) {
  const auto error = [&](const auto&... args) { fail<FormatError>("kiln: config.json file '", file, "': ", args...); };
  if (!rs.is_object())
    error("key ", quote_name(key), " is a JSON ", json_type_name(rs), ", expected an object or null");
  RopeScaling r;
  r.raw = rs;
  const auto field = [&](const char* k) -> const json* {
    const auto it = rs.find(k);
    return it == rs.end() || it->is_null() ? nullptr : &*it;
  };
  const std::string k(key);
  if (const json* t = field("rope_type")) r.type = json_as<std::string>(*t, file, k + ".rope_type");
  else if (const json* t2 = field("type")) r.type = json_as<std::string>(*t2, file, k + ".type");
  if (const json* f = field("factor")) {
    r.factor = json_as<double>(*f, file, k + ".factor");
    if (!(r.factor > 0) || !std::isfinite(r.factor))
      error("key ", quote_name(k + ".factor"), " = ", r.factor, " must be positive and finite");
  }
  if (const json* f = field("low_freq_factor")) r.low_freq_factor = json_as<double>(*f, file, k + ".low_freq_factor");
  if (const json* f = field("high_freq_factor"))
    r.high_freq_factor = json_as<double>(*f, file, k + ".high_freq_factor");
  if (const json* f = field("original_max_position_embeddings"))
    r.original_max_position_embeddings = json_as<int64_t>(*f, file, k + ".original_max_position_embeddings");
  return r;
}

}  // namespace detail

struct HFConfig {
  std::string model_type;
  std::vector<std::string> architectures;  ///< empty when absent
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  std::string torch_dtype;  ///< "bfloat16", "float32", ... or ""

  json config;         ///< the whole file
  std::string source;  ///< the file name, for messages

  /// The object hyper-parameters are read from: config["text_config"] when the file nests them
  /// there, else config.
  const json& params() const {
    const auto tc = config.find("text_config");
    if (tc != config.end() && tc->is_object() && !config.contains("hidden_size")) return *tc;
    return config;
  }
  /// The raw value of `key` (text_config first, then top level), or null when absent.
  const json* find_json(std::string_view key) const {
    for (const json* o : {&params(), &config}) {
      const auto it = o->find(key);
      if (it != o->end()) return &*it;
    }
    return nullptr;
  }
  bool contains(std::string_view key) const { return find_json(key) != nullptr; }
  /// The value as T, or nullopt when absent or JSON null; FormatError when it has another type.
  template <class T>
  std::optional<T> find(std::string_view key) const {
    const json* j = find_json(key);
    if (!j || j->is_null()) return std::nullopt;
    return detail::json_as<T>(*j, source, key);
  }
  /// RoPE theta and scaling of the layers of `layer_type` ("full_attention", "sliding_attention"):
  /// rope_parameters[layer_type] when the file nests them per layer type (transformers 5 Gemma 3), else a
  /// flat rope_parameters, else the top-level rope_theta and rope_scaling (unless `fallback` is false:
  /// then only the per-type entry counts). Absent fields are nullopt, so that the architecture supplies
  /// its own defaults.
  RopeParams rope_params(std::string_view layer_type = {}, bool fallback = true) const {
    RopeParams p;
    const json* rp = find_json("rope_parameters");
    const json* obj = nullptr;
    std::string key = "rope_parameters";
    if (rp && rp->is_object()) {
      const auto it = layer_type.empty() ? rp->end() : rp->find(layer_type);
      if (it != rp->end() && it->is_object()) {
        obj = &*it;
        key += '.';  // not `"." + std::string(...)`: GCC 12 -O3 warns falsely on it (-Wstringop-overflow)
        key += layer_type;
      } else if (fallback && (rp->contains("rope_theta") || rp->contains("rope_type"))) {
        obj = rp;
      }
    }
    if (!obj && !fallback) return p;
    if (obj) {
      if (const auto t = obj->find("rope_theta"); t != obj->end() && !t->is_null())
        p.theta = detail::json_as<double>(*t, source, key + ".rope_theta");
      if (obj->contains("rope_type") || obj->contains("type"))
        p.scaling = detail::parse_rope_scaling(*obj, source, key);
    } else {
      p.theta = find<double>("rope_theta");
      p.scaling = rope_scaling;
    }
    if (p.theta && (!(*p.theta > 0) || !std::isfinite(*p.theta)))
      fail<FormatError>("kiln: config.json file '", source, "': ", key, " rope_theta = ", *p.theta,
                        " must be positive and finite");
    return p;
  }
  /// The value as T; FormatError naming the file, the key and the types when absent or mistyped.
  template <class T>
  T get(std::string_view key) const {
    const json* j = find_json(key);
    if (!j || j->is_null())
      fail<FormatError>("kiln: config.json file '", source, "': key ", detail::quote_name(key), " is missing");
    return detail::json_as<T>(*j, source, key);
  }
};

/// Parses the text of a config.json; `source` names it in errors.
inline HFConfig parse_hf_config(std::string_view text, std::string source = "config.json") {
  HFConfig c;
  c.source = std::move(source);
  c.config = detail::parse_json(text, "config.json", c.source);
  const auto error = [&](const auto&... args) {
    fail<FormatError>("kiln: config.json file '", c.source, "': ", args...);
  };
  if (!c.config.is_object()) error("the file is a JSON ", detail::json_type_name(c.config), ", expected an object");

  constexpr int64_t max_dim = std::numeric_limits<int32_t>::max();
  const auto dim = [&](std::string_view key, std::optional<int64_t> fallback, int64_t min = 1) {
    const auto v = c.find<int64_t>(key);
    if (!v && !fallback) error("required key ", detail::quote_name(key), " is missing");
    const int64_t x = v ? *v : *fallback;
    if (x < min || x > max_dim)
      error("key ", detail::quote_name(key), " = ", x, " is out of range ", min, "..", max_dim);
    return x;
  };
  const auto positive = [&](std::string_view key, double x) {
    if (!(x > 0) || !std::isfinite(x)) error("key ", detail::quote_name(key), " = ", x, " must be positive and finite");
    return x;
  };

  const auto mt = c.find<std::string>("model_type");
  if (!mt) error("required key 'model_type' is missing");
  c.model_type = *mt;
  c.architectures = c.find<std::vector<std::string>>("architectures").value_or(std::vector<std::string>{});
  c.hidden_size = dim("hidden_size", std::nullopt);
  c.intermediate_size = dim("intermediate_size", std::nullopt);
  c.num_hidden_layers = dim("num_hidden_layers", std::nullopt);
  c.num_attention_heads = dim("num_attention_heads", std::nullopt);
  c.vocab_size = dim("vocab_size", std::nullopt);
  c.num_key_value_heads = dim("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    error("num_attention_heads ", c.num_attention_heads, " is not a multiple of num_key_value_heads ",
          c.num_key_value_heads);
  if (!c.find<int64_t>("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    error("head_dim is absent and hidden_size ", c.hidden_size, " is not a multiple of num_attention_heads ",
          c.num_attention_heads);
  c.head_dim = dim("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = dim("max_position_embeddings", int64_t(0), 0);

  if (auto v = c.find<double>("rms_norm_eps")) c.rms_norm_eps = positive("rms_norm_eps", *v);
  else if (auto v2 = c.find<double>("layer_norm_eps")) c.rms_norm_eps = positive("layer_norm_eps", *v2);
  else if (auto v3 = c.find<double>("layer_norm_epsilon")) c.rms_norm_eps = positive("layer_norm_epsilon", *v3);

  if (auto v = c.find<double>("rope_theta")) {
    c.rope_theta = positive("rope_theta", *v);
  } else if (const json* rp = c.find_json("rope_parameters"); rp && rp->is_object() && rp->contains("rope_theta")) {
    c.rope_theta = positive("rope_parameters.rope_theta",
                            detail::json_as<double>((*rp)["rope_theta"], c.source, "rope_parameters.rope_theta"));
  }

  if (const json* rs = c.find_json("rope_scaling"); rs && !rs->is_null()) {
    c.rope_scaling = detail::parse_rope_scaling(*rs, c.source, "rope_scaling");
  } else if (const json* rp = c.find_json("rope_parameters"); rp && rp->is_object() && rp->contains("rope_type")) {
    if (auto r = detail::parse_rope_scaling(*rp, c.source, "rope_parameters"); r.type != "default")
      c.rope_scaling = std::move(r);
  }

  c.tie_word_embeddings = c.find<bool>("tie_word_embeddings").value_or(false);
  if (auto d = c.find<std::string>("torch_dtype")) c.torch_dtype = *d;
  else if (auto d2 = c.find<std::string>("dtype")) c.torch_dtype = *d2;
  return c;
}

/// Reads config.json from a file path or from a model directory holding one.
inline HFConfig load_hf_config(const std::filesystem::path& file_or_dir) {
  auto p = file_or_dir;
  if (std::filesystem::is_directory(p)) p /= "config.json";
  const MappedFile f(p, LoadMode::read);
  return parse_hf_config(detail::as_string_view(f.bytes()), p.string());
}

}  // namespace kiln::io
