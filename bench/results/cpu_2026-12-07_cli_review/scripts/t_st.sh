source /tmp/cli_review/h.sh
TD=$D/tests/data
ulimit -v 8000000
M="$B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt '' --quiet"
O() { $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet "$@"; }
export -f O 2>/dev/null
for f in $R/st/*.safetensors; do n=$(basename $f .safetensors)
t stlm_$n $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm $f --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
done
t st_swap $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm $TD/mimi_tiny_a.safetensors --mimi $TD/lm_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_mimi_trunc $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm $TD/lm_tiny_a.safetensors --mimi $R/st/lm_trunc_half.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_lm_dir $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm /tmp --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_lm_devzero $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm /dev/zero --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_lm_missing $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm /nope.safetensors --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_lm_only $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --lm $TD/lm_tiny_a.safetensors
t st_no_tok $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --lm $TD/lm_tiny_a.safetensors --mimi $TD/mimi_tiny_a.safetensors
t st_no_config $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --lm $TD/lm_tiny_a.safetensors --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model
t st_demo_cfg_real_w $B/personaplex-offline --config $D/configs/tiny-demo.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --lm $TD/lm_tiny_a.safetensors --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model --text-prompt ""
t st_7b_cfg_tiny_w $B/personaplex-offline --config $D/configs/personaplex-7b.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --lm $TD/lm_tiny_a.safetensors --mimi $TD/mimi_tiny_a.safetensors --tokenizer $TD/tiny_spm_1000.model --text-prompt ""
for f in $R/tok/*.model /tmp $TD/lm_tiny_a.safetensors /nope.model; do n=$(basename $f .model)
t tok_$n $B/personaplex-offline --config $D/configs/tiny.json --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --seed 1 --text-prompt "" --quiet --lm $TD/lm_tiny_a.safetensors --mimi $TD/mimi_tiny_a.safetensors --tokenizer $f
done
t tok_demo_garbage $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --tokenizer $R/tok/garbage.model
t hfdir_missing $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --hf-dir /nope
t hfdir_file $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --hf-dir $TD/lm_tiny_a.safetensors
t hfdir_empty $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --hf-dir $R/tok
t config_missing $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --config /nope.json
t config_dir $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --config /tmp
t config_st $B/personaplex-offline --input-wav $R/in/silence_1s.wav --output-wav st.wav --output-text st.json --config $TD/lm_tiny_a.safetensors
