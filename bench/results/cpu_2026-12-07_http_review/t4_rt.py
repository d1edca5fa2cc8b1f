# Category 4: /v1/realtime with malformed and odd client events.
import h, json, time, base64, struct, sys, socket, os
def sess(extra='', q=''):
    time.sleep(0.2)
    w=h.WS('/v1/realtime'+q, extra=extra); assert b'101' in w.head.split(b'\r\n')[0], w.head
    return w
def ev(w, obj):
    w.send(1, obj if isinstance(obj,(bytes,bytearray)) else json.dumps(obj).encode())
def collect(w, dur, want=None):
    t0=time.time(); out=[]
    while time.time()-t0<dur:
        try: op,p=w.recv(0.05)
        except socket.timeout: continue
        except EOFError: out.append('EOF'); break
        if op==1:
            j=json.loads(p); out.append(j)
        elif op==8: out.append(('close', struct.unpack('>H',p[:2])[0] if len(p)>1 else None)); 
        elif op==9: w.send(10,p)
        else: out.append(('op',op))
    return out
def brief(evs):
    r=[]
    for e in evs:
        if isinstance(e,dict):
            t=e['type']
            if t=='error': r.append(('error',e['error'].get('code'),e['error'].get('param'),(e['error'].get('message') or '')[:90],e['error'].get('event_id')))
            elif t.endswith('.delta'): 
                if r and r[-1][0]==t: r[-1]=(t,r[-1][1]+1)
                else: r.append((t,1))
            else: r.append(t)
        else: r.append(e)
    return r
def pcm_b64(samples=480, val=1000): return base64.b64encode(struct.pack('<%dh'%samples,*([val,-val]*(samples//2)))).decode()
cases = {
 'not_json': [b'{not json'],
 'json_array': [b'[1,2,3]'],
 'json_string': [b'"hello"'],
 'json_null': [b'null'],
 'empty_msg': [b''],
 'nested_100': [b'['*100+b']'*100],
 'nested_65_obj': [('{"a":'*65+'1'+'}'*65).encode()],
 'neg_depth_trick': [b']'*200+b'['*250],
 'no_type': [{'event_id':'e1'}],
 'type_number': [{'type':5,'event_id':'e2'}],
 'type_null': [{'type':None}],
 'unknown_type': [{'type':'foo.bar','event_id':'x'*300}],
 'huge_unknown_type': [{'type':'x'*100000}],
 'event_id_nonstring': [{'type':'nope','event_id':{'a':1}}],
 'dup_keys': [b'{"type":"input_audio_buffer.clear","type":"bogus"}'],
 'bom_prefixed': [b'\xef\xbb\xbf{"type":"input_audio_buffer.clear"}'],
 'nul_in_json': [b'{"type":"input_audio_buffer.clear\\u0000x"}'],
 'lone_surrogate': [b'{"type":"a\\ud800b"}'],
 'append_no_audio': [{'type':'input_audio_buffer.append'}],
 'append_audio_number': [{'type':'input_audio_buffer.append','audio':123}],
 'append_bad_b64': [{'type':'input_audio_buffer.append','audio':'!!!!'}],
 'append_b64_nopad': [{'type':'input_audio_buffer.append','audio':'AAAA'[:3]}],
 'append_b64_urlsafe': [{'type':'input_audio_buffer.append','audio':base64.urlsafe_b64encode(b'\xff\xfe'*3).decode()}],
 'append_b64_whitespace': [{'type':'input_audio_buffer.append','audio':'AA AA\nAAAA'}],
 'append_odd': [{'type':'input_audio_buffer.append','audio':base64.b64encode(b'abc').decode()}],
 'append_empty': [{'type':'input_audio_buffer.append','audio':''}],
 'append_1MiB_event': [{'type':'input_audio_buffer.append','audio':base64.b64encode(b'\x00'*(780*1024)).decode()}],
 'append_2MiB_event': [{'type':'input_audio_buffer.append','audio':base64.b64encode(b'\x00'*(1536*1024)).decode()}],
 'msg_over_4MiB': [b'{"type":"x","pad":"'+b'a'*(4*1024*1024)+b'"}'],
 'session_update_wrong_types': [{'type':'session.update','session':{'instructions':123,'temperature':'0.5','voice':None,'audio':{'output':{'voice':7}},'turn_detection':'yes','tools':'nope'}}],
 'session_update_null': [{'type':'session.update','session':None}],
 'session_update_array': [{'type':'session.update','session':[1,2]}],
 'session_update_temp_edge': [{'type':'session.update','session':{'temperature':1e309}}],
 'session_update_voice_traversal': [{'type':'session.update','session':{'audio':{'output':{'voice':'../voices/demo'}}}}],
 'session_update_voice_demo': [{'type':'session.update','session':{'audio':{'output':{'voice':'demo'}}}}],
 'session_update_bad_format': [{'type':'session.update','session':{'audio':{'input':{'format':{'type':'audio/pcmu','rate':8000}}}}}],
 'item_create_strange': [{'type':'conversation.item.create','item':{'type':'message','role':'user','content':[{'type':'input_text','text':'\x00'*10}]}},{'type':'conversation.item.create','item':'str'},{'type':'conversation.item.create'}],
 'truncate_variants': [{'type':'conversation.item.truncate','item_id':'i'*1000,'content_index':-1,'audio_end_ms':1e30},{'type':'conversation.item.truncate','item_id':5},{'type':'conversation.item.delete','item_id':''},{'type':'conversation.item.retrieve','item_id':'x'}],
 'commit_clear_cancel_create_order': [{'type':'response.cancel'},{'type':'response.cancel'},{'type':'response.create'},{'type':'input_audio_buffer.commit'},{'type':'input_audio_buffer.clear'},{'type':'output_audio_buffer.clear'},{'type':'response.create','response':{'instructions':'x'}}],
}
if __name__!="__main__": cases={}
sel=(sys.argv[1:] or list(cases)) if __name__=="__main__" else []
for n in sel:
    w=sess(); first=collect(w,0.3)
    try:
        for e in cases[n]: ev(w,e)
        out=collect(w,1.5)
    except Exception as e: out=['EXC '+repr(e)]
    w.close()
    b=brief(out)
    print(f'{n:32s}', b[:8], f'... ({len(b)} items)' if len(b)>8 else '', flush=True)
if __name__=="__main__": print(h.alive()[:40],"rss",h.rss())
