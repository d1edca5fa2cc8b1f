# A voice WAV (float32) full of NaN/Inf/+-1e38 is accepted; does the conversation after it behave?
import h, oggopus as o, time, sys
from t3_chat import count, wait_handshake
v=sys.argv[1] if len(sys.argv)>1 else 'float32.wav'
w=h.WS('/api/chat?voice_prompt='+v); wait_handshake(w); s=o.Stream()
for hp in s.headers(): w.send(2,b'\x01'+hp)
texts=[]
def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
c=count(w,3,snd); w.close(); print(v, c); time.sleep(0.3); print(h.alive()[:40])
