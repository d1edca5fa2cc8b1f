# minimal WS client: connect to /api/chat, send nothing, report frames received and when the close came
import socket, base64, os, sys, time, struct
port=int(sys.argv[1]); dur=float(sys.argv[2]); path=sys.argv[3] if len(sys.argv)>3 else '/api/chat'
s=socket.create_connection(('127.0.0.1',port)); s.settimeout(0.5)
key=base64.b64encode(os.urandom(16)).decode()
s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
buf=b''; t0=time.time(); hdr_done=False; nframes=0
while time.time()-t0<dur:
    try: d=s.recv(65536)
    except socket.timeout: continue
    if not d: print(f"{time.time()-t0:.2f}s: TCP closed"); break
    buf+=d
    if not hdr_done:
        if b'\r\n\r\n' in buf:
            h,buf=buf.split(b'\r\n\r\n',1); print(f"{time.time()-t0:.2f}s:", h.split(b'\r\n')[0].decode()); hdr_done=True
        else: continue
    while len(buf)>=2:
        op=buf[0]&15; ln=buf[1]&127; o=2
        if ln==126:
            if len(buf)<4: break
            ln=struct.unpack('>H',buf[2:4])[0]; o=4
        elif ln==127:
            if len(buf)<10: break
            ln=struct.unpack('>Q',buf[2:10])[0]; o=10
        if len(buf)<o+ln: break
        p=buf[o:o+ln]; buf=buf[o+ln:]; nframes+=1
        if op==8 or (op==2 and p[:1]!=b'\x01') or nframes<=2:
            print(f"{time.time()-t0:.2f}s: frame op={op} len={ln} {p[:80]!r}")
        if op==8: sys.exit(0)
print(f"end after {time.time()-t0:.1f}s, {nframes} frames")
