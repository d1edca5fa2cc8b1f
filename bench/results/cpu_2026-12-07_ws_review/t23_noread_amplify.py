# Non-reading realtime client that makes the server queue its largest replies: session.updated with 4096 bytes of
# control characters in the instructions (JSON-escaped to ~24 KB each), at just under the 20/s control-event rate,
# plus real-time audio so the session stays alive. Measures server RSS while the output queue fills.
import time, socket, json
from wslib import *
pid=server_pid()
orig=socket.create_connection
def small(addr, timeout=None, *a):
    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(timeout); s.connect(addr); return s
socket.create_connection=small; w=WS("/v1/realtime"); socket.create_connection=orig
r0=rss_kb(pid); print("rss before", r0)
w.send_json({"type":"session.update","session":{"instructions":"\u0001"*4096}})
upd=json.dumps({"type":"session.update","session":{}})
audio=json.dumps({"type":"input_audio_buffer.append","audio":pcm_b64(0.08)})
t0=time.time(); i=0; last=0; peak=r0
while time.time()-t0<150:
    try:
        w.send_text(audio)
        if i%4==0 or i<150: w.send_text(upd)   # burst of ~150 first (<200), then ~3/s... 
    except Exception as e: print("send failed", round(time.time()-t0,1), repr(e)[:60]); break
    i+=1; time.sleep(0.08 if i>=150 else 0.001)
    if time.time()-last>5:
        last=time.time(); r=rss_kb(pid); peak=max(peak,r); print(f"t={time.time()-t0:5.1f} rss={r} kB (+{r-r0}) in_use={health()['sessions_in_use']}", flush=True)
print("peak +", peak-r0, "kB; after:", rss_kb(pid), health()["sessions_in_use"])
print(open("server.log").read().splitlines()[-1][:250])
