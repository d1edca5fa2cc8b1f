# Category 3: /api/chat protocol with real Ogg Opus audio.
import h, oggopus as o, time, struct, sys, os, socket
def sess(q=''):
    time.sleep(0.2)
    w=h.WS('/api/chat'+q+('&' if '?' in q else '?')+'api_key=s3cr3t'); assert b'101' in w.head.split(b'\r\n')[0], w.head
    return w
def wait_handshake(w):
    while True:
        op,p=w.recv(10)
        if op==2 and p[:1]==b'\x00': return
def count(w, dur, send=None):
    """Collect messages for dur s, sending via send(t) callback. Returns counts."""
    t0=time.time(); c={'audio':0,'text':0,'err':[],'close':None,'other':0}
    nxt=0
    while time.time()-t0<dur:
        if send and time.time()>=nxt: nxt=time.time()+send()
        try: op,p=w.recv(0.02)
        except socket.timeout: continue
        except EOFError: c['eof']=round(time.time()-t0,2); break
        if op==2 and p[:1]==b'\x01': c['audio']+=1
        elif op==2 and p[:1]==b'\x02': c['text']+=1
        elif op==2 and p[:1]==b'\x05': c['err'].append(p[1:200])
        elif op==8: c['close']=(struct.unpack('>H',p[:2])[0] if len(p)>1 else None); 
        else: c['other']+=1
    return c
def realtime_ok():
    w=sess(); wait_handshake(w); s=o.Stream()
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def garbage():
    w=sess(); wait_handshake(w)
    def snd(): w.send(2,b'\x01'+os.urandom(4000)); return 0.01
    c=count(w,6,snd); w.close(); return c
def oggs_fake():
    w=sess(); wait_handshake(w)
    def snd(): w.send(2,b'\x01'+b'OggS\x00\xff\xff'*1000); return 0.005
    c=count(w,5,snd); w.close(); return c
def wrong_rate_48k_stereo():
    w=sess(); wait_handshake(w); s=o.Stream(rate=48000,ch=2)
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def head_says_8k():
    w=sess(); wait_handshake(w); s=o.Stream(head_rate=8000)
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def head_channels_255():
    w=sess(); wait_handshake(w); s=o.Stream()
    hp=o.page([b'OpusHead'+bytes([1,255])+struct.pack('<HIhB',312,24000,0,1)+bytes([255,0])+bytes(range(255))],0x1234,0,0,2)
    w.send(2,b'\x01'+hp); s.seq=1
    def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def no_headers():
    w=sess(); wait_handshake(w); s=o.Stream(); s.seq=2
    def snd(): w.send(2,b'\x01'+s.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def two_streams_interleaved():
    w=sess(); wait_handshake(w); a=o.Stream(serial=1); b=o.Stream(serial=2)
    for hp in a.headers()+b.headers(): w.send(2,b'\x01'+hp)
    def snd(): w.send(2,b'\x01'+a.next_page()+b.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def byte_by_byte():
    w=sess(); wait_handshake(w); s=o.Stream(); data=b''.join(s.headers()+[s.next_page() for _ in range(25)])
    for i in range(len(data)): w.send(2,b'\x01'+data[i:i+1])
    c=count(w,3); w.close(); return c
def unknown_kinds_empty():
    w=sess(); wait_handshake(w)
    m0=h.metrics()['personaplex_ignored_messages_total']
    for k in [0,2,3,4,5,6,7,0xff]: w.send(2,bytes([k])+b'xyz')
    w.send(2,b''); w.send(2,b'\x01')
    c=count(w,1); w.close(); c['ignored_delta']=h.metrics()['personaplex_ignored_messages_total']-m0; return c
def never_sends_audio_but_pongs():
    # answers pings (raw WS client must do it): does it get 0x05 idle timeout at 10 s?
    w=sess(); wait_handshake(w); t0=time.time(); c={'err':[],'pings':0}
    while time.time()-t0<14:
        try: op,p=w.recv(0.5)
        except socket.timeout: continue
        except EOFError: c['eof']=round(time.time()-t0,2); break
        if op==9: c['pings']+=1; w.send(10,p)
        elif op==2 and p[:1]==b'\x05': c['err'].append((round(time.time()-t0,2),p[1:120]))
        elif op==8: c['close']=p[:2].hex()
    w.close(); return c
def never_sends_audio_no_pong():
    w=sess(); wait_handshake(w); c=count(w,14); w.close(); return c
def fast_flood():
    w=sess(); wait_handshake(w); s=o.Stream()
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    r0=h.rss(); sent=[0]
    def snd():
        for _ in range(50): w.send(2,b'\x01'+s.next_page()); sent[0]+=1
        return 0.0
    try: c=count(w,8,snd)
    except Exception as e: c={'exc':repr(e)}
    c['pages_sent']=sent[0]; c['rss_delta_kb']=h.rss()-r0; w.close(); return c
def audio_before_handshake_then_close():
    w=sess(); s=o.Stream()
    for hp in s.headers(): w.send(2,b'\x01'+hp)
    for _ in range(200): w.send(2,b'\x01'+s.next_page())
    c=count(w,2); w.close(); return c
def send_after_close():
    w=sess(); wait_handshake(w); s=o.Stream()
    w.send(8, struct.pack('>H',1000))
    try:
        for hp in s.headers(): w.send(2,b'\x01'+hp)
        for _ in range(20): w.send(2,b'\x01'+s.next_page())
    except Exception as e: return repr(e)
    c=count(w,2); w.close(); return c
tests={k:v for k,v in globals().items() if callable(v) and k not in ('sess','wait_handshake','count') and not k.startswith('_') and v.__module__=='__main__'}
sel=(sys.argv[1:] or list(tests)) if __name__=="__main__" else []
for n in sel:
    try: r=tests[n]()
    except Exception as e: r='EXC '+repr(e)
    print(f'{n:30s} {r}', flush=True)
if __name__=="__main__": print(h.alive()[:40], "rss", h.rss())
def _chained():
    # stream 1 ends (EOS), stream 2 (new serial, stereo 48 kHz) begins: chained Ogg
    w=sess(); wait_handshake(w); a=o.Stream(serial=1)
    for hp in a.headers(): w.send(2,b'\x01'+hp)
    for _ in range(10): w.send(2,b'\x01'+a.next_page()); time.sleep(0.08)
    last=a.next_page(); last=bytearray(last); last[5]|=4
    import struct as st; last[22:26]=b'\0\0\0\0'; last[22:26]=st.pack('<I',o.crc(bytes(last)))
    w.send(2,b'\x01'+bytes(last))
    b=o.Stream(rate=48000,ch=2,serial=2)
    for hp in b.headers(): w.send(2,b'\x01'+hp)
    def snd(): w.send(2,b'\x01'+b.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def _huge_packet_and_lacing():
    w=sess(); wait_handshake(w); a=o.Stream()
    for hp in a.headers(): w.send(2,b'\x01'+hp)
    # one page: a 70 KB "packet" spanning continued pages, then normal audio
    big=b'\xfc'+b'\x00'*70000
    seg=[]; rest=big; seq=2; pages=[]
    while rest:
        chunk=rest[:255*255]; rest=rest[255*255:]
        lac=[255]*(len(chunk)//255)+([len(chunk)%255] if (len(chunk)%255 or not rest) else [])
        lac=lac[:255]
        hdr=b'OggS'+bytes([0,1 if pages else 0])+struct.pack('<qIII',-1 if rest else 0,0x1234,seq,0)+bytes([len(lac)])+bytes(lac)
        p=bytearray(hdr+chunk); p[22:26]=struct.pack('<I',o.crc(bytes(p))); pages.append(bytes(p)); seq+=1
    for p in pages: w.send(2,b'\x01'+p)
    a.seq=seq
    def snd(): w.send(2,b'\x01'+a.next_page()); return 0.08
    c=count(w,3,snd); w.close(); return c
def _tiny_msgs_flood():
    w=sess(); wait_handshake(w); a=o.Stream(); data=b''.join(a.headers()+[a.next_page() for _ in range(2000)])
    t0=time.time(); i=0
    try:
        while i<len(data) and time.time()-t0<5: w.send(2,b'\x01'+data[i:i+2]); i+=2
    except Exception as e: pass
    c=count(w,3); c['bytes_sent']=i; c['secs']=round(time.time()-t0,1); w.close(); return c
if __name__=="__main__":
    for n in [x for x in sys.argv[1:] if x.startswith('_')]: print(n, globals()[n]())
