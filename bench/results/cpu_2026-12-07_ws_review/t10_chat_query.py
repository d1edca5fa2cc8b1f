# /api/chat query-string edge cases: each connection's first message (0x05 error or 0x00 handshake).
import time, urllib.parse
from wslib import *
def first(q, headers=None):
    w = WS("/api/chat"+q, headers=headers)
    if w.status!=101: 
        r=("HTTP", w.status, w.buf[-120:]); w.shut(); return r
    out=[]
    try:
        while True:
            m=w.recv_msg(8)
            if m[0]=="close": out.append(("close",m[1])); break
            k=m[1][:1]
            if k==b"\x05": out.append(("ERR", m[1][1:].decode(errors="replace")[:90]))
            elif k==b"\x00": out.append("handshake"); break
            elif k==b"\x06": out.append("ping")
    except Exception as e: out.append(repr(e))
    w.close(); w.shut(); wait_idle(10)
    return out
cases = ["?text_prompt="+"a"*4096, "?text_prompt="+"a"*4097, "?text_prompt="+"%41"*4097, "?text_prompt="+"%E9"*10, "?text_prompt=%", "?text_prompt=%G1%zz%4",
 "?text_prompt=%C3%28", "?text_prompt=%00abc", "?text_prompt="+"%F0%9F%98%80"*1024, "?text_prompt="+"%F0%9F%98%80"*1025,
 "?text_prompt="+"a"*20000,
 "?voice_prompt=../voices/demo.wav", "?voice_prompt=..%2Fvoices%2Fdemo.wav", "?voice_prompt=%2Ftmp%2Fws_review%2Fvoices%2Fdemo.wav", "?voice_prompt=demo.wav%00.pt",
 "?voice_prompt=demo", "?voice_prompt=."+"", "?voice_prompt=..", "?voice_prompt=demo.wav%5C", "?voice_prompt="+"x"*5000, "?voice_prompt=%FF%FE.wav", "?voice_prompt=demo.wav&voice_prompt=../x",
 "?text_seed=-1", "?text_seed=-2", "?text_seed=4611686018427387904", "?text_seed=4611686018427387905", "?text_seed=99999999999999999999", "?text_seed=0x10", "?text_seed=+1", "?text_seed=1.5", "?text_seed=",
 "?audio_seed=%201", "?text_temperature=nan", "?text_temperature=inf", "?text_temperature=1e2", "?text_temperature=100.0000001", "?text_temperature=-0", "?text_topk=1048577", "?text_topk=-1", "?audio_topk=1e3",
 "?a=b&&&&=&=x&%%%", "?" + "&"*30000, "?text_prompt=a#frag", "?text_prompt=x&text_prompt=y"]
for q in cases:
    print(q[:60] + ("..." if len(q)>60 else ""), "->", first(q + ("" if "voice_prompt" in q else "&voice_prompt=")))
