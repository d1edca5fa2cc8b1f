source /tmp/cli_review/h.sh
TD=$D/tests/data
C="$B/personaplex-codec --config $D/configs/tiny.json --mimi $TD/mimi_tiny_a.safetensors"
t cod_dev_cuda $C --input $TD/speech_16k.wav --output x.wav --device cuda
t cod_dev_bogus $C --input $TD/speech_16k.wav --output x.wav --device bogus
t cod_out_missing_dir $C --input $TD/speech_16k.wav --output /nope/x.wav
t cod_out_proc $C --input $TD/speech_16k.wav --output /proc/x.wav
t cod_out_devfull $C --input $TD/speech_16k.wav --output /dev/full
t cod_mimi_is_lm $B/personaplex-codec --config $D/configs/tiny.json --mimi $TD/lm_tiny_a.safetensors --input $TD/speech_16k.wav --output x.wav
t cod_cfg_7b $B/personaplex-codec --config $D/configs/personaplex-7b.json --mimi $TD/mimi_tiny_a.safetensors --input $TD/speech_16k.wav --output x.wav
t cod_cfg_nolm $B/personaplex-codec --config $R/cfg/missing_lm.json --mimi $TD/mimi_tiny_a.safetensors --input $TD/speech_16k.wav --output x.wav
t cod_missing_cfg $B/personaplex-codec --mimi $TD/mimi_tiny_a.safetensors --input $TD/speech_16k.wav --output x.wav
t cod_input_dir $C --input /tmp --output x.wav
t cod_in_eq_out $C --input $R/out/same_c.wav --output $R/out/same_c.wav
V=$B/personaplex-verify
t ver_none $V
t ver_bad_sub $V bogus
t ver_mimi_ok $V mimi --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --io $TD/mimi_tiny_a_io.safetensors
t ver_mimi_cuda $V mimi --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --io $TD/mimi_tiny_a_io.safetensors --device cuda
t ver_mimi_io_is_lm $V mimi --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --io $TD/lm_tiny_a.safetensors
t ver_mimi_io_trunc $V mimi --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --io $R/st/lm_trunc_half.safetensors
t ver_session_ok $V session --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/session_tiny_a_cpu_fp32.safetensors
t ver_session_tf $V session --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/session_tiny_a_cpu_fp32.safetensors --teacher-forced
t ver_session_io $V session --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/mimi_tiny_a_io.safetensors
t ver_session_voice $V session --config $TD/tiny_config_a.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/voice_tiny_a_cuda_contents.safetensors
t ver_session_cfgdemo $V session --config $D/configs/tiny-demo.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/session_tiny_a_cpu_fp32.safetensors
t ver_session_fpe $V session --config $R/cfg/ratios_overflow.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/session_tiny_a_cpu_fp32.safetensors
t ver_session_depq $V session --config $R/cfg/dep_q_small.json --mimi $TD/mimi_tiny_a.safetensors --lm $TD/lm_tiny_a.safetensors --session $TD/session_tiny_a_cpu_fp32.safetensors
