import t14_tls as t, time
for n in (60*1024+10, 64*1024, 300000):
    print(n, t.tls_req(b'GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer '+b'a'*n+b'\r\n\r\n')[:200])
print('bad key over TLS', t.tls_req(b'GET /api/chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \r\nSec-WebSocket-Version: 13\r\n\r\n')[:80])
print('HEAD over TLS', t.tls_req(b'HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n')[:200])
print('garbage over TLS', t.tls_req(b'\x00\x01garbage\r\n\r\n')[:120])
