# --max-session-duration 2 --idle-timeout 0.5: realtime + chat streaming at real time; and a realtime client that answers pings but sends nothing.
import time, threading
from wslib import *
w=WS("/v1/realtime"); w.send_json({"type":"session.update","session":{}}); c=pcm_b64(0.08); t=time.time(); stop=[]
def feed():
    while not stop:
        try: w.send_json({"type":"input_audio_buffer.append","audio":c})
        except Exception: return
        time.sleep(0.08)
threading.Thread(target=feed,daemon=True).start()
evs=w.recv_events(5, until=lambda e: e["type"] in ("error","__close__")); stop.append(1)
print("realtime streaming ->", errors(evs)[:2], round(time.time()-t,2),"s"); w.shut(); wait_idle()
w=WS("/v1/realtime"); t=time.time(); evs=w.recv_events(5, until=lambda e: e["type"] in ("error","__close__"))
print("realtime silent ->", errors(evs)[:2], round(time.time()-t,2),"s"); w.shut(); wait_idle()
w=WS("/api/chat?voice_prompt=demo.wav"); t=time.time(); out=[]
while time.time()-t<6:
    try: m=w.recv_msg(6)
    except Exception as e: out.append(repr(e)[:40]); break
    if m[0]=="close": out.append(("close",m[1])); break
    if m[1][:1] in (b"\x05",b"\x00"): out.append((round(time.time()-t,2), m[1][:60]))
print("chat silent with voice prompt ->", out)
