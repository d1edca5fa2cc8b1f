# Category 2: WebSocket framing against /api/chat (and some on /v1/realtime)
import h, time, struct, os, socket, sys
def sess(path='/api/chat'):
    time.sleep(0.15)
    w=h.WS(path)
    assert b'101' in w.head.split(b'\r\n')[0], w.head
    return w
def summarize(msgs):
    out=[]
    for op,p in msgs:
        if op=='END': out.append(p[:40]); break
        if op==8: out.append(('close', struct.unpack('>H',p[:2])[0] if len(p)>=2 else None, p[2:100]))
        elif op==2: out.append((op, p[:1].hex(), p[1:80] if p[:1]==b'\x05' else len(p)))
        elif op==1: out.append(('text', p[:200]))
        else: out.append((op, p[:20]))
    return out
def run(name, fn, path='/api/chat', t=3):
    w=sess(path)
    try:
        fn(w)
        r=summarize(w.drain(timeout=t, maxn=20))
    except Exception as e: r=['EXC',repr(e)]
    w.close()
    # compact: drop handshake/opus header pages
    print(f'{name:28s}', [x for x in r if not (isinstance(x,tuple) and x[0]==2 and x[1] in ('00','01'))])
tests = {
 'unmasked_binary': lambda w: w.send(2, b'\x01hello', mask=False),
 'text_frame': lambda w: w.send(1, b'\x01hello'),
 'text_invalid_utf8': lambda w: w.send(1, b'\xff\xfe'),
 'rsv1_set': lambda w: w.send(2, b'\x01hi', rsv=0x40),
 'opcode_3': lambda w: w.send(3, b'x'),
 'opcode_0xB': lambda w: w.send(0xB, b'x'),
 'cont_without_start': lambda w: w.send(0, b'x'),
 'frag_binary_ok': lambda w: (w.send(2, b'\x7f', fin=False), w.send(0, b'abc', fin=False), w.send(0, b'def')),
 'frag_interleaved_ping': lambda w: (w.send(2, b'\x7f', fin=False), w.send(9, b'pp'), w.send(0, b'def')),
 'frag_new_msg_midway': lambda w: (w.send(2, b'\x7f', fin=False), w.send(2, b'x')),
 'fragmented_ping': lambda w: w.send(9, b'x', fin=False),
 'ping_126_payload': lambda w: w.send(9, b'x'*126),
 'close_code_0': lambda w: w.send(8, struct.pack('>H',0)),
 'close_code_1005': lambda w: w.send(8, struct.pack('>H',1005)),
 'close_code_999': lambda w: w.send(8, struct.pack('>H',999)),
 'close_code_5000': lambda w: w.send(8, struct.pack('>H',5000)),
 'close_1byte': lambda w: w.send(8, b'\x03'),
 'close_bad_utf8_reason': lambda w: w.send(8, struct.pack('>H',1000)+b'\xff'),
 'huge_len_100MB_header': lambda w: w.s.sendall(h.frame(2, b'', fake_len=100*1024*1024)),
 'len_2^63': lambda w: w.s.sendall(bytes([0x82,0xff])+struct.pack('>Q',1<<63)+b'abcd'),
 'len_nonminimal': lambda w: w.s.sendall(bytes([0x82,0xfe])+struct.pack('>H',5)+b'\0\0\0\0'+b'\x01abcd'),
 'msg_1MiB_exact': lambda w: w.send(2, b'\x00'+b'\x00'*(1024*1024-1)),
 'msg_1MiB_plus1': lambda w: w.send(2, b'\x00'*(1024*1024+1)),
 'frag_total_over_1MiB': lambda w: [w.send(2 if i==0 else 0, b'\x00'*(300*1024), fin=(i==3)) for i in range(4)],
}
sel=sys.argv[1:] or list(tests)
for n in sel: run(n, tests[n])
print(h.alive()[:40], 'rss', h.rss())
