import socket, ssl, h, collections
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def tls_req(data, timeout=20):
    s=ctx.wrap_socket(socket.create_connection((h.HOST,h.PORT),timeout=timeout), server_hostname='x')
    try: s.sendall(data)
    except Exception as e: return ('send '+repr(e)[:40]).encode()
    out=b''
    try:
        while True:
            b=s.recv(65536)
            if not b: break
            out+=b
    except Exception as e: out+=f'<<{e!r}>>'.encode()
    return out
for n in (70000, 100000, 150000, 300000):
    c=collections.Counter(tls_req(b'GET /health HTTP/1.1\r\nHost: x\r\nX: '+b'a'*n+b'\r\n\r\n')[:45] for _ in range(10)); print(n, dict(c))
print('garbage over TLS', tls_req(b'\x00\x01garbage\r\n\r\n')[:80])
