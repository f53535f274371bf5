// kiln/io.hpp - umbrella header for reading and writing model files without the model runtime: GGUF
// (reader, writer, ggml types), llama2.c checkpoints, mapped files, and the safetensors and config.json
// readers when nlohmann-json is installed (unless KILN_NO_JSON). kiln/kiln.hpp includes this.
#pragma once

#include "kiln/io/ggml_types.hpp"
#include "kiln/io/gguf.hpp"
#include "kiln/io/gguf_writer.hpp"
#include "kiln/io/llama2c.hpp"
#include "kiln/io/map_fault.hpp"
#include "kiln/io/mmap.hpp"
// The safetensors and config.json readers need nlohmann-json (header-only, and it adds to every file's compile
// time: docs/building.md): included when it is installed, unless KILN_NO_JSON is defined.
#if __has_include(<nlohmann/json.hpp>) && !defined(KILN_NO_JSON)
#include "kiln/io/hf_config.hpp"
#include "kiln/io/safetensors.hpp"
#endif
