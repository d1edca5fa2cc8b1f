# Corrupt voice files that /api/voices lists (admin-side, but the client picks them): does each session fail with a clear error?
import time, json
from wslib import *
pid=server_pid()
for v in json.loads(http_get("/api/voices")[1]) + ["link.wav", "fifo.wav"]:
    t=time.time(); w=WS("/api/chat?voice_prompt="+v); out=[]
    try:
        while True:
            m=w.recv_msg(60)
            if m[0]=="close": out.append(("close",m[1])); break
            if m[1][:1]==b"\x05": out.append(m[1][1:].decode()[:150])
            if m[1][:1]==b"\x00": out.append("handshake"); break
    except Exception as e: out.append(repr(e)[:80])
    w.close(); w.shut(); wait_idle(30)
    print(f"{v:18s} {time.time()-t:6.2f}s rss {rss_kb(pid)} -> {out}")
