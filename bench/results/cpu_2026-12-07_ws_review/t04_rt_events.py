# /v1/realtime event-level hostile input: wrong types, voice path tricks, numbers, base64 edge cases.
import time, json, sys, base64
from wslib import *
pid=server_pid()
w = WS("/v1/realtime")
created = w.recv_events(1, until=lambda e: e["type"]=="session.created")
def send(obj, wait=0.3, raw=False):
    if raw: w.send_text(obj)
    else: w.send_json(obj)
    return w.recv_events(wait)
def sess(evs):
    for e in evs:
        if e.get("type")=="session.updated": return e["session"]
# BEFORE conversation starts: everything in one session.update each (the first update starts the conversation!)
# so use the fact that updates before start apply; we send them all in a quick burst and check each reply.
wrong = [
 {"instructions": 5}, {"instructions": ["a"]}, {"instructions": None}, {"instructions": {"a":1}},
 {"audio": "x"}, {"audio": {"output": 5}}, {"audio": {"output": {"voice": 5}}}, {"audio": {"output": {"voice": None}}},
 {"audio": {"output": {"voice": ["demo.wav"]}}}, {"voice": {"name":"demo"}},
 {"temperature": "0.5"}, {"temperature": None}, {"temperature": [1]}, {"temperature": 1e308}, {"temperature": -0.0},
 {"temperature": -1}, {"temperature": 3}, {"temperature": 1e-320},
 {"voice": "../voices/demo.wav"}, {"voice": "/tmp/ws_review/voices/demo.wav"}, {"voice": "demo.wav\u0000x"}, {"voice": "demo\u0000"},
 {"voice": "A"*100000}, {"voice": "."}, {"voice": ".."}, {"voice": "demo.wav/"}, {"voice": "demo.wav\\"}, {"voice":"DEMO.WAV"},
 {"voice": "demo"},
]
for s in wrong:
    evs = send({"type":"session.update","session":s}, 0.15)
    se = sess(evs)
    print(json.dumps(s)[:70], "->", errors(evs) or (se and {"voice": se.get("audio",{}).get("output",{}).get("voice"), "instr": (se.get("instructions") or "")[:20], "temp": se.get("temperature")}))
# non-object session / none
for s in [5, "x", None, [1,2], {}]:
    evs=send({"type":"session.update","session":s},0.15); print("session=",json.dumps(s), "->", errors(evs) or [e["type"] for e in evs])
# temperature NaN via raw JSON (invalid JSON per spec) and big exponent
for raw in ['{"type":"session.update","session":{"temperature":NaN}}', '{"type":"session.update","session":{"temperature":1e999}}',
            '{"type":"session.update","session":{"temperature":-1e999}}', '{"type":"session.update","session":{"temperature":123456789012345678901234567890}}']:
    evs=send(raw,0.15,raw=True); print(raw[40:], "->", errors(evs) or sess(evs) and sess(evs).get("temperature"))
# deep nesting
for d in [63, 64, 65, 100000]:
    raw = '{"type":"session.update","session":' + '{"a":'*d + '1' + '}'*d + '}'
    evs=send(raw,0.3,raw=True); print("depth",d+2 if d<1000 else d,"->", errors(evs) or [e["type"] for e in evs])
raw = '{"type":"session.update","x":' + '['*70 + ']'*70 + '}'; print("arrays 70 ->", errors(send(raw,0.2,raw=True)))
raw = '{"type":"x","a":"' + '['*1000 + '"}'; print("brackets in string ->", errors(send(raw,0.2,raw=True)))
raw = ']'*100 + '['*100; print("negative depth trick ->", errors(send(raw,0.2,raw=True)))
raw = '{"type":"session.update","session":{},"p":' + ']'*0 + '"\\\\"' + ',"q":' + '['*60 + ']'*60 + '}'; print("escaped backslash ->", errors(send(raw,0.2,raw=True)))
# duplicate keys, type not string, weird types
for raw in ['{"type":"session.update","type":"input_audio_buffer.clear"}', '{"type":5}', '{"type":null}', '[]', '"str"', '1', 'null', '', ' ', '{"type":"\u0000"}',
            '{"type":"input_audio_buffer.clear"} trailing', '{"type":"input_audio_buffer.clear"}{"type":"x"}']:
    print(repr(raw)[:60], "->", errors(send(raw,0.15,raw=True)) or [e["type"] for e in send("",0) ][:0] )
# event_id echo: huge and non-string
evs=send({"type":"nope","event_id":"E"*100000},0.2); print("huge event_id echoed len", [len(e["error"]["event_id"] or "") for e in evs if e["type"]=="error"])
evs=send({"type":"nope","event_id":{"x":1}},0.2); print("object event_id ->", [e["error"]["event_id"] for e in evs if e["type"]=="error"])
evs=send({"type":"nope\u00e9"*1000},0.2); print("long type ->", [len(e["error"]["message"]) for e in evs if e["type"]=="error"])
print(health()["sessions_in_use"], "rss", rss_kb(pid))
w.close(); w.shut(); print("free", wait_idle())
