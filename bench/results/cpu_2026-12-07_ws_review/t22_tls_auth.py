# --ssl + --api-key: auth edge cases over WSS; hostile TLS handshakes (stalls, partial ClientHello, RST, plain HTTP).
import ssl, socket, time, json, struct, os, base64
import wslib
from wslib import *
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
orig=socket.create_connection
def tls_conn(addr, timeout=None, *a):
    s=orig(addr, timeout); return ctx.wrap_socket(s, server_hostname="localhost")
def https(path, headers={}):
    s=tls_conn((HOST,PORT),5); s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{''.join(f'{k}: {v}'+chr(13)+chr(10) for k,v in headers.items())}\r\n".encode())
    out=b""
    try:
        while True:
            d=s.recv(65536)
            if not d: break
            out+=d
    except Exception: pass
    return out
def up(q="", headers=None):
    socket.create_connection=tls_conn
    try: w=WS("/v1/realtime"+q, headers=headers)
    finally: socket.create_connection=orig
    r=(w.status, w.buf[-90:] if w.status!=101 else "ok"); w.close(); w.shut(); time.sleep(0.3); return r
for label,q,h in [("no key","",None), ("query raw key (+/=& unencoded)","?api_key=s3cr3t+/=&",None), ("query encoded","?api_key=s3cr3t%2B%2F%3D%26",None),
                  ("Bearer ok","",{"Authorization":"Bearer s3cr3t+/=&"}), ("bearer lowercase","",{"Authorization":"bearer s3cr3t+/=&"}),
                  ("Bearer + trailing space","",{"Authorization":"Bearer s3cr3t+/=& "}), ("Bearer wrong","",{"Authorization":"Bearer nope"}),
                  ("two api_key params (wrong first)","?api_key=x&api_key=s3cr3t%2B%2F%3D%26",None), ("key in subprotocol (browser SDK)","",{"Sec-WebSocket-Protocol":"realtime, openai-insecure-api-key.s3cr3t+/=&"})]:
    print(f"{label:36s} ->", up(q,h))
print("/health over TLS ->", https("/health")[:40])
print("/metrics without key ->", https("/metrics")[:30])
# plain HTTP to TLS port
s=orig((HOST,PORT)); s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); s.settimeout(3)
try: print("plain HTTP to TLS port ->", s.recv(100))
except Exception as e: print("plain HTTP to TLS port ->", repr(e))
# stalled TLS handshakes: 80 raw TCP connections that send a partial ClientHello and stall; then is /health still reachable?
pid=server_pid()
stalls=[]
for i in range(80):
    x=orig((HOST,PORT)); x.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"); stalls.append(x)
time.sleep(1.5)
t=time.time(); r=https("/health"); print("80 stalled ClientHellos, then /health ->", r[:15], round(time.time()-t,2),"s")
m=metrics if False else None
for x in stalls: x.close()
# RST during TLS handshake, in a loop
for i in range(200):
    x=orig((HOST,PORT)); x.sendall(b"\x16\x03\x01\x00\x05\x01\x00\x00\x01"); x.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii",1,0)); x.close()
time.sleep(1)
r=https("/health"); j=json.loads(r.split(b"\r\n\r\n",1)[1]); print("after 200 RSTs mid-handshake: connections", j["connections"], "sessions", j["sessions_in_use"], "rss", rss_kb(pid))
# WSS session then RST mid stream, and idle-timeout (3 s) over TLS
socket.create_connection=tls_conn; w=WS("/v1/realtime?api_key=s3cr3t%2B%2F%3D%26"); socket.create_connection=orig
w.send_json({"type":"session.update","session":{}}); t=time.time(); evs=w.recv_events(8)
print("WSS session, no audio, idle-timeout 3 ->", errors(evs), round(time.time()-t,1),"s")
print(open("server.log").read().splitlines()[-1][:200])
