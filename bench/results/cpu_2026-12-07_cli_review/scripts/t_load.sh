source /tmp/cli_review/h.sh
T=30
L=$B/personaplex-load
t ld_noserver $L --port 1 --duration 1
t ld_badhost $L --host garbage --port 8998 --duration 1
t ld_hostname $L --host localhost --port 1 --duration 1
t ld_port0 $L --port 0 --duration 1
t ld_dur_nan $L --port 1 --duration nan
t ld_dur0 $L --port 1 --duration 0
t ld_ramp_nan $L --port 1 --duration 1 --ramp-ms nan
t ld_budget_nan $L --port 1 --duration 1 --budget-ms nan
t ld_hs_nan $L --port 1 --duration 1 --handshake-timeout nan
t ld_drain_nan $L --port 1 --duration 1 --drain nan
t ld_churn_nan $L --port 1 --duration 1 --churn nan
t ld_sessions0 $L --port 1 --sessions 0
t ld_input_missing $L --port 1 --input /nope.wav
t ld_input_garbage $L --port 1 --input $R/in/garbage.wav
t ld_input_empty $L --port 1 --input $R/in/zero_data.wav
t ld_input_short $L --port 1 --input $R/in/one_sample.wav
t ld_json_missing_dir $L --port 1 --duration 1 --json /nope/x.json
t ld_json_devfull $L --port 1 --duration 1 --json /dev/full
