// The one translation unit of kiln's own tests, benchmarks and examples that compiles the SIMD kernels.
#include "kiln/implementation.hpp"
