# Bytes sent in the same write as the upgrade request (before the 101): are they kept, dropped, or do they desync the stream?
import time, json, socket
from wslib import *
ev=WS.frame(1, json.dumps({"type":"session.update","session":{"instructions":"piped"}}).encode())
w=WS("/v1/realtime", extra_raw=ev); evs=w.recv_events(1.5)
print("whole frame pipelined ->", [e.get("type") for e in evs]); w.close(); w.shut(); wait_idle()
print([l for l in open("server.log").read().splitlines() if "session prompts " in l][-1])
# half a frame pipelined, the other half after the 101
full=WS.frame(1, json.dumps({"type":"session.update","session":{"instructions":"split"}}).encode())
w=WS("/v1/realtime", extra_raw=full[:20]); w.send_raw(full[20:]); evs=w.recv_events(2)
print("half frame pipelined, rest after 101 ->", [e.get("type") for e in evs], errors(evs)); w.shut(); wait_idle()
print([l for l in open("server.log").read().splitlines() if "session prompts " in l][-1])
