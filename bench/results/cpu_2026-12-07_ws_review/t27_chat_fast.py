# /api/chat: valid Ogg Opus far faster than real time (60 s of audio at once): which error, which end reason?
import time
from wslib import *
st=OggStream(); HDR=st.headers(); PAGES=[st.page() for _ in range(50)]
w=WS("/api/chat?voice_prompt=")
while True:
    m=w.recv_msg(10)
    if m[0]=="close" or m[1][:1]==b"\x00": break
for p in HDR: w.send_binary(b"\x01"+p)
t=time.time()
for i in range(750):   # 60 s
    pg=bytearray(PAGES[i%50]); w.send_binary(b"\x01"+ogg_page_reseq(pg, i+2) if False else b"\x01"+PAGES[i%50])
out=[]
while time.time()-t<8:
    try: m=w.recv_msg(8)
    except Exception as e: out.append(repr(e)[:50]); break
    if m[0]=="close": out.append(("close",m[1])); break
    if m[1][:1]==b"\x05": out.append((round(time.time()-t,2), m[1][1:].decode()))
print(out); print(open("server.log").read().splitlines()[-1][:300])
