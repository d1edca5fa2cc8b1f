import time, json, sys
from wslib import *
print("health", health()["sessions_in_use"], "rss", rss_kb())
t0=time.time()
w = WS("/v1/realtime")
print("status", w.status)
evs = w.recv_events(2, until=lambda e: e["type"]=="session.created")
print("created after", time.time()-t0, summarize(evs))
w.send_json({"type":"session.update","session":{"instructions":"hi"}})
for i in range(25):
    w.send_json({"type":"input_audio_buffer.append","audio":pcm_b64(0.08)})
    time.sleep(0.08)
evs = w.recv_events(6)
print("after audio", time.time()-t0, summarize(evs))
w.close(); print(w.recv_events(2)[-1:])
print("idle in", wait_idle())
# chat
t0=time.time()
c = WS("/api/chat?voice_prompt=demo.wav&text_prompt=hello")
print("chat status", c.status)
st = OggStream()
for p in st.headers(): c.send_binary(b"\x01"+p)
kinds={}
hs=None
for i in range(40):
    c.send_binary(b"\x01"+st.page())
    time.sleep(0.08)
deadline=time.time()+6
while time.time()<deadline:
    try: m=c.recv_msg(max(0.01,deadline-time.time()))
    except Exception as e: print("exc",e); break
    if m[0]=="close": print("close",m); break
    k=m[1][0]; kinds[k]=kinds.get(k,0)+1
    if k==0 and hs is None: hs=time.time()-t0
print("chat kinds", kinds, "handshake at", hs)
c.close(); print("idle in", wait_idle())
print(metrics())
