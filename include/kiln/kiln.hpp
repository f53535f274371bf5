// kiln/kiln.hpp - umbrella header. Define KILN_IMPLEMENTATION in exactly one .cpp before including it
// (stb style) to compile the SIMD kernels there; see kiln/implementation.hpp.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/layout.hpp"
#include "kiln/core/parallel.hpp"
#include "kiln/core/simd.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/ops/activation.hpp"
#include "kiln/ops/attention.hpp"
#include "kiln/ops/embedding.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/norm.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "kiln/ops/qmatmul_i16.hpp"
#include "kiln/ops/rope.hpp"
#include "kiln/ops/softmax.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/convert.hpp"
#include "kiln/quant/dequant.hpp"
#include "kiln/io/ggml_types.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/io/gguf_writer.hpp"
#include "kiln/io/llama2c.hpp"
#include "kiln/io/map_fault.hpp"
#include "kiln/io/mmap.hpp"
// safetensors and config.json readers need nlohmann-json (header-only; ~3 s more compile time per
// translation unit): included when it is installed, unless KILN_NO_JSON is defined.
#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#include "kiln/io/hf_config.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/model/hf_model.hpp"
#endif
#include "kiln/model/arch/gemma2.hpp"
#include "kiln/model/arch/gemma3.hpp"
#include "kiln/model/arch/granite.hpp"
#include "kiln/model/arch/llama.hpp"
#include "kiln/model/arch/mistral.hpp"
#include "kiln/model/arch/phi3.hpp"
#include "kiln/model/arch/qwen2.hpp"
#include "kiln/model/arch/qwen3.hpp"
#include "kiln/model/arch/qwen3moe.hpp"
#include "kiln/model/check_tensors.hpp"
#include "kiln/model/config.hpp"
#include "kiln/model/kv_cache.hpp"
#include "kiln/model/model.hpp"
#include "kiln/model/moe.hpp"
#include "kiln/model/session_group.hpp"
#include "kiln/model/transformer.hpp"
#include "kiln/model/weights.hpp"
#include "kiln/text/chat.hpp"
#include "kiln/text/tokenizer.hpp"
#include "kiln/text/utf8.hpp"
#include "kiln/generate/sampler.hpp"
#include "kiln/generate/generate.hpp"

#if defined(KILN_IMPLEMENTATION) && !defined(KILN_IMPLEMENTATION_INCLUDED)
#define KILN_IMPLEMENTATION_INCLUDED
#include "kiln/implementation.hpp"
#endif
