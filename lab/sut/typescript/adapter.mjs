// The lab's adapter for the official TypeScript SDK (@modelcontextprotocol/sdk).
//
//   LAB_LEDGER_KEY=<hex> node adapter.mjs [--log FILE] [--modules DIR]
//
// Protocol: docs/clients.md (commands on stdin, the mcpLabAppLog.v1 application log on
// stdout or --log FILE). DIR holds the installed SDK (`make node-adapter` puts it in .node/).
//
// Each client is the SDK's own Client over its StreamableHTTPClientTransport, with the
// SDK's default reconnection options, request timeout and handshake (2025-11-25, a
// session-era revision). What the adapter adds sits at the SDK's public seams and changes
// no behaviour: a `fetch` wrapper that sees the session ID in use and every GET that
// resumes (Last-Event-ID) or re-opens a stream; an `onmessage` hook (Protocol.connect
// keeps and calls it before its own dispatch) that logs every message the transport hands
// up; `onerror`, whose reports become `notice` lines; and a wrapper of `transport.send`
// that joins a tools/call's JSON-RPC id to the call's idempotency key.

import { createHash, createHmac } from 'node:crypto';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import readline from 'node:readline';

const SCHEMA = 'mcpLabAppLog.v1';
const IDEMPOTENCY_META = 'mcp-lab/idempotency-key';
const STOP_GRACE_MS = 10000;
const EXIT_CANNOT_RUN = 3;

function option(name) {
  const i = process.argv.indexOf(name);
  return i > 0 ? process.argv[i + 1] : undefined;
}

const keyHex = process.env.LAB_LEDGER_KEY ?? '';
if (!/^([0-9a-fA-F]{2}){16,}$/.test(keyHex)) {
  process.stderr.write('adapter.mjs: LAB_LEDGER_KEY must be the run\'s pseudonym key (hex, >= 16 bytes)\n');
  process.exit(EXIT_CANNOT_RUN);
}
const KEY = Buffer.from(keyHex, 'hex');
const modules = path.resolve(option('--modules') ?? process.env.LAB_NODE_DIR ?? '.node');
// The version in the SDK's own package.json (its dist folders carry package.json files too).
function sdkVersion(entry) {
  for (let dir = path.dirname(entry); dir !== path.dirname(dir); dir = path.dirname(dir)) {
    const file = path.join(dir, 'package.json');
    if (!fs.existsSync(file)) continue;
    const pkg = JSON.parse(fs.readFileSync(file, 'utf8'));
    if (pkg.name === '@modelcontextprotocol/sdk') return pkg.version;
  }
  return null;
}

let sdk;
try {
  const require = createRequire(path.join(modules, 'package.json'));
  sdk = {
    ...require('@modelcontextprotocol/sdk/client/index.js'),
    ...require('@modelcontextprotocol/sdk/client/streamableHttp.js'),
    McpError: require('@modelcontextprotocol/sdk/types.js').McpError,
    version: sdkVersion(require.resolve('@modelcontextprotocol/sdk/client/index.js')),
  };
} catch (e) {
  process.stderr.write(`adapter.mjs: @modelcontextprotocol/sdk is not installed in ${modules} (run \`make node-adapter\`): ${e.message}\n`);
  process.exit(EXIT_CANNOT_RUN);
}

const EXIT_CRASHED = 4;
const out = option('--log') ? fs.createWriteStream(option('--log'), { flags: 'a' }) : process.stdout;
out.on('error', e => {
  process.stderr.write(`adapter.mjs: cannot write the application log: ${e.message}\n`);
  process.exit(EXIT_CANNOT_RUN);
});
// Wall-clock Unix seconds with microseconds, like the Python adapters.
const now = () => Math.round((performance.timeOrigin + performance.now()) * 1000) / 1e6;
function write(ev, fields) {
  out.write(JSON.stringify({ ev, t: now(), ...fields }) + '\n');
}

// The same pseudonym as lab.wire.redact.Redactor.session: "s_" + 80 bits of HMAC-SHA256.
function pseudonym(sid) {
  if (sid === undefined || sid === null) return null;
  return 's_' + createHmac('sha256', KEY).update(Buffer.concat([Buffer.from('session\0'), Buffer.from(sid, 'utf8')])).digest('hex').slice(0, 20);
}

// Keys sorted, no whitespace, non-ASCII as is: the canonical JSON of docs/clients.md.
function canonical(v) {
  if (Array.isArray(v)) return '[' + v.map(x => (x === undefined ? 'null' : canonical(x))).join(',') + ']';
  if (v !== null && typeof v === 'object') {
    const keys = Object.keys(v).filter(k => v[k] !== undefined).sort();
    return '{' + keys.map(k => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
  }
  return JSON.stringify(v);
}
const digest = message => createHash('sha256').update(canonical(message), 'utf8').digest('hex');

function describe(m) {
  const id = typeof m.id === 'string' || typeof m.id === 'number' ? m.id : null;
  if (typeof m.method === 'string') return [id === null ? 'notification' : 'request', id, m.method];
  return ['error' in m ? 'error' : 'response', id, null];
}

const clients = new Map(); // client ID -> state
const calls = new Map(); // call ID -> { cl, abort, done, t0, cancelAsked }

function scrub(cl, text) {
  for (const [secret, standIn] of cl.secrets) text = text.split(secret).join(standIn);
  return text.slice(0, 2000);
}

function errorText(e) {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

function setSession(cl, sid) {
  if (!sid) return;
  const p = pseudonym(sid);
  if (sid.length >= 8) cl.secrets.set(sid, p);
  cl.session = p;
}

function makeFetch(cl) {
  let gets = 0;
  let hadSession = false;
  let requests = 0;
  return async (url, init) => {
    const headers = new Headers(init?.headers);
    const conn = headers.get('x-lab-conn');
    if (conn !== null) {
      // Number each request, as the lab's own clients do (docs/clients.md): the SDK never reads it.
      requests += 1;
      const cut = conn.lastIndexOf(':');
      headers.set('x-lab-conn', `${cut > 0 ? conn.slice(0, cut) : conn}:${requests}`);
      init = { ...init, headers };
    }
    const sid = headers.get('mcp-session-id');
    const method = (init?.method ?? 'GET').toUpperCase();
    if (sid) {
      setSession(cl, sid);
      hadSession = true;
    }
    if (method === 'GET') {
      if (headers.has('last-event-id')) reconnect(cl, 'resume');
      else if (gets > 0) reconnect(cl, 'reopen');
      gets += 1;
    } else if (method === 'POST' && !sid && hadSession) {
      reconnect(cl, 'reinitialize');
      gets = 0;
    }
    const response = await fetch(url, init);
    setSession(cl, response.headers.get('mcp-session-id'));
    return response;
  };
}

function reconnect(cl, kind) {
  write('reconnect', { client: cl.id, session: cl.session, kind });
}

function outcome(st, status, error, code) {
  if (st.done) return;
  st.done = true;
  const { cl, cmd } = st;
  write('outcome', {
    client: cl.id, session: cl.session, call: cmd.call, id: cl.callRpc.get(cmd.call) ?? null,
    status, error: error === null ? null : scrub(cl, error), code, elapsed_s: Math.round((now() - st.t0) * 1e6) / 1e6,
  });
}

async function runCall(st) {
  const { cl, cmd } = st;
  try {
    await cl.client.callTool(
      { name: cmd.tool, arguments: cmd.arguments ?? {}, _meta: { [IDEMPOTENCY_META]: cmd.idempotencyKey } },
      undefined,
      { onprogress: () => {}, signal: st.abort.signal },
    );
    outcome(st, 'ok', null, null);
  } catch (e) {
    if (st.cancelAsked || cl.leaving) outcome(st, 'cancelled', st.cancelAsked ? 'cancel' : 'leave', null);
    else if (e instanceof sdk.McpError) outcome(st, 'error', e.message, e.code);
    else outcome(st, 'exception', errorText(e), null);
  }
}

function startCall(cl, cmd) {
  const st = { cl, cmd, abort: new AbortController(), done: false, cancelAsked: false, t0: now() };
  calls.set(cmd.call, st);
  cl.calls.add(st);
  st.promise = runCall(st);
}

async function runClient(cl) {
  const t0 = now();
  const { start } = cl;
  try {
    if (start.options && Object.keys(start.options).length) throw new Error(`the typescript-sdk adapter takes no options; got ${Object.keys(start.options)}`);
    if (start.protocolVersion && start.protocolVersion !== '2025-11-25') {
      // The SDK's Client always asks for its newest revision; it offers no way to ask for another.
      throw new Error(`the SDK's Client asks for 2025-11-25 only; got protocolVersion ${start.protocolVersion}`);
    }
    const transport = new sdk.StreamableHTTPClientTransport(new URL(start.url), {
      requestInit: { headers: start.headers ?? {} },
      fetch: makeFetch(cl),
    });
    transport.onmessage = message => {
      const [kind, id, method] = describe(message);
      const call = id !== null && (kind === 'response' || kind === 'error') ? cl.rpcCalls.get(id) ?? null : null;
      write('deliver', { client: cl.id, session: cl.session, kind, id, method, call, digest: digest(message) });
    };
    const send = transport.send.bind(transport);
    transport.send = (message, options) => {
      if (message.method === 'tools/call' && message.id !== undefined) {
        const call = cl.keys.get(message.params?._meta?.[IDEMPOTENCY_META]);
        if (call !== undefined) {
          cl.rpcCalls.set(message.id, call);
          if (!cl.callRpc.has(call)) cl.callRpc.set(call, message.id);
        }
      }
      return send(message, options);
    };
    const client = new sdk.Client({ name: 'mcp-lab', version: '0' });
    client.onerror = e => write('notice', { client: cl.id, session: cl.session, text: scrub(cl, errorText(e)) });
    cl.transport = transport;
    await client.connect(transport);
    cl.client = client;
    write('started', {
      client: cl.id, session: cl.session, protocolVersion: transport.protocolVersion ?? null, elapsed_s: Math.round((now() - t0) * 1e6) / 1e6,
    });
    for (const cmd of cl.queued.splice(0)) startCall(cl, cmd);
    cl.state = 'started';
  } catch (e) {
    cl.state = 'ended';
    cl.endReason = scrub(cl, errorText(e));
    write('start_failed', { client: cl.id, error: cl.endReason });
    for (const cmd of cl.queued.splice(0)) {
      outcome({ cl, cmd, done: false, t0: now() }, 'exception', `client ended: ${cl.endReason}`, null);
    }
    cl.ended();
  }
}

async function leave(cl) {
  if (cl.leaving) return cl.endedPromise;
  cl.leaving = true;
  await cl.startedPromise;
  if (cl.state !== 'started') return;
  for (const st of cl.calls) if (!st.done) st.abort.abort('leave');
  await Promise.allSettled([...cl.calls].map(st => st.promise));
  try {
    await cl.transport.terminateSession(); // the SDK's way to leave: DELETE with the session ID
  } catch (e) {
    write('notice', { client: cl.id, session: cl.session, text: scrub(cl, `leave: ${errorText(e)}`) });
  }
  await cl.client.close();
  cl.state = 'ended';
  cl.endReason = 'left';
  write('left', { client: cl.id, session: cl.session });
  cl.ended();
}

function reject(lineno, error) {
  write('rejected', { line: lineno, error });
}

function handle(line, lineno) {
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch (e) {
    return reject(lineno, `not a JSON line: ${e.message}`);
  }
  if (cmd === null || typeof cmd !== 'object' || Array.isArray(cmd)) return reject(lineno, 'a command is a JSON object');
  const need = (...keys) => keys.find(k => typeof cmd[k] !== 'string' || !cmd[k]);
  switch (cmd.cmd) {
    case 'start': {
      const missing = need('client', 'url');
      if (missing) return reject(lineno, `start: '${missing}' must be a non-empty string`);
      if (clients.has(cmd.client)) return reject(lineno, `start: client '${cmd.client}' exists`);
      const cl = {
        id: cmd.client, start: cmd, session: null, secrets: new Map(), keys: new Map(), rpcCalls: new Map(),
        callRpc: new Map(), calls: new Set(), queued: [], state: 'starting', leaving: false,
      };
      for (const [name, value] of Object.entries(cmd.headers ?? {})) {
        if (['authorization', 'proxy-authorization', 'cookie', 'x-api-key'].includes(name.toLowerCase())) {
          cl.secrets.set(value, '<credential>');
          const rest = value.split(' ').slice(1).join(' ');
          if (rest.length >= 8) cl.secrets.set(rest, '<credential>');
        }
      }
      cl.endedPromise = new Promise(resolve => { cl.ended = resolve; });
      clients.set(cmd.client, cl);
      cl.startedPromise = runClient(cl);
      return;
    }
    case 'call': {
      const missing = need('client', 'call', 'tool', 'idempotencyKey');
      if (missing) return reject(lineno, `call: '${missing}' must be a non-empty string`);
      const cl = clients.get(cmd.client);
      if (!cl || calls.has(cmd.call)) return reject(lineno, `call '${cmd.call}': ${cl ? 'call ID already used' : 'unknown client'}`);
      cl.keys.set(cmd.idempotencyKey, cmd.call);
      if (cl.state === 'starting') {
        calls.set(cmd.call, { done: false });
        cl.queued.push(cmd);
      } else if (cl.state === 'started' && !cl.leaving) startCall(cl, cmd);
      else outcome({ cl, cmd, done: false, t0: now() }, 'exception', `client ended: ${cl.endReason ?? 'leaving'}`, null);
      return;
    }
    case 'cancel': {
      const st = calls.get(cmd.call);
      if (!st || st.done || !st.abort) return reject(lineno, `cancel: no running call '${cmd.call}'`);
      st.cancelAsked = true;
      st.abort.abort('cancel'); // the SDK sends notifications/cancelled for an aborted request
      return;
    }
    case 'leave': {
      const cl = clients.get(cmd.client);
      if (!cl) return reject(lineno, `leave: unknown client '${cmd.client}'`);
      leave(cl);
      return;
    }
    case 'stop':
      stop();
      return;
    default:
      return reject(lineno, `'cmd' must be one of start, call, cancel, leave, stop; got ${JSON.stringify(cmd.cmd)}`);
  }
}

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  input.close();
  const grace = new Promise(resolve => setTimeout(resolve, STOP_GRACE_MS).unref());
  await Promise.race([Promise.allSettled([...clients.values()].map(leave)), grace]);
  write('stopped', { clients: clients.size });
  const exit = () => process.exit(0);
  if (out === process.stdout) process.stdout.write('', exit);
  else out.end(exit);
}

write('ready', {
  schema: SCHEMA, adapter: 'typescript-sdk', implementation: { name: '@modelcontextprotocol/sdk', version: sdk.version }, pid: process.pid,
});
const input = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
let lineno = 0;
input.on('line', line => {
  lineno += 1;
  if (!stopping && line.trim()) handle(line, lineno);
});
input.on('close', () => stop());
process.on('SIGTERM', () => stop());
// The adapter itself failed (never the client under test: its errors are caught per call).
for (const event of ['uncaughtException', 'unhandledRejection']) {
  process.on(event, e => {
    process.stderr.write(`adapter.mjs: ${event}: ${e?.stack ?? e}\n`);
    write('crashed', { error: errorText(e) });
    process.exitCode = EXIT_CRASHED;
    if (out === process.stdout) process.stdout.write('', () => process.exit(EXIT_CRASHED));
    else out.end(() => process.exit(EXIT_CRASHED));
  });
}
process.on('SIGINT', () => stop());
