# full byte count, headers, and a slow reader (rate-limited) to see the 15 s cap
import h, socket, time, sys
def dl(rate=None, path='/big.bin', extra=''):
    s=socket.create_connection((h.HOST,h.PORT)); s.sendall(f'GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n'.encode())
    if rate: s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.settimeout(60); buf=b''; n=0; t0=time.time(); head=None
    while True:
        try: b=s.recv(65536)
        except Exception as e: print('recv exc',e); break
        if not b: break
        if head is None:
            buf+=b
            if b'\r\n\r\n' in buf:
                head,_,rest=buf.partition(b'\r\n\r\n'); n=len(rest)
        else: n+=len(b)
        if rate: time.sleep(len(b)/rate)
    s.close()
    return head, n, time.time()-t0
hd,n,dt=dl(); print(hd.decode()); print('body bytes',n,'expected',419430400,'in %.1fs'%dt)
hd,n,dt=dl(rate=10e6); print('slow 10MB/s reader:', hd.split(b'\r\n')[0], 'got',n,'bytes in %.1fs'%dt)
