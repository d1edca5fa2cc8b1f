# /v1/realtime: instructions that fit 4096 bytes but exceed the LM context -> what does the client see?
import time
from wslib import *
for instr in ["a"*4096, "a "*2048, "\u00e9"*3000]:
    w = WS("/v1/realtime"); w.recv_events(1, until=lambda e: e["type"]=="session.created")
    w.send_json({"type":"session.update","session":{"instructions":instr}})
    evs=w.recv_events(3)
    print(repr(instr[:6]), len(instr.encode()), "->", [e["type"] for e in evs][:4], errors(evs))
    w.shut(); wait_idle()
print(open("server.log").read().splitlines()[-1][:400])
