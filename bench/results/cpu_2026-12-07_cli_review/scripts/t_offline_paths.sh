source /tmp/cli_review/h.sh
IN=$D/tests/data/speech_16k.wav
P="$B/personaplex-offline --seed 1 --quiet"
t offp_missing_in $P --input-wav /nonexistent.wav --output-wav a.wav --output-text a.json
t offp_dir_in $P --input-wav /tmp --output-wav a.wav --output-text a.json
t offp_devnull_in $P --input-wav /dev/null --output-wav a.wav --output-text a.json
t offp_empty_in $P --input-wav "" --output-wav a.wav --output-text a.json
t offp_out_missing_dir $P --input-wav $IN --output-wav /nonexistent_dir/a.wav --output-text a.json
t offp_json_missing_dir $P --input-wav $IN --output-wav pm_a.wav --output-text /nonexistent_dir/a.json
t offp_out_proc $P --input-wav $IN --output-wav /proc/x.wav --output-text pp.json
t offp_json_proc $P --input-wav $IN --output-wav pj.wav --output-text /proc/x.json
t offp_out_dir $P --input-wav $IN --output-wav /tmp --output-text a.json
t offp_out_empty $P --input-wav $IN --output-wav "" --output-text a.json
t offp_json_empty $P --input-wav $IN --output-wav pe.wav --output-text ""
t offp_out_ro $P --input-wav $IN --output-wav ro_dir/a.wav --output-text a.json
t offp_json_ro $P --input-wav $IN --output-wav pro.wav --output-text ro_dir/a.json
cp $R/in/copy_in.wav $R/out/same.wav
t offp_out_eq_in $P --input-wav $R/out/same.wav --output-wav $R/out/same.wav --output-text same.json
cp $R/in/copy_in.wav $R/out/same2.wav
t offp_json_eq_in $P --input-wav $R/out/same2.wav --output-wav s2.wav --output-text $R/out/same2.wav
t offp_wav_eq_json $P --input-wav $IN --output-wav both.out --output-text both.out
t offp_out_devfull $P --input-wav $IN --output-wav /dev/full --output-text df.json
t offp_json_devfull $P --input-wav $IN --output-wav df2.wav --output-text /dev/full
t offp_out_devnull $P --input-wav $IN --output-wav /dev/null --output-text /dev/null
t offp_out_stdout $P --input-wav $IN --output-wav - --output-text dash.json
