import h, os, time, threading, socket
w=h.WS('/api/chat'); pongs=[0]; end=['']
def rd():
    while True:
        try: op,p=w.recv(5)
        except Exception as e: end[0]=repr(e)[:50]; return
        if op==10: pongs[0]+=1
threading.Thread(target=rd,daemon=True).start()
t0=time.time(); n=0
while time.time()-t0<3: w.send(9, os.urandom(100)); n+=1
time.sleep(2); print('ping flood with reader: sent',n,'pongs',pongs[0], end[0]); w.close(); time.sleep(0.5)
print(h.alive()[:30], 'rss', h.rss(), 'in_use', h.metrics()['personaplex_sessions_in_use'])
