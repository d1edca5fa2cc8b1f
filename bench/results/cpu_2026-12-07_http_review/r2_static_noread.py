import h, socket, time
socks=[]
r0=h.rss()
for i in range(30):
    s=socket.create_connection((h.HOST,h.PORT)); s.sendall(b'GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n'); socks.append(s)
for t in range(4):
    time.sleep(1); t0=time.time(); a=h.alive()[:15]; print('t',t,'rss MB',h.rss()//1024,'health',a,'%.3fs'%(time.time()-t0))
# HEAD on static
out,_=h.raw('HEAD /big.bin HTTP/1.1\r\nHost: x\r\n\r\n', timeout=3); print('HEAD static:', out[:300])
time.sleep(12)
print('after 17s: rss', h.rss()//1024, 'open', h.metrics()['personaplex_connections_open'])
for s in socks: s.close()
