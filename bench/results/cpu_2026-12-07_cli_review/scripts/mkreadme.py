import collections
rows=collections.OrderedDict()
for line in open('results.tsv', errors='replace'):
    p=line.rstrip('\n').split('\t')
    if len(p)<3: continue
    rows[p[0]]=p
V={
 'cfg_ratios_overflow':'CRASH (SIGFPE)','srv_cfg_fpe':'CRASH (SIGFPE)','ver_session_fpe':'CRASH (SIGFPE)',
 'cfg_dep_q_small':'BUG: heap over-read, garbage code in message','srv_cfg_depq1':'BUG: starts, every session fails',
 'offp_json_devfull':'SILENT BAD OUTPUT (rc 0, write error ignored)',
 'offp_json_missing_dir':'partial output left (WAV written), error after full run',
 'offp_json_empty':'partial output left (WAV written), error after full run','offp_json_proc':'partial output left (WAV written); no errno',
 'offp_out_missing_dir':'error only after full run','offp_out_proc':'error only after full run','offp_out_empty':'error only after full run',
 'offp_wav_eq_json':'silent clobber (JSON overwrites WAV)','offp_json_eq_in':'silent clobber of input','offp_out_eq_in':'overwrites input (ok-ish)',
 'off_temp_nan':'NaN accepted (=greedy)','off_temp_nan2':'NaN accepted (=greedy)','off_temp_nan_upper':'NaN accepted',
 'off_random_weights':'HANG/OOM: 7B fp32 on CPU, no message','srv_idle_nan':'NaN accepted (idle timeout disabled)',
 'srv_drain_nan':'NaN accepted (drain = 0)','srv_maxdur_nan':'NaN accepted: every session ends at once',
 'srv_host_localhost':'hostname refused, "Invalid argument", after model load','srv_host_garbage':'checked after model load',
 'srv_host_empty':'checked after model load','srv_host_999':'checked after model load','srv_host_bracket':'[::1] refused',
 'srv_host_ipv6':'ok, but URL printed as http://::1:PORT','srv_port_empty':'empty --port = random port',
 'ld_dur_nan':'unclear message (vector max_size)','ld_churn_nan':'unclear message (vector max_size)',
 'codwav_zero_data':'rc 0, prints -nan RTF, empty output (offline refuses)',
 'cfg_dep_dim_max':'bad_alloc after 16 s (no size check, no context)','cfg_ffn_max':'bad_alloc after 13 s','cfg_seanet_dim_max':'bad_alloc after 8 s',
 'cfg_dim_max':'bad_alloc, no context','cfg_nfilters_max':'bad_alloc, no context',
 'off_seed_neg2':'negative seed != -1 is random (docs: reproducible)','off_seed_over':'out-of-range seed silently clamped',
 'offwav_trunc_data':'truncated WAV accepted silently','offwav_huge_len':'bad data length accepted silently',
 'offwav_f32_nan':'NaN samples accepted silently','stlm_lm_nan':'NaN weights accepted silently',
 'config_dir':'misleading message (dir -> "not valid JSON")','tok_tmp':'misleading message (dir -> "no such file")',
 'ver_bad_sub':'"A subcommand is required" for unknown subcommand','st_no_config':'no hint that 7B config was assumed',
 'base_codec':'progress \\r spam when stderr is not a TTY','cfg_frame_rate_tiny':'slow (valid but absurd config)','cfg2_ratios_1':'slow (valid but absurd config)',
}
out=['# CLI adversarial review (personaplex-* tools, CPU, tiny models)','',
'Scripts: `h.sh` (harness: `t NAME cmd...` runs under `timeout 60`, logs rc/wall/first error line to `results.tsv`, full output in `logs/NAME.{out,err,cmd}`),',
'`mkwav.py` (bad WAVs in `in/`), `mkcfg.py` (bad configs in `cfg/`), `t_offline_flags*.sh`, `t_offline_wav.sh`, `t_offline_paths.sh`, `t_codec_wav.sh`,',
'`t_cfg.sh`, `t_cfg2.sh` (run under `ulimit -v 8000000`), `t_st.sh` (safetensors/tokenizer/hf-dir), `t_voice.sh`, `t_server.sh` (server `s NAME flags`: SIGINT after 6 s; rc 124 = started and ran),',
'`t_load.sh`, `t_codec_verify.sh`, `wsidle.py` (silent WebSocket client). Bad safetensors in `st/`, tokenizers in `tok/`, TLS dirs `ssl_*`.',
'Ad-hoc runs (long WAV, NaN server timeouts with live sessions, load --duration, encrypted TLS key, --log-level off) are listed in FINDINGS.','',
'| case | rc | wall | first error line (trimmed) | verdict |','|---|---|---|---|---|']
for k,p in rows.items():
    rc=p[1].replace('rc=',''); w=p[2]; msg=(p[-1] if len(p)>3 else '').replace('|','\\|')[:160]
    v=V.get(k)
    if v is None: v='ok' if rc in ('0','2','1','124') else 'CHECK'
    out.append(f'| {k} | {rc} | {w} | {msg} | {v} |')
open('README.md','w').write('\n'.join(out)+'\n')
print(len(rows))
