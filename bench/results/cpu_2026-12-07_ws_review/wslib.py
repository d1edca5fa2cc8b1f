"""Minimal raw-socket WebSocket client + Ogg/Opus helpers for the hostile-client review."""
import base64, ctypes, ctypes.util, json, os, random, socket, struct, time, urllib.request, re, math

HOST = "127.0.0.1"
PORT = int(os.environ.get("PPX_PORT", "18931"))


def http_get(path, timeout=5):
    try:
        with urllib.request.urlopen(f"http://{HOST}:{PORT}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def health():
    st, body = http_get("/health")
    try:
        return json.loads(body)
    except Exception:
        return {"status_code": st, "body": body}


def metrics():
    st, body = http_get("/metrics")
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        out[k] = float(v)
    return out


def server_pid():
    return int(open("/tmp/ws_review/server.pid").read().strip())


def rss_kb(pid=None):
    pid = pid or server_pid()
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


def threads(pid=None):
    pid = pid or server_pid()
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Threads"):
            return int(line.split()[1])


def wait_idle(timeout=20):
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = health()
        if h.get("sessions_in_use") == 0:
            return time.time() - t0
        time.sleep(0.2)
    return None


class WS:
    def __init__(self, path="/v1/realtime", headers=None, timeout=10, connect=True, extra_raw=None):
        self.path = path
        self.sock = socket.create_connection((HOST, PORT), timeout=timeout)
        self.buf = b""
        self.status = None
        self.resp_head = None
        if connect:
            self.handshake(headers or {}, extra_raw)

    def handshake(self, headers, extra_raw=None):
        key = base64.b64encode(os.urandom(16)).decode()
        h = {"Host": f"{HOST}:{PORT}", "Upgrade": "websocket", "Connection": "Upgrade",
             "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
        h.update(headers)
        req = f"GET {self.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        self.sock.sendall(req.encode("latin1") + (extra_raw or b""))
        while b"\r\n\r\n" not in self.buf:
            d = self.sock.recv(65536)
            if not d:
                break
            self.buf += d
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        self.resp_head = head.decode("latin1")
        m = re.match(r"HTTP/1.1 (\d+)", self.resp_head)
        self.status = int(m.group(1)) if m else None
        if self.status != 101:
            # read the body too
            try:
                self.sock.settimeout(2)
                while True:
                    d = self.sock.recv(65536)
                    if not d:
                        break
                    self.buf += d
            except Exception:
                pass

    # ---------- sending ----------
    @staticmethod
    def frame(opcode, payload=b"", fin=True, mask=True, rsv=0, declared_len=None, mask_key=None):
        b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
        n = len(payload) if declared_len is None else declared_len
        if n < 126:
            hdr = struct.pack("!BB", b0, (0x80 if mask else 0) | n)
        elif n < 65536:
            hdr = struct.pack("!BBH", b0, (0x80 if mask else 0) | 126, n)
        else:
            hdr = struct.pack("!BBQ", b0, (0x80 if mask else 0) | 127, n)
        if mask:
            mk = mask_key if mask_key is not None else os.urandom(4)
            payload = bytes(c ^ mk[i % 4] for i, c in enumerate(payload)) if len(payload) < 4096 else _mask_fast(payload, mk)
            return hdr + mk + payload
        return hdr + payload

    def send_raw(self, data):
        self.sock.sendall(data)

    def send_frame(self, opcode, payload=b"", **kw):
        self.sock.sendall(self.frame(opcode, payload, **kw))

    def send_text(self, s):
        self.send_frame(1, s.encode() if isinstance(s, str) else s)

    def send_json(self, obj):
        self.send_text(json.dumps(obj))

    def send_binary(self, b):
        self.send_frame(2, b)

    def close(self, code=1000, reason=b""):
        try:
            self.send_frame(8, struct.pack("!H", code) + reason)
        except OSError:
            pass

    # ---------- receiving ----------
    def _need(self, n, deadline):
        while len(self.buf) < n:
            self.sock.settimeout(max(0.01, deadline - time.time()))
            d = self.sock.recv(1 << 20)
            if not d:
                raise EOFError("connection closed")
            self.buf += d

    def recv_frame(self, timeout=10):
        """Returns (fin, opcode, payload). Raises EOFError on close, socket.timeout on timeout."""
        deadline = time.time() + timeout
        self._need(2, deadline)
        b0, b1 = self.buf[0], self.buf[1]
        n = b1 & 0x7F
        off = 2
        if n == 126:
            self._need(4, deadline); n = struct.unpack("!H", self.buf[2:4])[0]; off = 4
        elif n == 127:
            self._need(10, deadline); n = struct.unpack("!Q", self.buf[2:10])[0]; off = 10
        if b1 & 0x80:
            off += 4
        self._need(off + n, deadline)
        payload = self.buf[off:off + n]
        self.buf = self.buf[off + n:]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def recv_msg(self, timeout=10, auto_pong=True):
        """Returns (opcode, payload) of a whole message, or ('close', code, reason)."""
        deadline = time.time() + timeout
        parts, op0 = [], None
        while True:
            fin, op, p = self.recv_frame(max(0.01, deadline - time.time()))
            if op == 9:
                if auto_pong:
                    self.send_frame(10, p)
                continue
            if op == 10:
                continue
            if op == 8:
                code = struct.unpack("!H", p[:2])[0] if len(p) >= 2 else None
                return ("close", code, p[2:])
            if op != 0:
                op0 = op
            parts.append(p)
            if fin:
                return (op0, b"".join(parts))

    def recv_events(self, timeout=5, until=None, max_n=100000):
        """Collects realtime JSON events until timeout/close/`until(ev)`."""
        evs = []
        deadline = time.time() + timeout
        while time.time() < deadline and len(evs) < max_n:
            try:
                m = self.recv_msg(max(0.01, deadline - time.time()))
            except (socket.timeout, TimeoutError):
                break
            except (EOFError, ConnectionResetError, BrokenPipeError, OSError) as e:
                evs.append({"type": "__eof__", "err": repr(e)})
                break
            if m[0] == "close":
                evs.append({"type": "__close__", "code": m[1], "reason": m[2].decode(errors="replace")})
                break
            try:
                ev = json.loads(m[1])
            except Exception:
                ev = {"type": "__raw__", "op": m[0], "data": m[1][:200]}
            evs.append(ev)
            if until and until(ev):
                break
        return evs

    def shut(self):
        try:
            self.sock.close()
        except Exception:
            pass

    def reset(self):
        """Abrupt TCP RST."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def _mask_fast(payload, mk):
    n = len(payload)
    m = (mk * (n // 4 + 1))[:n]
    a = int.from_bytes(payload, "little") ^ int.from_bytes(m, "little")
    return a.to_bytes(n, "little")


def summarize(evs):
    from collections import Counter
    c = Counter(e.get("type") for e in evs)
    return dict(c)


def errors(evs):
    return [(e.get("error", {}).get("code"), e.get("error", {}).get("message")) for e in evs if e.get("type") == "error"] + \
           [("CLOSE", e.get("code"), e.get("reason")) for e in evs if e.get("type") == "__close__"] + \
           [("EOF", e.get("err")) for e in evs if e.get("type") == "__eof__"]


def pcm_b64(seconds, freq=220.0, amp=0.2, rate=24000):
    n = int(seconds * rate)
    data = b"".join(struct.pack("<h", int(amp * 32767 * math.sin(2 * math.pi * freq * i / rate))) for i in range(n))
    return base64.b64encode(data).decode()


# ---------------- Ogg / Opus ----------------
_crc_table = []
for i in range(256):
    r = i << 24
    for _ in range(8):
        r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
    _crc_table.append(r & 0xFFFFFFFF)


def ogg_crc(data):
    crc = 0
    for b in data:
        crc = ((crc << 8) ^ _crc_table[((crc >> 24) & 0xFF) ^ b]) & 0xFFFFFFFF
    return crc


def ogg_page(packets, serial=0x1234, seq=0, granule=0, htype=0, bad_crc=False, segtable=None):
    segs = []
    for p in packets:
        n = len(p)
        while n >= 255:
            segs.append(255); n -= 255
        segs.append(n)
    if segtable is not None:
        segs = segtable
    body = b"".join(packets)
    hdr = b"OggS" + struct.pack("<BBqIIIB", 0, htype, granule, serial, seq, 0, len(segs)) + bytes(segs)
    page = bytearray(hdr + body)
    crc = ogg_crc(page)
    if bad_crc:
        crc ^= 0xDEADBEEF
    struct.pack_into("<I", page, 22, crc)
    return bytes(page)


def opus_head():
    return b"OpusHead" + struct.pack("<BBHIhB", 1, 1, 312, 24000, 0, 0)


def opus_tags():
    return b"OpusTags" + struct.pack("<I", 4) + b"test" + struct.pack("<I", 0)


class OpusEnc:
    def __init__(self, rate=24000):
        self.lib = ctypes.CDLL(ctypes.util.find_library("opus"))
        err = ctypes.c_int()
        self.lib.opus_encoder_create.restype = ctypes.c_void_p
        self.enc = self.lib.opus_encoder_create(rate, 1, 2048, ctypes.byref(err))
        assert err.value == 0
        self.rate = rate

    def encode(self, pcm_i16):  # 20 ms at 24 kHz: 480 samples
        n = len(pcm_i16)
        arr = (ctypes.c_int16 * n)(*pcm_i16)
        out = ctypes.create_string_buffer(4000)
        r = self.lib.opus_encode(ctypes.c_void_p(self.enc), arr, n, out, 4000)
        assert r > 0, r
        return out.raw[:r]


class OggStream:
    """Produces an Ogg Opus stream, 4 x 20 ms packets per page (80 ms)."""
    def __init__(self, serial=0x5151):
        self.enc = OpusEnc()
        self.serial = serial
        self.seq = 0
        self.granule = 0
        self.t = 0

    def headers(self):
        a = ogg_page([opus_head()], self.serial, 0, 0, htype=2)
        b = ogg_page([opus_tags()], self.serial, 1, 0)
        self.seq = 2
        return [a, b]

    def page(self, freq=220.0, amp=0.2):
        pk = []
        for _ in range(4):
            s = [int(amp * 32767 * math.sin(2 * math.pi * freq * (self.t + i) / 24000)) for i in range(480)]
            self.t += 480
            pk.append(self.enc.encode(s))
        self.granule += 4 * 960
        p = ogg_page(pk, self.serial, self.seq, self.granule)
        self.seq += 1
        return p
