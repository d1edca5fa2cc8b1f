#!/bin/sh
# Repeated floods; prints RSS after each round to look for unbounded growth.
cd /tmp/fuzz
for i in $(seq 1 12); do
  python3 t3_chat.py fast_flood garbage oggs_fake realtime_ok | tail -1
  python3 t4b_rt.py t_append_flood t_cancel_midresponse | tail -1
done
