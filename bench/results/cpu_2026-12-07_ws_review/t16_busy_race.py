# Two upgrades at the same instant (max-sessions 1): provoke the after-upgrade 'busy' path; check its message and slot accounting.
import time, threading, socket, base64, os
from wslib import *
from collections import Counter
res=Counter(); samples={}
def attempt(path, out, barrier):
    s=socket.create_connection((HOST,PORT)); key=base64.b64encode(os.urandom(16)).decode()
    req=f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    barrier.wait(); s.sendall(req)
    w=WS.__new__(WS); w.sock=s; w.buf=b""
    while b"\r\n\r\n" not in w.buf:
        d=s.recv(65536)
        if not d: break
        w.buf+=d
    head,_,w.buf=w.buf.partition(b"\r\n\r\n"); code=head[9:12].decode()
    first=None
    if code=="101":
        try:
            m=w.recv_msg(3)
            first = m if m[0]=="close" else m[1][:120]
        except Exception as e: first=repr(e)
    out.append((code, first)); w.shut()
for i in range(40):
    for path in ["/v1/realtime","/api/chat"]:
        out=[]; bar=threading.Barrier(2)
        ts=[threading.Thread(target=attempt,args=(path,out,bar)) for _ in range(2)]
        [t.start() for t in ts]; [t.join() for t in ts]
        key=(path, tuple(sorted(o[0] for o in out)))
        res[key]+=1
        for o in out:
            if o[0]=="101" and o[1] and (b"busy" in (o[1] if isinstance(o[1],bytes) else b"")): samples[path]=o[1]
        wait_idle(5)
print(dict(res)); print(samples)
m=metrics(); print("busy rejects", m['personaplex_rejected_total{reason="busy"}'], "in_use", health()["sessions_in_use"])
