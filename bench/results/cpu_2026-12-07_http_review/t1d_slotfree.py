# How long does the (single) session slot stay taken after the client closes its TCP socket
# (a) abruptly (close without WS close), (b) after a proper WS close frame, (c) RST?
import h, time, socket, struct
def wait_free():
    t0=time.time()
    while time.time()-t0<30:
        out,_=h.raw('GET /health/ready HTTP/1.1\r\nHost: x\r\n\r\n')
        if b' 200 ' in h.status(out): return time.time()-t0
        time.sleep(0.01)
    return None
for mode in ['tcp_close','ws_close','rst','tcp_close_during_prompts']:
    w=h.WS('/api/chat')
    if mode!='tcp_close_during_prompts':
        ops=[w.recv()[0] for _ in range(3)]
    if mode=='ws_close':
        w.send(8, struct.pack('>H',1000)); time.sleep(0.0)
    if mode=='rst':
        w.s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii',1,0))
    w.close()
    print(mode, 'slot free after', wait_free())
