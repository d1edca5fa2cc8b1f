#!/bin/bash
# restart.sh PORT PIDFILE LOG [flags...]: stop the server started from PIDFILE (only that pid) and start a new one.
PORT=$1; PIDF=$2; LOG=$3; shift 3
if [ -f $PIDF ]; then P=$(cat $PIDF); kill $P 2>/dev/null; for i in $(seq 1 50); do kill -0 $P 2>/dev/null || break; sleep 0.2; done; kill -9 $P 2>/dev/null; fi
cd /work/main
/tmp/ws_review/personaplex-server --voice-prompt-dir ${VDIR:-/tmp/ws_review/voices} --port $PORT "$@" > $LOG 2>&1 &
echo $! > $PIDF
for i in $(seq 1 60); do curl -sf localhost:$PORT/health/live >/dev/null && break; sleep 0.5; done
echo "server pid $(cat $PIDF) on $PORT"
