// Tests of protocol.js and the code tables, run by TestJSLogic (node --test)
// in a directory holding copies of the console's own modules.
import test from 'node:test';
import assert from 'node:assert/strict';
import {
  OutputQueue, ProtocolError, ResizeGate, clampSize, clientProtocols, decodeFrame, encodeFrame,
  encodeJSONFrame, parseControl, terminalURL,
} from './protocol.js';
import { CHANNELS, ERROR_CODES, GENERIC_RECOVERY } from './codes.js';
import { MINT_CODES, UI_CODES, lookupUICode } from './uicodes.js';

const te = new TextEncoder();
const ctl = (obj) => te.encode(JSON.stringify(obj));

test('frames round-trip and reject bad channels', () => {
  const f = encodeFrame(CHANNELS.stdin, te.encode('ls\r'));
  assert.deepEqual([...f], [0, 108, 115, 13]);
  const d = decodeFrame(f.buffer);
  assert.equal(d.channel, 0);
  assert.equal(new TextDecoder().decode(d.payload), 'ls\r');
  assert.deepEqual([...encodeJSONFrame(CHANNELS.resize, { cols: 80, rows: 24 })],
    [3, ...te.encode('{"cols":80,"rows":24}')]);
  for (const bad of [new Uint8Array([]), new Uint8Array([2, 1]), new Uint8Array([9])]) {
    assert.throws(() => decodeFrame(bad), ProtocolError);
  }
  assert.equal(decodeFrame(new Uint8Array([1])).payload.length, 0);
});

test('parseControl accepts every message type of v1', () => {
  const cases = [
    [{ type: 'status', state: 'queued' }, { type: 'status', state: 'queued' }],
    [{ type: 'status', state: 'spawning' }, { type: 'status', state: 'spawning' }],
    [{ type: 'ready', session_id: 'ts_1' }, { type: 'ready', session_id: 'ts_1' }],
    [{ type: 'exit', code: 0 }, { type: 'exit', code: 0 }],
    [{ type: 'exit', code: 130 }, { type: 'exit', code: 130 }],
    [{ type: 'error', code: 'node_offline', message: 'm', retryable: true },
      { type: 'error', code: 'node_offline', message: 'm', retryable: true }],
    // retryable missing: taken from the table.
    [{ type: 'error', code: 'terminal_pty_failed' },
      { type: 'error', code: 'terminal_pty_failed', message: '', retryable: false }],
    [{ type: 'error', code: 'token_expired' }, { type: 'error', code: 'token_expired', message: '', retryable: true }],
    // A newer gateway's code is shown, not turned into protocol_error.
    [{ type: 'error', code: 'brand_new' }, { type: 'error', code: 'brand_new', message: '', retryable: false }],
    [{ type: 'ping' }, { type: 'ping' }],
    [{ type: 'pong' }, { type: 'pong' }],
  ];
  for (const [wire, want] of cases) assert.deepEqual(parseControl(ctl(wire)), want, JSON.stringify(wire));
});

test('parseControl rejects malformed messages', () => {
  const bad = [
    '', 'not json', '[]', 'null', '"x"',
    JSON.stringify({ type: 'status', state: 'warming' }),
    JSON.stringify({ type: 'status' }),
    JSON.stringify({ type: 'ready' }),
    JSON.stringify({ type: 'ready', session_id: '' }),
    JSON.stringify({ type: 'exit' }),
    JSON.stringify({ type: 'exit', code: '1' }),
    JSON.stringify({ type: 'exit', code: 1.5 }),
    JSON.stringify({ type: 'error', code: 7 }),
    JSON.stringify({ type: 'error' }),
    JSON.stringify({ type: 'hello' }),
  ];
  for (const s of bad) assert.throws(() => parseControl(te.encode(s)), ProtocolError, s);
  assert.throws(() => parseControl(new Uint8Array([0xff, 0xfe])), ProtocolError);
});

test('clientProtocols offers the subprotocol and the token', () => {
  assert.deepEqual(clientProtocols('abc.DEF-123_~'), ['drover.terminal.v1', 'drover.token.abc.DEF-123_~']);
  for (const bad of ['', 'a b', 'a,b', 'a/b', 'tök', undefined]) {
    assert.throws(() => clientProtocols(bad), ProtocolError, String(bad));
  }
});

test('terminalURL maps the page origin to ws or wss', () => {
  const p = '/api/v1/terminal?allocation_id=al_1';
  assert.equal(terminalURL('https://drover.example/ui/terminal.html?allocation_id=al_1', p),
    'wss://drover.example/api/v1/terminal?allocation_id=al_1');
  assert.equal(terminalURL('http://127.0.0.1:8080/ui/terminal.html', p),
    'ws://127.0.0.1:8080/api/v1/terminal?allocation_id=al_1');
  assert.equal(terminalURL('http://a/ui/', 'https://b:9/x'), 'wss://b:9/x');
  assert.throws(() => terminalURL('http://a/ui/', 'ftp://b/x'), ProtocolError);
});

test('clampSize bounds sizes and refuses zero', () => {
  assert.deepEqual(clampSize({ cols: 80, rows: 24 }), { cols: 80, rows: 24 });
  assert.deepEqual(clampSize({ cols: 5000, rows: 900 }), { cols: 1000, rows: 500 });
  assert.deepEqual(clampSize({ cols: 80.7, rows: 24.2 }), { cols: 80, rows: 24 });
  for (const bad of [null, {}, { cols: 0, rows: 24 }, { cols: 80, rows: 0 }, { cols: NaN, rows: 1 }, { cols: -3, rows: 4 }]) {
    assert.equal(clampSize(bad), null);
  }
});

// fakeTimers is a manual clock for ResizeGate and Player.
function fakeTimers() {
  let now = 0;
  let next = 1;
  const timers = new Map();
  return {
    now: () => now,
    setTimeout: (f, ms) => { const id = next++; timers.set(id, { at: now + ms, f }); return id; },
    clearTimeout: (id) => { timers.delete(id); },
    pending: () => timers.size,
    advance(ms) {
      const end = now + ms;
      for (;;) {
        let first = null;
        for (const [id, t] of timers) if (t.at <= end && (!first || t.at < first[1].at)) first = [id, t];
        if (!first) break;
        timers.delete(first[0]);
        now = first[1].at;
        first[1].f();
      }
      now = end;
    },
  };
}

test('ResizeGate holds until open, then sends only a changed size', () => {
  const clock = fakeTimers();
  const sent = [];
  const gate = new ResizeGate((s) => sent.push(s), clock);
  gate.set({ cols: 100, rows: 30 });
  gate.set({ cols: 120, rows: 40 });
  clock.advance(1000);
  assert.deepEqual(sent, [], 'nothing before ready');
  gate.open({ cols: 80, rows: 24 });
  assert.deepEqual(sent, [{ cols: 120, rows: 40 }], 'latest size at ready');

  const g2 = new ResizeGate((s) => sent.push(s), clock);
  g2.set({ cols: 80, rows: 24 });
  g2.open({ cols: 80, rows: 24 });
  assert.equal(sent.length, 1, 'unchanged size is not sent at ready');
});

test('ResizeGate debounces 100 ms after ready', () => {
  const clock = fakeTimers();
  const sent = [];
  const gate = new ResizeGate((s) => sent.push(s), clock);
  gate.open({ cols: 80, rows: 24 });
  gate.set({ cols: 81, rows: 24 });
  clock.advance(50);
  gate.set({ cols: 82, rows: 24 });
  clock.advance(50);
  gate.set({ cols: 83, rows: 25 });
  assert.deepEqual(sent, [], 'a burst sends nothing yet');
  clock.advance(100);
  assert.deepEqual(sent, [{ cols: 83, rows: 25 }], 'the burst ends on the latest size');
  gate.set({ cols: 83, rows: 25 });
  clock.advance(200);
  assert.equal(sent.length, 1, 'the same size is not sent twice');
  gate.set({ cols: 0, rows: 25 });
  clock.advance(200);
  assert.equal(sent.length, 1, 'a zero size is ignored');
  gate.set({ cols: 90, rows: 30 });
  gate.stop();
  clock.advance(200);
  assert.equal(sent.length, 1, 'stop cancels a pending send');
  assert.equal(clock.pending(), 0);
});

// fakeXterm records writes and acknowledges them when told.
function fakeXterm() {
  const written = [];
  const acks = [];
  return {
    written,
    write: (chunk, done) => { written.push(chunk); acks.push(done); },
    ackAll() { while (acks.length) acks.shift()(); },
    ackOne() { acks.shift()(); },
  };
}

test('OutputQueue never drops output and bounds what xterm holds', () => {
  const x = fakeXterm();
  const backlog = [];
  const q = new OutputQueue(x.write, { high: 10, low: 4, onBacklog: (b) => backlog.push(b) });
  const chunk = (n, c) => new Uint8Array(n).fill(c);
  q.push(chunk(6, 1));
  q.push(chunk(6, 2)); // pending 6 < 10: handed over
  q.push(chunk(6, 3)); // pending 12 >= 10: queued
  q.push(chunk(6, 4));
  assert.equal(x.written.length, 2);
  assert.equal(q.pending, 12);
  assert.equal(q.queued, 12);
  assert.deepEqual(backlog, [true]);
  x.ackOne(); // pending 6: still >= low, nothing handed over
  assert.equal(x.written.length, 2);
  x.ackOne(); // pending 0: drains until pending >= low
  assert.equal(x.written.length, 3);
  let done = false;
  q.push('tail', () => { done = true; });
  x.ackAll();
  x.ackAll();
  x.ackAll();
  assert.deepEqual(x.written.map((c) => (typeof c === 'string' ? c : c[0])), [1, 2, 3, 4, 'tail'], 'order kept');
  assert.equal(done, true);
  assert.equal(q.pending, 0);
  assert.equal(q.queued, 0);
  assert.deepEqual(backlog, [true, false]);
});

test('code tables: every gateway code has recovery text; console codes do not clash', () => {
  assert.ok(Object.keys(ERROR_CODES).length >= 13);
  for (const [code, info] of Object.entries(ERROR_CODES)) {
    assert.ok(info.recovery.length > 20 && info.recovery !== GENERIC_RECOVERY, code);
    assert.ok(info.close >= 4000 && info.close <= 4999, code);
    assert.equal(typeof info.retryable, 'boolean', code);
  }
  for (const table of [UI_CODES, MINT_CODES]) {
    for (const [code, info] of Object.entries(table)) {
      assert.ok(!Object.hasOwn(ERROR_CODES, code), `${code} clashes with a gateway code`);
      assert.ok(info.recovery.length > 20, code);
      assert.equal(lookupUICode(code), info);
    }
  }
  assert.ok(Object.hasOwn(UI_CODES, 'terminal_ui_connecting_stuck'));
  assert.equal(lookupUICode('node_offline'), undefined);
  assert.equal(lookupUICode('toString'), undefined);
});
