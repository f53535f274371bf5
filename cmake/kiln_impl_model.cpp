// One of the translation units of kiln_add_kernels() (cmake/KilnKernels.cmake): the built-in
// architectures' loaders and forward passes, compiled here once instead of in every file that calls
// kiln::load (about 20 s each); the library defines KILN_EXTERN_ARCHITECTURES for its users.
#include "kiln/model/instantiate.hpp"
