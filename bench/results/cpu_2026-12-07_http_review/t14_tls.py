# TLS (server3: --ssl tests/data/tls): garbage/partial handshakes, big header field over TLS, slow handshake.
import socket, ssl, time, h
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def tls_req(data, timeout=20):
    s=ctx.wrap_socket(socket.create_connection((h.HOST,h.PORT),timeout=timeout), server_hostname='x')
    s.sendall(data); out=b''
    try:
        while True:
            b=s.recv(65536)
            if not b: break
            out+=b
    except Exception as e: out+=f'<<{e!r}>>'.encode()
    return out
t=time.time(); print('big field over TLS:', tls_req(b'GET /health HTTP/1.1\r\nHost: x\r\nX: '+b'a'*70000+b'\r\n\r\n')[:80], round(time.time()-t,2))
for name,data in [('garbage',b'\x16\x03\x01\xff\xff'+b'\x00'*100),('sslv2 hello',b'\x80\x2e\x01\x00\x02'+b'\x00'*43),('zero bytes',b'')]:
    s=socket.create_connection((h.HOST,h.PORT),timeout=20); t=time.time(); s.sendall(data)
    try: r=s.recv(100)
    except Exception as e: r=repr(e).encode()
    print(name, r[:40], round(time.time()-t,2)); s.close()
# a TLS 1.0-only client
c10=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT); c10.check_hostname=False; c10.verify_mode=ssl.CERT_NONE
try: c10.maximum_version=ssl.TLSVersion.TLSv1_1; c10.minimum_version=ssl.TLSVersion.TLSv1
except Exception as e: print(e)
try: c10.wrap_socket(socket.create_connection((h.HOST,h.PORT),timeout=5)); print('TLS1.1 accepted!')
except Exception as e: print('TLS<=1.1 refused:', repr(e)[:80])
out=tls_req(b'GET /health HTTP/1.1\r\nHost: x\r\n\r\n'); print('after:', out[:40])
