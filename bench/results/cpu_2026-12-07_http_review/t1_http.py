# Category 1: malformed HTTP
import h, time
cases = {
 'garbage': b'\x00\x01\x02garbage\r\n\r\n',
 'no_crlf_garbage': b'HELLO WORLD',
 'bad_method': 'FOO /health HTTP/1.1\r\nHost: x\r\n\r\n',
 'post_health': 'POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello',
 'no_host': 'GET /health HTTP/1.1\r\n\r\n',
 'http10': 'GET /health HTTP/1.0\r\n\r\n',
 'http09': 'GET /health\r\n\r\n',
 'http2_preface': b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n',
 'http_3_0': 'GET /health HTTP/3.0\r\nHost: x\r\n\r\n',
 'lf_only': 'GET /health HTTP/1.1\nHost: x\n\n',
 'space_in_path': 'GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n',
 'abs_uri': 'GET http://evil/health HTTP/1.1\r\nHost: x\r\n\r\n',
 'star': 'OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n',
 'pipelined': 'GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n',
 'chunked_get': 'GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n',
 'bad_chunked': 'GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n',
 'huge_cl': 'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n',
 'neg_cl': 'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n',
 'dup_cl': 'GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab',
 'cl_and_te': 'POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n',
 'header_no_colon': 'GET /health HTTP/1.1\r\nHost: x\r\nBogusHeader\r\n\r\n',
 'nul_in_header': 'GET /health HTTP/1.1\r\nHost: x\x00y\r\n\r\n',
 'huge_header_100k': 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ' + 'a'*100000 + '\r\n\r\n',
 'huge_header_300k': 'GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ' + 'a'*300000 + '\r\n\r\n',
 'many_headers_5000': 'GET /health HTTP/1.1\r\nHost: x\r\n' + ''.join(f'X-{i}: v\r\n' for i in range(5000)) + '\r\n',
 'long_url_200k': 'GET /health?' + 'a'*200000 + ' HTTP/1.1\r\nHost: x\r\n\r\n',
 'long_url_300k': 'GET /' + 'a'*300000 + ' HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav1': 'GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav2': 'GET /%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav3': 'GET /..%2f..%2fetc%2fpasswd HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav4': 'GET //etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav5': 'GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n',
 'trav6': 'GET /index.html%00.js HTTP/1.1\r\nHost: x\r\n\r\n',
 'voices': 'GET /api/voices HTTP/1.1\r\nHost: x\r\n\r\n',
 'voices_trav': 'GET /api/voices/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n',
 'index': 'GET / HTTP/1.1\r\nHost: x\r\n\r\n',
 'index_q': 'GET /?%zz HTTP/1.1\r\nHost: x\r\n\r\n',
 'head_health': 'HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n',
 'health_ready': 'GET /health/ready HTTP/1.1\r\nHost: x\r\n\r\n',
 'health_slash': 'GET /health/ HTTP/1.1\r\nHost: x\r\n\r\n',
 'api_chat_plain': 'GET /api/chat HTTP/1.1\r\nHost: x\r\n\r\n',
 'realtime_plain': 'GET /v1/realtime HTTP/1.1\r\nHost: x\r\n\r\n',
 'ws_no_key': 'GET /api/chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n',
 'ws_ver8': h.upgrade_req('/api/chat').replace('Version: 13','Version: 8'),
 'ws_ver_abc': h.upgrade_req('/api/chat').replace('Version: 13','Version: abc'),
 'ws_bad_upgrade': h.upgrade_req('/api/chat').replace('Upgrade: websocket','Upgrade: h2c'),
 'ws_no_conn': h.upgrade_req('/api/chat').replace('Connection: Upgrade\r\n',''),
 'ws_bad_key': h.upgrade_req('/api/chat', key='short'),
 'ws_empty_key': h.upgrade_req('/api/chat', key=''),
 'ws_post': h.upgrade_req('/api/chat').replace('GET','POST',1),
 'ws_http10': h.upgrade_req('/api/chat').replace('HTTP/1.1','HTTP/1.0',1),
 'ws_unknown_path': h.upgrade_req('/api/chatx'),
 'ws_health': h.upgrade_req('/health'),
}
import sys
sel = sys.argv[1:] or list(cases)
for name in sel:
    try:
        out, dt = h.raw(cases[name], timeout=20)
        body = out.split(b'\r\n\r\n',1)
        print(f'{name:20s} {dt:5.2f}s {h.status(out)[:80]!r} len={len(out)} body={body[1][:150]!r}' if len(body)>1 else f'{name:20s} {dt:5.2f}s {out[:200]!r}')
    except Exception as e:
        print(f'{name:20s} EXC {e!r}')
print('ALIVE', h.alive()[:60], 'RSS', h.rss())
