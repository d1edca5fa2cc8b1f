source /tmp/cli_review/h.sh
for f in $R/in/*.wav; do n=$(basename $f .wav); [ $n = long_10min ] && continue
t offwav_$n $B/personaplex-offline --input-wav $f --output-wav w_$n.wav --output-text w_$n.json --seed 1 --quiet
done
