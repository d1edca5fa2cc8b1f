# Client sends WebSocket frames in the same TCP write as the upgrade request (before the 101 arrives).
# Are those bytes kept (beast::flat_buffer of the HTTP read) or dropped / desynced?
import h, socket, json, time, struct
import oggopus as o
def test(path, frames, label):
    s=socket.create_connection((h.HOST,h.PORT),timeout=5)
    s.sendall(h.upgrade_req(path).encode()+frames)
    w=h.WS.__new__(h.WS); w.s=s; w.buf=b''
    while b'\r\n\r\n' not in w.buf: w.buf+=s.recv(65536)
    w.head,_,w.buf=w.buf.partition(b'\r\n\r\n')
    out=[]
    t0=time.time()
    try:
        while time.time()-t0<3:
            op,p=w.recv(3)
            if op==1: j=json.loads(p); out.append(j['type'] if j['type']!='error' else ('error',j['error']['code'],j['error']['message'][:60]))
            elif op==2: out.append(('bin',p[:1].hex(), p[1:60] if p[:1]==b'\x05' else len(p)))
            elif op==8: out.append(('close',struct.unpack('>H',p[:2])[0] if len(p)>1 else None)); break
            else: out.append(('op',op))
    except Exception as e: out.append(repr(e)[:30])
    s.close(); time.sleep(0.3)
    # compress runs
    comp=[]
    for x in out:
        if comp and comp[-1][0]==x: comp[-1][1]+=1
        else: comp.append([x,1])
    print(label, w.head.split(b'\r\n')[0].decode(), [(x if n==1 else (x,n)) for x,n in comp][:14])
key='?api_key=s3cr3t'
ev=json.dumps({'type':'session.update','session':{'instructions':'hi'}}).encode()
test('/v1/realtime'+key, h.frame(1, ev), 'rt: session.update in same write   ')
test('/v1/realtime'+key, h.frame(1, json.dumps({'type':'bogus'}).encode()), 'rt: bogus event in same write      ')
st=o.Stream(); data=b''.join(st.headers()+[st.next_page() for _ in range(12)])
test('/api/chat'+key, h.frame(2, b'\x01'+data), 'chat: 1 s of Ogg in same write      ')
test('/api/chat'+key, h.frame(2, b'\x01'+data)[:7], 'chat: half a frame header in same write')
print(h.alive()[:40])
