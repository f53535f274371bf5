// kiln's own tests, benchmarks and examples are built with KILN_EXTERN_ARCHITECTURES (CMakeLists.txt):
// the built-in architectures' loaders and forward passes are compiled here once, not in every file that
// calls kiln::load (about 20 s each).
#include "kiln/model/instantiate.hpp"
