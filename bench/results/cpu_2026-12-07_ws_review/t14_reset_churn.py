# Abrupt TCP resets at every phase, in a loop, on both endpoints; then check slots, connections, counters, RSS, threads.
import time, random, socket, struct, base64, os, sys
from wslib import *
pid=server_pid()
N=int(sys.argv[1]) if len(sys.argv)>1 else 30
m0=metrics(); r0=rss_kb(pid); th0=threads(pid)
print("start rss", r0, "threads", th0, "health", health()["sessions_in_use"], health()["connections"])
def rst(s):
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)); s.close()
chunk=pcm_b64(0.08); st=OggStream(); HDR=st.headers(); PAGES=[st.page() for _ in range(10)]
def phase(path, ph):
    if ph=="tcp-only":
        s=socket.create_connection((HOST,PORT)); rst(s); return
    if ph=="partial-head":
        s=socket.create_connection((HOST,PORT)); s.sendall(b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nUpgr"); time.sleep(random.random()*0.05); rst(s); return
    if ph=="head-no-wait":
        s=socket.create_connection((HOST,PORT)); key=base64.b64encode(os.urandom(16)).decode()
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()); rst(s); return
    q = "?voice_prompt=demo.wav" if path=="/api/chat" else ""
    w=WS(path+q)
    if ph=="after-101": rst(w.sock); return
    if path=="/v1/realtime":
        w.send_json({"type":"session.update","session":{"audio":{"output":{"voice":"demo"}}}})
        if ph=="during-prompts": time.sleep(random.random()*0.3); rst(w.sock); return
        for i in range(random.randint(1,20)): w.send_json({"type":"input_audio_buffer.append","audio":chunk})
    else:
        if ph=="during-prompts": 
            for p in HDR: w.send_binary(b"\x01"+p)
            time.sleep(random.random()*0.3); rst(w.sock); return
        for p in HDR: w.send_binary(b"\x01"+p)
        while True:
            m=w.recv_msg(5)
            if m[0]=="close" or m[1][:1]==b"\x00": break
        for i in range(random.randint(1,10)): w.send_binary(b"\x01"+PAGES[i])
    if ph=="mid-stream":
        time.sleep(random.random()*0.5); rst(w.sock); return
    if ph=="mid-frame":
        w.send_raw(WS.frame(2 if path=="/api/chat" else 1, b"\x01"*1000)[:500]); rst(w.sock); return
    if ph=="during-close":
        w.close(); rst(w.sock); return
phases=["tcp-only","partial-head","head-no-wait","after-101","during-prompts","mid-stream","mid-frame","during-close"]
t0=time.time(); busy=0
for i in range(N):
    for path in ["/v1/realtime","/api/chat"]:
        for ph in phases:
            wait_idle(5)
            try: phase(path, ph)
            except Exception as e: busy+=1; print("  ", path, ph, repr(e)[:100])
print("loop done in", round(time.time()-t0,1), "s; exceptions", busy)
print("slot free after", wait_idle(30))
time.sleep(2)
m1=metrics(); h=health()
d=lambda k: m1.get(k,0)-m0.get(k,0)
ended=sum(v-m0.get(k,0) for k,v in m1.items() if k.startswith("personaplex_sessions_ended_total"))
print("sessions_in_use", h["sessions_in_use"], "connections", h["connections"], "started+", d("personaplex_sessions_started_total"), "ended+", ended,
      {k.split("{")[1][:-1]: v-m0.get(k,0) for k,v in m1.items() if ("ended_total" in k or "rejected_total" in k) and v-m0.get(k,0)})
print("rss", rss_kb(pid), "(+%d kB)"%(rss_kb(pid)-r0), "threads", threads(pid), "fds", len(os.listdir(f"/proc/{pid}/fd")))
