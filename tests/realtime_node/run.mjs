#!/usr/bin/env node
// ctest realtime_node_sdk: the official OpenAI Node SDK's realtime client against personaplex-server.
//
//   node run.mjs --server PATH/personaplex-server --work DIR
//
// 1. Installs the pinned `openai` and `ws` packages (package-lock.json) into DIR with `npm ci`
//    (skipped when DIR already holds exactly the locked versions).
// 2. Makes a self-signed certificate for 127.0.0.1 (openssl CLI): the SDK always connects with
//    wss://, so the server runs with --ssl and the client trusts the certificate through
//    NODE_EXTRA_CA_CERTS, which Node reads only at start: hence client.mjs runs as a child process.
// 3. Starts the server on a free port (embedded tiny demo model, CPU, --api-key), runs client.mjs,
//    checks that every session slot is free afterwards (GET /health), and stops the server
//    (SIGTERM, clean exit required).
// Uses Node built-ins only, so it runs before the packages are installed.
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const arg = (name, fallback) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : fallback;
};
const serverBin =
  process.env.PPX_SERVER_BIN ?? arg('--server', path.join(here, '../../build/src/personaplex-server'));
const work = path.resolve(arg('--work', path.join(os.tmpdir(), 'ppx_realtime_node')));
const API_KEY = 'ppx-test-key-' + process.pid;
const t0 = Date.now();
const log = (m) => console.log(`[run ${((Date.now() - t0) / 1000).toFixed(1)}s] ${m}`);
const fail = (m) => {
  console.error(`FAIL: ${m}`);
  process.exitCode = 1;
};

// --- 1. the SDK, from the lockfile ---------------------------------------------------------------
function installedMatchesLock() {
  const lock = JSON.parse(fs.readFileSync(path.join(work, 'package-lock.json'), 'utf8'));
  for (const [key, entry] of Object.entries(lock.packages ?? {})) {
    if (!key.startsWith('node_modules/')) continue;
    const pj = path.join(work, key, 'package.json');
    if (!fs.existsSync(pj)) return false;
    if (JSON.parse(fs.readFileSync(pj, 'utf8')).version !== entry.version) return false;
  }
  return true;
}

function installSdk() {
  fs.mkdirSync(work, { recursive: true });
  for (const f of ['package.json', 'package-lock.json', 'client.mjs'])
    fs.copyFileSync(path.join(here, f), path.join(work, f));
  if (installedMatchesLock()) {
    log(`packages already installed in ${work}`);
    return true;
  }
  log(`npm ci in ${work}`);
  const r = spawnSync('npm', ['ci', '--no-audit', '--no-fund', '--loglevel=error', '--fetch-retries=2',
                              '--fetch-retry-maxtimeout=20000', '--fetch-timeout=60000'], {
    cwd: work,
    encoding: 'utf8',
    timeout: 180_000,
  });
  if (r.status !== 0) {
    console.error(r.stdout ?? '', r.stderr ?? '', r.error ? String(r.error) : '');
    fail(
      'npm ci could not install the OpenAI SDK (npm packages openai and ws, pinned in ' +
        'tests/realtime_node/package-lock.json): the npm registry must be reachable for this test ' +
        '(set npm_config_registry for a mirror)',
    );
    return false;
  }
  return true;
}

// --- 2. a certificate for 127.0.0.1 --------------------------------------------------------------
function makeCert(dir) {
  const r = spawnSync(
    'openssl',
    ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=127.0.0.1',
     '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(dir, 'key.pem'),
     '-out', path.join(dir, 'cert.pem')],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) {
    console.error(r.stderr ?? String(r.error));
    fail('openssl could not make the test certificate');
    return false;
  }
  return true;
}

// --- 3. the server -------------------------------------------------------------------------------
function startServer(certDir, logFile) {
  const out = fs.openSync(logFile, 'w');
  const child = spawn(
    serverBin,
    ['--host', '127.0.0.1', '--port', '0', '--ssl', certDir, '--api-key', API_KEY,
     '--max-sessions', '1', '--idle-timeout', '10'],
    { stdio: ['ignore', out, out] },
  );
  fs.closeSync(out);
  return child;
}

async function waitPort(child, logFile, limitMs) {
  const re = /listening on https:\/\/127\.0\.0\.1:(\d+)/;
  for (const end = Date.now() + limitMs; Date.now() < end;) {
    const m = re.exec(fs.readFileSync(logFile, 'utf8'));
    if (m) return Number(m[1]);
    if (child.exitCode !== null) return 0;
    await new Promise((r) => setTimeout(r, 50));
  }
  return 0;
}

function health(port, ca) {
  return new Promise((resolve, reject) => {
    const req = https.get({ host: '127.0.0.1', port, path: '/health', ca, timeout: 5000 }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => {
        try {
          resolve(JSON.parse(body));
        } catch (e) {
          reject(e);
        }
      });
    });
    req.on('error', reject);
    req.on('timeout', () => req.destroy(new Error('timeout')));
  });
}

function runClient(port, certFile) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(work, 'client.mjs')], {
      cwd: work,
      stdio: 'inherit',
      env: { ...process.env, NODE_EXTRA_CA_CERTS: certFile, PPX_RT_PORT: String(port),
             PPX_RT_API_KEY: API_KEY, PPX_RT_SPEECH: path.join(here, '../data/speech_16k.wav') },
    });
    const guard = setTimeout(() => {
      fail('client.mjs ran past 50 s');
      child.kill('SIGKILL');
    }, 50_000);
    child.on('exit', (code, sig) => {
      clearTimeout(guard);
      resolve(code ?? 128 + (sig === 'SIGKILL' ? 9 : 15));
    });
  });
}

async function main() {
  if (!fs.existsSync(serverBin)) return fail(`no server binary at ${serverBin}`);
  if (!installSdk()) return;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'ppx_rt_'));
  const logFile = path.join(tmp, 'server.log');
  let server = null;
  try {
    if (!makeCert(tmp)) return;
    server = startServer(tmp, logFile);
    const port = await waitPort(server, logFile, 60_000);
    if (!port) return fail(`the server did not print its ready line:\n${fs.readFileSync(logFile, 'utf8')}`);
    log(`server ready on https://127.0.0.1:${port}`);
    const ca = fs.readFileSync(path.join(tmp, 'cert.pem'));
    const rc = await runClient(port, path.join(tmp, 'cert.pem'));
    if (rc !== 0) fail(`client.mjs exited with ${rc}`);
    // Every slot comes back once the client has closed.
    let inUse = -1;
    for (const end = Date.now() + 10_000; Date.now() < end;) {
      inUse = (await health(port, ca)).sessions_in_use;
      if (inUse === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    if (inUse !== 0) fail(`sessions_in_use is ${inUse} 10 s after the client left`);
    else log('all session slots free');
    server.kill('SIGTERM');
    const code = await new Promise((r) =>
      server.exitCode !== null ? r(server.exitCode) : server.on('exit', (c) => r(c)));
    server = null;
    if (code !== 0) fail(`the server exited with ${code}`);
  } finally {
    if (server) server.kill('SIGKILL');
    if (process.exitCode) console.error(`--- server log ---\n${fs.readFileSync(logFile, 'utf8')}`);
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  if (!process.exitCode) console.log('realtime node sdk test passed');
}

main().catch((e) => fail(e?.stack ?? String(e)));
