source /tmp/cli_review/h.sh
IN=$D/tests/data/speech_16k.wav
O="$B/personaplex-offline --input-wav $IN --output-wav o.wav --output-text o.json"
t off_seed_huge $O --seed 9223372036854775807
t off_seed_over $O --seed 9223372036854775808
t off_seed_neg2 $O --seed -2
t off_seed_abc $O --seed abc
t off_seed_float $O --seed 1.5
t off_seed_dup $O --seed 1 --seed 2
t off_seed_2p32 $O --seed 4294967296
t off_topk_1 $O --topk-audio 1 --topk-text 1
t off_topk_max $O --topk-audio 1048576
t off_eq_syntax $B/personaplex-offline --input-wav=$IN --output-wav=o.wav --output-text=o.json
t off_textprompt_empty $O --text-prompt ""
t off_textprompt_wrapped $O --text-prompt "<system> hi <system>"
t off_textprompt_half $O --text-prompt "<system> hi"
t off_textprompt_long $O --text-prompt "$(python3 -c 'print("hello world "*2000)')"
t off_textprompt_binary $O --text-prompt "$(printf '\xff\xfe\x80abc')"
t off_textprompt_ctl $O --text-prompt "$(printf 'a\x01\x02\x1b[31m')"
t off_quiet $O --quiet
