# A large file under --static (400 MB here) is read whole into memory, synchronously on an I/O thread.
# N concurrent downloads: peak RSS and /health latency meanwhile.
import h, threading, time, socket, sys
N=int(sys.argv[1]) if len(sys.argv)>1 else 4
peak=[h.rss()]; stop=False; lat=[]
def mon():
    while not stop: peak[0]=max(peak[0],h.rss()); time.sleep(0.05)
def dl(i):
    s=socket.create_connection((h.HOST,h.PORT)); s.sendall(b'GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n'); n=0
    s.settimeout(60)
    while True:
        b=s.recv(1<<20)
        if not b: break
        n+=len(b)
        if n<1000: time.sleep(0)  
    s.close()
def probe():
    while not stop:
        t=time.time()
        try: h.raw('GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n', timeout=30)
        except Exception as e: pass
        lat.append(time.time()-t); time.sleep(0.1)
r0=h.rss()
threading.Thread(target=mon,daemon=True).start(); threading.Thread(target=probe,daemon=True).start()
t0=time.time(); ts=[threading.Thread(target=dl,args=(i,)) for i in range(N)]; [t.start() for t in ts]; [t.join() for t in ts]
stop=True; time.sleep(0.2)
print(f'{N} downloads of 400 MB in {time.time()-t0:.1f}s; RSS {r0//1024} MB -> peak {peak[0]//1024} MB -> after {h.rss()//1024} MB; /health/live latency max {max(lat):.2f}s')
