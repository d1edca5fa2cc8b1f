# Upgrade header variants real browsers/proxies send (server3 is TLS).
import socket, ssl, h, time
ctx=ssl.create_default_context(); ctx.check_hostname=False; ctx.verify_mode=ssl.CERT_NONE
def st(req):
    s=ctx.wrap_socket(socket.create_connection((h.HOST,h.PORT),timeout=5), server_hostname='x'); s.sendall(req.encode())
    r=s.recv(4096); s.close(); time.sleep(0.3); return r.split(b'\r\n')[0]
base=h.upgrade_req('/api/chat')
for name,req in [('firefox conn',base.replace('Connection: Upgrade','Connection: keep-alive, Upgrade')),
                 ('Upgrade: WebSocket',base.replace('Upgrade: websocket','Upgrade: WebSocket')),
                 ('lowercase headers',base.replace('Upgrade:','upgrade:').replace('Connection:','connection:').replace('Sec-WebSocket','sec-websocket')),
                 ('permessage-deflate offered',base.replace('\r\n\r\n','\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n')),
                 ('subprotocol',base.replace('\r\n\r\n','\r\nSec-WebSocket-Protocol: chat, superchat\r\n\r\n')),
                 ('version list 13,8',base.replace('Version: 13','Version: 13, 8')),
                 ('beta v10',h.upgrade_req('/v1/realtime','OpenAI-Beta: realtime=v10\r\n'))]:
    print(f'{name:28s}', st(req))
