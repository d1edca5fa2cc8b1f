# A client that never reads: sends real-time audio (realtime) / Ogg pages (chat) but never calls recv. Small SO_RCVBUF.
import time, socket, sys, base64, json, os
import wslib
from wslib import *
path = sys.argv[1]
mode = sys.argv[2] if len(sys.argv)>2 else "send"   # send: keep sending audio; silent: send nothing
orig = socket.create_connection
def small(addr, timeout=None, *a):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(timeout); s.connect(addr); return s
socket.create_connection = small
w = WS(path); print("status", w.status)
socket.create_connection = orig
pid=server_pid(); t0=time.time()
st=OggStream()
if path=="/api/chat":
    for p in st.headers(): w.send_binary(b"\x01"+p)
else:
    w.send_json({"type":"session.update","session":{}})
chunk = pcm_b64(0.08)
pages=[st.page() for _ in range(25)] if path=="/api/chat" else None
i=0; last=0
while time.time()-t0 < 120:
    if mode=="send":
        try:
            if path=="/api/chat": w.send_binary(b"\x01"+pages[i%25])
            else: w.send_json({"type":"input_audio_buffer.append","audio":chunk})
        except Exception as e:
            print(f"send failed at {time.time()-t0:.1f}s: {e!r}"); break
    i+=1
    time.sleep(0.08)
    if time.time()-last>5:
        last=time.time(); h=health(); print(f"t={time.time()-t0:5.1f}s in_use={h['sessions_in_use']} conns={h['connections']} rss={rss_kb(pid)}kB")
        if h['sessions_in_use']==0 and mode!="send": break
print("end", round(time.time()-t0,1), "health", health()["sessions_in_use"], health()["connections"])
print([l for l in open("server.log").read().splitlines() if "session ended" in l][-1])
w.shut()
