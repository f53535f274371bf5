// kiln/model/instantiate.hpp - the built-in architectures' loaders and Transformer<C> code, compiled here.
//
// For programs built with KILN_EXTERN_ARCHITECTURES (see kiln/model/model.hpp): exactly one .cpp includes
// this file, and every other translation unit then skips compiling kiln::load's per-architecture code.
// Without KILN_EXTERN_ARCHITECTURES nothing needs this file.
#pragma once

#define KILN_DETAIL_INSTANTIATING_ARCHITECTURES 1
#include "kiln/model/model.hpp"

#define KILN_DETAIL_INSTANTIATE_ARCHITECTURE(C) KILN_DETAIL_ARCHITECTURE_TEMPLATES(, C)
KILN_DETAIL_FOR_EACH_ARCHITECTURE(KILN_DETAIL_INSTANTIATE_ARCHITECTURE)
#undef KILN_DETAIL_INSTANTIATE_ARCHITECTURE
KILN_DETAIL_LOADER_TEMPLATES()
