// kiln/kiln.hpp - umbrella header: everything (kiln/ops.hpp, kiln/io.hpp, the model runtime, tokenizers,
// chat templates, generation). Define KILN_IMPLEMENTATION in exactly one .cpp before including it
// (stb style) to compile the SIMD kernels there; see kiln/implementation.hpp.
#pragma once

#include "kiln/ops.hpp"
#include "kiln/io.hpp"
// The Hugging Face model reader needs nlohmann-json: included when it is installed, unless KILN_NO_JSON
// is defined (as io.hpp's safetensors and config.json readers).
#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#include "kiln/model/hf_model.hpp"
#include "kiln/generate/json_schema.hpp"
#endif
#include "kiln/model/arch/all.hpp"
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
#include "kiln/generate/gbnf.hpp"
#include "kiln/generate/perplexity.hpp"

#if defined(KILN_IMPLEMENTATION) && !defined(KILN_IMPLEMENTATION_INCLUDED)
#define KILN_IMPLEMENTATION_INCLUDED
#include "kiln/implementation.hpp"
#endif
