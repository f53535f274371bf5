// config.json: real-world shapes of the file (Llama 3.2 with llama3 rope scaling, SmolLM2, Qwen2.5,
// Gemma 3 with text_config, transformers v5 rope_parameters), defaults, other keys, and errors.
#include "io_test_util.hpp"
#include "kiln/io/hf_config.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {
// Abridged from the published config.json files of these models (values as published).
constexpr std::string_view llama32_1b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 128256})";
constexpr std::string_view smollm2_135m = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "vocab_size": 49152})";
constexpr std::string_view gemma3_nested = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
  "text_config": {"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048,
                  "num_hidden_layers": 18, "num_attention_heads": 4, "num_key_value_heads": 1,
                  "head_dim": 256, "vocab_size": 262144, "max_position_embeddings": 32768,
                  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
                  "sliding_window": 512, "query_pre_attn_scalar": 256,
                  "layer_types": ["sliding_attention", "full_attention"]},
  "torch_dtype": "bfloat16", "tie_word_embeddings": true})";
constexpr std::string_view v5_style = R"({
  "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
  "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "dtype": "bfloat16",
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "head_dim": null,
  "sliding_window": null, "use_sliding_window": false})";

std::string with(std::string_view base, std::string_view replace, std::string_view by) {
  std::string s(base);
  const auto at = s.find(replace);
  REQUIRE_MESSAGE(at != std::string::npos, "test bug: '", std::string(replace), "' not in the config");
  s.replace(at, replace.size(), by);
  return s;
}
}  // namespace

TEST_CASE("config.json: Llama 3.2 with llama3 rope scaling") {
  const auto c = io::parse_hf_config(llama32_1b, "llama/config.json");
  CHECK(c.model_type == "llama");
  CHECK(c.architectures == std::vector<std::string>{"LlamaForCausalLM"});
  CHECK(c.hidden_size == 2048);
  CHECK(c.intermediate_size == 8192);
  CHECK(c.num_hidden_layers == 16);
  CHECK(c.num_attention_heads == 32);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 128256);
  CHECK(c.max_position_embeddings == 131072);
  CHECK(c.rms_norm_eps == 1e-05);
  CHECK(c.rope_theta == 500000.0);
  REQUIRE(c.rope_scaling.has_value());
  CHECK(c.rope_scaling->type == "llama3");
  CHECK(c.rope_scaling->factor == 32.0);
  CHECK(c.rope_scaling->low_freq_factor == 1.0);
  CHECK(c.rope_scaling->high_freq_factor == 4.0);
  CHECK(c.rope_scaling->original_max_position_embeddings == 8192);
  CHECK(c.tie_word_embeddings);
  CHECK(c.torch_dtype == "bfloat16");
  // Other keys, typed.
  CHECK(c.get<std::vector<int64_t>>("eos_token_id") == std::vector<int64_t>{128001, 128008, 128009});
  CHECK(c.get<std::string>("hidden_act") == "silu");
  CHECK(c.find<bool>("attention_bias") == false);
  CHECK_FALSE(c.find<int>("sliding_window").has_value());
  CHECK(c.find_json("rope_scaling")->at("rope_type") == "llama3");
  CHECK_THROWS_WITH_AS(
      c.get<int>("hidden_act"),
      "kiln: config.json file 'llama/config.json': key 'hidden_act' is a JSON string, expected an integer",
      FormatError);
  CHECK_THROWS_WITH_AS(c.get<int>("missing_key"), doctest::Contains("key 'missing_key' is missing"), FormatError);
  CHECK_THROWS_WITH_AS(c.get<uint16_t>("vocab_size"),
                       doctest::Contains("key 'vocab_size' value 128256 is out of range"), FormatError);
  CHECK_THROWS_WITH_AS(c.get<std::vector<std::string>>("eos_token_id"),
                       doctest::Contains("key 'eos_token_id[0]' is a JSON number (integer), expected a string"),
                       FormatError);
}

TEST_CASE("config.json: SmolLM2, Gemma 3 (text_config) and transformers v5 style") {
  const auto s = io::parse_hf_config(smollm2_135m);
  CHECK(s.head_dim == 64);  // 576 / 9, defaulted
  CHECK(s.num_key_value_heads == 3);
  CHECK(s.rope_theta == 100000.0);          // an integer in the file
  CHECK_FALSE(s.rope_scaling.has_value());  // null

  const auto g = io::parse_hf_config(gemma3_nested);
  CHECK(g.model_type == "gemma3_text");  // read from text_config
  CHECK(g.hidden_size == 640);
  CHECK(g.head_dim == 256);  // given: not 640 / 4
  CHECK(g.num_key_value_heads == 1);
  CHECK(g.rms_norm_eps == 1e-06);
  CHECK(g.rope_theta == 1000000.0);
  CHECK(g.tie_word_embeddings);  // top level
  CHECK(g.torch_dtype == "bfloat16");
  CHECK(g.architectures == std::vector<std::string>{"Gemma3ForConditionalGeneration"});
  CHECK(g.get<double>("rope_local_base_freq") == 10000.0);
  CHECK(g.get<std::vector<std::string>>("layer_types").size() == 2);

  const auto q = io::parse_hf_config(v5_style);
  CHECK(q.rope_theta == 1000000.0);       // from rope_parameters
  CHECK(q.head_dim == 64);                // null -> 896 / 14
  CHECK(q.torch_dtype == "bfloat16");     // "dtype"
  CHECK(q.max_position_embeddings == 0);  // absent
  CHECK_FALSE(q.tie_word_embeddings);     // absent
  CHECK(q.rms_norm_eps == 1e-6);          // absent: default
}

TEST_CASE("config.json: load_hf_config reads a file or a model directory") {
  const auto dir = temp_path("model_dir");
  std::filesystem::create_directories(dir);
  write_file(dir / "config.json", llama32_1b);
  CHECK(io::load_hf_config(dir).hidden_size == 2048);
  CHECK(io::load_hf_config(dir / "config.json").source == (dir / "config.json").string());
  CHECK_THROWS_WITH_AS(io::load_hf_config(temp_path("nope")), doctest::Contains("No such file or directory"),
                       kiln::Error);
}

TEST_CASE("config.json: errors name the file and the key") {
  CHECK_THROWS_WITH_AS(io::parse_hf_config("{", "c.json"), doctest::Contains("config.json file 'c.json': invalid JSON"),
                       FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config("[]", "c.json"),
                       doctest::Contains("the file is a JSON array, expected an object"), FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"model_type\": \"llama\",", ""), "c.json"),
                       "kiln: config.json file 'c.json': required key 'model_type' is missing", FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"hidden_size\": 576,", "")),
                       doctest::Contains("required key 'hidden_size' is missing"), FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"hidden_size\": 576", "\"hidden_size\": \"576\"")),
                       doctest::Contains("key 'hidden_size' is a JSON string, expected an integer"), FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"hidden_size\": 576", "\"hidden_size\": 576.0")),
                       doctest::Contains("key 'hidden_size' is a JSON number (float), expected an integer"),
                       FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"num_hidden_layers\": 30", "\"num_hidden_layers\": 0")),
                       doctest::Contains("key 'num_hidden_layers' = 0 is out of range 1..2147483647"), FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"vocab_size\": 49152", "\"vocab_size\": 4294967296")),
                       doctest::Contains("key 'vocab_size' = 4294967296 is out of range"), FormatError);
  CHECK_THROWS_WITH_AS(
      io::parse_hf_config(with(smollm2_135m, "\"num_key_value_heads\": 3", "\"num_key_value_heads\": 2")),
      doctest::Contains("num_attention_heads 9 is not a multiple of num_key_value_heads 2"), FormatError);
  CHECK_THROWS_WITH_AS(
      io::parse_hf_config(with(smollm2_135m, "\"hidden_size\": 576", "\"hidden_size\": 577")),
      doctest::Contains("head_dim is absent and hidden_size 577 is not a multiple of num_attention_heads 9"),
      FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": -1")),
                       doctest::Contains("key 'rms_norm_eps' = -1 must be positive and finite"), FormatError);
  CHECK_THROWS_WITH_AS(io::parse_hf_config(with(smollm2_135m, "\"rope_scaling\": null", "\"rope_scaling\": 2")),
                       doctest::Contains("key 'rope_scaling' is a JSON number (integer), expected an object or null"),
                       FormatError);
  CHECK_THROWS_WITH_AS(
      io::parse_hf_config(with(smollm2_135m, "\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": \"x\"}")),
      doctest::Contains("key 'rope_scaling.factor' is a JSON string, expected a number"), FormatError);
  CHECK_THROWS_WITH_AS(
      io::parse_hf_config(with(smollm2_135m, "\"rope_theta\": 100000,", "\"rope_theta\": 1, \"rope_theta\": 2,")),
      doctest::Contains("duplicate JSON key 'rope_theta'"), FormatError);
}

TEST_CASE(
    "config.json: rope_params per layer type (transformers 5 Gemma 3), flat rope_parameters, and the older keys") {
  constexpr std::string_view gemma3_v5 = R"({
  "model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
  "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "vocab_size": 262144,
  "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}})";
  const auto g = io::parse_hf_config(gemma3_v5);
  const auto full = g.rope_params("full_attention"), slid = g.rope_params("sliding_attention");
  CHECK(full.theta == 1000000.0);
  REQUIRE(full.scaling.has_value());
  CHECK(full.scaling->type == "linear");
  CHECK(full.scaling->factor == 8.0);
  CHECK(slid.theta == 10000.0);
  REQUIRE(slid.scaling.has_value());
  CHECK(slid.scaling->type == "default");
  CHECK_FALSE(g.rope_scaling.has_value());  // no flat rope_type at the top of rope_parameters
  CHECK(g.rope_theta == 10000.0);           // the generic field does not look inside the per-type entries

  const auto q =
      io::parse_hf_config(with(v5_style, R"("rope_type": "default")", R"("rope_type": "linear", "factor": 2.0)"));
  REQUIRE(q.rope_scaling.has_value());  // a flat rope_parameters with a non-default type is rope_scaling
  CHECK(q.rope_scaling->factor == 2.0);
  CHECK(q.rope_params("sliding_attention").theta == 1000000.0);              // flat: the same for every layer type
  CHECK_FALSE(q.rope_params("sliding_attention", false).theta.has_value());  // unless only per-type counts

  const auto n = io::parse_hf_config(gemma3_nested);  // older keys: rope_theta (+ rope_local_base_freq, not read here)
  CHECK(n.rope_params("full_attention").theta == 1000000.0);
  CHECK_FALSE(n.rope_params("full_attention").scaling.has_value());
  CHECK_FALSE(n.rope_params("sliding_attention", false).theta.has_value());

  CHECK_THROWS_WITH_AS(
      io::parse_hf_config(with(gemma3_v5, R"("factor": 8.0)", R"("factor": -1)")).rope_params("full_attention"),
      doctest::Contains("key 'rope_parameters.full_attention.factor' = -1 must be positive and finite"), FormatError);
}
