# Cross-compiling kiln for 64-bit Arm Linux (Highway's NEON target) from an x86-64 Debian host:
#   cmake -S . -B build/aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake \
#         -DKILN_AARCH64_SYSROOT=<dir with the arm64 libhwy and the header-only dependencies under usr/>
# scripts/cross_aarch64.sh prepares that directory (Debian's arm64 packages, unpacked), builds the tests
# and runs them under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR below).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

if(NOT KILN_AARCH64_SYSROOT)
  set(KILN_AARCH64_SYSROOT "$ENV{KILN_AARCH64_SYSROOT}")
endif()
if(NOT KILN_AARCH64_SYSROOT OR NOT EXISTS "${KILN_AARCH64_SYSROOT}/usr/include/hwy/highway.h")
  message(FATAL_ERROR "kiln aarch64 toolchain: KILN_AARCH64_SYSROOT ('${KILN_AARCH64_SYSROOT}') holds no arm64 "
                      "Highway. Run scripts/cross_aarch64.sh, which unpacks it there.")
endif()
# Try-compile checks run in a fresh project that sees only cache variables and the environment.
set(ENV{KILN_AARCH64_SYSROOT} "${KILN_AARCH64_SYSROOT}")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES KILN_AARCH64_SYSROOT)

# Packages (Highway, doctest, Eigen, nlohmann-json) only from the unpacked arm64 tree and the cross
# compiler's own tree, never the host's /usr.
set(CMAKE_FIND_ROOT_PATH "${KILN_AARCH64_SYSROOT}" /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# Test programs run under user-mode QEMU with the cross C library and the unpacked libhwy.so.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu -E
    LD_LIBRARY_PATH=${KILN_AARCH64_SYSROOT}/usr/lib/aarch64-linux-gnu)
