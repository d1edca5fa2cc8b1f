source /tmp/cli_review/h.sh
V="$B/personaplex-offline --input-wav $D/tests/data/speech_16k.wav --output-wav v.wav --output-text v.json --seed 1 --quiet --voice-prompt-dir $R/voices"
t v_ok $V --voice-prompt voice_tiny_a.pt
t v_ok_noext $V --voice-prompt voice_tiny_a
t v_wav $V --voice-prompt sp.wav
t v_short $V --voice-prompt short.wav
t v_garb $V --voice-prompt garb.wav
t v_trunc $V --voice-prompt trunc.pt
t v_rand $V --voice-prompt rand.pt
t v_dir $V --voice-prompt subdir.pt
t v_missing $V --voice-prompt nope.pt
t v_nan $V --voice-prompt nan.wav
t v_silence $V --voice-prompt silence.wav
t v_traversal $V --voice-prompt ../in/copy_in.wav
t v_abs $V --voice-prompt $R/voices/sp.wav
t v_empty $V --voice-prompt ""
t v_cuda_pt $V --voice-prompt $D/tests/data/voice_tiny_a_cuda.pt
t v_dir_missing $B/personaplex-offline --input-wav $D/tests/data/speech_16k.wav --output-wav v.wav --output-text v.json --voice-prompt-dir /nope --voice-prompt x.pt
t v_dir_file $B/personaplex-offline --input-wav $D/tests/data/speech_16k.wav --output-wav v.wav --output-text v.json --voice-prompt-dir $R/voices/sp.wav --voice-prompt x.pt
t v_dir_nouse $B/personaplex-offline --input-wav $D/tests/data/speech_16k.wav --output-wav v.wav --output-text v.json --voice-prompt-dir /nope
t v_noexist_nodir $B/personaplex-offline --input-wav $D/tests/data/speech_16k.wav --output-wav v.wav --output-text v.json --voice-prompt NATF0.pt
