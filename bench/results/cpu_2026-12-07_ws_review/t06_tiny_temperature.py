# Subnormal / float-underflowing temperatures: accepted (in range) but the CPU sampler divides by (float)temp == 0.
import time, sys
from wslib import *
def chat(q, n=30):
    c = WS("/api/chat?voice_prompt=&"+q)
    if c.status!=101: return ("status", c.status)
    st=OggStream(); 
    # wait for handshake first
    while True:
        m=c.recv_msg(10)
        if m[0]=="close": return m
        if m[1][:1]==b"\x00": break
    for p in st.headers(): c.send_binary(b"\x01"+p)
    texts=[]; audio=0
    for i in range(n): c.send_binary(b"\x01"+st.page())
    deadline=time.time()+6
    while time.time()<deadline and audio<n+2:
        try: m=c.recv_msg(max(0.01,deadline-time.time()))
        except Exception: break
        if m[0]=="close": texts.append(("close",m)); break
        k=m[1][0]
        if k==2: texts.append(m[1][1:].decode(errors="replace"))
        elif k==1: audio+=1
        elif k==5: texts.append(("ERR",m[1][1:]))
    c.close(); c.shut(); wait_idle()
    return audio, len(texts), "".join(t for t in texts if isinstance(t,str))[:80], [t for t in texts if not isinstance(t,str)]
for q in ["text_seed=1&audio_seed=1", "text_seed=1&audio_seed=1&text_temperature=1e-320", "text_seed=1&audio_seed=1&text_temperature=1e-300",
          "text_seed=1&audio_seed=1&text_temperature=0", "text_seed=1&audio_seed=1&text_temperature=1e-30", "text_seed=2&audio_seed=7&text_temperature=1e-320",
          "text_temperature=4.9e-324", "text_temperature=1e-400", "audio_temperature=1e-320&text_temperature=1e-320"]:
    print(q, "->", chat(q))
