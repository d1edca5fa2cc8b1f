import h, collections
def st(req, reps=1):
    c=collections.Counter()
    for _ in range(reps):
        try: out,_=h.raw(req, timeout=5); c[(h.status(out).decode() or repr(out[:40]))+(' body='+repr(out.split(b'\r\n\r\n',1)[1][:70]) if b'\r\n\r\n' in out else '')]+=1
        except Exception as e: c[repr(e)[:60]]+=1
    return dict(c)
base='GET /health HTTP/1.1\r\nHost: x\r\n'
print('before', h.alive()[:20], 'rss', h.rss())
for n in (59*1024, 60*1024-60, 60*1024+10, 63*1024, 64*1024, 70000, 300000):
    print(f'Authorization value {n:7d}:', st(base+'Authorization: Bearer '+'a'*n+'\r\n\r\n', 20))
print('many small fields 80 KiB  :', st(base+''.join(f'X-F{i}: {"v"*100}\r\n' for i in range(800))+'\r\n', 20))
print('70 KB URL                 :', st('GET /health?'+'q'*70000+' HTTP/1.1\r\nHost: x\r\n\r\n', 20))
print('70 KB field name          :', st(base+'X'*70000+': 1\r\n\r\n', 20))
print('ws upgrade 70 KB cookie   :', st(h.upgrade_req('/api/chat', extra='Cookie: '+'c'*70000+'\r\n'), 20))
print('ws upgrade 61 KiB cookie  :', st(h.upgrade_req('/api/chat', extra='Cookie: '+'c'*(61*1024)+'\r\n'), 5))
print('ws upgrade 50 KiB cookie  :', st(h.upgrade_req('/v1/realtime', extra='Cookie: '+'c'*(50*1024)+'\r\n'), 1))
m1=h.metrics()
print('connections_open', m1['personaplex_connections_open'], 'rejected', {k:v for k,v in m1.items() if 'rejected' in k and v})
print('after', h.alive()[:20], 'rss', h.rss())
