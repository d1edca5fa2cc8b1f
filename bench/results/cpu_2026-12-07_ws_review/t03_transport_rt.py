# Transport-level (RFC 6455) attacks on /v1/realtime and /api/chat.
import time, struct, sys, json, socket
from wslib import *
path = sys.argv[1] if len(sys.argv)>1 else "/v1/realtime"
pid=server_pid()
def case(name, fn, settle=0.7):
    w = WS(path)
    if w.status!=101: print(name, "UPGRADE FAILED", w.status, w.buf[:200]); return
    if path=="/v1/realtime": w.recv_events(1, until=lambda e: e["type"]=="session.created")
    t0=time.time()
    try: out = fn(w)
    except Exception as e: out = "exc "+repr(e)
    dt=time.time()-t0
    w.shut()
    t=wait_idle(20)
    print(f"[{name}] -> {out} ({dt:.2f}s) | slot free +{t and round(t,2)}s | rss {rss_kb(pid)} kB")

def upd(w): return json.dumps({"type":"session.update","session":{"instructions":"x"}}).encode()

def frag_with_pings(w):
    m = upd(w)
    w.send_frame(1, m[:5], fin=False); w.send_frame(9, b"p1"); w.send_frame(0, m[5:10], fin=False); w.send_frame(9, b"p2")
    w.send_frame(0, m[10:], fin=True)
    got=[]
    deadline=time.time()+2
    while time.time()<deadline:
        try: fin,op,p=w.recv_frame(max(0.01,deadline-time.time()))
        except Exception: break
        got.append((op, p[:40]))
        if op==1 and b"session.updated" in p: break
        if op==8: break
    return got
def binary_on_rt(w):
    w.send_frame(2, upd(w)); return [e.get("type") for e in w.recv_events(1.5)][:5]
def binary_garbage(w):
    w.send_frame(2, b"\xff\xfe\x00garbage"); return errors(w.recv_events(1.5))
def cont_without_start(w):
    w.send_frame(0, b"hello", fin=True); return errors(w.recv_events(2)) or "nothing"
def bad_utf8_split(w):
    # valid UTF-8 split across fragments: first must be accepted
    w.send_frame(1, b'{"type":"x\xe2\x82', fin=False); w.send_frame(0, b'\xac"}', fin=True)
    ok = errors(w.recv_events(1.5))
    # invalid: C3 then 28
    w.send_frame(1, b'{"type":"x\xc3', fin=False); w.send_frame(0, b'\x28"}', fin=True)
    return ("valid split ->", ok, "invalid split ->", errors(w.recv_events(2)))
def truncated_utf8_at_end(w):
    w.send_frame(1, b'{"type":"x"}\xe2\x82', fin=True); return errors(w.recv_events(2))
def close_codes(code_payload):
    def f(w):
        w.send_frame(8, code_payload); return errors(w.recv_events(2))
    return f
def close_mid_message(w):
    m=upd(w); w.send_frame(1, m[:10], fin=False); w.send_frame(8, struct.pack("!H",1000)); return errors(w.recv_events(2))
def huge_len(w):
    w.send_raw(WS.frame(1, b"abc", declared_len=(1<<63))); return errors(w.recv_events(3))
def huge_len2(w):
    w.send_raw(WS.frame(1, b"abc", declared_len=(1<<64)-1)); return errors(w.recv_events(3))
def big_len_slow(w):  # 3 MiB declared (< 4 MiB limit) but only a few bytes sent, then silence
    w.send_raw(WS.frame(1, b"abc", declared_len=3<<20)); return errors(w.recv_events(15))
def unmasked(w):
    w.send_frame(1, upd(w), mask=False); return errors(w.recv_events(2))
def rsv_bits(w):
    w.send_frame(1, upd(w), rsv=4); return errors(w.recv_events(2))
def reserved_opcode(w):
    w.send_frame(3, b"x"); return errors(w.recv_events(2))
def reserved_ctrl_opcode(w):
    w.send_frame(0xB, b"x"); return errors(w.recv_events(2))
def fragmented_ping(w):
    w.send_frame(9, b"ab", fin=False); return errors(w.recv_events(2))
def big_ping(w):
    w.send_frame(9, b"a"*200); return errors(w.recv_events(2))
def new_msg_inside_frag(w):
    w.send_frame(1, b'{"ty', fin=False); w.send_frame(1, b'{"type":"x"}'); return errors(w.recv_events(2))
def many_tiny(w):
    m = json.dumps({"type":"input_audio_buffer.append","audio":pcm_b64(0.5)}).encode()  # ~32 KB
    data=[WS.frame(1 if i==0 else 0, m[i:i+1], fin=(i==len(m)-1)) for i in range(len(m))]
    t=time.time(); w.send_raw(b"".join(data)); 
    evs=w.recv_events(2)
    return (len(m),"1-byte frames sent in",round(time.time()-t,2),"s;", errors(evs) or summarize(evs))
def many_empty_frames(w):
    # 200k empty continuation frames then fin
    data = WS.frame(1, b'{"type":"response.create"', fin=False) + WS.frame(0,b"",fin=False)*200000 + WS.frame(0,b'}',fin=True)
    t=time.time(); w.send_raw(data); evs=w.recv_events(2)
    return (len(data),"bytes of empty frames in", round(time.time()-t,2), errors(evs) or summarize(evs))
def ping_flood(w):
    data = WS.frame(9, b"x"*100)*50000
    t=time.time()
    import threading
    th=threading.Thread(target=lambda: w.send_raw(data)); th.daemon=True; th.start()
    th.join(10)
    return ("ping flood 50k sent:", not th.is_alive(), round(time.time()-t,2))
def ping_flood_noread(w):
    import threading
    data = WS.frame(9, b"x"*125)*200000
    th=threading.Thread(target=lambda: (w.send_raw(data))); th.daemon=True; th.start()
    th.join(10)
    return ("200k pings without reading pongs; sender finished:", not th.is_alive())

cases = [("fragmented+pings", frag_with_pings), ("binary frame JSON", binary_on_rt), ("binary garbage", binary_garbage),
  ("continuation w/o start", cont_without_start), ("utf8 split", bad_utf8_split), ("truncated utf8 at end", truncated_utf8_at_end),
  ("close 1005 (reserved)", close_codes(struct.pack("!H",1005))), ("close 999", close_codes(struct.pack("!H",999))),
  ("close 5000", close_codes(struct.pack("!H",5000))), ("close 1-byte payload", close_codes(b"\x03")),
  ("close bad utf8 reason", close_codes(struct.pack("!H",1000)+b"\xff\xfe")), ("close 4999+123 byte reason", close_codes(struct.pack("!H",4999)+b"r"*123)),
  ("close mid-message", close_mid_message), ("declared len 2^63", huge_len), ("declared len 2^64-1", huge_len2),
  ("declared 3MiB, 3 bytes sent", big_len_slow), ("unmasked", unmasked), ("rsv bits", rsv_bits), ("opcode 3", reserved_opcode),
  ("opcode 0xB", reserved_ctrl_opcode), ("fragmented ping", fragmented_ping), ("ping 200 bytes", big_ping),
  ("new msg inside fragmented", new_msg_inside_frag), ("many 1-byte frames", many_tiny), ("200k empty frames", many_empty_frames),
  ("ping flood", ping_flood), ("ping flood no read", ping_flood_noread)]
sel = sys.argv[2:] 
for n,f in cases:
    if sel and not any(s in n for s in sel): continue
    case(n,f)
print("health", health()["sessions_in_use"], health()["connections"])
