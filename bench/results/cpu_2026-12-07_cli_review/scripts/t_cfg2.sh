source /tmp/cli_review/h.sh
T=60
ulimit -v 8000000
for n in hidden_scale_tiny dep_ffn_1 mimi_ffn_1 qdim_1 dep_heads_64 dep_heads_odd ratios_1 ratios_2_fr compress_64 dilation_16 delays_64 delays_ctx max_period_1 layer_scale_0 frame_rate_odd silence_cnt_0 use_sampling_false topk_huge mimi_heads_big pad_id_0 zero_text_code_0; do f=$R/cfg/$n.json
t cfg2_$n $B/personaplex-offline --config $f --input-wav $R/in/silence_1s.wav --output-wav cfg_$n.wav --output-text cfg_$n.json --seed 1 --text-prompt "" --quiet
done
