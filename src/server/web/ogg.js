// Ogg framing (RFC 3533) of an Opus stream (RFC 7845): a muxer for the microphone stream the page
// sends, and a demuxer for the stream the server sends back. Pages carry a CRC over the whole page;
// the demuxer checks it and resynchronizes on the next capture pattern after damage.

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
    t[i] = r >>> 0;
  }
  return t;
})();

export function oggCrc(bytes) {
  let c = 0;
  for (let i = 0; i < bytes.length; i++) c = ((c << 8) ^ CRC_TABLE[((c >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  return c;
}

const ascii = (s) => Uint8Array.from(s, (ch) => ch.charCodeAt(0));

// Identification header. Pre-skip is in 48 kHz samples; inputRate is informational.
export function opusHead(channels, preSkip, inputRate) {
  const b = new Uint8Array(19);
  const dv = new DataView(b.buffer);
  b.set(ascii('OpusHead'), 0);
  b[8] = 1;  // version
  b[9] = channels;
  dv.setUint16(10, preSkip, true);
  dv.setUint32(12, inputRate, true);
  dv.setInt16(16, 0, true);  // output gain
  b[18] = 0;  // channel mapping family 0: mono or stereo
  return b;
}

export function opusTags(vendor) {
  const v = new TextEncoder().encode(vendor);
  const b = new Uint8Array(8 + 4 + v.length + 4);
  const dv = new DataView(b.buffer);
  b.set(ascii('OpusTags'), 0);
  dv.setUint32(8, v.length, true);
  b.set(v, 12);
  dv.setUint32(12 + v.length, 0, true);  // no user comments
  return b;
}

export const isOpusHeader = (p) =>
  p.length >= 8 && p[0] === 0x4f && p[1] === 0x70 && p[2] === 0x75 && p[3] === 0x73 &&
  p[4] === 0x48 && p[5] === 0x65 && p[6] === 0x61 && p[7] === 0x64;  // "OpusHead"
export const isOpusTags = (p) =>
  p.length >= 8 && p[0] === 0x4f && p[1] === 0x70 && p[2] === 0x75 && p[3] === 0x73 &&
  p[4] === 0x54 && p[5] === 0x61 && p[6] === 0x67 && p[7] === 0x73;  // "OpusTags"

// Duration of one Opus packet in 48 kHz samples, from its TOC byte (RFC 6716 section 3.1).
export function opusPacketSamples(p) {
  if (p.length < 1) return 0;
  const config = p[0] >> 3;
  let frame;  // in 48 kHz samples
  if (config < 12) frame = [480, 960, 1920, 2880][config & 3];
  else if (config < 16) frame = [480, 960][config & 1];
  else frame = [120, 240, 480, 960][config & 3];
  const code = p[0] & 3;
  const count = code === 0 ? 1 : code === 3 ? (p.length > 1 ? p[1] & 0x3f : 0) : 2;
  return frame * count;
}

export class OggWriter {
  constructor() {
    this.serial = (Math.random() * 0xffffffff) >>> 0;
    this.seq = 0;
  }

  // One page holding whole `packets`; flags: 0x02 first page, 0x04 last page.
  page(packets, granule, flags = 0) {
    const lacing = [];
    for (const p of packets) {
      let n = p.length;
      for (; n >= 255; n -= 255) lacing.push(255);
      lacing.push(n);
    }
    if (lacing.length > 255) throw new Error('too many packet segments for one Ogg page');
    const bodyLength = packets.reduce((a, p) => a + p.length, 0);
    const page = new Uint8Array(27 + lacing.length + bodyLength);
    const dv = new DataView(page.buffer);
    page.set(ascii('OggS'), 0);
    page[4] = 0;  // version
    page[5] = flags;
    dv.setBigInt64(6, BigInt(granule), true);
    dv.setUint32(14, this.serial, true);
    dv.setUint32(18, this.seq++, true);
    page[26] = lacing.length;
    page.set(lacing, 27);
    let at = 27 + lacing.length;
    for (const p of packets) {
      page.set(p, at);
      at += p.length;
    }
    dv.setUint32(22, oggCrc(page), true);  // computed with the CRC field still zero
    return page;
  }
}

export class OggReader {
  constructor() {
    this.buf = new Uint8Array(0);
    this.partial = [];  // segments of a packet continued on the next page
    this.damaged = 0;   // bytes skipped while resynchronizing
  }

  // Appends bytes; returns the packets completed by them.
  push(bytes) {
    const joined = new Uint8Array(this.buf.length + bytes.length);
    joined.set(this.buf, 0);
    joined.set(bytes, this.buf.length);
    this.buf = joined;
    const packets = [];
    let at = 0;
    while (this.buf.length - at >= 27) {
      const b = this.buf;
      if (!(b[at] === 0x4f && b[at + 1] === 0x67 && b[at + 2] === 0x67 && b[at + 3] === 0x53)) {
        at++;
        this.damaged++;
        continue;
      }
      const nseg = b[at + 26];
      if (b.length - at < 27 + nseg) break;
      let body = 0;
      for (let i = 0; i < nseg; i++) body += b[at + 27 + i];
      const size = 27 + nseg + body;
      if (b.length - at < size) break;
      const page = b.slice(at, at + size);
      const dv = new DataView(page.buffer);
      const crc = dv.getUint32(22, true);
      dv.setUint32(22, 0, true);
      if (oggCrc(page) !== crc) {
        at++;
        this.damaged++;
        continue;
      }
      if (!(page[5] & 0x01)) this.partial = [];  // not a continuation: drop a stale fragment
      let off = 27 + nseg;
      for (let i = 0; i < nseg; i++) {
        const len = page[27 + i];
        this.partial.push(page.subarray(off, off + len));
        off += len;
        if (len < 255) {
          const n = this.partial.reduce((a, s) => a + s.length, 0);
          const pkt = new Uint8Array(n);
          let o = 0;
          for (const s of this.partial) {
            pkt.set(s, o);
            o += s.length;
          }
          packets.push(pkt);
          this.partial = [];
        }
      }
      at += size;
    }
    this.buf = this.buf.slice(at);
    return packets;
  }
}
