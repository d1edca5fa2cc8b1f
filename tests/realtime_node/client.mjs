// The OpenAI Node SDK's realtime client (openai/realtime/ws) against personaplex-server's
// /v1/realtime, run by run.mjs with NODE_EXTRA_CA_CERTS trusting the server's test certificate.
// Env: PPX_RT_PORT, PPX_RT_API_KEY, PPX_RT_SPEECH (a 16-bit mono WAV, resampled here to 24 kHz).
//
// Checks: a wrong key is refused; session.created; session.update -> session.updated; ~6 s of
// PCM16 24 kHz speech streamed in real time in 20 ms base64 chunks (as Pipecat sends it); audio
// deltas in real time, each one 80 ms frame, never more audio out than in (within one frame), and
// (the tiny model is never silent) about as much out as in; transcript deltas; at least one complete
// response lifecycle; every server event with a unique event_id, a GA type, under 256 KiB; no error.
import fs from 'node:fs';
import OpenAI from 'openai';
import { OpenAIRealtimeWS } from 'openai/realtime/ws';

const RATE = 24000;
const FRAME = 1920; // samples in one 80 ms model frame
const CHUNK = 480; // 20 ms
const STREAM_S = 6;
const port = Number(process.env.PPX_RT_PORT);
const apiKey = process.env.PPX_RT_API_KEY;
const baseURL = `https://127.0.0.1:${port}/v1`;
const t0 = Date.now();
const now = () => Date.now() - t0;
const log = (m) => console.log(`[client ${(now() / 1000).toFixed(2)}s] ${m}`);
const failures = [];
const check = (ok, m) => {
  if (!ok) {
    failures.push(m);
    console.error(`FAIL: ${m}`);
  }
  return ok;
};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// GA server event types (Pipecat >= 1.0 dies on any other type).
const GA_TYPES = new Set([
  'error', 'session.created', 'session.updated', 'conversation.created',
  'input_audio_buffer.committed', 'input_audio_buffer.cleared',
  'input_audio_buffer.speech_started', 'input_audio_buffer.speech_stopped',
  'conversation.item.added', 'conversation.item.done',
  'conversation.item.input_audio_transcription.delta',
  'conversation.item.input_audio_transcription.completed',
  'conversation.item.input_audio_transcription.failed', 'conversation.item.truncated',
  'conversation.item.deleted', 'conversation.item.retrieved', 'response.created', 'response.done',
  'response.output_item.added', 'response.output_item.done', 'response.content_part.added',
  'response.content_part.done', 'response.output_text.delta', 'response.output_text.done',
  'response.output_audio_transcript.delta', 'response.output_audio_transcript.done',
  'response.output_audio.delta', 'response.output_audio.done',
  'response.function_call_arguments.delta', 'response.function_call_arguments.done',
  'rate_limits.updated',
]);

// PCM16 24 kHz speech: the WAV's data chunk, linearly resampled, repeated to `seconds`.
function speech24k(file, seconds) {
  const b = fs.readFileSync(file);
  let off = 12, rate = 0, data = null;
  while (off + 8 <= b.length) {
    const id = b.toString('ascii', off, off + 4), size = b.readUInt32LE(off + 4);
    if (id === 'fmt ') rate = b.readUInt32LE(off + 12);
    if (id === 'data') data = b.subarray(off + 8, off + 8 + size);
    off += 8 + size + (size & 1);
  }
  if (!data || !rate) throw new Error(`${file}: not a PCM WAV`);
  const n = data.length >> 1;
  const src = new Int16Array(n);
  for (let i = 0; i < n; ++i) src[i] = data.readInt16LE(2 * i);
  const total = seconds * RATE, out = Buffer.alloc(2 * total), srcLen = Math.floor((n * RATE) / rate);
  for (let i = 0; i < total; ++i) {
    const pos = ((i % srcLen) * rate) / RATE, k = Math.floor(pos), f = pos - k;
    const a = src[Math.min(k, n - 1)], c = src[Math.min(k + 1, n - 1)];
    out.writeInt16LE(Math.round(a + (c - a) * f), 2 * i);
  }
  return out;
}

function once(rt, type, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), ms);
    rt.on(type, (ev) => {
      clearTimeout(timer);
      resolve(ev);
    });
    rt.socket.on('close', () => resolve(null)); // no waiting on a connection that is gone
  });
}

// A wrong key: the upgrade is refused (401) before anything else happens.
async function wrongKeyIsRefused() {
  const bad = new OpenAIRealtimeWS({ model: 'personaplex' }, new OpenAI({ apiKey: 'wrong', baseURL }));
  const err = await new Promise((resolve) => {
    const timer = setTimeout(() => resolve(null), 10_000);
    bad.on('error', (e) => {
      clearTimeout(timer);
      resolve(e);
    });
    bad.socket.on('open', () => {
      clearTimeout(timer);
      resolve(new Error('opened'));
    });
  });
  check(err && /401/.test(String(err.message)), `a wrong API key must get 401, got ${err?.message}`);
  bad.socket.terminate();
}

function checkUsage(u, where) {
  if (!check(u && typeof u === 'object', `${where}: response.usage missing`)) return;
  for (const k of ['total_tokens', 'input_tokens', 'output_tokens'])
    check(Number.isInteger(u[k]), `${where}: usage.${k} is not an integer`);
  for (const k of ['input_token_details', 'output_token_details'])
    check(u[k] && typeof u[k] === 'object', `${where}: usage.${k} is not an object`);
}

function checkResponseObject(r, where) {
  if (!check(r && typeof r === 'object', `${where}: no response object`)) return;
  check(typeof r.id === 'string' && r.id.length > 0, `${where}: response.id`);
  check(r.object === 'realtime.response', `${where}: response.object is ${r.object}`);
  check(['completed', 'in_progress', 'incomplete', 'cancelled', 'failed'].includes(r.status),
        `${where}: response.status is ${r.status}`);
  check('status_details' in r, `${where}: response.status_details key missing`);
  check(Array.isArray(r.output), `${where}: response.output is not an array`);
}

function checkSession(s, where) {
  if (!check(s && typeof s === 'object', `${where}: no session`)) return;
  check(s.type === 'realtime', `${where}: session.type is ${s.type}`);
  for (const dir of ['input', 'output']) {
    const rate = s.audio?.[dir]?.format?.rate;
    if (rate !== undefined) check(rate === RATE, `${where}: audio.${dir}.format.rate is ${rate}`);
  }
  if (s.tool_choice !== undefined)
    check(typeof s.tool_choice === 'string', `${where}: tool_choice is not a string`);
}

async function conversation() {
  const pcm = speech24k(process.env.PPX_RT_SPEECH, STREAM_S);
  const client = new OpenAI({ apiKey, baseURL });
  const rt = new OpenAIRealtimeWS({ model: 'personaplex' }, client);
  const events = []; // {t, ev}
  const ids = new Set();
  let sentSamples = 0, outSamples = 0, maxAhead = -Infinity;
  const deltaTimes = [];
  const errors = [];
  rt.on('error', (e) => {
    errors.push(e);
    log(`error: ${e.message}`);
  });
  rt.socket.on('message', (data) => {
    check(data.length < 256 * 1024, `a server event of ${data.length} bytes (limit 256 KiB)`);
  });
  rt.on('event', (ev) => {
    events.push({ t: now(), ev });
    check(typeof ev.event_id === 'string' && ev.event_id.length > 0, `${ev.type} without event_id`);
    check(!ids.has(ev.event_id), `event_id ${ev.event_id} repeated (${ev.type})`);
    ids.add(ev.event_id);
    check(GA_TYPES.has(ev.type), `server event type ${ev.type} is not a GA Realtime event`);
    if (ev.type === 'response.output_audio.delta') {
      const bytes = Buffer.from(ev.delta, 'base64');
      check(bytes.length === 2 * FRAME, `an audio delta of ${bytes.length} bytes (one 80 ms frame is ${2 * FRAME})`);
      outSamples += bytes.length >> 1;
      maxAhead = Math.max(maxAhead, outSamples - sentSamples);
      deltaTimes.push(now());
    }
  });

  const created = await once(rt, 'session.created', 20_000);
  if (!check(created, 'no session.created within 20 s')) return rt;
  log('session.created');
  checkSession(created.session, 'session.created');

  const instructions = 'You are a patient tester. Answer briefly.';
  const updated = once(rt, 'session.updated', 20_000);
  rt.send({
    type: 'session.update',
    session: {
      type: 'realtime',
      instructions,
      output_modalities: ['audio'],
      audio: {
        input: { format: { type: 'audio/pcm', rate: RATE } },
        output: { format: { type: 'audio/pcm', rate: RATE } },
      },
    },
  });
  const upd = await updated;
  if (!check(upd, 'no session.updated within 20 s of session.update')) return rt;
  log('session.updated');
  checkSession(upd.session, 'session.updated');
  check(upd.session.instructions === instructions,
        `session.updated instructions ${JSON.stringify(upd.session.instructions)}`);

  // Real-time stream: chunk k leaves at tStart + 20k ms (no drift), as a live microphone would.
  const chunks = pcm.length / (2 * CHUNK);
  const tStart = now();
  for (let k = 0; k < chunks; ++k) {
    const wait = tStart + 20 * k - now();
    if (wait > 0) await sleep(wait);
    const piece = pcm.subarray(2 * CHUNK * k, 2 * CHUNK * (k + 1));
    rt.send({ type: 'input_audio_buffer.append', audio: piece.toString('base64') });
    sentSamples += CHUNK;
  }
  const tEnd = now();
  log(`streamed ${(sentSamples / RATE).toFixed(2)} s in ${((tEnd - tStart) / 1000).toFixed(2)} s`);
  // The answers to the last frames, then quiet.
  for (const end = tEnd + 3000; now() < end;) {
    await sleep(50);
    if (outSamples >= sentSamples && now() - deltaTimes.at(-1) > 300) break;
  }
  const tailMs = deltaTimes.length ? deltaTimes.at(-1) - tEnd : NaN;
  log(`received ${(outSamples / RATE).toFixed(2)} s of audio in ${deltaTimes.length} deltas; ` +
      `last one ${tailMs} ms after the last append; most ahead of the input: ${maxAhead} samples`);

  // --- audio: never ahead of the input, about as much as the input, in real time ---------------
  check(maxAhead <= FRAME, `the server sent ${maxAhead} samples more than it was sent (limit one frame, ${FRAME})`);
  check(outSamples >= sentSamples - 2 * FRAME,
        `only ${outSamples} samples out for ${sentSamples} in (the tiny model is never silent)`);
  check(tailMs <= 1500, `the last audio delta came ${tailMs} ms after the last append`);
  const during = deltaTimes.filter((t) => t > tStart + 1000 && t <= tEnd);
  let maxGap = 0;
  for (let i = 1; i < during.length; ++i) maxGap = Math.max(maxGap, during[i] - during[i - 1]);
  check(maxGap <= 600, `audio deltas stalled for ${maxGap} ms while the input streamed`);
  // From 1 s in to the end of the stream, audio arrives at the rate it is sent (not in bursts).
  const windowS = (tEnd - tStart - 1000) / 1000;
  check(Math.abs(during.length * 0.08 - windowS) <= 0.5,
        `${(during.length * 0.08).toFixed(2)} s of audio arrived during ${windowS.toFixed(2)} s of streaming`);

  // --- transcript and response lifecycles ------------------------------------------------------
  const evs = events.map((e) => e.ev);
  const transcripts = evs.filter((e) => e.type === 'response.output_audio_transcript.delta');
  check(transcripts.length > 0, 'no response.output_audio_transcript.delta');
  check(!evs.some((e) => e.type === 'error'), `error events: ${JSON.stringify(evs.filter((e) => e.type === 'error'))}`);
  check(errors.length === 0, `SDK errors: ${errors.map((e) => e.message).join('; ')}`);

  const responses = new Map(); // id -> {steps: [...], item}
  const order = ['response.created', 'conversation.item.added', 'response.output_audio.delta',
                 'response.output_audio.done', 'response.done'];
  let open = null;
  for (const e of evs) {
    if (e.type === 'response.created') {
      checkResponseObject(e.response, 'response.created');
      check(open === null, `response.created ${e.response.id} while ${open} is still open`);
      open = e.response.id;
      responses.set(open, { steps: ['response.created'], item: null, deltas: 0 });
      continue;
    }
    const r = open ? responses.get(open) : null;
    if (e.type === 'conversation.item.added' && e.item?.role === 'assistant') {
      if (!check(r, 'an assistant conversation.item.added outside a response')) continue;
      check(e.item.type === 'message' && typeof e.item.id === 'string', 'assistant item without type/id');
      r.item = e.item.id;
      r.steps.push(e.type);
    } else if (e.type.startsWith('response.output_audio') || e.type.startsWith('response.output_item') ||
               e.type.startsWith('response.content_part')) {
      if (!check(r, `${e.type} outside a response`)) continue;
      check(e.response_id === open, `${e.type}: response_id ${e.response_id}, open response ${open}`);
      const itemId = e.item_id ?? e.item?.id;
      check(itemId === r.item, `${e.type}: item_id ${itemId}, the response's item ${r.item}`);
      if (e.type === 'response.output_audio.delta') {
        if (r.deltas++ === 0) r.steps.push(e.type);
      } else if (e.type === 'response.output_audio.done') r.steps.push(e.type);
    } else if (e.type === 'response.done') {
      checkResponseObject(e.response, 'response.done');
      checkUsage(e.response?.usage, 'response.done');
      check(e.response?.id === open, `response.done for ${e.response?.id}, open response ${open}`);
      if (r) r.steps.push(e.type);
      open = null;
    }
  }
  const complete = [...responses.values()].filter((r) => JSON.stringify(r.steps) === JSON.stringify(order));
  log(`${responses.size} responses, ${complete.length} complete; ${transcripts.length} transcript deltas: ` +
      JSON.stringify(transcripts.map((e) => e.delta).join('')).slice(0, 200));
  check(complete.length >= 1, `no complete response lifecycle (${order.join(' -> ')}); got ` +
        JSON.stringify([...responses.values()].map((r) => r.steps)));
  return rt;
}

async function main() {
  await wrongKeyIsRefused();
  const rt = await conversation();
  const closed = new Promise((r) => rt.socket.once('close', r));
  rt.close();
  await Promise.race([closed, sleep(5000)]);
  if (failures.length) {
    console.error(`${failures.length} check(s) failed`);
    process.exit(1);
  }
  log('all checks passed');
  process.exit(0);
}

main().catch((e) => {
  console.error(e?.stack ?? String(e));
  process.exit(1);
});
