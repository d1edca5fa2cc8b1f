# After the close handshake (client-initiated), does the server send FIN (RFC 6455 7.1.1: server closes TCP first)?
import time, socket
from wslib import *
for path in ["/v1/realtime", "/api/chat"]:
    w = WS(path)
    time.sleep(0.6)
    try: w.recv_events(0.3)
    except Exception: pass
    t0=time.time(); w.close()
    # read frames until close frame, then wait for EOF
    got_close=None
    try:
        while True:
            fin,op,p = w.recv_frame(10)
            if op==8: got_close=time.time()-t0; break
    except Exception as e: print("err",e)
    try:
        w.sock.settimeout(10); d=w.sock.recv(100)
        print(path, "close frame after", round(got_close,3), "then recv ->", d, "after", round(time.time()-t0,3))
    except Exception as e: print(path, "close frame after", got_close, "then", e, round(time.time()-t0,3))
    w.shut(); wait_idle()
