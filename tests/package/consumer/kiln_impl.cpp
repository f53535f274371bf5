// The one translation unit of this program that compiles kiln's SIMD kernels (stb style).
#define KILN_IMPLEMENTATION
#include <kiln/kiln.hpp>
