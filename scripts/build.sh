#!/usr/bin/env bash
# Configures and builds into build/ (Release). Extra arguments go to cmake's configure step,
# e.g. -DPPX_CUDA=OFF or -DCMAKE_CUDA_ARCHITECTURES=90.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$jobs"
