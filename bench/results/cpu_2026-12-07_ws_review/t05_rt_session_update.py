# One fresh /v1/realtime connection per hostile session.update (the first update starts the conversation).
import time, json, sys
from wslib import *
pid=server_pid()
def one(s, raw=None, beta=False):
    w = WS("/v1/realtime", headers={"OpenAI-Beta":"realtime=v1"} if beta else None)
    w.recv_events(1, until=lambda e: e["type"]=="session.created")
    if raw: w.send_text(raw)
    else: w.send_json({"type":"session.update","session":s})
    evs = w.recv_events(0.4)
    w.close(); w.shut()
    se=None
    for e in evs:
        if e.get("type")=="session.updated": se=e["session"]
    if se:
        v = se.get("voice") if beta else se.get("audio",{}).get("output",{}).get("voice")
        return {"voice": v, "instr": (se.get("instructions") or "")[:12], "temp": se.get("temperature")}
    return errors(evs)
cases = [
 ({"instructions": 5},0), ({"instructions": ["a"]},0), ({"instructions": None},0), ({"instructions": {"a":1}},0),
 ({"instructions": "é"*5000},0),
 ({"audio": "x"},0), ({"audio": {"output": 5}},0), ({"audio": {"output": {"voice": 5}}},0), ({"audio": {"output": {"voice": None}}},0),
 ({"audio": {"output": {"voice": ["demo.wav"]}}},0),
 ({"audio": {"output": {"voice": "demo"}}},0), ({"audio": {"output": {"voice": "demo.wav"}}},0),
 ({"voice": "demo"},1), ({"voice": {"name":"demo"}},1),
 ({"temperature": "0.5"},1), ({"temperature": None},1), ({"temperature": [1]},1), ({"temperature": 1e308},1), ({"temperature": -0.0},1),
 ({"temperature": -1},1), ({"temperature": 3},1), ({"temperature": 1e-320},1), ({"temperature": 2},1), ({"temperature": 123456789012345678901234567890},1),
 ({"voice": "../voices/demo.wav"},1), ({"voice": "/tmp/ws_review/voices/demo.wav"},1), ({"voice": "demo.wav\u0000x"},1), ({"voice": "demo\u0000"},1),
 ({"voice": "A"*200000},1), ({"voice": "."},1), ({"voice": ".."},1), ({"voice": "demo.wav/"},1), ({"voice": "voices/demo"},1), ({"voice":"DEMO.WAV"},1),
 ({"voice": "demo.wav.pt"},1), ({"voice": ""},1),
]
for s,beta in cases:
    r = one(s, beta=bool(beta)); print(("beta " if beta else "GA   ")+json.dumps(s)[:70], "->", r)
    wait_idle(5)
# non-UTF8 voice name: raw bytes in a text frame are refused by the transport; try JSON \ud800 lone surrogate escape
for raw in ['{"type":"session.update","session":{"voice":"\\ud800demo"}}', '{"type":"session.update","session":{"voice":"demo\\u0000"}}',
            '{"type":"session.update","session":{"temperature":NaN}}', '{"type":"session.update","session":{"temperature":1e999}}']:
    print("raw", raw[36:], "->", one(None, raw=raw, beta=True)); wait_idle(5)
print("rss", rss_kb(pid), "in use", health()["sessions_in_use"])
