# /v1/realtime floods: audio far faster than real time; byte-rate limit; control-event flood; invalid-event limit.
import time, json, threading
from wslib import *
pid=server_pid()
def run(name, fn, secs=4):
    w = WS("/v1/realtime"); w.recv_events(1, until=lambda e: e["type"]=="session.created")
    w.send_json({"type":"session.update","session":{}}); w.recv_events(0.3)
    t0=time.time(); res={}
    def reader():
        res["evs"]=w.recv_events(secs+4)
    th=threading.Thread(target=reader); th.start()
    try: fn(w)
    except Exception as e: res["send_exc"]=repr(e)[:80]
    th.join()
    evs=res["evs"]; w.shut(); t=wait_idle(20)
    print(f"[{name}] {round(time.time()-t0,1)}s deltas={sum(1 for e in evs if e.get('type')=='response.output_audio.delta')} errs={errors(evs)[:3]} {res.get('send_exc','')} | free +{t and round(t,2)} | rss {rss_kb(pid)}")
one_s = pcm_b64(1.0)   # 64 KB b64
def fast_audio(w):   # 25 s of audio in ~0.5 s
    for i in range(25): w.send_json({"type":"input_audio_buffer.append","audio":one_s})
run("25 s of audio at once (under 30 s cap)", fast_audio, secs=6)
def over_cap(w):
    for i in range(40): w.send_json({"type":"input_audio_buffer.append","audio":one_s})
run("40 s of audio at once (over 30 s cap)", over_cap)
big = pcm_b64(20.0)  # ~1.28 MB -> too big for one event; use 0.75 MB chunks
chunk = pcm_b64(11.0) # ~704 KB
def byte_flood(w):
    for i in range(40): w.send_json({"type":"input_audio_buffer.append","audio":chunk})
run("28 MB of appends at once (byte budget 16 MiB burst)", byte_flood)
def ctrl_flood(w):
    for i in range(400): w.send_json({"type":"input_audio_buffer.clear"})
run("400 control events at once (200 burst)", ctrl_flood)
def invalid_flood(w):
    for i in range(150): w.send_text("nope")
run("150 invalid events", invalid_flood)
def oversize_flood(w):
    ev = json.dumps({"type":"x","p":"a"*(3*1024*1024)})
    for i in range(120): w.send_text(ev)
run("120 x 3 MB oversized events (not byte-budgeted?)", oversize_flood, secs=8)
def retrieve_flood(w):
    for i in range(150): w.send_json({"type":"conversation.item.retrieve","item_id":"x"})
run("150 retrieve (errors not counted)", retrieve_flood)
print(metrics().get('personaplex_sessions_ended_total{reason="session_error"}'), metrics().get('personaplex_sessions_ended_total{reason="input_overflow"}'))
