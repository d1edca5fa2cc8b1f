# Garbage before/instead of the HTTP head on the WebSocket port.
import socket, os, time
from wslib import *
def raw(data, wait=3):
    s=socket.create_connection((HOST,PORT)); 
    try: s.sendall(data)
    except Exception as e: return repr(e)
    s.settimeout(wait); out=b""
    try:
        while True:
            d=s.recv(65536)
            if not d: break
            out+=d
    except Exception as e: out+=b" <"+repr(e).encode()[:30]+b">"
    s.close(); return out.split(b"\r\n")[0][:60]
t=time.time()
print("binary garbage        ->", raw(os.urandom(3000)))
print("2 MB header line      ->", raw(b"GET / HTTP/1.1\r\nX: "+b"a"*2000000))
print("NUL in request line   ->", raw(b"GET /v1/real\x00time HTTP/1.1\r\nHost: x\r\n\r\n"))
print("LF-only line endings  ->", raw(b"GET /health HTTP/1.1\nHost: x\n\n"))
print("HTTP/2 preface        ->", raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
print("TLS hello to plain    ->", raw(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"))
print("health", health()["connections"], round(time.time()-t,1))
