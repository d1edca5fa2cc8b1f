#!/usr/bin/env bash
# Builds and runs every test (ctest). CUDA tests are labelled `cuda` and skip without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure -j "$(nproc)"
