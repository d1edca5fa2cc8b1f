# A single header value >= 64 KiB: Beast throws std::length_error "field value too large" out of the
# completion handler into the io_context run loop ("I/O thread: uncaught exception").
import h
print('before', h.alive()[:40], 'rss', h.rss())
m0=h.metrics()
for i in range(200):
    out,_=h.raw('GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer '+'a'*70000+'\r\n\r\n')
    assert out==b'', out[:100]
# also on the websocket upgrade path
for i in range(20):
    out,_=h.raw(h.upgrade_req('/api/chat', extra='Cookie: '+'c'*70000+'\r\n'))
    assert out==b''
m1=h.metrics()
print('connections_open', m1['personaplex_connections_open'], 'rejected', {k:v for k,v in m1.items() if 'rejected' in k and v})
print('after', h.alive()[:40], 'rss', h.rss())
