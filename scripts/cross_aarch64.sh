#!/usr/bin/env bash
# The aarch64 stage of CI (GB10 boxes are Arm): cross-compiles the CPU build (no CUDA) for
# aarch64 with Debian's cross toolchain and multiarch :arm64 libraries, in build-aarch64/
# (toolchain: cmake/toolchain-aarch64.cmake), and runs the unit suites under qemu-user, so that
# nothing x86-only (intrinsics, signed char, unaligned loads, ...) creeps in.
#   1. installs what is missing: the arm64 architecture, g++-aarch64-linux-gnu, qemu-user and the
#      :arm64 -dev packages of scripts/setup.sh's libraries. libsentencepiece-dev:arm64 is not
#      Multi-Arch: same (installing it would remove the amd64 one), so its .debs are unpacked into
#      build-aarch64/sysroot/ instead;
#   2. builds ppx_tests (the CPU unit suite) only, plus ppx_server_tests (the server suite) when it
#      is to run (the server library alone is ~40% of the build's compile time);
#   3. runs the suites of PPX_CROSS_SUITES (default: ppx_tests; "ppx_tests ppx_server_tests"
#      adds the server suite, ~2 min more under qemu, left out of CI for its time: the server code
#      has no architecture-specific paths, and the CPU suite covers the numerics, Ogg/Opus and the
#      codecs), each as two shards at once (scripts/gtest_shards.sh), with `qemu-aarch64 -L /`
#      (no binfmt_misc needed): the multiarch libc6:arm64 and
#      its own ld.so, not the cross libc's (/usr/aarch64-linux-gnu: another Debian revision of
#      glibc, whose ld.so with the multiarch libc.so.6 hangs in the first pthread_create).
# Exclusions under emulation (qemu runs the float kernels ~10-30x slower than native):
#   ppx_tests: Scheduler.*AloneEqualBeside63Others (80 sessions on 64 threads: ~4 min of the 4.5
#   under qemu on 2 cores; their thread interplay cannot show aarch64 memory-ordering bugs here
#   anyway, qemu on an x86 host keeps x86 ordering). Their 8-slot twins (*Beside7Others) and
#   Scheduler.AFailedStepFailsItsSessionsOnly run.
#   ppx_server_tests: ServerProcessTest.* exec personaplex-server as a child process, which
#   would need binfmt_misc to run under qemu.
# Any build error, warning (-Werror) or failed test makes the script fail.
# Time on CI's 2 cores (2026-12-05, packages present, empty build dir): with both suites, build
# 324 s, ppx_tests 142 s, ppx_server_tests 125 s; ppx_tests alone builds in ~2 min. The first apt
# install adds about 80 s.
#
# Usage: scripts/cross_aarch64.sh [--build-only]
# PPX_BUILD_LOCK=FILE runs the build steps under `flock FILE`, PPX_APT_LOCK=FILE the apt steps
# (a tree or machine shared by several builders).
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=0
if [ "${1:-}" = "--build-only" ]; then build_only=1; fi
build_lock=()
if [ -n "${PPX_BUILD_LOCK:-}" ]; then build_lock=(flock "$PPX_BUILD_LOCK"); fi
apt_lock=()
if [ -n "${PPX_APT_LOCK:-}" ]; then apt_lock=(flock "$PPX_APT_LOCK"); fi
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive

# 1. The toolchain, the emulator and the arm64 libraries.
packages=(
  g++-aarch64-linux-gnu qemu-user
  libboost-dev:arm64 nlohmann-json3-dev libspdlog-dev:arm64 libfmt-dev:arm64 libcli11-dev
  libgtest-dev:arm64 libopus-dev:arm64 libogg-dev:arm64 libsndfile1-dev:arm64 libsoxr-dev:arm64
  libebur128-dev:arm64 libssl-dev:arm64
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
sysroot=build-aarch64/sysroot  # sentencepiece (see above)
spm_pkgs=(libsentencepiece0:arm64 libsentencepiece-dev:arm64)
if [ ${#missing[@]} -gt 0 ] || [ ! -e $sysroot/usr/include/sentencepiece_processor.h ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${apt_lock[@]}" "${sudo_cmd[@]}" dpkg --add-architecture arm64
  fi
  "${apt_lock[@]}" "${sudo_cmd[@]}" apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "cross_aarch64: installing ${missing[*]}"
  "${apt_lock[@]}" "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -e $sysroot/usr/include/sentencepiece_processor.h ]; then
  echo "cross_aarch64: unpacking ${spm_pkgs[*]} into $sysroot"
  debs=$(mktemp -d)
  (cd "$debs" && chmod 777 . && "${apt_lock[@]}" apt-get download -qq "${spm_pkgs[@]}")
  mkdir -p $sysroot
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" $sysroot; done
  rm -rf "$debs"
fi

# 2. Configure and build. Release (-O3): the suites' kernels are the slow part under qemu.
# Tests are listed when ctest runs (PRE_TEST), not at build time under the emulator.
"${build_lock[@]}" cmake -S . -B build-aarch64 -G Ninja \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64.cmake" -DCMAKE_BUILD_TYPE=Release \
  -DPPX_CUDA=OFF -DPPX_WERROR=ON -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >/dev/null
start=$SECONDS
read -ra suites <<<"${PPX_CROSS_SUITES:-ppx_tests}"
if [ ${#suites[@]} -eq 0 ]; then echo "cross_aarch64: PPX_CROSS_SUITES names no suite" >&2; exit 2; fi
targets=(ppx_tests)
for suite in "${suites[@]}"; do
  case "$suite" in
    ppx_tests) ;;
    ppx_server_tests) targets+=(ppx_server_tests) ;;
    *) echo "cross_aarch64: unknown suite '$suite' in PPX_CROSS_SUITES (ppx_tests, ppx_server_tests)" >&2; exit 2 ;;
  esac
done
"${build_lock[@]}" cmake --build build-aarch64 -j "$(nproc)" --target "${targets[@]}"
echo "cross_aarch64: built in $((SECONDS - start)) s"
file build-aarch64/tests/ppx_tests | grep -q "ARM aarch64" || { echo "cross_aarch64: not an aarch64 binary" >&2; exit 1; }
if [ "$build_only" = 1 ]; then exit 0; fi

# 3. The suites under qemu-user.
qemu=(qemu-aarch64 -L /)
declare -A filters=(
  [ppx_tests]='-Scheduler.*AloneEqualBeside63Others'
  [ppx_server_tests]='-ServerProcessTest.*'
)
for suite in "${suites[@]}"; do
  echo "cross_aarch64: $suite under qemu-aarch64 (filter ${filters[$suite]})"
  start=$SECONDS
  scripts/gtest_shards.sh 2 "build-aarch64/test-logs/$suite" \
    "${qemu[@]}" build-aarch64/tests/$suite --gtest_brief=1 --gtest_filter="${filters[$suite]}"
  echo "cross_aarch64: $suite passed in $((SECONDS - start)) s"
done
