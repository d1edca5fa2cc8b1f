# SIGTERM while one /api/chat session streams audio: new upgrades 503 draining, /health 503, /health/live 200,
# the live session goes on for --drain-timeout (10 s) then gets 0x05 and a close; the process exits 0.
import h, oggopus as o, time, threading, os, signal, struct
from t3_chat import wait_handshake
pid=int(open('server.pid').read())
w=h.WS('/api/chat?api_key=s3cr3t'); wait_handshake(w); s=o.Stream()
for hp in s.headers(): w.send(2,b'\x01'+hp)
ev=[]; stop=False; t0=None
def rd():
    while not stop:
        try: op,p=w.recv(1)
        except EOFError: ev.append((round(time.time()-t0,2),'EOF')); return
        except Exception: continue
        if op==2 and p[:1]==b'\x05': ev.append((round(time.time()-t0,2),p[1:100]))
        if op==8: ev.append((round(time.time()-t0,2),'close',p[:2].hex()))
threading.Thread(target=rd,daemon=True).start()
for _ in range(10): w.send(2,b'\x01'+s.next_page()); time.sleep(0.08)
t0=time.time(); os.kill(pid, signal.SIGTERM); time.sleep(0.3)
for p in ['/health','/health/live','/health/ready']:
    out,_=h.raw(f'GET {p} HTTP/1.1\r\nHost: x\r\n\r\n'); print(p, h.status(out), out.split(b'\r\n\r\n',1)[1][:70])
x=h.WS('/v1/realtime?api_key=s3cr3t'); print('new upgrade during drain:', x.head.split(b'\r\n')[0], x.buf[:100]); x.close()
try:
    while time.time()-t0<13: w.send(2,b'\x01'+s.next_page()); time.sleep(0.08)
except Exception as e: print('send ended', repr(e)[:40], round(time.time()-t0,2))
time.sleep(1); stop=True
print('session events', ev)
time.sleep(1)
try: os.kill(pid,0); print('process still alive!')
except ProcessLookupError: print('process exited')
