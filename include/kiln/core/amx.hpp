// kiln/core/amx.hpp - run-time detection of Intel AMX (the int8 and bf16 tile units) and the switch that turns it off.
//
// AMX is usable when the CPU has it (CPUID leaf 7: EDX bit 24 AMX-TILE, 25 AMX-INT8, 22 AMX-BF16), the OS
// saves the tile state (XCR0 bits 17 XTILECFG and 18 XTILEDATA), and, on Linux, the process was granted the
// 8 KiB tile data state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), asked once per process: the
// kernel refuses tile instructions (SIGILL) without it). Any missing piece leaves the VNNI kernels (and, for f16/bf16
// weights, the f32 FMA GEMM) in charge.
// The switch: on by default where usable; off with set_amx_enabled({.enabled = false}), KILN_AMX=0 or --no-amx
// in the CLIs; KILN_NO_AMX=1 forces it off.
#pragma once

#include <atomic>
#include <cstdlib>
#include <cstring>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define KILN_AMX_X86 1
#else
#define KILN_AMX_X86 0
#endif

namespace kiln {

/// What the CPU and the OS offer (each field independently), and whether the tile data permission was granted.
struct AmxSupport {
  bool tile = false;       // CPUID.(7,0):EDX[24]
  bool int8 = false;       // CPUID.(7,0):EDX[25]
  bool bf16 = false;       // CPUID.(7,0):EDX[22]
  bool os_state = false;   // XCR0 bits 17 and 18 (the OS saves XTILECFG and XTILEDATA)
  bool permitted = false;  // Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, 18) succeeded
  bool usable_int8() const { return tile && int8 && os_state && permitted; }
  bool usable_bf16() const { return tile && bf16 && os_state && permitted; }
};

namespace detail {

#if KILN_AMX_X86
__attribute__((target("xsave"))) inline unsigned long long amx_xgetbv0() {
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}
#endif

inline AmxSupport amx_probe() {
  AmxSupport s;
#if KILN_AMX_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return s;
  __cpuid_count(7, 0, a, b, c, d);
  s.tile = (d >> 24) & 1u;
  s.int8 = (d >> 25) & 1u;
  s.bf16 = (d >> 22) & 1u;
  __cpuid(1, a, b, c, d);
  const bool osxsave = (c >> 27) & 1u;
  if (osxsave) {
    const unsigned long long xcr0 = amx_xgetbv0();
    s.os_state = ((xcr0 >> 17) & 3u) == 3u;
  }
#if defined(__linux__)
  if (s.tile && s.os_state) {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    s.permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }
#else
  s.permitted = false;  // other OSes: no permission protocol wired up here
#endif
#endif
  return s;
}

// Starts on (the tile kernel is faster than VNNI end to end: docs/benchmarks.md) unless KILN_AMX is "0".
inline std::atomic<bool>& amx_switch() {
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("KILN_AMX");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }()};
  return on;
}
// KILN_NO_AMX set to anything but "" or "0". Read on every check (a GEMM call costs far more than getenv),
// so a process that sets it before its first product is covered whatever initialized kiln.
inline bool amx_env_off() {
  const char* e = std::getenv("KILN_NO_AMX");
  return e != nullptr && e[0] != '\0' && std::strcmp(e, "0") != 0;
}
// GEMM calls that ran on the tiles (per thread share), for tests that must see the switch take effect.
inline std::atomic<unsigned long>& amx_gemm_calls() {
  static std::atomic<unsigned long> n{0};
  return n;
}
// kiln::attention calls that ran on the bf16 tiles (AttentionOptions::amx_bf16), likewise.
inline std::atomic<unsigned long>& amx_attention_calls() {
  static std::atomic<unsigned long> n{0};
  return n;
}

}  // namespace detail

/// The CPU's and OS's AMX support, probed (and the Linux permission requested) once per process.
inline const AmxSupport& amx_support() {
  static const AmxSupport s = detail::amx_probe();
  return s;
}

struct AmxOptions {
  // true: the integer prompt GEMMs on AMX int8 tiles where usable, and f16/bf16 weights' GEMMs that ask for it
  // (MatmulOptions::amx_bf16) and prompt attentions that ask for it (AttentionOptions::amx_bf16) on AMX bf16
  // tiles; false: AVX-512 VNNI and f32 FMA
  bool enabled = true;
};

/// Turns AMX on or off for every later kernel call (process-wide; for A/B runs). Starts on unless the
/// environment variable KILN_AMX is "0"; KILN_NO_AMX (set to anything but "" or "0") keeps it off whatever
/// this says.
inline void set_amx_enabled(const AmxOptions& options) {
  detail::amx_switch().store(options.enabled, std::memory_order_relaxed);
}

/// What set_amx_enabled (or KILN_AMX) last asked for, usable or not.
inline AmxOptions amx_options() { return {.enabled = detail::amx_switch().load(std::memory_order_relaxed)}; }

/// Whether the integer GEMMs use AMX tiles now: the switch is on and the CPU, OS and kernel allow it.
inline bool amx_active() {
  return detail::amx_switch().load(std::memory_order_relaxed) && !detail::amx_env_off() && amx_support().usable_int8();
}

/// Whether the f16/bf16 GEMMs and prompt attentions that ask for it (MatmulOptions::amx_bf16,
/// AttentionOptions::amx_bf16) use AMX bf16 tiles now: the same switch, and the CPU, OS and kernel allow AMX-BF16.
inline bool amx_bf16_active() {
  return detail::amx_switch().load(std::memory_order_relaxed) && !detail::amx_env_off() && amx_support().usable_bf16();
}

}  // namespace kiln
