// kiln/kernels/x86/common.hpp - what the x86 kernel files share: the diagnostics block around AVX-512
// intrinsics, the target attributes that add instructions to Highway's per-target string, and the AMX tile
// configuration. Not for direct inclusion: the kernel files include it (outside their per-target guard's
// namespaces). An ordinary header, included once: the macros expand HWY_TARGET_STR where they are used, so
// each target's code gets its own target string.
#ifndef KILN_KERNELS_X86_COMMON_HPP_
#define KILN_KERNELS_X86_COMMON_HPP_

#include <cstdint>
#include <cstdlib>

#include <hwy/base.h>

#if HWY_ARCH_X86
#include <cpuid.h>
#endif

// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized (and -Wuninitialized) in its own _mm512_undefined_*
// operands when they are inlined into a kernel (GCC bug 105593, fixed in 13; Highway's x86_512-inl.h silences
// it the same way, google/highway#710). Put KILN_X86_DIAGNOSTICS_PUSH before such code, KILN_X86_DIAGNOSTICS_POP
// after it.
#if HWY_COMPILER_GCC_ACTUAL
#define KILN_X86_DIAGNOSTICS_PUSH                                \
  HWY_DIAGNOSTICS(push)                                          \
  HWY_DIAGNOSTICS_OFF(disable : 4701, ignored "-Wuninitialized") \
  HWY_DIAGNOSTICS_OFF(disable : 4703 6001 26494, ignored "-Wmaybe-uninitialized")
#else
#define KILN_X86_DIAGNOSTICS_PUSH HWY_DIAGNOSTICS(push)
#endif
#define KILN_X86_DIAGNOSTICS_POP HWY_DIAGNOSTICS(pop)

// Function attributes: Highway's target string of the target being compiled plus the instructions a kernel
// needs beyond it, so that Highway ops still inline into these functions. Only for code compiled into the
// AVX3_DL target (Ice Lake and later), behind a run-time check of the extra feature.
#define KILN_QMM_VNNI __attribute__((target(HWY_TARGET_STR ",avx512vnni")))                    // vpdpbusd
#define KILN_QMM_AMX __attribute__((target(HWY_TARGET_STR ",avx512vnni,amx-tile,amx-int8")))   // tdpbusd
#define KILN_MM_ATTR_BF16 __attribute__((target(HWY_TARGET_STR ",avx512bf16")))                // vdpbf16ps
#define KILN_MM_AMXBF __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))  // tdpbf16ps

#if HWY_ARCH_X86
namespace kiln::detail::x86 {

// Whether the decode GEMVs prefetch their weight stream in software (the interleaved quantized GEMVs and the
// packed f16/bf16 one, AVX3_DL). Intel's Sapphire/Emerald Rapids cores read one stream near a plain read loop's
// speed only with it (their read bandwidth is bound by outstanding misses); AMD's Zen 4 reads it faster
// without (its hardware prefetchers keep ahead, and the extra prefetch instructions and L2 fills cost
// bandwidth), so it is on for Intel CPUs only. KILN_GEMV_PREFETCH=0 or 1 overrides the choice (A/B runs).
// Read once; the kernels load it once per call. Prefetches change no result.
inline bool stream_prefetch_on() {
  static const bool on = [] {
    if (const char* e = std::getenv("KILN_GEMV_PREFETCH"); e != nullptr && *e != '\0') return *e != '0';
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "GenuineIntel"
  }();
  return on;
}

// The AMX tile configuration (palette 1): the kernels write it field by field into a zeroed one.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "AMX tile configuration is 64 bytes");

// Not _tile_loadconfig: GCC 12's builtin does not tell the optimizer it reads the struct, so the stores into
// it were dropped (ldtilecfg of an all-zero-but-palette config; the first tile instruction then faults).
// The asm needs no target attribute, so this inlines into any tile kernel.
HWY_INLINE void LoadTileConfig(const TileConfig& c) { __asm__ volatile("ldtilecfg %0" : : "m"(c)); }

}  // namespace kiln::detail::x86
#endif  // HWY_ARCH_X86

#endif  // KILN_KERNELS_X86_COMMON_HPP_
