# 30 rounds of 8 simultaneous upgrades (mixed /api/chat and /v1/realtime) to hit the slot race;
# afterwards sessions_in_use must return to 0 and started == ended.
import h, threading, time, struct, json
from collections import Counter
res=Counter()
def one(path, barrier):
    try:
        barrier.wait()
        w=h.WS(path, timeout=5); st=w.head.split(b'\r\n')[0][9:12].decode()
        if st=='101':
            op,p=w.recv(3)
            if op==2: res[(path,'101',p[:1].hex(), p[1:40] if p[:1]==b'\x05' else b'')]+=1
            else:
                j=json.loads(p); res[(path,'101',j['type'], j.get('error',{}).get('code'))]+=1
            time.sleep(0.05)
        else: res[(path,st)]+=1
        w.close()
    except Exception as e: res[('exc',repr(e)[:50])]+=1
m0=h.metrics()
for r in range(30):
    b=threading.Barrier(8)
    ts=[threading.Thread(target=one,args=('/api/chat' if i%2 else '/v1/realtime',b)) for i in range(8)]
    [t.start() for t in ts]; [t.join() for t in ts]
    time.sleep(0.1)
time.sleep(1)
for k,v in sorted(res.items(), key=str): print(v, k)
m1=h.metrics()
print('in_use', m1['personaplex_sessions_in_use'], 'started', m1['personaplex_sessions_started_total']-m0['personaplex_sessions_started_total'],
      'ended', sum(m1[k]-m0[k] for k in m1 if k.startswith('personaplex_sessions_ended_total')),
      'busy', m1['personaplex_rejected_total{reason="busy"}']-m0['personaplex_rejected_total{reason="busy"}'], 'conns', m1['personaplex_connections_open'])
print(h.alive()[:40])
