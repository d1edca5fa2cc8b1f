# harness: source me. t NAME cmd...   -> runs with timeout, logs rc, wall, head of stderr/stdout
B=/tmp/clibin
D=/work/main
R=/tmp/cli_review
T=${T:-60}
t() {
  local name=$1; shift
  local s=$(date +%s.%N)
  ( cd $R/out && timeout -k 5 $T "$@" ) >$R/logs/$name.out 2>$R/logs/$name.err
  local rc=$?
  local e=$(date +%s.%N)
  local w=$(printf "%.1f" $(echo "$e - $s" | bc))
  local first=$(grep -v '^\s*$' $R/logs/$name.err | grep -iE 'error|terminate|abort|fault|what\(\)|exception' | head -2 | tr '\n' ' ' | cut -c1-300)
  [ -z "$first" ] && first=$(head -c 300 $R/logs/$name.err | tr '\n' ' ')
  printf '%s\trc=%s\t%ss\t%s\n' "$name" "$rc" "$w" "$first" | tee -a $R/results.tsv
  echo "CMD: $*" > $R/logs/$name.cmd
}
