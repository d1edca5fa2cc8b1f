# Minimal Ogg Opus writer using libopus through ctypes.
import ctypes, struct, math, wave, random
lib=ctypes.CDLL('libopus.so.0')
lib.opus_encoder_create.restype=ctypes.c_void_p
lib.opus_encoder_create.argtypes=[ctypes.c_int,ctypes.c_int,ctypes.c_int,ctypes.POINTER(ctypes.c_int)]
lib.opus_encode.argtypes=[ctypes.c_void_p,ctypes.POINTER(ctypes.c_int16),ctypes.c_int,ctypes.c_char_p,ctypes.c_int32]
def crc_table():
    t=[]
    for i in range(256):
        r=i<<24
        for _ in range(8): r=((r<<1)^0x04c11db7) if r&0x80000000 else (r<<1)
        t.append(r&0xffffffff)
    return t
T=crc_table()
def crc(b):
    c=0
    for x in b: c=((c<<8)&0xffffffff)^T[((c>>24)&0xff)^x]
    return c
def page(packets, serial, seq, granule, htype=0):
    segs=b''
    for p in packets:
        n=len(p)
        segs+=bytes([255]*(n//255)+[n%255])
    hdr=b'OggS'+bytes([0,htype])+struct.pack('<qIII',granule,serial,seq,0)+bytes([len(segs)])+segs
    body=b''.join(packets)
    c=crc(hdr+body)
    return hdr[:22]+struct.pack('<I',c)+hdr[26:]+body
def opus_head(rate=24000, ch=1, preskip=312):
    return b'OpusHead'+bytes([1,ch])+struct.pack('<HIhB',preskip,rate,0,0)
def opus_tags(): return b'OpusTags'+struct.pack('<I',4)+b'test'+struct.pack('<I',0)
class Enc:
    def __init__(self, rate=24000, ch=1):
        err=ctypes.c_int(); self.e=lib.opus_encoder_create(rate,ch,2048,ctypes.byref(err)); assert err.value==0
        self.rate=rate; self.ch=ch
    def encode(self, pcm):  # list of ints, 20ms
        n=len(pcm)//self.ch
        arr=(ctypes.c_int16*len(pcm))(*pcm); out=ctypes.create_string_buffer(4000)
        r=lib.opus_encode(self.e,arr,n,out,4000); assert r>0,r
        return out.raw[:r]
def speech_24k():
    w=wave.open('/work/main/tests/data/speech_16k.wav'); fr=w.getframerate(); d=w.readframes(w.getnframes())
    s=struct.unpack('<%dh'%(len(d)//2),d)
    return [s[int(i*fr/24000)] for i in range(int(len(s)*24000/fr))]
class Stream:
    """Yields Ogg pages: head, tags, then pages of 4 x 20 ms packets (80 ms) at 24 kHz mono."""
    def __init__(self, rate=24000, ch=1, head_rate=None, serial=0x1234):
        self.enc=Enc(rate,ch); self.serial=serial; self.seq=0; self.gran=0; self.rate=rate; self.ch=ch
        self.head_rate=head_rate or rate
        self.src=speech_24k() if rate==24000 and ch==1 else None
        self.pos=0
    def headers(self):
        a=page([opus_head(self.head_rate,self.ch)],self.serial,0,0,htype=2); b=page([opus_tags()],self.serial,1,0)
        self.seq=2; return [a,b]
    def next_page(self, npk=4):
        pk=[]
        fs=self.rate//50
        for _ in range(npk):
            if self.src:
                pcm=[self.src[(self.pos+i)%len(self.src)] for i in range(fs)]; self.pos+=fs
            else:
                pcm=[int(8000*math.sin(2*math.pi*440*(self.pos+i)/self.rate)) for i in range(fs) for _ in range(self.ch)]; self.pos+=fs
            pk.append(self.enc.encode(pcm)); self.gran+=960
        p=page(pk,self.serial,self.seq,self.gran); self.seq+=1; return p
