# How long a slot stays taken after a client's close frame, depending on what the client does next.
import time
from wslib import *
def run(label, after):
    w = WS("/v1/realtime"); w.recv_events(1, until=lambda e: e["type"]=="session.created")
    w.send_json({"type":"session.update","session":{}})
    w.recv_events(0.5)
    t0=time.time(); w.close()
    after(w)
    t=wait_idle(30); print(f"{label}: slot free after {t and round(t,2)} s (from close frame)"); w.shut()
run("close+read close+TCP close", lambda w: (w.recv_events(2), w.shut()))
run("close, TCP kept open, reading", lambda w: w.recv_events(1))
run("close, TCP kept open, not reading", lambda w: None)
def rst(w): w.reset()
run("RST right after close", rst)
