import struct, sys
def wav(name, rate, n, ch=1):
    data=b"\x00\x10"*n*ch
    h=b"RIFF"+struct.pack("<I",36+len(data))+b"WAVEfmt "+struct.pack("<IHHIIHH",16,1,ch,rate,(rate*2*ch)&0xffffffff,2*ch,16)+b"data"+struct.pack("<I",len(data))
    open(name,"wb").write(h+data)
wav(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
