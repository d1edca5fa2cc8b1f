// The PersonaPlex web client: microphone -> Opus (WebCodecs) -> Ogg pages -> WebSocket /api/chat,
// and back: Ogg pages -> Opus decoder -> a small jitter buffer -> speakers; text pieces are shown
// as they arrive. Protocol: docs/PROTOCOL.md. No build step, no dependencies.
import {
  OggReader, OggWriter, isOpusHeader, isOpusTags, opusHead, opusPacketSamples, opusTags,
} from './ogg.js';

const KIND_HANDSHAKE = 0x00, KIND_AUDIO = 0x01, KIND_TEXT = 0x02, KIND_ERROR = 0x05;
const DEFAULT_PROMPT =
  'You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way.';
const PLAYBACK_LEAD_S = 0.1;  // buffered before playback starts, and again after an underrun
const PLAYBACK_MAX_S = 0.4;   // more queued than this and new audio is dropped (stay live)
const PAGE_US = 80000;        // microphone audio per Ogg page (one model frame)
const MAX_SOCKET_BACKLOG = 1 << 20;  // bytes; beyond it the network cannot keep up

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
// With --api-key, open the page as /?api_key=KEY: the key goes along on /api/voices and /api/chat.
const apiKey = query.get('api_key') || '';

// What the page has done so far: shown below the controls, and read by the browser test.
const stats = (window.ppxStats = {
  state: 'idle', micSeconds: 0, pagesSent: 0, audioMessages: 0, agentSeconds: 0, textPieces: 0,
  decodedPeak: 0, playedPeak: 0, underruns: 0, dropped: 0, latencyMs: null, error: null,
});

function setState(state, detail = '') {
  stats.state = state;
  const el = $('state');
  el.textContent = detail ? `${state} (${detail})` : state;
  el.dataset.state = state;
  const idle = state === 'idle' || state === 'closed' || state === 'error';
  $('connect').textContent = idle ? 'Connect' : 'Disconnect';
  $('voice').disabled = $('prompt').disabled = !idle;
}

function showError(message) {
  stats.error = message;
  $('error').textContent = message;
  $('error').hidden = false;
}

async function loadVoices() {
  const select = $('voice');
  let voices = [];
  try {
    const r = await fetch('/api/voices' + (apiKey ? '?api_key=' + encodeURIComponent(apiKey) : ''));
    if (r.ok) voices = await r.json();
  } catch (e) { /* no voice list: only "(none)" */ }
  select.replaceChildren(...voices.map((v) => new Option(v, v)), new Option('(no voice prompt)', ''));
  const wanted = query.get('voice_prompt');
  if (wanted !== null && (wanted === '' || voices.includes(wanted))) select.value = wanted;
  else if (voices.includes('NATF0.pt')) select.value = 'NATF0.pt';
}

async function encoderConfig() {
  if (typeof AudioEncoder === 'undefined' || typeof AudioDecoder === 'undefined')
    throw new Error('this browser has no WebCodecs audio (AudioEncoder/AudioDecoder); use a recent Chrome or Edge');
  for (const sampleRate of [24000, 48000]) {
    const config = { codec: 'opus', sampleRate, numberOfChannels: 1, bitrate: 32000 };
    if ((await AudioEncoder.isConfigSupported(config)).supported) return config;
  }
  throw new Error('this browser cannot encode Opus with WebCodecs');
}

class Session {
  constructor() {
    this.writer = new OggWriter();
    this.reader = new OggReader();
    this.live = false;
    this.stopped = false;
    this.pending = [];      // encoded packets not yet sent
    this.pendingUs = 0;
    this.granule = 0;       // 48 kHz samples sent
    this.micTimestamp = 0;  // microseconds of microphone audio encoded
    this.decodeSamples = 0; // 48 kHz samples handed to the decoder
    this.playhead = 0;      // AudioContext time where the next agent chunk starts
  }

  async start() {
    setState('starting', 'microphone and codecs');
    const enc = await encoderConfig();
    const dec = { codec: 'opus', sampleRate: 48000, numberOfChannels: 1 };
    if (!(await AudioDecoder.isConfigSupported(dec)).supported)
      throw new Error('this browser cannot decode Opus with WebCodecs');
    this.mic = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    if (this.stopped) return this.release();
    // One context for both directions, at the encoder's rate: the browser resamples the microphone.
    this.ctx = new AudioContext({ sampleRate: enc.sampleRate, latencyHint: 'interactive' });
    await this.ctx.resume();
    await this.ctx.audioWorklet.addModule('capture-worklet.js');
    this.capture = new AudioWorkletNode(this.ctx, 'ppx-capture', {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: { blockFrames: enc.sampleRate / 50 },  // 20 ms: one Opus packet
    });
    this.capture.port.onmessage = (e) => this.onMicBlock(e.data);
    const muted = this.ctx.createGain();
    muted.gain.value = 0;  // keeps the capture node pulled without echoing the microphone
    this.ctx.createMediaStreamSource(this.mic).connect(this.capture).connect(muted).connect(this.ctx.destination);
    this.analyser = this.ctx.createAnalyser();
    this.analyser.fftSize = 2048;
    this.analyser.connect(this.ctx.destination);
    this.levels = new Float32Array(this.analyser.fftSize);

    this.encoder = new AudioEncoder({
      output: (chunk) => this.onPacket(chunk),
      error: (e) => this.fail(`Opus encoder: ${e.message}`),
    });
    this.encoder.configure(enc);
    this.decoder = new AudioDecoder({
      output: (data) => this.onDecoded(data),
      error: (e) => this.fail(`Opus decoder: ${e.message}`),
    });
    this.decoder.configure(dec);

    const url = new URL('/api/chat', location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const params = { voice_prompt: $('voice').value, text_prompt: $('prompt').value };
    if (apiKey) params.api_key = apiKey;
    url.search = new URLSearchParams(params).toString();
    this.ws = new WebSocket(url);
    this.ws.binaryType = 'arraybuffer';
    this.ws.onopen = () => {
      this.opened = true;
      setState('preparing', 'the server runs the voice and role prompts');
    };
    this.ws.onmessage = (e) => this.onMessage(new Uint8Array(e.data));
    this.ws.onclose = (e) => {
      if (this.opened || this.stopped) return this.stop(e.reason || 'connection closed');
      // Refused before the upgrade: a full or draining server answers HTTP 503, which the
      // WebSocket API does not show. /health/ready says which.
      fetch('/health/ready', { cache: 'no-store' })
        .then((r) => (r.ok ? null : r.json()))
        .catch(() => null)
        .then((h) => {
          if (!h || this.stopped) return this.stop('connection refused');
          const why = h.status !== 'ok' ? `server unavailable: ${h.status}`
            : `server busy: all ${h.max_sessions} sessions in use, try again shortly`;
          this.fail(why);
        });
    };
    setState('connecting');
    this.timer = setInterval(() => this.tick(), 100);
    this.send(KIND_AUDIO, this.writer.page([opusHead(1, 0, enc.sampleRate)], 0, 0x02));
    this.send(KIND_AUDIO, this.writer.page([opusTags('personaplex-cpp web client')], 0));
  }

  send(kind, bytes) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) {
      (this.early ??= []).push([kind, bytes]);  // the header pages, before the socket opens
      return;
    }
    for (const [k, b] of this.early ?? []) this.ws.send(frame(k, b));
    this.early = null;
    if (this.ws.bufferedAmount > MAX_SOCKET_BACKLOG) return this.fail('the network cannot keep up with the audio');
    this.ws.send(frame(kind, bytes));
  }

  onMessage(m) {
    if (m.length === 0) return;
    const body = m.subarray(1);
    switch (m[0]) {
      case KIND_HANDSHAKE:
        this.live = true;
        setState('live');
        break;
      case KIND_AUDIO:
        stats.audioMessages++;
        for (const p of this.reader.push(body)) {
          if (isOpusHeader(p) || isOpusTags(p)) continue;
          const n = opusPacketSamples(p);
          if (n === 0) continue;
          this.decoder.decode(new EncodedAudioChunk({
            type: 'key', timestamp: Math.round((this.decodeSamples * 1e6) / 48000), data: p,
          }));
          this.decodeSamples += n;
        }
        break;
      case KIND_TEXT:
        stats.textPieces++;
        appendText(new TextDecoder().decode(body));
        break;
      case KIND_ERROR:
        showError(`server: ${new TextDecoder().decode(body)}`);
        break;
      default:  // 0x06 ping while the prompts run; anything else is ignored
        break;
    }
  }

  onMicBlock(block) {
    if (!this.live || this.stopped) return;  // nothing before the handshake, as upstream's client
    let peak = 0;
    for (const v of block) peak = Math.max(peak, Math.abs(v));
    $('mic-level').value = peak;
    const data = new AudioData({
      format: 'f32-planar', sampleRate: this.ctx.sampleRate, numberOfFrames: block.length,
      numberOfChannels: 1, timestamp: this.micTimestamp, data: block,
    });
    this.micTimestamp += (block.length * 1e6) / this.ctx.sampleRate;
    this.encoder.encode(data);
    data.close();
  }

  onPacket(chunk) {
    const p = new Uint8Array(chunk.byteLength);
    chunk.copyTo(p);
    const samples = opusPacketSamples(p);
    this.pending.push(p);
    this.pendingUs += (samples * 1e6) / 48000;
    this.granule += samples;
    if (this.pendingUs + 1 < PAGE_US) return;
    this.send(KIND_AUDIO, this.writer.page(this.pending, this.granule));
    stats.micSeconds += this.pendingUs / 1e6;
    stats.pagesSent++;
    this.pending = [];
    this.pendingUs = 0;
  }

  onDecoded(data) {
    const n = data.numberOfFrames, rate = data.sampleRate;
    const pcm = new Float32Array(n);
    data.copyTo(pcm, { planeIndex: 0, format: 'f32-planar' });
    data.close();
    if (this.stopped) return;
    let peak = 0;
    for (const v of pcm) peak = Math.max(peak, Math.abs(v));
    stats.decodedPeak = Math.max(stats.decodedPeak, peak);
    stats.agentSeconds += n / rate;
    const now = this.ctx.currentTime;
    if (this.playhead < now) {
      if (this.playhead > 0) stats.underruns++;
      this.playhead = now + PLAYBACK_LEAD_S;
    }
    if (this.playhead - now > PLAYBACK_MAX_S) {
      stats.dropped++;
      return;
    }
    const buffer = this.ctx.createBuffer(1, n, rate);
    buffer.copyToChannel(pcm, 0);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.analyser);
    source.start(this.playhead);
    this.playhead += n / rate;
  }

  tick() {
    if (!this.ctx) return;
    this.analyser.getFloatTimeDomainData(this.levels);
    let peak = 0;
    for (const v of this.levels) peak = Math.max(peak, Math.abs(v));
    stats.playedPeak = Math.max(stats.playedPeak, peak);
    $('out-level').value = peak;
    if (this.live) {
      // Microphone audio sent but not yet answered, plus agent audio queued for the speakers.
      const inFlight = Math.max(0, stats.micSeconds - stats.agentSeconds);
      const queued = Math.max(0, this.playhead - this.ctx.currentTime);
      const device = (this.ctx.baseLatency || 0) + (this.ctx.outputLatency || 0);
      stats.latencyMs = Math.round((inFlight + queued + device) * 1000);
      $('latency').textContent = `${stats.latencyMs} ms`;
    }
    $('stats').textContent =
      `sent ${stats.micSeconds.toFixed(1)} s, received ${stats.agentSeconds.toFixed(1)} s, ` +
      `${stats.textPieces} text pieces, ${stats.underruns} underruns, ${stats.dropped} dropped`;
  }

  fail(message) {
    showError(message);
    this.stop(message);
  }

  stop(reason) {
    if (this.stopped) return;
    this.stopped = true;
    this.live = false;
    this.release();
    setState(stats.error ? 'error' : 'closed', reason);
  }

  release() {
    clearInterval(this.timer);
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, 'client done');
    for (const c of [this.encoder, this.decoder]) {
      try {
        if (c && c.state !== 'closed') c.close();
      } catch (e) { /* already closed */ }
    }
    if (this.mic) this.mic.getTracks().forEach((t) => t.stop());
    if (this.ctx && this.ctx.state !== 'closed') this.ctx.close();
  }
}

function frame(kind, bytes) {
  const m = new Uint8Array(1 + bytes.length);
  m[0] = kind;
  m.set(bytes, 1);
  return m;
}

function appendText(piece) {
  const t = $('transcript');
  const span = document.createElement('span');
  span.textContent = piece;
  t.append(span);
  t.scrollTop = t.scrollHeight;
}

let session = null;

async function toggle() {
  if (session && !session.stopped) return session.stop('closed by you');
  $('error').hidden = true;
  stats.error = null;
  $('transcript').replaceChildren();
  Object.assign(stats, { micSeconds: 0, pagesSent: 0, audioMessages: 0, agentSeconds: 0, textPieces: 0,
                         decodedPeak: 0, playedPeak: 0, underruns: 0, dropped: 0, latencyMs: null });
  session = new Session();
  try {
    await session.start();
  } catch (e) {
    session.fail(e.message || String(e));
  }
}

$('prompt').value = query.get('text_prompt') ?? DEFAULT_PROMPT;
$('connect').onclick = toggle;
setState('idle');
loadVoices().then(() => {
  if (query.get('autostart') === '1') toggle();
});
