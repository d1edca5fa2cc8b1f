#!/usr/bin/env bash
# Builds the CUDA binaries for one architecture (default sm_90) into build-dev/ and packs them,
# stripped, with the shared libraries a bare GPU machine lacks, into devpkg/devrun.tar.xz (git-ignored),
# for the `device` tool: carry devpkg and run scripts/device_check.sh there (the GPU machine has
# cuBLAS but not the Debian audio and tokenizer libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:-90-real}
bdir=${PPX_DEV_BUILD:-build-dev}  # PPX_DEV_BUILD=build reuses an sm_90 build/ instead of a second tree
scripts/setup.sh
cmake -S . -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPPX_CUDA=ON -DPPX_CUDA_ARCHS="$arch" >/dev/null
cmake --build "$bdir" -j "$(nproc)"
rm -rf devrun && mkdir -p devrun/bin devrun/lib
# PPX_DEV_BINS: a subset (the working tree and the pack travel within 64 MiB; ~6 MiB a binary).
bins=${PPX_DEV_BINS:-"src/personaplex-verify src/personaplex-offline src/personaplex-server src/personaplex-load bench/personaplex-bench
      bench/personaplex-bench-mimi bench/personaplex-bench-kernels tests/ppx_cuda_tests tests/ppx_server_tests"}
for b in $bins; do
  [ -f "$bdir/$b" ] && cp "$bdir/$b" devrun/bin/ && strip devrun/bin/"$(basename "$b")"
done
# Non-system shared libraries (everything but glibc, libstdc++/libgcc and the CUDA driver).
# (grep finds nothing when the binaries need only system libraries: not an error.)
ldd devrun/bin/* | awk '/=> \//{print $3}' | sort -u |
  { grep -v -E 'libc\.so|libm\.so|libdl|libpthread|librt|ld-linux|libstdc\+\+|libgcc_s|libcuda\.so|libcublas' || true; } |
  while read -r lib; do cp -L "$lib" devrun/lib/; done
# The device tool carries at most 64 MiB with the working tree: ship it compressed.
mkdir -p devpkg
# -9e: about a third smaller than the default level (the tree and the pack share 64 MiB).
XZ_OPT=${XZ_OPT:-"-9e -T0"} tar -cJf devpkg/devrun.tar.xz -C devrun bin lib
du -sh devpkg/devrun.tar.xz
