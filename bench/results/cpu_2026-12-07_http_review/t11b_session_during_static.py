# Does an active /api/chat session stall while 3 large --static downloads run? (server2, api key s3cr3t)
import h, oggopus as o, time, threading, socket
from t3_chat import wait_handshake
w=h.WS('/api/chat?api_key=s3cr3t'); wait_handshake(w); s=o.Stream()
for hp in s.headers(): w.send(2,b'\x01'+hp)
arr=[]; stop=False
def rd():
    while not stop:
        try: op,p=w.recv(1)
        except Exception: continue
        if op==2 and p[:1]==b'\x01': arr.append(time.time())
threading.Thread(target=rd,daemon=True).start()
def dl():
    x=socket.create_connection((h.HOST,h.PORT)); x.sendall(b'GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n'); x.settimeout(60)
    while x.recv(1<<20): pass
t0=time.time()
for i in range(100):
    if i==25: [threading.Thread(target=dl,daemon=True).start() for _ in range(3)]
    w.send(2,b'\x01'+s.next_page()); time.sleep(0.08)
time.sleep(1); stop=True
gaps=[b-a for a,b in zip(arr,arr[1:])]
print(f'{len(arr)} audio pages; max gap between pages {max(gaps):.2f}s (real time: 0.08 s)')
