source /tmp/cli_review/h.sh
T=60
ulimit -v 8000000
for f in $R/cfg/*.json; do n=$(basename $f .json)
t cfg_$n $B/personaplex-offline --config $f --input-wav $R/in/silence_1s.wav --output-wav cfg_$n.wav --output-text cfg_$n.json --seed 1 --text-prompt "" --quiet
done
