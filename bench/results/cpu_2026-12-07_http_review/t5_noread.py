# A client that sends audio in real time (then faster) but never reads: is it dropped, and does RSS stay bounded?
import h, json, time, base64, struct, socket, sys
from t4_rt import pcm_b64
mode=sys.argv[1] if len(sys.argv)>1 else 'rt'
w=h.WS('/v1/realtime' if mode=='rt' else '/api/chat')
w.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
r0=h.rss(); t0=time.time(); n=0
if mode=='rt':
    w.send(1, json.dumps({'type':'session.update','session':{}}).encode())
    chunk=json.dumps({'type':'input_audio_buffer.append','audio':pcm_b64(1920)}).encode()
else:
    import oggopus as o; s=o.Stream(); w.send(2,b'\x01'+b''.join(s.headers()))
try:
    while time.time()-t0<40:
        if mode=='rt': w.send(1, chunk)
        else: w.send(2, b'\x01'+s.next_page())
        n+=1; time.sleep(0.08)
        if n%50==0: print(f't={time.time()-t0:.1f} sent={n} rss_delta={h.rss()-r0} in_use={h.metrics()["personaplex_sessions_in_use"]}', flush=True)
except Exception as e: print('send stopped', repr(e), 'at', round(time.time()-t0,1))
print('rss delta', h.rss()-r0, h.alive()[:40])
w.close()
