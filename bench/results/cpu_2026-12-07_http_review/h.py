import socket, os, struct, time, json, base64, subprocess
HOST='127.0.0.1'; PORT=int(os.environ.get('PORT','18931'))
def raw(data, timeout=5, read=True, shut=False):
    s=socket.create_connection((HOST,PORT),timeout=timeout)
    if isinstance(data,str): data=data.encode('latin1')
    s.sendall(data)
    if shut: s.shutdown(socket.SHUT_WR)
    out=b''
    t0=time.time()
    if read:
        try:
            while True:
                b=s.recv(65536)
                if not b: break
                out+=b
        except socket.timeout: out+=b'<<TIMEOUT>>'
        except ConnectionResetError: out+=b'<<RST>>'
    s.close()
    return out, time.time()-t0
def status(out):
    return out.split(b'\r\n',1)[0]
def rss():
    pid=open('/tmp/fuzz/server.pid').read().strip()
    return int(subprocess.check_output(['ps','-o','rss=','-p',pid]).strip())
def alive():
    try:
        out,_=raw('GET /health HTTP/1.1\r\nHost: x\r\n\r\n')
        return status(out).decode()+' '+out.split(b'\r\n\r\n',1)[1][:160].decode(errors='replace')
    except Exception as e: return 'DEAD '+repr(e)
def metrics():
    out,_=raw('GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n')
    d={}
    for l in out.split(b'\r\n\r\n',1)[1].decode().splitlines():
        if l.startswith('#') or not l: continue
        k,v=l.rsplit(' ',1); d[k]=float(v)
    return d
def upgrade_req(path, extra='', key='dGhlIHNhbXBsZSBub25jZQ=='):
    return (f'GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
            f'Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n')
def frame(opcode, payload, mask=True, fin=True, fake_len=None, rsv=0):
    b0=(0x80 if fin else 0)|rsv|opcode
    n=len(payload) if fake_len is None else fake_len
    m=0x80 if mask else 0
    if n<126: h=bytes([b0,m|n])
    elif n<65536: h=bytes([b0,m|126])+struct.pack('>H',n)
    else: h=bytes([b0,m|127])+struct.pack('>Q',n)
    if mask:
        k=os.urandom(4); p=bytes(c^k[i%4] for i,c in enumerate(payload)) if len(payload)<200000 else xor_big(payload,k)
        return h+k+p
    return h+payload
def xor_big(p,k):
    kk=(k*((len(p)+3)//4))[:len(p)]
    return (int.from_bytes(p,'big')^int.from_bytes(kk,'big')).to_bytes(len(p),'big')
class WS:
    def __init__(self, path, extra='', timeout=5):
        self.s=socket.create_connection((HOST,PORT),timeout=timeout)
        self.s.sendall(upgrade_req(path,extra).encode())
        self.buf=b''
        while b'\r\n\r\n' not in self.buf:
            b=self.s.recv(65536)
            if not b: break
            self.buf+=b
        self.head,_,self.buf=self.buf.partition(b'\r\n\r\n')
    def send(self, opcode, payload, **kw): self.s.sendall(frame(opcode,payload,**kw))
    def recv(self, timeout=5):
        op,p,fin=self.recv1(timeout)
        while not fin and op in (0,1,2):
            op2,p2,fin=self.recv1(timeout)
            if op2>=8: continue
            p+=p2
        return op,p
    def recv1(self, timeout=5):
        self.s.settimeout(timeout)
        def need(n):
            while len(self.buf)<n:
                b=self.s.recv(65536)
                if not b: raise EOFError('eof')
                self.buf+=b
        need(2); b0,b1=self.buf[0],self.buf[1]; n=b1&0x7f; off=2
        if n==126: need(4); n=struct.unpack('>H',self.buf[2:4])[0]; off=4
        elif n==127: need(10); n=struct.unpack('>Q',self.buf[2:10])[0]; off=10
        need(off+n); p=self.buf[off:off+n]; self.buf=self.buf[off+n:]
        return b0&0xf, p, bool(b0&0x80)
    def drain(self, timeout=3, maxn=100000):
        out=[]
        try:
            for _ in range(maxn): out.append(self.recv(timeout))
        except Exception as e: out.append(('END',repr(e)))
        return out
    def close(self): self.s.close()
