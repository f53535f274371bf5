// kiln/model/arch/all.hpp - the built-in architectures: the one list that kiln::load, kiln::Architectures
// and the explicit instantiations of KILN_EXTERN_ARCHITECTURES (model/instantiate.hpp) derive from.
//
// Adding a built-in architecture: its own file in model/arch/, then here its #include and its X(Config)
// entry. kiln::load tries the entries in this order (the first whose GGUF name or Hugging Face model_type
// matches wins). mistral.hpp is not an entry: the Llama Config runs Mistral's files (llama.hpp includes it).
#pragma once

#include "kiln/model/arch/gemma2.hpp"
#include "kiln/model/arch/gemma3.hpp"
#include "kiln/model/arch/gpt_oss.hpp"
#include "kiln/model/arch/granite.hpp"
#include "kiln/model/arch/llama.hpp"
#include "kiln/model/arch/minimax_m2.hpp"
#include "kiln/model/arch/olmoe.hpp"
#include "kiln/model/arch/phi3.hpp"
#include "kiln/model/arch/qwen2.hpp"
#include "kiln/model/arch/qwen2moe.hpp"
#include "kiln/model/arch/qwen3.hpp"
#include "kiln/model/arch/qwen3moe.hpp"

// X(Config) for each built-in Config (in namespace kiln), in kiln::load's order.
#define KILN_DETAIL_FOR_EACH_ARCHITECTURE(X) \
  X(Llama)                                   \
  X(Qwen2)                                   \
  X(Qwen3)                                   \
  X(Gemma3)                                  \
  X(Granite)                                 \
  X(Gemma2)                                  \
  X(Phi3)                                    \
  X(Qwen3Moe)                                \
  X(Qwen2Moe)                                \
  X(Olmoe)                                   \
  X(MiniMaxM2)                               \
  X(GptOss)
