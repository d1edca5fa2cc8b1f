source /tmp/cli_review/h.sh
IN=$D/tests/data/speech_16k.wav
O="$B/personaplex-offline --input-wav $IN --output-wav o.wav --output-text o.json --seed 1"
t off_temp_neg $O --temp-audio -1
t off_temp_nan $O --temp-audio nan
t off_temp_inf $O --temp-text inf
t off_temp_1e308 $O --temp-text 1e308
t off_temp_empty $O --temp-text ""
t off_temp_abc $O --temp-text abc
t off_temp_0 $O --temp-text 0 --temp-audio 0
t off_topk_neg $O --topk-audio -5
t off_topk_huge $O --topk-audio 9223372036854775808
t off_topk_0 $O --topk-audio 0 --topk-text 0
t off_seed_huge $O --seed 9223372036854775807
t off_seed_over $O --seed 9223372036854775808
t off_seed_neg2 $O --seed -2
t off_seed_abc $O --seed abc
t off_dup_seed $O --seed 5
t off_unknown $O --bogus
t off_positional $O extra
t off_fast_cpu $O --fast
t off_w8_cpu $O --w8a16
t off_kvfp8_cpu $O --kv-fp8
t off_mimifp16_cpu $O --mimi-fp16
t off_nopdl_cpu $O --no-mimi-pdl
t off_w8fmt_only $O --w8-format fp8
t off_w8fmt_bad $O --w8-format int4
t off_depq_3 $O --dep-q-exit 3
t off_depq_0 $O --dep-q-exit 0
t off_depq_17 $O --dep-q-exit 17
t off_depq_m1 $O --dep-q-exit -1
t off_depq_m2 $O --dep-q-exit -2
t off_depq_8 $O --dep-q-exit 8
t off_depq_16 $O --dep-q-exit 16
t off_depq_huge $O --dep-q-exit 99999999999
t off_skipother $O --skip-other-mimi
t off_dev_cuda $O --device cuda
t off_dev_cuda0 $O --device cuda:0
t off_dev_cuda99 $O --device cuda:99
t off_dev_bogus $O --device bogus
t off_dev_cudax $O --device cuda:x
t off_dev_cudaneg $O --device cuda:-1
t off_dev_empty $O --device ""
t off_dev_CPU $O --device CPU
t off_dev_cuda_ $O --device "cuda:"
t off_dev_cudabig $O --device cuda:99999999999999999999
t off_greedy $O --greedy
t off_noargs $B/personaplex-offline
t off_random_weights $O --random-weights
