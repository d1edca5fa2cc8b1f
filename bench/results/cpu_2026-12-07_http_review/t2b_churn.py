# 200 rapid connect/disconnect cycles on /api/chat in various ways, a ping flood, and RST mid-audio;
# then compare /metrics counters and RSS.
import h, oggopus as o, time, socket, struct, random, os
m0=h.metrics(); r0=h.rss()
stats={}
s=o.Stream(); hdr=s.headers(); pages=[s.next_page() for _ in range(30)]
for i in range(200):
    mode=i%5
    try:
        w=h.WS('/api/chat', timeout=5)
        st=w.head.split(b'\r\n')[0].split(b' ')[1].decode()
        stats[st]=stats.get(st,0)+1
        if st=='101':
            if mode==1:
                w.send(2,b'\x01'+b''.join(hdr+pages[:5]))
            if mode==2:
                w.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii',1,0))
                w.send(2,b'\x01'+b''.join(hdr+pages))
            if mode==3:
                w.send(8, struct.pack('>H',1000))
            if mode==4:
                try: w.recv(2)
                except Exception: pass
                w.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii',1,0))
        w.close()
    except Exception as e:
        stats[repr(e)[:40]]=stats.get(repr(e)[:40],0)+1
    time.sleep(0.02)
print('upgrade results', stats)
time.sleep(1)
m1=h.metrics()
for k in sorted(m1):
    if ('total' in k or 'in_use' in k or 'open' in k) and m1[k]!=m0.get(k) and 'bucket' not in k:
        print(f'  {k} {m0.get(k)} -> {m1[k]}')
print('rss', r0, '->', h.rss())
# ping flood within one session
w=h.WS('/api/chat'); 
t0=time.time(); n=0
while time.time()-t0<3:
    w.send(9, os.urandom(100)); n+=1
pongs=0
w.s.settimeout(3)
try:
    while True:
        op,p=w.recv(2)
        if op==10: pongs+=1
except Exception as e: end=repr(e)
print('ping flood: sent', n, 'pongs', pongs, end)
w.close(); time.sleep(0.5)
print(h.alive()[:40],'rss',h.rss(), 'in_use', h.metrics()['personaplex_sessions_in_use'])
