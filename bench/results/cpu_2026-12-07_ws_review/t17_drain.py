# SIGTERM during live sessions (one realtime, one chat, one realtime still in prompts? no: 2 slots): what each client gets, new connections during drain, exit.
import time, threading, os, signal, subprocess
from wslib import *
pid=server_pid()
drain_timeout=float(os.environ.get("DRAIN","3"))
rt = WS("/v1/realtime"); rt.recv_events(1, until=lambda e: e["type"]=="session.created"); rt.send_json({"type":"session.update","session":{}})
ch = WS("/api/chat?voice_prompt="); st=OggStream(); 
for p in st.headers(): ch.send_binary(b"\x01"+p)
stop=False; log={"rt":[], "ch":[]}
def feed():
    i=0; c=pcm_b64(0.08)
    while not stop:
        try: rt.send_json({"type":"input_audio_buffer.append","audio":c}); ch.send_binary(b"\x01"+st.page())
        except Exception as e: log.setdefault("send_err",repr(e)); break
        time.sleep(0.08)
def read_rt():
    for e in rt.recv_events(30):
        if e["type"] in ("error","__close__","__eof__","response.done"): log["rt"].append((round(time.time()-T,2), e["type"], e.get("error",{}).get("code"), e.get("error",{}).get("message") or e.get("code") or e.get("err") or e.get("response",{}).get("status")))
def read_ch():
    t=time.time()
    while time.time()-t<30:
        try: m=ch.recv_msg(30)
        except Exception as e: log["ch"].append((round(time.time()-T,2),"exc",repr(e)[:60])); break
        if m[0]=="close": log["ch"].append((round(time.time()-T,2),"close",m[1])); break
        if m[1][:1]==b"\x05": log["ch"].append((round(time.time()-T,2),"ERR",m[1][1:].decode()))
T=time.time()
ths=[threading.Thread(target=f) for f in (feed, read_rt, read_ch)]; [t.start() for t in ths]
time.sleep(2)
print("sessions before", health()["sessions_in_use"])
T=time.time(); os.kill(pid, signal.SIGTERM)
time.sleep(0.3)
st_,body=http_get("/health"); print("during drain /health:", st_, body[:90])
b=WS("/api/chat"); print("new upgrade during drain:", b.status, b.buf[:120]); b.shut()
st_,body=http_get("/health/live"); print("/health/live:", st_, body)
t_exit=None
for i in range(200):
    try: os.kill(pid,0)
    except ProcessLookupError: t_exit=time.time()-T; break
    time.sleep(0.1)
stop=True; [t.join(5) for t in ths]
print("process exited after", t_exit and round(t_exit,2), "s")
print("realtime client:", log["rt"]); print("chat client:", log["ch"]); print(log.get("send_err"))
