# /api/chat client that sends real-time Ogg audio forever and never reads; measures how long until the server drops it.
import time, socket, sys, subprocess, os
os.environ["PPX_PORT"]=sys.argv[1] if len(sys.argv)>1 else "18932"
import wslib
from wslib import *
orig = socket.create_connection
def small(addr, timeout=None, *a):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(timeout); s.connect(addr); return s
socket.create_connection = small
w = WS("/api/chat?voice_prompt="); socket.create_connection = orig
st=OggStream()
for p in st.headers(): w.send_binary(b"\x01"+p)
pages=[st.page() for _ in range(25)]
t0=time.time(); i=0; last=0
while time.time()-t0 < float(sys.argv[2] if len(sys.argv)>2 else 580):
    try: w.send_binary(b"\x01"+pages[i%25])
    except Exception as e: print(f"send failed at {time.time()-t0:.1f}s: {e!r}", flush=True); break
    i+=1; time.sleep(0.08)
    if time.time()-last>30:
        last=time.time()
        ss=subprocess.run(["ss","-tn","sport = :%s"%wslib.PORT],capture_output=True,text=True).stdout.splitlines()[1:]
        print(f"t={time.time()-t0:5.1f}s in_use={health()['sessions_in_use']} server Send-Q={[l.split()[2] for l in ss]}", flush=True)
print("end", round(time.time()-t0,1), health()["sessions_in_use"], flush=True)
