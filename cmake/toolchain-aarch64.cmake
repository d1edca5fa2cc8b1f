# Cross-compiles for aarch64 (GB10 / DGX Spark class boxes) on a Debian amd64 host with Debian's
# cross toolchain (g++-aarch64-linux-gnu) and multiarch :arm64 libraries in
# /usr/lib/aarch64-linux-gnu. Used by scripts/cross_aarch64.sh, which installs all of it.
#
#   cmake -S . -B build-aarch64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake -DPPX_CUDA=OFF
#
# PPX_AARCH64_EXTRA_ROOT: a directory searched before the system for libraries whose :arm64 -dev
# package cannot be co-installed with the amd64 one (not Multi-Arch: same; today sentencepiece):
# the script unpacks those .debs there. Binaries get it in their build RPATH.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

if(NOT DEFINED PPX_AARCH64_EXTRA_ROOT)
  set(PPX_AARCH64_EXTRA_ROOT "${CMAKE_CURRENT_LIST_DIR}/../build-aarch64/sysroot")
endif()
get_filename_component(PPX_AARCH64_EXTRA_ROOT "${PPX_AARCH64_EXTRA_ROOT}" ABSOLUTE)
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES PPX_AARCH64_EXTRA_ROOT)

# Libraries, headers and CMake packages: the extra root, the cross libc, then the multiarch
# system (/usr/lib/aarch64-linux-gnu through CMAKE_LIBRARY_ARCHITECTURE; headers in /usr/include
# are shared by all architectures). Programs (git, pkg-config) are the host's.
set(CMAKE_FIND_ROOT_PATH "${PPX_AARCH64_EXTRA_ROOT}" /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config reads only the arm64 .pc files (and the architecture-independent ones).
set(ENV{PKG_CONFIG_LIBDIR}
    "${PPX_AARCH64_EXTRA_ROOT}/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
unset(ENV{PKG_CONFIG_PATH})
unset(ENV{PKG_CONFIG_SYSROOT_DIR})

# try_run, gtest_discover_tests and ctest run the aarch64 binaries under qemu-user (no binfmt
# needed). -L / (not /usr/aarch64-linux-gnu): the binaries need the multiarch :arm64 libraries,
# and those come with libc6:arm64, whose libc.so.6 must be loaded by its own ld.so; the cross
# libc's ld.so (libc6-arm64-cross, another Debian revision) with the multiarch libc.so.6 hangs
# in the first pthread_create (seen with 2.36-8cross1 beside 2.36-9+deb12u14).
find_program(PPX_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR "${PPX_QEMU_AARCH64};-L;/")
