// terminal.js: a browser terminal for one allocation
// (terminal.html?allocation_id=...). It mints a terminal token, opens the
// gateway WebSocket with the token as a subprotocol, and shows every
// readiness hop as it happens. It never sits at "connecting": the gateway's
// error frame, a close without one, or CONNECT_TIMEOUT_MS without ready all
// end in #term-error with the code, its recovery text and the correlation id.
//
// #term-state holds one of: starting, minting, token_ready,
// browser_ws_ready, queued, dispatched, node_connecting, spawning,
// pty_ready, exited, failed, closed.
//
// Output backpressure: a browser WebSocket cannot stop reading, so the node
// is slowed only by TCP; OutputQueue keeps xterm's own buffer bounded and
// queues the rest (never dropping it) and #term-backlog says so.
//
// ?connect_timeout_ms=N (1000..600000) overrides the 45 s limit, for tests.
//
// The dashboard (internal/cp/dashboard, /ui/allocations/{id}/terminal)
// serves this module on its own page, whose <body> says so: data-mint-url
// is the dashboard's CSRF-protected token route (the session cookie stands
// in for the bearer token, which the dashboard keeps server-side),
// data-csrf its CSRF token, data-allocation-id the allocation, and
// data-signals the outage signal of each error code (#term-error-signal).
import { Terminal } from './vendor/xterm.mjs';
import { FitAddon } from './vendor/addon-fit.mjs';
import { CHANNELS, ERROR_CODES, GENERIC_RECOVERY, SUBPROTOCOL } from './codes.js';
import { CONNECT_TIMEOUT_MS, UI_CODES, lookupUICode } from './uicodes.js';
import {
  OutputQueue, ProtocolError, ResizeGate, clampSize, clientProtocols, decodeFrame, encodeFrame,
  encodeJSONFrame, parseControl, terminalURL,
} from './protocol.js';
import {
  APIError, byId, enc, errorFromResponse, getToken, newCorrelationID, param, request, showText, toLogin,
} from './common.js';

/** dash is the dashboard page's settings, or null on the console's page. */
const dash = (() => {
  const d = document.body.dataset;
  if (!d.mintUrl) return null;
  let signals = {};
  try {
    signals = JSON.parse(d.signals || '{}');
  } catch {
    signals = {};
  }
  return { mintUrl: d.mintUrl, csrf: d.csrf || '', allocationId: d.allocationId || '', signals };
})();

const ui = {
  alloc: byId('term-alloc'),
  state: byId('term-state'),
  sessionId: byId('term-session-id'),
  sessionsLink: byId('term-sessions-link'),
  timeline: byId('term-timeline'),
  backlog: byId('term-backlog'),
  exit: byId('term-exit'),
  exitCode: byId('term-exit-code'),
  error: byId('term-error'),
  errorCode: byId('term-error-code'),
  errorHop: byId('term-error-hop'),
  errorRecovery: byId('term-error-recovery'),
  errorMessage: byId('term-error-message'),
  errorClose: byId('term-error-close'),
  errorCorrelation: byId('term-error-correlation'),
  errorSignal: document.getElementById('term-error-signal'), // dashboard only
  retry: byId('term-retry'),
  container: byId('term-container'),
};

const allocationId = dash ? dash.allocationId : param('allocation_id');
const timeoutMs = (() => {
  const v = Number(param('connect_timeout_ms'));
  return Number.isInteger(v) && v >= 1000 && v <= 600000 ? v : CONNECT_TIMEOUT_MS;
})();

const term = new Terminal({
  cursorBlink: true,
  scrollback: 5000,
  fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace',
  fontSize: 14,
});
const fit = new FitAddon();
term.loadAddon(fit);
term.open(ui.container);

const output = new OutputQueue((chunk, done) => term.write(chunk, done), {
  onBacklog: (b) => { ui.backlog.hidden = !b; },
});

let state = 'starting';
let sessionId = '';
let attempts = 0;
let hops = []; // [{state, elapsed_ms, detail}]
let cur = null; // the current attempt

function setState(s) {
  state = s;
  ui.state.textContent = s;
  ui.state.dataset.state = s;
}

function setSession(id) {
  sessionId = id;
  ui.sessionId.textContent = id;
}

/** hop records a readiness hop of attempt a with its elapsed time. */
function hop(a, name, detail = '') {
  const ms = Math.round(performance.now() - a.t0);
  hops.push({ state: name, elapsed_ms: ms, detail });
  const li = document.createElement('li');
  li.dataset.state = name;
  li.dataset.elapsedMs = String(ms);
  const label = document.createElement('span');
  label.className = 'hop';
  label.textContent = name;
  const at = document.createElement('span');
  at.className = 'elapsed';
  at.textContent = ` ${ms} ms`;
  li.append(label, at);
  if (detail) {
    const d = document.createElement('span');
    d.className = 'hint';
    d.textContent = ` ${detail}`;
    li.append(d);
  }
  ui.timeline.append(li);
  a.lastHop = name;
}

function recoveryFor(code) {
  if (Object.hasOwn(ERROR_CODES, code)) return ERROR_CODES[code].recovery;
  const known = lookupUICode(code);
  return known ? known.recovery : GENERIC_RECOVERY;
}

/**
 * fail ends attempt a with code: the timeline gets a "failed" hop, the
 * error box the code, recovery text and correlation id, and Retry when
 * retryable. endState is "failed" or, for a lost connection, "closed".
 */
function fail(a, { code, message = '', retryable, endState = 'failed' }) {
  if (a.ended) return;
  a.ended = true;
  clearTimeout(a.timer);
  a.gate.stop();
  a.abort.abort();
  const at = a.lastHop;
  hop(a, endState, code);
  setState(endState);
  ui.errorCode.textContent = code;
  ui.errorHop.textContent = at ? `after ${at}` : '';
  ui.errorRecovery.textContent = recoveryFor(code);
  showText(ui.errorMessage, message);
  ui.errorCorrelation.textContent = a.correlationId || '(none)';
  if (ui.errorSignal) ui.errorSignal.textContent = (dash && dash.signals[code]) || '(none)';
  ui.retry.hidden = !retryable;
  ui.error.hidden = false;
  output.push(`\r\n\x1b[31m[terminal ${endState}: ${code}]\x1b[0m\r\n`);
  if (a.ws && (a.ws.readyState === WebSocket.CONNECTING || a.ws.readyState === WebSocket.OPEN)) {
    a.ws.close(1000, code.slice(0, 120));
  }
  if (retryable) ui.retry.focus();
}

function protocolFail(a, err) {
  fail(a, { code: 'protocol_error', message: err.message, retryable: ERROR_CODES.protocol_error.retryable });
}

function send(a, frame) {
  if (a.ws && a.ws.readyState === WebSocket.OPEN) a.ws.send(frame);
}

function fitNow() {
  try {
    fit.fit();
  } catch (e) {
    console.warn('fit:', e);
  }
}

/** connect starts a fresh attempt: a new token, socket and session. */
function connect() {
  if (cur && !cur.ended) fail(cur, { code: 'terminal_connection_lost', message: 'replaced by a new attempt', retryable: true });
  attempts++;
  const a = {
    n: attempts, t0: performance.now(), ws: null, abort: new AbortController(), timer: null,
    gate: null, correlationId: '', ptySize: null, lastHop: '', opened: false, ready: false,
    exited: false, ended: false,
  };
  a.gate = new ResizeGate((size) => send(a, encodeJSONFrame(CHANNELS.resize, size)));
  cur = a;
  hops = [];
  ui.timeline.replaceChildren();
  ui.error.hidden = true;
  ui.errorClose.hidden = true;
  ui.exit.hidden = true;
  ui.retry.hidden = true;
  setSession('');
  term.reset();
  setState('minting');
  a.timer = setTimeout(() => {
    if (cur !== a || a.ended || a.ready) return;
    fail(a, {
      code: 'terminal_ui_connecting_stuck',
      message: `No ready or error frame within ${timeoutMs / 1000} s; last step reached: ${a.lastHop || 'token mint'}.`,
      retryable: UI_CODES.terminal_ui_connecting_stuck.retryable,
    });
  }, timeoutMs);
  mint(a);
}

/**
 * dashMint mints the token through the dashboard (form POST with the CSRF
 * token, the session cookie): {data, correlationId} like request, or an
 * APIError.
 */
async function dashMint(size, signal) {
  const cid = newCorrelationID();
  const body = new URLSearchParams({ csrf: dash.csrf, cols: String(size.cols), rows: String(size.rows) });
  let resp;
  try {
    resp = await fetch(dash.mintUrl, {
      method: 'POST', body, signal, credentials: 'same-origin', cache: 'no-store', redirect: 'error',
      headers: { 'X-Correlation-ID': cid, Accept: 'application/json' },
    });
  } catch (e) {
    throw new APIError({
      status: 0, code: 'network_error', message: `POST ${dash.mintUrl}: ${e.message}`, correlationId: cid, retryable: true,
    });
  }
  const correlationId = resp.headers.get('X-Correlation-ID') || cid;
  const text = await resp.text();
  if (!resp.ok) throw errorFromResponse(resp.status, resp.statusText, text, correlationId);
  try {
    return { data: JSON.parse(text), correlationId };
  } catch (e) {
    throw new APIError({ status: resp.status, code: 'invalid_response', message: e.message, correlationId });
  }
}

async function mint(a) {
  fitNow();
  const size = clampSize({ cols: term.cols, rows: term.rows }) || { cols: 80, rows: 24 };
  let tok;
  try {
    const r = dash ? await dashMint(size, a.abort.signal)
      : await request('POST', `/api/v1/allocations/${enc(allocationId)}/terminal-token`,
        { body: size, signal: a.abort.signal });
    tok = r.data;
    a.correlationId = r.correlationId;
  } catch (e) {
    if (cur !== a || a.ended) return;
    if (e instanceof APIError && e.status === 401) {
      if (dash) location.assign('/ui/login');
      else toLogin(`${e.message || 'The operator token was refused.'} (${e.code})`);
      return;
    }
    a.correlationId = e.correlationId || '';
    const known = lookupUICode(e.code);
    const code = e instanceof APIError && e.status > 0 ? e.code : 'terminal_token_mint_failed';
    fail(a, {
      code,
      message: `Token mint failed: ${e.message}`,
      retryable: known ? known.retryable : !(e instanceof APIError) || e.status === 0 || e.retryable,
    });
    return;
  }
  if (cur !== a || a.ended) return;
  a.ptySize = size;
  setSession(tok.session_id || '');
  hop(a, 'token_ready');
  setState('token_ready');
  let url;
  let protocols;
  try {
    url = terminalURL(location.href, tok.url);
    protocols = clientProtocols(tok.token);
  } catch (e) {
    protocolFail(a, e);
    return;
  }
  const ws = new WebSocket(url, protocols);
  ws.binaryType = 'arraybuffer';
  a.ws = ws;
  ws.addEventListener('open', () => onOpen(a));
  ws.addEventListener('message', (ev) => onMessage(a, ev));
  ws.addEventListener('close', (ev) => onClose(a, ev));
}

function onOpen(a) {
  if (cur !== a || a.ended) return;
  a.opened = true;
  if (a.ws.protocol !== SUBPROTOCOL) {
    protocolFail(a, new ProtocolError(`gateway chose subprotocol "${a.ws.protocol}"`));
    return;
  }
  hop(a, 'browser_ws_ready');
  setState('browser_ws_ready');
}

function onMessage(a, ev) {
  if (cur !== a || a.ended) return;
  try {
    if (typeof ev.data === 'string') throw new ProtocolError('text message on a binary protocol');
    const { channel, payload } = decodeFrame(ev.data);
    if (channel === CHANNELS.stdout) {
      output.push(payload);
    } else if (channel === CHANNELS.control) {
      onControl(a, parseControl(payload));
    } else {
      throw new ProtocolError(`gateway sent a frame on channel ${channel}`);
    }
  } catch (e) {
    if (e instanceof ProtocolError) protocolFail(a, e);
    else throw e;
  }
}

function onControl(a, msg) {
  switch (msg.type) {
    case 'status':
      if (a.ready || a.exited) return;
      hop(a, msg.state);
      setState(msg.state);
      return;
    case 'ready':
      if (a.ready) return;
      a.ready = true;
      clearTimeout(a.timer);
      setSession(msg.session_id);
      hop(a, 'pty_ready');
      setState('pty_ready');
      a.gate.open(a.ptySize);
      term.focus();
      return;
    case 'exit':
      a.exited = true;
      a.ended = true;
      clearTimeout(a.timer);
      a.gate.stop();
      hop(a, 'exited', `code ${msg.code}`);
      output.push(`\r\n[process exited with code ${msg.code}]\r\n`, () => {
        if (cur !== a) return;
        ui.exitCode.textContent = String(msg.code);
        ui.exit.hidden = false;
        setState('exited');
      });
      return;
    case 'error':
      fail(a, { code: msg.code, message: msg.message, retryable: msg.retryable });
      return;
    case 'ping':
      send(a, encodeJSONFrame(CHANNELS.control, { type: 'pong' }));
      return;
    default: // pong
  }
}

function onClose(a, ev) {
  if (cur !== a) return;
  const info = `WebSocket closed with code ${ev.code}${ev.reason ? ` (${ev.reason})` : ''}.`;
  if (a.exited) return;
  if (a.ended) {
    if (!ui.error.hidden) showText(ui.errorClose, info);
    return;
  }
  const reasonCode = Object.hasOwn(ERROR_CODES, ev.reason) ? ev.reason : '';
  let code;
  let endState = 'failed';
  if (!a.opened) code = 'terminal_gateway_upgrade_failed';
  else if (reasonCode) code = reasonCode;
  else if (!a.ready) code = 'terminal_gateway_closed';
  else {
    code = 'terminal_connection_lost';
    endState = 'closed';
  }
  const retryable = reasonCode ? ERROR_CODES[reasonCode].retryable : lookupUICode(code).retryable;
  fail(a, { code, message: `${info} No exit or error frame came first.`, retryable, endState });
  showText(ui.errorClose, info);
}

function sendInput(bytes) {
  const a = cur;
  if (!a || !a.ready || a.ended) return; // the gateway refuses input before ready
  send(a, encodeFrame(CHANNELS.stdin, bytes));
}

const encoder = new TextEncoder();
term.onData((d) => sendInput(encoder.encode(d)));
term.onBinary((d) => sendInput(Uint8Array.from(d, (c) => c.charCodeAt(0) & 0xff)));
term.onResize((size) => { if (cur) cur.gate.set(size); });

let fitQueued = false;
function scheduleFit() {
  if (fitQueued) return;
  fitQueued = true;
  requestAnimationFrame(() => {
    fitQueued = false;
    fitNow();
  });
}
new ResizeObserver(scheduleFit).observe(ui.container);
window.addEventListener('resize', scheduleFit);
ui.retry.addEventListener('click', () => connect());

/** droverTerm is the page's test hook. */
window.droverTerm = {
  term,
  state: () => state,
  sessionId: () => sessionId,
  allocationId: () => allocationId,
  timeline: () => hops.map((x) => ({ ...x })),
  attempts: () => attempts,
};

ui.alloc.textContent = allocationId;
if (!dash) {
  ui.sessionsLink.href = `sessions.html?allocation_id=${enc(allocationId)}`;
  document.title = `Terminal ${allocationId} · Drover console`;
}
if (!dash && !getToken()) {
  toLogin('Log in to open a terminal.');
} else if (!allocationId) {
  setState('failed');
  ui.errorCode.textContent = 'terminal_ui_no_allocation';
  ui.errorRecovery.textContent = recoveryFor('terminal_ui_no_allocation');
  ui.errorCorrelation.textContent = '(none)';
  ui.error.hidden = false;
} else {
  fitNow();
  connect();
}
