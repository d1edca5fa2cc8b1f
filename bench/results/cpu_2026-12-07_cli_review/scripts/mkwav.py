import struct, wave, math, os, random
def hdr(fmt=1, ch=1, sr=24000, bits=16, datalen=None, nsamples=2400, extra=b'', riff_len=None, data=None, block_align=None, byterate=None):
    if data is None:
        bps = max(bits//8,1)
        data = bytes(nsamples*ch*bps)
        if bits==16:
            data = b''.join(struct.pack('<h', int(8000*math.sin(i*0.05))) for i in range(nsamples*ch))
    if datalen is None: datalen=len(data)
    ba = block_align if block_align is not None else ch*bits//8
    br = byterate if byterate is not None else sr*ba
    fmtc = struct.pack('<HHIIHH', fmt, ch, sr, br, ba, bits)+extra
    body = b'WAVE' + b'fmt ' + struct.pack('<I', len(fmtc)) + fmtc + b'data' + struct.pack('<I', datalen) + data
    rl = riff_len if riff_len is not None else len(body)
    return b'RIFF'+struct.pack('<I', rl & 0xffffffff)+body
def w(name, b): open(name,'wb').write(b)
w('ch0.wav', hdr(ch=0, block_align=0))
w('sr0.wav', hdr(sr=0))
w('sr1.wav', hdr(sr=1, nsamples=10))
w('sr768001.wav', hdr(sr=768001))
w('sr_max.wav', hdr(sr=0xffffffff, byterate=0xfffffffe))
w('ch8.wav', hdr(ch=8))
w('ch65535.wav', hdr(ch=65535, nsamples=2, block_align=0xfffe))
w('f32.wav', hdr(fmt=3, bits=32, data=struct.pack('<'+'f'*2400, *[0.3*math.sin(i*0.05) for i in range(2400)])))
w('f32_nan.wav', hdr(fmt=3, bits=32, data=struct.pack('<'+'f'*24000, *([float('nan')]*24000))))
w('f32_inf.wav', hdr(fmt=3, bits=32, data=struct.pack('<'+'f'*24000, *([float('inf'), -float('inf')]*12000))))
w('f32_huge.wav', hdr(fmt=3, bits=32, data=struct.pack('<'+'f'*24000, *([1e30, -1e30]*12000))))
w('f64.wav', hdr(fmt=3, bits=64, data=struct.pack('<'+'d'*2400, *[0.3*math.sin(i*0.05) for i in range(2400)])))
w('u8.wav', hdr(bits=8, data=bytes((128+int(100*math.sin(i*0.05)))&255 for i in range(2400))))
w('s24.wav', hdr(bits=24, data=bytes(2400*3)))
w('s32.wav', hdr(bits=32, data=bytes(2400*4)))
w('bits0.wav', hdr(bits=0, data=bytes(100)))
w('bits13.wav', hdr(bits=13, data=bytes(2400*2)))
w('alaw.wav', hdr(fmt=6, bits=8, data=bytes(2400)))
w('fmt_unknown.wav', hdr(fmt=0x1234, data=bytes(4800)))
w('huge_len.wav', hdr(datalen=0xffffffff))
w('huge_riff.wav', hdr(riff_len=0xffffffff))
w('zero_data.wav', hdr(data=b''))
w('odd_data.wav', hdr(data=b'\x01\x02\x03'))
w('one_sample.wav', hdr(data=b'\x01\x02'))
good = hdr(nsamples=24000)
w('trunc_hdr.wav', good[:30])
w('trunc_12.wav', good[:12])
w('trunc_data.wav', good[:44+1000])
w('garbage.wav', os.urandom(5000))
w('text.wav', b'hello world this is not a wav\n'*100)
w('empty.wav', b'')
w('riff_only.wav', b'RIFF')
# fmt chunk size huge
b = bytearray(hdr()); struct.pack_into('<I', b, 16, 0xfffffff0); w('fmt_huge.wav', bytes(b))
# junk chunk with huge size before data
fmtc = struct.pack('<HHIIHH', 1,1,24000,48000,2,16)
body = b'WAVE'+b'fmt '+struct.pack('<I',16)+fmtc+b'JUNK'+struct.pack('<I',0xfffffff0)+b'xx'
w('junk_huge.wav', b'RIFF'+struct.pack('<I',len(body))+body)
# no data chunk
body = b'WAVE'+b'fmt '+struct.pack('<I',16)+fmtc
w('no_data.wav', b'RIFF'+struct.pack('<I',len(body))+body)
# no fmt chunk
body = b'WAVE'+b'data'+struct.pack('<I',4800)+bytes(4800)
w('no_fmt.wav', b'RIFF'+struct.pack('<I',len(body))+body)
# RF64
w('rf64.wav', b'RF64'+hdr()[4:])
# silence 1s
w('silence_1s.wav', hdr(data=bytes(48000)))
# 10-minute 24k mono 16-bit
random.seed(1)
import array
n=24000*600
a=array.array('h',(int(6000*math.sin(i*0.031)) for i in range(24000)))
data=a.tobytes()*600
w('long_10min.wav', hdr(data=data))
# 0.01 s
w('short_10ms.wav', hdr(nsamples=240))
# extensible format with float subformat
ext = struct.pack('<HHI', 22, 16, 3) + b'\x03\x00\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71'
w('extensible_f32_bits16.wav', hdr(fmt=0xFFFE, extra=ext))
