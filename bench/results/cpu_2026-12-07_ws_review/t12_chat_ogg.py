# /api/chat: message kinds, empty messages, corrupt-but-plausible Ogg pages, Opus garbage, huge pages, chained streams.
import time, struct, os, random
from wslib import *
pid=server_pid()
def session(name, sender, secs=4, wait_hs=True):
    w = WS("/api/chat?voice_prompt=&text_prompt=")
    if w.status!=101: print(name, "HTTP", w.status); return
    if wait_hs:
        while True:
            m=w.recv_msg(10)
            if m[0]=="close" or m[1][:1]==b"\x00": break
    ign0 = metrics().get("personaplex_ignored_messages_total",0)
    t0=time.time()
    try: sender(w)
    except Exception as e: print("  send exc", repr(e))
    audio=text=0; errs=[]
    deadline=time.time()+secs
    while time.time()<deadline:
        try: m=w.recv_msg(max(0.01,deadline-time.time()))
        except Exception as e:
            if "timed out" not in repr(e): errs.append(repr(e)[:60])
            break
        if m[0]=="close": errs.append(("close",m[1])); break
        k=m[1][0]
        if k==1: audio+=1
        elif k==2: text+=1
        elif k==5: errs.append(("ERR", m[1][1:].decode(errors="replace")[:120], round(time.time()-t0,2)))
        else: errs.append(("kind",k))
    w.close(); w.shut(); t=wait_idle(15)
    ign = metrics().get("personaplex_ignored_messages_total",0)-ign0
    print(f"[{name}] audio pages out={audio} text={text} {errs} | ignored+={ign:.0f} | slot free +{t and round(t,2)} | rss {rss_kb(pid)}")

st=OggStream(); HDR=st.headers(); PAGES=[st.page() for _ in range(30)]
def valid(w, n=30, pre=b""):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(n): w.send_binary(b"\x01"+pre+PAGES[i%30]); time.sleep(0.02)
session("valid 30 pages", valid)
session("kinds 0x00,0x02..0xff, empty, 0x01 alone", lambda w: [w.send_binary(bytes([k])+b"xyz") for k in [0]+list(range(2,256))] + [w.send_binary(b""), w.send_binary(b"\x01")])
session("text frame with 0x01 + valid pages? (text frames must be UTF-8)", lambda w: w.send_text(b"\x01OggS"))
def bad_crc(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(30):
        b=bytearray(PAGES[i]); b[30]^=0xFF; w.send_binary(b"\x01"+bytes(b))
session("30 pages with bad CRC", bad_crc)
def wrong_serial(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    s2=OggStream(serial=999); s2.headers()
    for i in range(30):
        pg = s2.page(); w.send_binary(b"\x01"+pg)   # non-BOS pages of a foreign serial
session("pages of a foreign serial (no BOS)", wrong_serial)
def chained_bos_flood(w):
    for i in range(300):
        s=OggStream(serial=1000+i); h=s.headers(); w.send_binary(b"\x01"+h[0]+h[1]+s.page())
session("300 chained streams (new BOS each)", chained_bos_flood)
def huge_page(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    body=os.urandom(255*255)
    pg=ogg_page([body], st.serial, 2, 0, segtable=[255]*255)  # 65025-byte continued packet (not terminated)
    for i in range(15): w.send_binary(b"\x01"+pg)
session("max-size pages w/ unterminated 65 KB packet x15", huge_page)
def garbage_opus(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(200):
        pk=[os.urandom(random.randint(1,200)) for _ in range(4)]
        w.send_binary(b"\x01"+ogg_page(pk, st.serial, 2+i, 0))
session("200 pages of random Opus packets", garbage_opus)
def tiny_120ms(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    # code-3 packet: TOC 0xFB? use CELT FB 20ms (config 31 -> toc=0xF8|3), count byte 6 frames, CBR, frames empty -> 120 ms
    pk = bytes([0xFB, 0x06])
    for i in range(20):
        w.send_binary(b"\x01"+ogg_page([pk]*255, st.serial, 2+i, 0))
session("120ms-per-2-byte packets x255 per page (amplification)", tiny_120ms)
def opushead_weird(w):
    h = b"OpusHead"+struct.pack("<BBHIhB",1,255,65535,0,-32768,255)+bytes([255,0])+bytes(range(255))
    w.send_binary(b"\x01"+ogg_page([h], st.serial, 0, 0, htype=2))
    for i in range(30): w.send_binary(b"\x01"+PAGES[i])
session("OpusHead 255 ch family 255 then pages", opushead_weird)
def opushead_trunc(w):
    w.send_binary(b"\x01"+ogg_page([b"OpusHead\x01"], st.serial, 0, 0, htype=2))
    for i in range(30): w.send_binary(b"\x01"+PAGES[i])
session("truncated OpusHead then pages", opushead_trunc)
def split_bytes(w):
    data=b"".join(HDR+PAGES)
    for i in range(0,len(data),7): w.send_binary(b"\x01"+data[i:i+7])
session("valid stream split into 7-byte messages", split_bytes)
def fake_hdr(w):
    w.send_binary(b"\x01"+(b"OggS\x00\xff\xff"*140000)[:900000])
session("fake header 'OggS\\0\\xff\\xff' x ~128k (900 KB)", fake_hdr, secs=6)
def random_garbage(w):
    for i in range(3): w.send_binary(b"\x01"+os.urandom(900000))
session("2.7 MB of random bytes", random_garbage, secs=6)
def overflow(w):
    for i in range(6): w.send_binary(b"\x01"+b"\x00"*(1000000))
session("6 x 1 MB messages at once (4 MiB queue)", overflow, secs=6)
def over_1mib(w): w.send_binary(b"\x01"+b"\x00"*(1<<20))
session("one message of 1 MiB + 1 (limit)", over_1mib)
def before_handshake(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(30): w.send_binary(b"\x01"+PAGES[i])
session("audio before handshake (voice prompt runs)", before_handshake, wait_hs=False)
def eos_then_more(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    last = bytearray(ogg_page([b"\xfc\xff\xfe"], st.serial, 2, 960, htype=4))
    w.send_binary(b"\x01"+bytes(last))
    for i in range(30): w.send_binary(b"\x01"+PAGES[i])
session("EOS page then more pages same serial", eos_then_more)
def granule_neg(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(30):
        pk=[]; 
        b=bytearray(PAGES[i]); struct.pack_into("<q", b, 6, -1 - i); struct.pack_into("<I", b, 22, 0); c=ogg_crc(bytes(b)); struct.pack_into("<I", b, 22, c)
        w.send_binary(b"\x01"+bytes(b))
session("negative granules, valid CRC", granule_neg)
def seq_gaps(w):
    for p in HDR: w.send_binary(b"\x01"+p)
    for i in range(30):
        b=bytearray(PAGES[i]); struct.pack_into("<I", b, 18, random.getrandbits(32)); struct.pack_into("<I", b, 22, 0); struct.pack_into("<I", b, 22, ogg_crc(bytes(b)))
        w.send_binary(b"\x01"+bytes(b))
session("random page sequence numbers", seq_gaps)
print(health()["sessions_in_use"], "rss", rss_kb(pid))
