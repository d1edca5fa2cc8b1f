# Leak check: many short normal sessions (both endpoints, with voice prompt, audio, clean close); RSS/threads/fds every 20.
import time, os
from wslib import *
pid=server_pid(); st=OggStream(); HDR=st.headers(); PAGES=[st.page() for _ in range(15)]; c=pcm_b64(0.08)
def rt():
    w=WS("/v1/realtime"); w.recv_events(1, until=lambda e: e["type"]=="session.created")
    w.send_json({"type":"session.update","session":{"instructions":"hello there","audio":{"output":{"voice":"demo"}}}})
    for i in range(15): w.send_json({"type":"input_audio_buffer.append","audio":c})
    w.recv_events(1.2); w.close(); w.recv_events(0.5); w.shut()
def ch():
    w=WS("/api/chat?voice_prompt=demo.wav&text_prompt=hi")
    for p in HDR: w.send_binary(b"\x01"+p)
    while True:
        m=w.recv_msg(10)
        if m[0]=="close" or m[1][:1]==b"\x00": break
    for p in PAGES: w.send_binary(b"\x01"+p)
    t=time.time()
    while time.time()-t<1.2:
        try: w.recv_msg(0.3)
        except Exception: pass
    w.close(); w.shut()
N=int(os.environ.get("N","120"))
for i in range(N):
    (rt if i%2==0 else ch)(); wait_idle(10)
    if i%20==0 or i==N-1: print(i, "rss", rss_kb(pid), "threads", threads(pid), "fds", len(os.listdir(f"/proc/{pid}/fd")), flush=True)
m=metrics(); print("started", m["personaplex_sessions_started_total"], "ended", sum(v for k,v in m.items() if "ended_total" in k), health()["sessions_in_use"], health()["connections"])
