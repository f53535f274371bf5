// Must not compile: rms_norm given a bf16 view where it needs f32. With -DKILN_COMPILE_FAIL_CONTROL the
// same call gets f32 views and must compile, which proves the failure is the dtype and nothing else.
#include <kiln/kiln.hpp>

#if defined(KILN_COMPILE_FAIL_CONTROL)
using X = float;
#else
using X = kiln::bf16;
#endif

void use(X* xp, const float* w, float* out) {
  auto x = kiln::make_tensor(xp, 4, 8);  // (4, 8)
  kiln::rms_norm(x, kiln::make_tensor(w, 8), kiln::make_tensor(out, 4, 8), 1e-5f);
}
