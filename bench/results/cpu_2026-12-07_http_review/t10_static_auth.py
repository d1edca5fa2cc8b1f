# --static traversal and --api-key / --allowed-origin bypass attempts (server2: --static /tmp/fuzz/static --api-key s3cr3t --allowed-origin https://good.example)
import h
def get(path, extra=''):
    out,dt=h.raw(f'GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n', timeout=30)
    b=out.split(b'\r\n\r\n',1)
    return f'{h.status(out).decode()[9:]:28s} {dt:5.2f}s body={b[1][:50] if len(b)>1 else out[:50]!r}'
paths=['/','/index.html','/sub/','/sub/a.txt','/sub_link/a.txt','/passwd_link','/voices_link/demo.wav','/../staticX_secret.txt',
 '/%2e%2e/staticX_secret.txt','/sub/%2e%2e/%2e%2e/staticX_secret.txt','/sub/..%2f..%2fstaticX_secret.txt','//tmp/fuzz/static/index.html',
 '//etc/passwd','/%2Fetc%2Fpasswd','/sub%2f..%2f..%2fstaticX_secret.txt','/..%5c..%5cstaticX_secret.txt','/sub/.%2e/index.html',
 '/%00','/index.html%00','/static/../staticX_secret.txt','/app.js','/health?x','/api/voices','/api/voices?api_key=s3cr3t',
 '/api/voices?api_key=S3CR3T','/api/voices?api_key=s3cr3t%00','/api/voices?api_key=s3cr3t&api_key=bad','/api/voices?api_key=bad&api_key=s3cr3t',
 '/API/voices','/api//voices','/api/%76oices','/metrics']
for p in paths: print(f'{p[:45]:45s}', get(p))
for hdr in ['Authorization: Bearer s3cr3t','Authorization: bearer s3cr3t','Authorization: Bearer  s3cr3t','Authorization: Basic s3cr3t','Authorization: Bearer s3cr3t\r\nAuthorization: Bearer x','Authorization: Bearer x\r\nAuthorization: Bearer s3cr3t']:
    print(f'{hdr[:45]!r:47s}', get('/api/voices', hdr+'\r\n'))
for q,extra in [('',''),('?api_key=s3cr3t',''),('?api_key=s3cr3t','Origin: https://evil.example\r\n'),('?api_key=s3cr3t','Origin: https://good.example\r\n'),
                ('?api_key=s3cr3t','Origin: https://good.example/\r\n'),('?api_key=s3cr3t','Origin: null\r\n'),('?api_key=s3cr3t','Origin: https://evil.example\r\nOrigin: https://good.example\r\n'),
                ('?api_key=s3cr3t','Origin: https://good.example\r\nOrigin: https://evil.example\r\n')]:
    w=h.WS('/api/chat'+q, extra=extra); st=w.head.split(b'\r\n')[0]; w.close()
    print(f'ws {q} {extra.strip()!r:70s}', st.decode())
    __import__('time').sleep(0.2)
print(h.alive()[:40])
