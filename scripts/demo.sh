#!/usr/bin/env bash
# The main job: builds, then runs the offline tool end to end on the embedded tiny demo model
# (random weights generated deterministically, bundled tokenizer): a bundled speech sample is the
# voice prompt and the user audio; prints the real-time factor. Outputs land in out/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
mkdir -p out
./build/src/personaplex-offline --input-wav tests/data/speech_16k.wav \
  --voice-prompt tests/data/speech_16k.wav \
  --text-prompt "You are a wise and friendly teacher." \
  --output-wav out/agent.wav --output-text out/agent.json --seed 42424242
