# Each hostile voice file in /tmp/fuzz/voices as voice_prompt on /api/chat: clear 0x05 and no crash?
import h, time, struct, json, sys
names=json.loads(h.raw('GET /api/voices HTTP/1.1\r\nHost: x\r\n\r\n')[0].split(b'\r\n\r\n',1)[1])
for n in (sys.argv[1:] or names):
    time.sleep(0.3)
    t0=time.time(); w=h.WS('/api/chat?voice_prompt='+n, timeout=60); res=[]
    try:
        while True:
            op,p=w.recv(60)
            if op==2 and p[:1]==b'\x05': res.append(p[1:200].decode(errors='replace'))
            elif op==2 and p[:1]==b'\x00': res.append('handshake'); break
            elif op==2 and p[:1]==b'\x06': res.append('ping') if 'ping' not in res else None
            elif op==8: res.append('close'); break
    except Exception as e: res.append(repr(e)[:40])
    w.close()
    print(f'{n:20s} {time.time()-t0:6.2f}s {res}  rss={h.rss()}', flush=True)
print(h.alive()[:40])
