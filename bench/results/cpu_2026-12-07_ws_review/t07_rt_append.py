# input_audio_buffer.append base64 edge cases, events before session.created, truncate numbers, update after start.
import time, json, base64
from wslib import *
pid=server_pid()
w = WS("/v1/realtime")
# send events immediately, before reading session.created (they are in flight before it's sent)
w.send_json({"type":"input_audio_buffer.append","audio":pcm_b64(0.04)})
w.send_json({"type":"session.update","session":{"instructions":"early"}})
evs = w.recv_events(0.5)
print("early events ->", [e["type"] for e in evs])
good = base64.b64encode(b"\x01\x02"*100).decode()
cases = {
 "whitespace inside": good[:8]+" \n"+good[8:], "trailing newline": good+"\n", "leading space": " "+good,
 "url-safe alphabet": base64.urlsafe_b64encode(bytes(range(256))*2).decode(), "missing padding": base64.b64encode(b"\x01\x02\x03\x04").decode().rstrip("="),
 "pad in middle": "AA==AAAA", "=== pad": "A===", "only ==": "====", "empty": "", "odd bytes": base64.b64encode(b"\x01\x02\x03").decode(),
 "non-canonical last bits (AB==)": "AB==", "unicode chars": "ÀÀÀÀ", "NUL": "AA\u0000A", "audio null": None, "audio number": 5, "audio array": ["AAAA"], "audio object": {"a":1},
}
for k,v in cases.items():
    w.send_json({"type":"input_audio_buffer.append","audio":v})
    print(f"{k:32s} ->", errors(w.recv_events(0.2)) or "accepted")
w.send_json({"type":"input_audio_buffer.append"}); print("no audio field ->", errors(w.recv_events(0.2)))
# huge append just under and over the 1 MiB event limit, and ~4 MiB
for n in [700000, 790000, 1200000, 3000000]:
    b64 = base64.b64encode(b"\x00"*n).decode()
    t=time.time(); w.send_json({"type":"input_audio_buffer.append","audio":b64}); evs=w.recv_events(0.6)
    print(f"append of {len(b64)} b64 chars ->", errors(evs) or "accepted", round(time.time()-t,2),"s rss",rss_kb(pid))
# truncate with odd numbers
for ci,ms in [(1<<63, -1), (-5, 1e308), ("3", None), (1.5, 2.5), (2**64, -2**63)]:
    w.send_json({"type":"conversation.item.truncate","item_id":"item_x","content_index":ci,"audio_end_ms":ms})
    ev=[e for e in w.recv_events(0.2) if e["type"] in ("conversation.item.truncated","error")]
    print("truncate", ci, ms, "->", [(e["type"], e.get("content_index"), e.get("audio_end_ms")) for e in ev])
w.send_json({"type":"conversation.item.truncate","item_id":5}); print("truncate item_id=5 ->", errors(w.recv_events(0.2)))
w.send_json({"type":"conversation.item.truncate","item_id":"\u00e9"*200}); print("truncate long item_id ->", [len(e.get("item_id","")) for e in w.recv_events(0.2)])
w.send_json({"type":"conversation.item.create","item":"x"}); print("item.create item string ->", errors(w.recv_events(0.2)))
w.send_json({"type":"conversation.item.retrieve","item_id":"x"}); print("retrieve ->", errors(w.recv_events(0.2)))
# session.update after start
w.send_json({"type":"session.update","session":{"instructions":"LATE","audio":{"output":{"voice":"demo"}}}})
ev=[e for e in w.recv_events(0.3) if e["type"]=="session.updated"]
print("update after start ->", ev and (ev[0]["session"]["instructions"], ev[0]["session"]["audio"]["output"]["voice"]))
print("health", health()["sessions_in_use"]); w.close(); w.shut(); print("free", wait_idle())
print([l for l in open("server.log").read().splitlines() if "session ended" in l][-1])
