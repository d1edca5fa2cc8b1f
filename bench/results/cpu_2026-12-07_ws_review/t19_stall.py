# Does a hostile client stall another live session? Victim: realtime client at real time, measuring gaps between audio deltas.
import time, threading, json, os, socket, struct
from wslib import *
pid=server_pid()
victim=WS("/v1/realtime"); victim.recv_events(1, until=lambda e: e["type"]=="session.created"); victim.send_json({"type":"session.update","session":{}})
stop=False; arrivals=[]
def feed():
    c=pcm_b64(0.08); t=time.time(); i=0
    while not stop:
        victim.send_json({"type":"input_audio_buffer.append","audio":c}); i+=1
        time.sleep(max(0, t+i*0.08-time.time()))
def read():
    while not stop:
        try: fin,op,p=victim.recv_frame(5)
        except Exception: continue
        if op==9: victim.send_frame(10,p)
        if op==1 and b'output_audio.delta' in p[:80]: arrivals.append(time.time())
ths=[threading.Thread(target=feed,daemon=True), threading.Thread(target=read,daemon=True)]; [t.start() for t in ths]
time.sleep(4)
def window(a,b):
    xs=[t for t in arrivals if a<=t<=b]; gaps=[y-x for x,y in zip(xs,xs[1:])]
    return len(xs), round(max(gaps)*1000) if gaps else None
def attack(name, fn, dur=3):
    m0=metrics(); t0=time.time()
    try: r=fn()
    except Exception as e: r=repr(e)[:80]
    time.sleep(max(0, dur-(time.time()-t0))); t1=time.time()
    n,g=window(t0,t1); m1=metrics()
    print(f"[{name}] {r} | victim deltas {n} in {t1-t0:.1f}s, max gap {g} ms | budget misses +{m1['personaplex_frame_budget_misses_total']-m0['personaplex_frame_budget_misses_total']:.0f} | rss {rss_kb(pid)}")
attack("baseline", lambda: None)
def json_parse_flood():
    w=WS("/v1/realtime"); w.recv_events(0.2)
    ev=('{"type":"conversation.item.create","item":{"a":[' + ",".join(["1e5"]*200000) + ']}}').encode()[:1040000]
    ev=ev[:ev.rfind(b",")] + b"]}}"
    t=time.time()
    for i in range(17): w.send_text(ev)
    evs=w.recv_events(2); w.shut(); return ("17 x 1 MB number arrays", errors(evs)[:1], round(time.time()-t,2))
attack("json parse flood", json_parse_flood)
def oversize():
    w=WS("/v1/realtime"); w.recv_events(0.2)
    ev=json.dumps({"type":"x","p":"\u00e9"*(1900000)})  # 3.8 MB of 2-byte UTF-8
    t=time.time()
    for i in range(101): w.send_text(ev)
    evs=w.recv_events(2); w.shut(); return ("101 x 3.8 MB oversized", errors(evs)[-2:], round(time.time()-t,2))
attack("oversize flood", oversize, 4)
def fake_ogg():
    w=WS("/api/chat?voice_prompt=&text_prompt=")
    for i in range(4): w.send_binary(b"\x01"+(b"OggS\x00\xff\xff"*150000)[:1000000])
    evs=w.recv_msg(3); w.shut(); return ("fake Ogg headers", evs[1][:60] if evs[0]!="close" else evs)
attack("fake ogg", fake_ogg)
def conns():
    ss=[socket.create_connection((HOST,PORT)) for _ in range(100)]
    time.sleep(1.5); st,b=http_get("/health"); r=(st, json.loads(b)["connections"] if st==200 else b[:60])
    for s in ss: s.close()
    return ("100 idle TCP conns; /health ->", r)
attack("connection flood", conns)
def upd_spam():
    w=WS("/v1/realtime"); w.recv_events(0.2)
    w.send_json({"type":"session.update","session":{"instructions":"é"*2040}})
    for i in range(250): w.send_json({"type":"session.update","session":{}})
    evs=w.recv_events(2); w.shut(); return ("250 session.update", summarize(evs))
attack("update spam", upd_spam)
stop=True; time.sleep(0.3)
attack("after", lambda: None, 1)
victim.shut()
