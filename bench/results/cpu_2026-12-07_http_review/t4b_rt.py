import h, json, time, base64, struct, sys, socket
from t4_rt import sess, ev, collect, brief, pcm_b64
def sessobj(evs):
    for e in evs:
        if isinstance(e,dict) and e['type'] in ('session.updated','session.created'): 
            s=e['session']; yield e['type'], {k:s.get(k) for k in ('model','instructions','voice','temperature')} | {'voice_ga': (s.get('audio') or {}).get('output',{}).get('voice')}
def t_voice_traversal():
    w=sess(); a=collect(w,0.3)
    ev(w,{'type':'session.update','session':{'audio':{'output':{'voice':'../voices/demo'}}}})
    ev(w,{'type':'session.update','session':{'voice':'/tmp/fuzz/voices/demo.wav'}})
    ev(w,{'type':'session.update','session':{'audio':{'output':{'voice':'demo'}}, 'instructions':'hi'}})
    b=collect(w,0.5); w.close(); return [x for x in sessobj(a+b)]
def t_model_param():
    r=[]
    for q in ['?model=gpt-4o-realtime-preview','?model=','?model=a%20b','?model='+'a'*200,'?model=%ff','?model=<script>']:
        time.sleep(0.2)
        w=h.WS('/v1/realtime'+q); st=w.head.split(b'\r\n')[0]
        out=collect(w,0.5); w.close()
        r.append((q[:30], st[9:12], brief(out)[:3]))
    return r
def t_long_instructions():
    # 4096 bytes of instructions that tokenize to more than the LM context (3000 steps)
    w=sess(); a=collect(w,0.3)
    ev(w,{'type':'session.update','session':{'instructions':'a'*5000}})
    b=collect(w,3); w.close()
    return brief(a+b), [len(x[1]['instructions']) for x in sessobj(a+b) if x[0]=='session.updated']
def t_100_invalid():
    w=sess(); a=collect(w,0.3)
    for i in range(105): ev(w,b'nope')
    b=collect(w,2); w.close(); br=brief(b)
    return len(br), br[-4:]
def t_append_flood():
    w=sess(); a=collect(w,0.2)
    ev(w,{'type':'session.update','session':{}})
    r0=h.rss(); chunk=pcm_b64(24000*10) # 10 s per event (480 KB)
    n=0; t0=time.time()
    try:
        while time.time()-t0<4: ev(w,{'type':'input_audio_buffer.append','audio':chunk}); n+=1
    except Exception as e: pass
    b=collect(w,3); w.close()
    return n, h.rss()-r0, [x for x in brief(b) if not (isinstance(x,tuple) and x[0].endswith('delta'))][-4:]
def t_cancel_midresponse():
    w=sess(); a=collect(w,0.2); ev(w,{'type':'session.update','session':{}})
    out=[]
    for i in range(30):
        ev(w,{'type':'input_audio_buffer.append','audio':pcm_b64(1920)})
        if i in (5,6,15): ev(w,{'type':'response.cancel'})
        out+=collect(w,0.08)
    out+=collect(w,1); w.close()
    br=brief(out)
    return [x for x in br if x in ('response.created','response.done') or (isinstance(x,tuple))][:20], [e['response']['status'] for e in out if isinstance(e,dict) and e['type']=='response.done']
def t_beta():
    w=sess(extra='OpenAI-Beta: realtime=v1\r\n'); a=collect(w,0.2); ev(w,{'type':'session.update','session':{'voice':'demo','modalities':['text']}})
    for i in range(10): ev(w,{'type':'input_audio_buffer.append','audio':pcm_b64(1920)}); time.sleep(0.08)
    b=collect(w,1); w.close(); return brief(a+b)[:12]
def t_append_before_created_then_close():
    time.sleep(0.2)
    w=h.WS('/v1/realtime')
    for i in range(50): ev(w,{'type':'input_audio_buffer.append','audio':pcm_b64(4800)})
    w.close(); time.sleep(0.3); return h.alive()[:40]
def t_update_after_start():
    w=sess(); a=collect(w,1.3)   # conversation starts 1 s after connect without update
    ev(w,{'type':'session.update','session':{'instructions':'changed','temperature':0.1}})
    b=collect(w,0.5); w.close(); return [x for x in sessobj(a+b)]
def t_no_audio_idle():
    w=sess(); a=collect(w,12); w.close(); return brief(a)[-3:]
tests={k:v for k,v in globals().items() if k.startswith('t_')}
for n in (sys.argv[1:] or list(tests)):
    try: r=tests[n]()
    except Exception as e: r='EXC '+repr(e)
    print(n, r, flush=True)
print(h.alive()[:40],'rss',h.rss())
