#!/usr/bin/env bash
# The main job: builds, then streams a bundled speech sample through the Mimi codec frame by frame
# (encode + decode, CPU fp32, tiny golden model) and prints the real-time factor.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p out
./build/src/personaplex-codec --config tests/data/tiny_config_a.json \
  --mimi tests/data/mimi_tiny_a.safetensors \
  --input tests/data/speech_16k.wav --output out/speech_roundtrip.wav
