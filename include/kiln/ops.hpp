// kiln/ops.hpp - umbrella header for a program that uses tensors and ops without the model runtime:
// core (tensors, storage, threads), the quantized block formats and every public op, linear() over
// GGUF-typed weights included. kiln/kiln.hpp includes this and the rest (loaders, model, text, generate).
// The kernels still come from one translation unit: exactly one .cpp of the program includes
// kiln/implementation.hpp (or defines KILN_IMPLEMENTATION before including kiln/kiln.hpp), or the program
// links kiln_add_kernels()'s library.
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
#include "kiln/ops/linear.hpp"
#include "kiln/ops/matmul.hpp"
#include "kiln/ops/norm.hpp"
#include "kiln/ops/qmatmul.hpp"
#include "kiln/ops/qmatmul_i16.hpp"
#include "kiln/ops/rope.hpp"
#include "kiln/ops/softmax.hpp"
#include "kiln/quant/blocks.hpp"
#include "kiln/quant/convert.hpp"
#include "kiln/quant/dequant.hpp"
#include "kiln/quant/interleave.hpp"
