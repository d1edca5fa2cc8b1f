# Upgrade-request edge cases: pipelined first frame, subprotocols, extensions, odd methods/headers.
import time, json, socket, base64, os
from wslib import *
def raw(req, read=1.0):
    s=socket.create_connection((HOST,PORT)); s.sendall(req); s.settimeout(read); out=b""
    try:
        while True:
            d=s.recv(65536)
            if not d: break
            out+=d
    except Exception: pass
    s.close(); return out
key=base64.b64encode(os.urandom(16)).decode()
def up(path="/v1/realtime", method="GET", extra="", ver="HTTP/1.1"):
    return (f"{method} {path} {ver}\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n").encode()
# pipelined frame right after the head
ev=WS.frame(1, json.dumps({"type":"session.update","session":{"instructions":"piped"}}).encode())
w=WS("/v1/realtime", extra_raw=ev); evs=w.recv_events(1.5); print("pipelined first frame ->", w.status, [e.get("type") for e in evs], errors(evs)); w.close(); w.shut(); wait_idle()
w=WS("/api/chat", extra_raw=WS.frame(2, b"\x01"+b"x"*10)); m=None
try: m=w.recv_msg(2)
except Exception as e: m=repr(e)
print("chat pipelined first frame ->", w.status, m if isinstance(m,str) else (m[0], m[1][:10])); w.close(); w.shut(); wait_idle()
w=WS("/v1/realtime", headers={"Sec-WebSocket-Protocol":"realtime, openai-insecure-api-key.sk-xyz, openai-beta.realtime-v1"})
print("subprotocols requested ->", w.status, [l for l in w.resp_head.splitlines() if "Protocol" in l] or "no Sec-WebSocket-Protocol in reply"); w.close(); w.shut(); wait_idle()
w=WS("/v1/realtime", headers={"Sec-WebSocket-Extensions":"permessage-deflate; client_max_window_bits"})
print("permessage-deflate offered ->", w.status, [l for l in w.resp_head.splitlines() if "Extension" in l] or "not negotiated"); w.close(); w.shut(); wait_idle()
for name, req in [("POST upgrade", up(method="POST")), ("HEAD upgrade", up(method="HEAD")), ("HTTP/1.0 upgrade", up(ver="HTTP/1.0")),
                  ("version 8", up().replace(b"Version: 13", b"Version: 8")), ("bad key", up().replace(key.encode(), b"short")),
                  ("two Upgrade headers", up(extra="Upgrade: h2c\r\n")), ("Connection: keep-alive, Upgrade", up().replace(b"Connection: Upgrade", b"Connection: keep-alive, Upgrade")),
                  ("chunked body on upgrade", up(extra="Transfer-Encoding: chunked\r\n")+b"5\r\nhello\r\n0\r\n\r\n"),
                  ("Content-Length 16K+1 body", up(extra="Content-Length: 16385\r\n")+b"a"*16385),
                  ("path /v1/realtime/", up(path="/v1/realtime/")), ("path //v1/realtime", up(path="//v1/realtime")), ("path /v1/realtime%00", up(path="/v1/realtime%00")),
                  ("model bad", up(path="/v1/realtime?model=../../x")), ("model 129 chars", up(path="/v1/realtime?model="+"a"*129)),
                  ("absolute-form target", up(path="http://x/v1/realtime")), ("60KiB header", up(extra="X-A: "+"a"*61000+"\r\n")),
                  ("Host missing", up().replace(b"Host: x\r\n", b""))]:
    r=raw(req)
    first=r.split(b"\r\n")[0]; body=r.split(b"\r\n\r\n",1)[1][:100] if b"\r\n\r\n" in r else b""
    print(f"{name:32s} -> {first} {body}")
    wait_idle(5)
print("health", health()["sessions_in_use"], health()["connections"])
