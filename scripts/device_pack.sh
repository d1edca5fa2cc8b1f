#!/usr/bin/env bash
# Builds the CUDA binaries for one architecture (default sm_90) into build-dev/ and packs them,
# stripped, with the shared libraries a bare GPU machine lacks, into devpkg/devrun.tar.xz (git-ignored),
# for the `device` tool: carry devpkg and run scripts/device_check.sh there (the GPU machine has
# cuBLAS but not the Debian audio and tokenizer libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90-real}
scripts/setup.sh
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPPX_CUDA=ON -DPPX_CUDA_ARCHS="$arch" >/dev/null
cmake --build build-dev -j "$(nproc)"
rm -rf devrun && mkdir -p devrun/bin devrun/lib
for b in src/personaplex-verify src/personaplex-offline bench/personaplex-bench bench/personaplex-bench-mimi \
         bench/personaplex-bench-kernels tests/ppx_cuda_tests tests/ppx_server_tests; do
  [ -f "build-dev/$b" ] && cp "build-dev/$b" devrun/bin/ && strip devrun/bin/"$(basename "$b")"
done
# Non-system shared libraries (everything but glibc, libstdc++/libgcc and the CUDA driver).
ldd devrun/bin/* | awk '/=> \//{print $3}' | sort -u | grep -v -E 'libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc\+\+|libgcc_s|libcuda\.so|libcublas' |
  while read -r lib; do cp -L "$lib" devrun/lib/; done
# The device tool carries at most 64 MiB with the working tree: ship it compressed.
mkdir -p devpkg
tar -cJf devpkg/devrun.tar.xz -C devrun bin lib
du -sh devpkg/devrun.tar.xz
