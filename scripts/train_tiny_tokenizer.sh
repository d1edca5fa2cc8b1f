#!/usr/bin/env bash
# Trains the tiny SentencePiece model shipped for the tiny test LM (text_card 1000) from
# scripts/tokenizer_corpus.txt, with Debian's `spm_train` (package `sentencepiece`).
# Deterministic: one thread, no sentence sampling, fixed seed; rerunning it gives the same bytes
# for the same sentencepiece version (0.1.97 made the checked-in model).
#
# Special ids follow the real tokenizer_spm_32k_3.model: 0 <unk> (upstream reads a sampled 0 as
# EPAD), 1 <s>, 2 </s>, 3 <pad> (upstream's text padding / zero_text_code). <system> is a
# user-defined symbol (id 4) so the system-prompt tags encode to one piece each.
#
# Usage: scripts/train_tiny_tokenizer.sh [output.model]   (default tests/data/tiny_spm_1000.model)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-$root/tests/data/tiny_spm_1000.model}")"
if ! command -v spm_train >/dev/null; then
  echo "needs spm_train (apt-get install sentencepiece)" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The model records its training flags, paths included: train in a scratch folder under fixed
# relative names so that the bytes do not depend on where this runs.
cp "$root/scripts/tokenizer_corpus.txt" "$tmp/"
cd "$tmp"
spm_train \
  --input=tokenizer_corpus.txt \
  --model_prefix=tiny_spm_1000 \
  --model_type=unigram \
  --vocab_size=1000 \
  --hard_vocab_limit=true \
  --character_coverage=1.0 \
  --input_sentence_size=0 \
  --shuffle_input_sentence=false \
  --num_threads=1 \
  --random_seed=1234 \
  --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=3 \
  --unk_piece='<unk>' --bos_piece='<s>' --eos_piece='</s>' --pad_piece='<pad>' \
  --user_defined_symbols='<system>' \
  --minloglevel=1
mkdir -p "$(dirname "$out")"
cp tiny_spm_1000.model "$out"
echo "wrote $out ($(wc -c <"$out") bytes)"
