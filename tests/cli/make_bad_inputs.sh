#!/usr/bin/env bash
# Writes damaged inputs for the CLI error tests into $1.
set -e
d=$1
data=$(dirname "$0")/../data
mkdir -p "$d"
head -c 1000000 "$data/lm_tiny_a.safetensors" > "$d/truncated_lm.safetensors"
head -c 4096 /dev/urandom > "$d/random.wav"
head -c 4096 /dev/urandom > "$d/random.pt"
python3 - "$d/long_prompt.txt" <<'PY' 2>/dev/null || printf 'word %.0s' $(seq 1 200) > "$d/long_prompt.txt"
import sys; open(sys.argv[1], "w").write("word " * 200)
PY
# A valid WAV header (24 kHz mono 16-bit) with no samples.
printf 'RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00\xc0\x5d\x00\x00\x80\xbb\x00\x00\x02\x00\x10\x00data\x00\x00\x00\x00' > "$d/no_samples.wav"
