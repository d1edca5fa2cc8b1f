# Eviction at --max-connections: (a) is a live /api/chat session ever evicted? (b) can a rapid reconnecting attacker starve /health/live?
import h, oggopus as o, time, threading, socket, sys, collections
from t3_chat import wait_handshake
ATT_THREADS=int(sys.argv[1]) if len(sys.argv)>1 else 8
RATE=float(sys.argv[2]) if len(sys.argv)>2 else 0
DUR=24
res={'sess_end':None}; arr=[]; stop=False
def session():
    w=h.WS('/api/chat'); print('session head', w.head.split(b'\r\n')[0]); wait_handshake(w); s=o.Stream()
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    def rd():
        while True:
            try: op,p=w.recv(1)
            except socket.timeout: continue
            except Exception as e: res['sess_end']=(round(time.time()-T0,2),repr(e)[:60]); return
            if op==2 and p[:1]==b'\x01': arr.append(time.time())
            if op==8: res['sess_end']=(round(time.time()-T0,2),'close',p[:40]); return
    threading.Thread(target=rd,daemon=True).start()
    t=time.time()
    while time.time()-T0<DUR and res['sess_end'] is None:
        try: w.send(2,b'\x01'+s.next_page())
        except Exception as e: res['sess_end']=(round(time.time()-T0,2),'send',repr(e)[:60]); break
        t+=0.08; time.sleep(max(0,t-time.time()))
    w.close()
T0=time.time()
st=threading.Thread(target=session); st.start(); time.sleep(1.5)
# phase 1: 100 slowloris sockets (past limit), dribbled
slow=[]
for i in range(100):
    try: s=socket.create_connection((h.HOST,h.PORT),timeout=2); s.sendall(b'GET /health HTTP/1.1\r\n'); slow.append(s)
    except Exception as e: pass
def dribble():
    while not stop:
        for s in slow:
            try: s.sendall(b'X')
            except Exception: pass
        time.sleep(1)
threading.Thread(target=dribble,daemon=True).start()
probe=collections.Counter(); plat=[]; phase=['slowloris']
def prober():
    while not stop:
        t=time.time()
        try:
            out,_=h.raw('GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n', timeout=2); k=h.status(out).decode() or ('EMPTY '+repr(out[:30]))
        except Exception as e: k=type(e).__name__+str(getattr(e,'errno',''))
        probe[(phase[0],k)]+=1; plat.append(time.time()-t); time.sleep(0.05)
threading.Thread(target=prober,daemon=True).start()
time.sleep(6)
# phase 2: rapid reconnecting attackers
phase[0]='rapid'; att=collections.Counter()
def attacker():
    mine=collections.deque()
    while not stop:
        try:
            s=socket.create_connection((h.HOST,h.PORT),timeout=2); s.sendall(b'GET / HTTP/1.1\r\n'); mine.append((time.time(),s)); att['ok']+=1
        except Exception as e: att[type(e).__name__+str(getattr(e,'errno',''))]+=1
        if RATE: time.sleep(ATT_THREADS/RATE)
        while mine and time.time()-mine[0][0]>3: mine.popleft()[1].close()
    for _,s in mine: s.close()
ths=[threading.Thread(target=attacker,daemon=True) for _ in range(ATT_THREADS)]; [t.start() for t in ths]
time.sleep(12); phase[0]='after'
stop_att=True
stop=True; [t.join() for t in ths]; stop=False
threading.Thread(target=prober,daemon=True).start(); time.sleep(3); stop=True
st.join()
gaps=[b-a for a,b in zip(arr,arr[1:])]
print('attacker connects', dict(att), 'rate/s %.0f'%(att['ok']/12))
for k,v in sorted(probe.items()): print('probe',k,v)
print('session end', res['sess_end'], 'audio pages', len(arr), 'max gap %.2f'%max(gaps) if gaps else '')
for s in slow: s.close()
time.sleep(0.5); m=h.metrics(); print('rejected too_many', m['personaplex_rejected_total{reason="too_many_connections"}'], 'open', m['personaplex_connections_open'])
