# /api/chat query parameter validation: what does each bad value get?
import h
qs = ['text_temperature=abc','text_temperature=nan','text_temperature=NaN','text_temperature=inf','text_temperature=-1',
      'text_temperature=1e309','text_temperature=','text_temperature=0x10','text_temperature=1.5abc','text_temperature=%20 1',
      'text_topk=-5','text_topk=1.5','text_topk=99999999999999999999','text_topk=1048577','audio_topk=0',
      'audio_temperature=100.0001','text_seed=abc','text_seed=-1','text_seed=18446744073709551616','audio_seed=1e3',
      'text_temperature=1&text_temperature=abc','voice_prompt=../demo.wav','voice_prompt=demo.wav%00.pt','voice_prompt=nonexistent.pt',
      'voice_prompt=demo.wav','voice_prompt=%2e%2e%2fdemo.wav','text_prompt=%ff%fe','text_prompt=%zz','text_prompt='+'a'*5000,
      'text_prompt=%','text_prompt=%2','unknown=1&&&==&=','text_prompt=' + '%e2%96%81'*1000,'api_key=x', '&&&&']
import sys
if len(sys.argv)>1: qs=sys.argv[1:]
for q in qs:
    w = h.WS('/api/chat?'+q)
    st = w.head.split(b'\r\n')[0]
    msgs=[]
    if b'101' in st:
        for op,p in w.drain(timeout=3, maxn=6):
            if op=='END': msgs.append(p[:30]); break
            if op==2: msgs.append((p[0], p[1:120]))
            elif op==8: msgs.append(('close', p[:2].hex(), p[2:80])); break
            else: msgs.append(('op',op))
    else:
        msgs.append(w.buf[:200] if w.buf else w.head[-200:])
    w.close(); __import__("time").sleep(0.2)
    print(f'{q[:50]:50s} {st.decode()[:32]:32s} {msgs}')
print(h.alive()[:40])
