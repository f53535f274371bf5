// kiln/io/mmap.hpp - a model file's bytes, memory-mapped read-only or loaded into aligned memory.
//
//   auto f = kiln::io::MappedFile("model.gguf");                          // mmap (default)
//   auto g = kiln::io::MappedFile("model.gguf", kiln::io::LoadMode::read);  // copy into 64-byte-aligned RAM
//
// LoadMode::map maps the file PROT_READ / MAP_PRIVATE: pages come from the page cache on first touch and
// are shared between processes; the bytes are never writable. LoadMode::read reads the whole file into
// ordinary heap memory aligned to 64 bytes (kiln::alignment), with transparent huge pages requested
// (kiln::detail::advise_huge_pages) and up to 4 threads reading: no page faults later, fewer TLB misses
// when the weights are streamed, no dependence on the file staying unchanged, at the cost of a copy.
// Either way bytes() is stable for the object's lifetime and survives moves (the pointer does not change
// when a MappedFile is moved).
//
// The contents must not change while mapped (truncating a mapped file makes later reads SIGBUS; that is
// the nature of mmap, use LoadMode::read if the file may be rewritten). Mapped ranges are registered with
// io/map_fault.hpp, whose opt-in SIGBUS handler names the file instead of dying with "Bus error". Errors (kiln::Error) name the
// file and the system's errno text.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/storage.hpp"
#include "kiln/io/map_fault.hpp"

namespace kiln::io {

enum class LoadMode {
  map,   ///< mmap the file read-only (zero-copy, lazily paged in)
  read,  ///< read the whole file into 64-byte-aligned heap memory
};

class MappedFile {
 public:
  MappedFile() = default;

  explicit MappedFile(const std::filesystem::path& path, LoadMode mode = LoadMode::map)
      : path_(path.string()), mode_(mode) {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) sys_fail("cannot open");
    struct FdCloser {
      int fd;
      ~FdCloser() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) sys_fail("cannot stat");
    if (!S_ISREG(st.st_mode)) fail("kiln: '", path_, "' is not a regular file");
    if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > SIZE_MAX / 2)
      fail("kiln: '", path_, "' has an unsupported size ", st.st_size);
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ == 0) return;  // nothing to map: data() is null, size() is 0
    if (mode == LoadMode::map) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) sys_fail("cannot mmap");
      data_ = static_cast<const std::byte*>(p);
      detail::register_mapping(data_, size_, path_);
    } else {
      auto* p = static_cast<std::byte*>(kiln::detail::aligned_alloc_bytes(size_));
      const ReadResult r = read_parallel(fd, p, size_);
      if (r.err || r.got < size_) {
        kiln::detail::aligned_free(p);
        if (r.err) {
          errno = r.err;
          sys_fail("cannot read");
        }
        fail("kiln: '", path_, "' shrank while being read (got ", r.got, " of ", size_, " bytes)");
      }
      data_ = p;
    }
  }

  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept { swap(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    if (this != &o) {
      release();
      swap(o);
    }
    return *this;
  }
  ~MappedFile() { release(); }

  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  LoadMode mode() const { return mode_; }
  bool is_mapped() const { return mode_ == LoadMode::map && data_ != nullptr; }
  /// The bytes, writable, when the file was read into memory (LoadMode::read; null when mapped). They are
  /// this object's own heap memory; the model loader repacks f16/bf16 weights in place through this.
  std::byte* writable_data() { return mode_ == LoadMode::read ? const_cast<std::byte*>(data_) : nullptr; }

  /// Drops this process's pages of [p, p + n) (the whole pages inside it) when mapped (MADV_DONTNEED: the
  /// mapping is read-only and clean, so a later access reads the file again); no-op otherwise. For bytes
  /// copied elsewhere at load, so that they stop counting in the resident set.
  void release(const std::byte* p, std::size_t n) const {
    if (!is_mapped() || p < data_ || p + n > data_ + size_) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto a = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
    const auto b = (reinterpret_cast<std::uintptr_t>(p) + n) / page * page;
    if (a < b) ::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
  }

  /// Maps the pages of [p, p + n) in one call (MADV_POPULATE_READ where the kernel has it, Linux 5.14) before
  /// a sequential read of all of it (page faults one by one cost more than the copy); no-op otherwise.
  void populate(const std::byte* p, std::size_t n) const {
#ifdef MADV_POPULATE_READ
    if (!is_mapped() || p < data_ || p + n > data_ + size_) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto a = reinterpret_cast<std::uintptr_t>(p) / page * page;
    (void)::madvise(reinterpret_cast<void*>(a), reinterpret_cast<std::uintptr_t>(p) + n - a, MADV_POPULATE_READ);
#else
    (void)p;
    (void)n;
#endif
  }

  /// Marks the pages of [p, p + n) as read sparsely (a token embedding's rows, norm vectors): no huge-page
  /// mappings there (MADV_NOHUGEPAGE: where the page cache holds the file in 2 MiB folios, one row read
  /// would otherwise map, and count in the resident set, all 2 MiB around it) and no read-ahead
  /// (MADV_RANDOM); no-op when loaded into memory.
  void advise_sparse(const std::byte* p, std::size_t n) const {
    if (!is_mapped() || n == 0 || p < data_ || p + n > data_ + size_) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto a = reinterpret_cast<std::uintptr_t>(p) / page * page;
    const auto b = (reinterpret_cast<std::uintptr_t>(p) + n + page - 1) / page * page;
#ifdef MADV_NOHUGEPAGE
    (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_NOHUGEPAGE);
#endif
    (void)::madvise(reinterpret_cast<void*>(a), b - a, MADV_RANDOM);
  }

  /// Hints the kernel to read the mapping ahead (MADV_WILLNEED); no-op when loaded into memory.
  void prefetch() const {
    if (is_mapped()) ::madvise(const_cast<std::byte*>(data_), size_, MADV_WILLNEED);
  }

 private:
  struct ReadResult {
    int err = 0;                 // the errno of a failed read, or 0
    std::size_t got = SIZE_MAX;  // where the piece stopped early (SIZE_MAX: it did not)
  };
  // Reads [a, b) of fd into p + a; on an early end, got = where it ended.
  static ReadResult read_range(int fd, std::byte* p, std::size_t a, std::size_t b) {
    for (std::size_t done = a; done < b;) {
      const ssize_t r = ::pread(fd, p + done, b - done, static_cast<off_t>(done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return {errno, done};
      if (r == 0) return {0, done};
      done += static_cast<std::size_t>(r);
    }
    return {};
  }
  // The whole file, in up to 4 pieces of whole 2 MiB pages on as many threads (at least 64 MiB each): the
  // first touch of the fresh memory (a page fault per page, on a VM often a host fault as well) costs
  // more than the copy, and it spreads over the cores. Returns got = size when all of it was read.
  static ReadResult read_parallel(int fd, std::byte* p, std::size_t size) {
    constexpr std::size_t kPiece = std::size_t{64} << 20, kPage = std::size_t{2} << 20;
    const std::size_t n = std::min<std::size_t>(4, (size + kPiece - 1) / kPiece);
    const std::size_t step = (size / n + kPage - 1) / kPage * kPage;
    const std::size_t pieces = (size + step - 1) / step;
    std::vector<ReadResult> res(pieces);
    kiln::detail::run_once_parallel(
        pieces, n, [&](std::size_t i) { res[i] = read_range(fd, p, i * step, std::min(size, (i + 1) * step)); });
    for (const ReadResult& r : res)
      if (r.err || r.got != SIZE_MAX) return r;  // the first piece that failed or ended early
    return {0, size};
  }
  [[noreturn]] void sys_fail(const char* what) const {
    const int e = errno;
    fail("kiln: ", what, " '", path_, "': ", std::generic_category().message(e));
  }
  void release() noexcept {
    if (!data_) return;
    if (mode_ == LoadMode::map) {
      detail::unregister_mapping(data_);
      ::munmap(const_cast<std::byte*>(data_), size_);
    } else kiln::detail::aligned_free(const_cast<std::byte*>(data_));
    data_ = nullptr;
    size_ = 0;
  }
  void swap(MappedFile& o) noexcept {
    std::swap(path_, o.path_);
    std::swap(mode_, o.mode_);
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }

  std::string path_;
  LoadMode mode_ = LoadMode::map;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kiln::io
