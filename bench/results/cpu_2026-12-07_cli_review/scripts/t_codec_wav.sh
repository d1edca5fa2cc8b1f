source /tmp/cli_review/h.sh
C="$B/personaplex-codec --config $D/configs/tiny.json --mimi $D/tests/data/mimi_tiny_a.safetensors"
for f in $R/in/*.wav; do n=$(basename $f .wav); [ $n = long_10min ] && continue
t codwav_$n $C --input $f --output c_$n.wav
done
