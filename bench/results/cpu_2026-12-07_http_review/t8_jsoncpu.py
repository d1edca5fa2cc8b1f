# Valid ~1 MiB realtime events (a known type plus a big array) are parsed on the I/O thread and are not
# counted as invalid, so there is no limit on them. Measure server CPU and /health latency meanwhile.
import h, json, time, threading, os, subprocess, sys
kind=sys.argv[1] if len(sys.argv)>1 else 'array'
if kind=='array': payload=b'{"type":"response.create","x":['+b'0,'*500000+b'0]}'
elif kind=='objects': payload=b'{"type":"response.create","x":['+b'{},'*300000+b'{}]}'
else: payload=b'{"type":"response.create","x":"'+b'a'*1000000+b'"}'
print('event bytes', len(payload))
w=h.WS('/v1/realtime')
stop=False; errs=[]
def reader():
    while not stop:
        try:
            op,p=w.recv(1)
            if op==1 and b'"error"' in p[:40]: errs.append(p[:150])
            if op==9: w.send(10,p)
        except Exception: pass
threading.Thread(target=reader,daemon=True).start()
pid=open('server.pid').read().strip()
def cpu(): 
    f=open(f'/proc/{pid}/stat').read().split(); return (int(f[13])+int(f[14]))/os.sysconf('SC_CLK_TCK')
c0=cpu(); t0=time.time(); n=0
lat=[]
def prober():
    while not stop:
        t=time.time(); h.raw('GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n'); lat.append(time.time()-t); time.sleep(0.1)
threading.Thread(target=prober,daemon=True).start()
while time.time()-t0<8:
    w.send(1,payload); n+=1
dt=time.time()-t0; stop=True; time.sleep(0.5)
print(f'sent {n} events in {dt:.1f}s; server cpu {cpu()-c0:.1f}s; health latency max {max(lat)*1000:.0f} ms median {sorted(lat)[len(lat)//2]*1000:.1f} ms; errors {errs[:2]} rss {h.rss()}')
w.close()
