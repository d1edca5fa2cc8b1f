source /tmp/cli_review/h.sh
# servers: timeout -s INT 6: rc 124 = still running after 6 s (started)
s() { local name=$1; shift
  local st=$(date +%s.%N)
  ( cd $R/out && timeout -s INT -k 5 ${ST:-6} $B/personaplex-server "$@" ) >$R/logs/$name.out 2>$R/logs/$name.err
  local rc=$?; local w=$(printf "%.1f" $(echo "$(date +%s.%N) - $st" | bc))
  local lst=$(grep -o 'listening on [^ ]*' $R/logs/$name.out | head -1)
  local first=$(grep -iE 'error|terminate|abort|fault|what\(\)|exception|warn' $R/logs/$name.err | grep -v 'signal: draining' | head -2 | sed 's/^[0-9TZ:.-]* //' | tr '\n' ' ' | cut -c1-300)
  printf '%s\trc=%s\t%ss\t[%s]\t%s\n' "$name" "$rc" "$w" "$lst" "$first" | tee -a $R/results.tsv
  echo "CMD: personaplex-server $*" > $R/logs/$name.cmd
}
H="--host 127.0.0.1"
s srv_port0 $H --port 0
s srv_port65535 $H --port 65535
s srv_port65536 $H --port 65536
s srv_port_neg $H --port -1
s srv_port_huge $H --port 99999999999
s srv_port_abc $H --port abc
s srv_port_empty $H --port ""
s srv_port_priv $H --port 80
s srv_host_garbage --host garbage --port 0
s srv_host_empty --host "" --port 0
s srv_host_999 --host 999.1.1.1 --port 0
s srv_host_ipv6 --host ::1 --port 0
s srv_host_bracket --host "[::1]" --port 0
s srv_host_foreign --host 8.8.8.8 --port 0
s srv_host_localhost --host localhost --port 0
s srv_maxsess0 $H --port 0 --max-sessions 0
s srv_maxsess_neg $H --port 0 --max-sessions -1
s srv_maxsess_huge $H --port 0 --max-sessions 100000
s srv_maxsess_256 $H --port 0 --max-sessions 256
s srv_maxsess_4 $H --port 0 --max-sessions 4
s srv_ssl_missing $H --port 0 --ssl /nope
s srv_ssl_empty $H --port 0 --ssl $R/ssl_empty
s srv_ssl_garb $H --port 0 --ssl $R/ssl_garb
s srv_ssl_keyonly $H --port 0 --ssl $R/ssl_keyonly
s srv_ssl_swapped $H --port 0 --ssl $R/ssl_swapped
s srv_ssl_mismatch $H --port 0 --ssl $R/ssl_mismatch
s srv_ssl_file $H --port 0 --ssl $R/in/emptyfile
s srv_ssl_emptystr $H --port 0 --ssl ""
s srv_ssl_ok $H --port 0 --ssl $D/tests/data/tls
s srv_voicedir_file $H --port 0 --voice-prompt-dir $R/in/emptyfile
s srv_voicedir_missing $H --port 0 --voice-prompt-dir /nope
s srv_static_file $H --port 0 --static $R/in/emptyfile
s srv_static_missing $H --port 0 --static /nope
s srv_static_empty $H --port 0 --static ""
s srv_pc_neg $H --port 0 --prompt-cache-mb -1
s srv_pc_huge $H --port 0 --prompt-cache-mb 99999999999999999999
s srv_pc_2p63 $H --port 0 --prompt-cache-mb 9223372036854775807
s srv_pc_abc $H --port 0 --prompt-cache-mb abc
s srv_pc_float $H --port 0 --prompt-cache-mb 1.5
s srv_pc_empty $H --port 0 --prompt-cache-mb ""
s srv_pc_nan $H --port 0 --prompt-cache-mb nan
s srv_pc_AUTO $H --port 0 --prompt-cache-mb AUTO
s srv_pc_0 $H --port 0 --prompt-cache-mb 0
s srv_pc_1e6 $H --port 0 --prompt-cache-mb 1000000
s srv_idle_nan $H --port 0 --idle-timeout nan
s srv_idle_0 $H --port 0 --idle-timeout 0
s srv_drain_nan $H --port 0 --drain-timeout nan
s srv_drain_inf $H --port 0 --drain-timeout inf
s srv_maxdur_nan $H --port 0 --max-session-duration nan
s srv_maxdur_neg $H --port 0 --max-session-duration -1
s srv_iothreads0 $H --port 0 --io-threads 0
s srv_sessthreads_huge $H --port 0 --session-threads 256
s srv_maxconn1 $H --port 0 --max-connections 1
s srv_maxconn_huge $H --port 0 --max-connections 1000000
s srv_loglevel_bad $H --port 0 --log-level verbose
s srv_apikey_empty $H --port 0 --api-key ""
s srv_origin_empty $H --port 0 --allowed-origin ""
s srv_fast $H --port 0 --fast
s srv_kvfp8 $H --port 0 --kv-fp8
s srv_w8a16 $H --port 0 --w8a16
s srv_depq3 $H --port 0 --dep-q-exit 3
s srv_depq0 $H --port 0 --dep-q-exit 0
s srv_depq17 $H --port 0 --dep-q-exit 17
s srv_depqm1 $H --port 0 --dep-q-exit -1
s srv_depq8 $H --port 0 --dep-q-exit 8
s srv_dev_cuda0 $H --port 0 --device cuda:0
s srv_dev_cuda99 $H --port 0 --device cuda:99
s srv_dev_bogus $H --port 0 --device bogus
s srv_unknown $H --port 0 --bogus
s srv_dup_port $H --port 0 --port 1
s srv_positional $H --port 0 extra
s srv_metrics_auth_nokey $H --port 0 --metrics-auth
s srv_percodec $H --port 0 --per-session-codec
s srv_random_w_cfg $H --port 0 --random-weights --config $D/configs/tiny-demo.json
s srv_hfdir_missing $H --port 0 --hf-dir /nope
s srv_cfg_fpe $H --port 0 --config $R/cfg/ratios_overflow.json
s srv_cfg_depq1 $H --port 0 --config $R/cfg/dep_q_small.json
