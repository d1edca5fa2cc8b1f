# Slow-loris inside a WebSocket frame: declare a 3 MiB text frame and trickle 1 payload byte every 3 s, never finishing it.
# Does the session end (slot freed)? Does the connection itself ever get closed (connections count)?
import time, os, sys, socket
from wslib import *
n=int(sys.argv[1]) if len(sys.argv)>1 else 1
dur=float(sys.argv[2]) if len(sys.argv)>2 else 60
ws=[]
for i in range(n):
    w=WS("/v1/realtime" if i%2==0 else "/api/chat?voice_prompt=")
    if w.status!=101: print("upgrade", w.status); continue
    w.send_json({"type":"session.update","session":{}}) if i%2==0 else None
    w.send_raw(WS.frame(1, b"", declared_len=3<<20, mask_key=b"\x00\x00\x00\x00")[:-0 or None])
    ws.append(w); 
    if n>1: wait_idle(30)
t0=time.time(); last=0
while time.time()-t0<dur:
    alive=0
    for w in ws:
        try: w.send_raw(b"a"); alive+=1
        except Exception: pass
    h=health()
    if time.time()-last>9: last=time.time(); print(f"t={time.time()-t0:5.1f}s trickling={alive} in_use={h['sessions_in_use']} connections={h['connections']}", flush=True)
    time.sleep(3)
print([l[:200] for l in open("server.log").read().splitlines() if "session ended" in l][-2:])
