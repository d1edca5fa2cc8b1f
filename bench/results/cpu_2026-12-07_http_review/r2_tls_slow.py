import socket, ssl, h, time
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def probe():
    try:
        s=ctx.wrap_socket(socket.create_connection((h.HOST,h.PORT),timeout=3), server_hostname='x'); s.sendall(b'GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n')
        return s.recv(100)[:30]
    except Exception as e: return repr(e)[:60]
for mode in ('no TLS bytes','TLS done, partial head'):
    socks=[]
    for i in range(80):
        try:
            s=socket.create_connection((h.HOST,h.PORT),timeout=3)
            if mode!='no TLS bytes': s=ctx.wrap_socket(s, server_hostname='x'); s.sendall(b'GET /health HTTP/1.1\r\n')
            socks.append(s)
        except Exception as e: pass
    print(mode, 'opened', len(socks))
    for t in range(4): time.sleep(1.5); print('  t=%.1f'%(1.5*(t+1)), probe())
    for s in socks: s.close()
    time.sleep(1)
