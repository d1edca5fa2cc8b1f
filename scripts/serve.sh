#!/usr/bin/env bash
# The main job: builds, then starts personaplex-server on the embedded tiny demo model (random
# weights generated deterministically, bundled tokenizer) with one demo voice made from a bundled
# speech sample, and prints the URL to open. Extra arguments go to the server (e.g. --port 9000,
# --hf-dir DIR for the real model, --device cuda, --ssl DIR). Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p out/voices
cp tests/data/speech_16k.wav out/voices/demo.wav
exec ./build/src/personaplex-server --voice-prompt-dir out/voices "$@"
