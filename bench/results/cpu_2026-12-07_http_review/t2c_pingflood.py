# Ping flood (reading pongs concurrently), then check the session still produces audio.
import h, oggopus as o, time, threading, os, struct
w=h.WS('/api/chat'); pongs=[0]; other=[]
def reader():
    try:
        while True:
            op,p=w.recv(5)
            if op==10: pongs[0]+=1
            else: other.append((op,p[:1]))
    except Exception as e: other.append(repr(e))
threading.Thread(target=reader,daemon=True).start()
r0=h.rss(); t0=time.time(); n=0
while time.time()-t0<5:
    w.send(9, os.urandom(125)); n+=1
time.sleep(1)
print('sent',n,'pongs',pongs[0],'other',other[:5],'rss',r0,'->',h.rss())
s=o.Stream()
for p in s.headers(): w.send(2,b'\x01'+p)
for _ in range(12): w.send(2,b'\x01'+s.next_page()); time.sleep(0.08)
time.sleep(0.5)
print('audio msgs after flood', sum(1 for x in other if x==(2,b'\x01')), 'err', [x for x in other if x==(2,b'\x05')])
w.close(); time.sleep(0.3); print(h.alive()[:40])
