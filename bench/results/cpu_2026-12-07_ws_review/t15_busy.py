# --max-sessions 1: second client on each endpoint while one session is live.
import time
from wslib import *
a = WS("/v1/realtime"); a.recv_events(1, until=lambda e: e["type"]=="session.created")
for p in ["/v1/realtime", "/api/chat"]:
    b = WS(p); print(p, "second client ->", b.status, b.resp_head.splitlines()[1:], b.buf[:200]); b.shut()
st,body=http_get("/health/ready"); print("ready", st, body[:80])
a.close(); a.shut(); print("free", wait_idle())
b = WS("/api/chat"); print("after free ->", b.status); b.close(); b.shut(); wait_idle()
