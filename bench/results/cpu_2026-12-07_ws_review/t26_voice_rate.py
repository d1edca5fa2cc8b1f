# One chat session with voice_prompt=$1 (a file in the voice dir); prints outcome and whether the server survived.
import sys, time
from wslib import *
pid=server_pid(); t=time.time(); out=[]
w=WS("/api/chat?voice_prompt="+sys.argv[1])
try:
    while True:
        m=w.recv_msg(60)
        if m[0]=="close": out.append(("close",m[1])); break
        if m[1][:1]==b"\x05": out.append(m[1][1:].decode()[:160])
        if m[1][:1]==b"\x00": out.append("handshake"); break
except Exception as e: out.append(repr(e)[:80])
time.sleep(0.5)
st=open(f"/proc/{pid}/stat").read().split(")")[1].split()[0]
print(sys.argv[1], round(time.time()-t,2), "s ->", out, "| server state", st)
