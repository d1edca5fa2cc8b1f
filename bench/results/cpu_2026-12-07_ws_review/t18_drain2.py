# SIGTERM with hostile connections around: a non-reading realtime client, a half-sent HTTP head, an idle TCP connection,
# a client that ignores the close. Exit time measured from /proc state (zombie = exited).
import time, os, signal, socket, sys, threading
from wslib import *
pid=server_pid()
def state():
    try: return open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
    except FileNotFoundError: return "gone"
# non-reading realtime client with small buffer
s0=socket.create_connection
def small(addr, timeout=None, *a):
    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(timeout); s.connect(addr); return s
socket.create_connection=small; nr=WS("/v1/realtime"); socket.create_connection=s0
nr.send_json({"type":"session.update","session":{}})
big=pcm_b64(20.0)[:900000]
for i in range(2): nr.send_json({"type":"input_audio_buffer.append","audio":big[:len(big)//4*4]})
# a chat client that reads but ignores close frames (never closes TCP)
ch=WS("/api/chat?voice_prompt=")
half=socket.create_connection((HOST,PORT)); half.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
idle=socket.create_connection((HOST,PORT))
time.sleep(3)
print("before: ", health()["sessions_in_use"], "sessions,", health()["connections"], "connections")
T=time.time(); os.kill(pid, signal.SIGTERM)
sec=len(sys.argv)>1 and sys.argv[1]=="twice"
if sec: time.sleep(0.5); os.kill(pid, signal.SIGTERM)
chlog=[]
def rd():
    while True:
        try: m=ch.recv_msg(30)
        except Exception as e: chlog.append((round(time.time()-T,2),repr(e)[:50])); return
        if m[0]=="close": chlog.append((round(time.time()-T,2),"close",m[1])); 
        elif m[1][:1]==b"\x05": chlog.append((round(time.time()-T,2),m[1][1:].decode()))
threading.Thread(target=rd,daemon=True).start()
while state() not in ("Z","gone") and time.time()-T<60: time.sleep(0.05)
print("server state", state(), "after", round(time.time()-T,2), "s")
time.sleep(0.5); print("chat client saw:", chlog)
print(open("server.log").read().splitlines()[-6:])
