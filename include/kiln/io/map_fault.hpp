// kiln/io/map_fault.hpp - a clear message instead of "Bus error" when a mapped model file shrinks.
//
//   kiln::io::install_map_fault_handler();   // once, early in main() (kiln-generate and kiln-chat do)
//
// What LoadMode::map promises: the bytes of the file as they are while it stays unchanged. A file that is
// rewritten in place or truncated under a running process changes or loses the mapped pages; reading a
// page past the new end raises SIGBUS, which by default kills the process with no message (exit 135).
// The handler installed here turns a SIGBUS whose address lies inside a mapped model file into a message
// naming the file on stderr and _exit(kMapFaultExitCode); any other SIGBUS gets the default action. It is
// opt-in because a signal handler is process-wide: a program with its own SIGBUS handling keeps it. A
// program that must survive the file changing loads it with LoadMode::read (--load read), which copies
// the file into memory: nothing read later depends on it.
//
// Every mapped MappedFile registers its address range and path here (a fixed table of kMaxMappings
// entries, lock-free; a mapping beyond that is not named, the handler then falls back to the default
// action for it). The handler only reads the table and calls write() and _exit(), which are
// async-signal-safe.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string_view>

namespace kiln::io {

/// The exit status of a process stopped by the handler (the CLIs' status for any error).
inline constexpr int kMapFaultExitCode = 1;

namespace detail {

inline constexpr std::size_t kMaxMappings = 64;
inline constexpr std::size_t kMaxMappedPath = 512;

struct MappingSlot {
  std::atomic<int> state{0};  // 0 free, 1 being written, 2 published
  const std::byte* begin = nullptr;
  std::size_t size = 0;
  char path[kMaxMappedPath] = {};
};

inline MappingSlot* mapping_slots() {
  static MappingSlot slots[kMaxMappings];  // constant-initialized: safe to read from the handler
  return slots;
}

/// Records a mapped range and its file's path (truncated to kMaxMappedPath - 1 bytes). No-op when the
/// table is full.
inline void register_mapping(const std::byte* begin, std::size_t size, std::string_view path) {
  MappingSlot* slots = mapping_slots();
  for (std::size_t i = 0; i < kMaxMappings; ++i) {
    int expected = 0;
    if (!slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
    slots[i].begin = begin;
    slots[i].size = size;
    const std::size_t n = std::min(path.size(), kMaxMappedPath - 1);
    std::memcpy(slots[i].path, path.data(), n);
    slots[i].path[n] = '\0';
    slots[i].state.store(2, std::memory_order_release);
    return;
  }
}

/// Forgets the range that starts at begin (before it is unmapped).
inline void unregister_mapping(const std::byte* begin) {
  MappingSlot* slots = mapping_slots();
  for (std::size_t i = 0; i < kMaxMappings; ++i)
    if (slots[i].state.load(std::memory_order_acquire) == 2 && slots[i].begin == begin) {
      slots[i].state.store(0, std::memory_order_release);
      return;
    }
}

inline void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= std::size_t(w);
  }
}
inline void write_str(const char* s) { write_all(s, std::strlen(s)); }

inline void map_fault_handler(int sig, siginfo_t* info, void*) {
  const auto* addr = static_cast<const std::byte*>(info ? info->si_addr : nullptr);
  MappingSlot* slots = mapping_slots();
  for (std::size_t i = 0; i < kMaxMappings; ++i) {
    if (slots[i].state.load(std::memory_order_acquire) != 2) continue;
    const std::byte* b = slots[i].begin;
    if (addr < b || addr >= b + slots[i].size) continue;
    write_str("kiln: error: model file '");
    write_str(slots[i].path);
    write_str(
        "' was truncated or changed while mapped (SIGBUS reading it); a file that may change must be "
        "loaded with --load read (kiln::io::LoadMode::read)\n");
    ::_exit(kMapFaultExitCode);
  }
  // Not a mapped model file: the default action (the fault recurs when the handler returns).
  ::signal(sig, SIG_DFL);
}

}  // namespace detail

/// Installs the SIGBUS handler described above (process-wide; idempotent). Returns false when sigaction
/// fails.
inline bool install_map_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = detail::map_fault_handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  (void)detail::mapping_slots();  // the table exists before any signal
  return ::sigaction(SIGBUS, &sa, nullptr) == 0;
}

}  // namespace kiln::io
