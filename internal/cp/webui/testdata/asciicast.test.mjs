// Tests of asciicast.js, run by TestJSLogic (node --test).
import test from 'node:test';
import assert from 'node:assert/strict';
import { Player, compressIdle, parseAsciicast, parseSize } from './asciicast.js';

const rec = [
  '{"version":2,"width":80,"height":24,"timestamp":1700000000}',
  '[0.1,"o","hello "]',
  '[0.1,"o","world\\r\\n"]',
  '[0.5,"i","ls\\r"]',
  '[1.0,"r","100x30"]',
  '[2.0,"o","\\u001b[1mbold\\u001b[0m"]',
  '',
].join('\n');

test('parseAsciicast reads the header and events', () => {
  const { header, events } = parseAsciicast(rec);
  assert.equal(header.width, 80);
  assert.equal(header.height, 24);
  assert.equal(events.length, 5);
  assert.deepEqual(events[0], { t: 0.1, type: 'o', data: 'hello ' });
  assert.deepEqual(events[3], { t: 1.0, type: 'r', data: '100x30' });
  assert.equal(events[4].data, '\x1b[1mbold\x1b[0m');
});

test('parseAsciicast rejects what is not asciicast v2', () => {
  for (const bad of [
    '',
    '{"version":1,"width":80,"height":24}',
    '{"version":2,"width":0,"height":24}',
    '{"version":2,"height":24}',
    '[0.1,"o","x"]',
    '{"version":2,"width":80,"height":24}\n{"t":1}',
    '{"version":2,"width":80,"height":24}\n[-1,"o","x"]',
    '{"version":2,"width":80,"height":24}\n[1,"o"]',
    '{"version":2,"width":80,"height":24}\n[1,"o",5]',
    '{"version":2,"width":80,"height":24}\nnot json',
  ]) {
    assert.throws(() => parseAsciicast(bad), Error, bad);
  }
});

test('parseSize reads COLSxROWS', () => {
  assert.deepEqual(parseSize('100x30'), { cols: 100, rows: 30 });
  for (const bad of ['', '100', '0x30', '100x0', 'axb', '100x30x2', ' 100x30']) assert.equal(parseSize(bad), null, bad);
});

test('compressIdle caps gaps', () => {
  const ev = [{ t: 1, type: 'o', data: 'a' }, { t: 10, type: 'o', data: 'b' }, { t: 10.5, type: 'o', data: 'c' }];
  assert.deepEqual(compressIdle(ev, 2).map((e) => e.t), [1, 3, 3.5]);
  assert.equal(compressIdle(ev, undefined), ev);
});

function fakeClock() {
  let now = 0;
  let next = 1;
  const timers = new Map();
  return {
    now: () => now,
    setTimeout: (f, ms) => { const id = next++; timers.set(id, { at: now + ms, f }); return id; },
    clearTimeout: (id) => { timers.delete(id); },
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

function sink(clock) {
  const log = [];
  return { log, now: clock.now, setTimeout: clock.setTimeout, clearTimeout: clock.clearTimeout,
    output: (d) => log.push(['o', d, clock.now()]),
    resize: (s) => log.push(['r', `${s.cols}x${s.rows}`, clock.now()]),
    done: () => log.push(['done', '', clock.now()]) };
}

test('Player plays output and resizes with their timing', () => {
  const clock = fakeClock();
  const s = sink(clock);
  const p = new Player(parseAsciicast(rec).events, s);
  p.play();
  clock.advance(99);
  assert.deepEqual(s.log, []);
  clock.advance(1);
  assert.deepEqual(s.log, [['o', 'hello world\r\n', 100]], 'same-time output merged');
  clock.advance(900);
  assert.deepEqual(s.log.at(-1), ['r', '100x30', 1000], 'input events skipped, resize applied');
  clock.advance(1000);
  assert.deepEqual(s.log.slice(-2), [['o', '\x1b[1mbold\x1b[0m', 2000], ['done', '', 2000]]);
  assert.equal(p.finished, true);
});

test('Player speed changes mid-play without jumping', () => {
  const clock = fakeClock();
  const s = sink(clock);
  const p = new Player(parseAsciicast(rec).events, s);
  p.play();
  clock.advance(1000); // position 1.0 s
  p.setSpeed(10); // the remaining 1.0 s takes 100 ms
  clock.advance(99);
  assert.equal(s.log.at(-1)[0], 'r');
  clock.advance(1);
  assert.equal(s.log.at(-1)[0], 'done');
  assert.equal(s.log.at(-1)[2], 1100);
});

test('Player skipToEnd applies the rest at once, done once', () => {
  const clock = fakeClock();
  const s = sink(clock);
  const p = new Player(parseAsciicast(rec).events, s);
  p.play();
  clock.advance(150);
  p.skipToEnd();
  assert.deepEqual(s.log.map((e) => e[0]), ['o', 'r', 'o', 'done']);
  clock.advance(10000);
  p.skipToEnd();
  assert.equal(s.log.filter((e) => e[0] === 'done').length, 1);
});
