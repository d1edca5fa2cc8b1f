# Slowloris: N sockets that each dribble one header byte every 2 s. Does the server keep serving
# others (/health, a new /api/chat session)? What happens at --max-connections (68 here)?
import h, socket, time, sys
N=int(sys.argv[1]) if len(sys.argv)>1 else 80
socks=[]
for i in range(N):
    try:
        s=socket.create_connection((h.HOST,h.PORT),timeout=2); s.sendall(b'GET /health HTTP/1.1\r\n'); socks.append(s)
    except Exception as e: print('connect',i,e)
print('opened',len(socks),'rss',h.rss())
t0=time.time()
for rnd in range(10):
    time.sleep(2)
    dead=0
    for s in socks:
        try: s.sendall(b'X')
        except Exception: dead+=1
    try:
        out,dt=h.raw('GET /health HTTP/1.1\r\nHost: x\r\n\r\n', timeout=3)
        hs=h.status(out) or out[:60]
    except Exception as e: hs=repr(e)
    try:
        w=h.WS('/api/chat', timeout=3); ws=w.head.split(b'\r\n')[0]; w.close()
    except Exception as e: ws=repr(e)
    print(f't={time.time()-t0:5.1f} dead={dead} health={hs} ws={ws}')
print(h.metrics()['personaplex_rejected_total{reason="too_many_connections"}'])
for s in socks: s.close()
time.sleep(0.5)
print('after', h.alive()[:40], h.metrics()['personaplex_connections_open'])
