// asciicast.js: parsing and timed playback of asciicast v2 recordings, the
// format internal/wire/terminal's Recorder writes. No DOM; timers and the clock
// are injected, so node tests it directly.

/**
 * parseAsciicast parses an asciicast v2 recording: a JSON header line, then
 * one [time, type, data] JSON array per line. It returns {header, events}
 * with events as {t, type, data}, sorted as recorded. Blank lines are
 * skipped; anything else malformed throws an Error naming the line.
 */
export function parseAsciicast(text) {
  const lines = text.split('\n');
  let header = null;
  const events = [];
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (line === '') return;
    let v;
    try {
      v = JSON.parse(line);
    } catch (e) {
      throw new Error(`recording line ${i + 1}: ${e.message}`);
    }
    if (header === null) {
      if (v === null || typeof v !== 'object' || Array.isArray(v) || v.version !== 2) {
        throw new Error(`recording line ${i + 1}: not an asciicast v2 header`);
      }
      if (!Number.isInteger(v.width) || v.width < 1 || !Number.isInteger(v.height) || v.height < 1) {
        throw new Error(`recording line ${i + 1}: header without a valid width and height`);
      }
      header = v;
      return;
    }
    if (!Array.isArray(v) || v.length < 3 || typeof v[0] !== 'number' || !(v[0] >= 0) ||
        typeof v[1] !== 'string' || typeof v[2] !== 'string') {
      throw new Error(`recording line ${i + 1}: not an asciicast event`);
    }
    events.push({ t: v[0], type: v[1], data: v[2] });
  });
  if (header === null) throw new Error('recording is empty');
  return { header, events };
}

/** parseSize parses a resize event's data, "COLSxROWS"; null if malformed. */
export function parseSize(s) {
  const m = /^(\d{1,4})x(\d{1,4})$/.exec(s);
  if (!m) return null;
  const cols = Number(m[1]);
  const rows = Number(m[2]);
  return cols > 0 && rows > 0 ? { cols, rows } : null;
}

/**
 * compressIdle returns events with every gap between consecutive events
 * capped at limit seconds (asciinema's idle_time_limit); limit <= 0 or not
 * a number leaves them as they are.
 */
export function compressIdle(events, limit) {
  if (!(limit > 0)) return events;
  let shift = 0;
  let prev = 0;
  return events.map((e) => {
    const gap = e.t - prev;
    if (gap > limit) shift += gap - limit;
    prev = e.t;
    return { ...e, t: e.t - shift };
  });
}

/**
 * Player plays events in time: output(data) for "o" events, resize({cols,
 * rows}) for "r" events ("i" input events and unknown types are skipped),
 * then done() once, after the last event. Speed may change while playing;
 * skipToEnd applies everything left at once.
 */
export class Player {
  /**
   * @param {{t: number, type: string, data: string}[]} events
   * @param {{output: Function, resize: Function, done: Function,
   *          now?: () => number, setTimeout?: Function, clearTimeout?: Function}} sink
   */
  constructor(events, sink) {
    this._events = events;
    this._sink = sink;
    this._now = sink.now ?? (() => performance.now());
    this._setTimeout = sink.setTimeout ?? ((f, ms) => setTimeout(f, ms));
    this._clearTimeout = sink.clearTimeout ?? ((id) => clearTimeout(id));
    this._i = 0;
    this._speed = 1;
    this._baseT = 0; // recording time (s) at _baseWall
    this._baseWall = 0; // wall clock (ms)
    this._timer = null;
    this._playing = false;
    this._finished = false;
  }

  /** position is the recording time reached, in seconds. */
  get position() {
    if (!this._playing) return this._baseT;
    return this._baseT + ((this._now() - this._baseWall) * this._speed) / 1000;
  }

  get finished() { return this._finished; }

  /** play starts (or resumes) playback at the current position. */
  play() {
    if (this._playing || this._finished) return;
    this._playing = true;
    this._baseWall = this._now();
    this._tick();
  }

  /** setSpeed changes the speed (1 = real time) without jumping. */
  setSpeed(speed) {
    if (!(speed > 0)) return;
    this._baseT = this.position;
    this._baseWall = this._now();
    this._speed = speed;
    if (this._playing) {
      this._cancel();
      this._tick();
    }
  }

  /** skipToEnd applies every remaining event now and finishes. */
  skipToEnd() {
    this._cancel();
    this._applyUntil(Infinity);
    this._finish();
  }

  /** stop cancels playback; done is not called. */
  stop() {
    this._cancel();
    this._playing = false;
    this._finished = true;
  }

  _tick() {
    this._timer = null;
    this._applyUntil(this.position);
    if (this._i >= this._events.length) {
      this._finish();
      return;
    }
    const wait = ((this._events[this._i].t - this.position) * 1000) / this._speed;
    this._timer = this._setTimeout(() => this._tick(), Math.max(0, wait));
  }

  // _applyUntil applies events due at or before t, merging consecutive
  // output into one write.
  _applyUntil(t) {
    let out = '';
    while (this._i < this._events.length && this._events[this._i].t <= t) {
      const e = this._events[this._i++];
      if (e.type === 'o') {
        out += e.data;
      } else if (e.type === 'r') {
        const size = parseSize(e.data);
        if (size) {
          if (out) this._sink.output(out);
          out = '';
          this._sink.resize(size);
        }
      }
    }
    if (out) this._sink.output(out);
  }

  _finish() {
    if (this._finished) return;
    this._finished = true;
    this._playing = false;
    this._sink.done();
  }

  _cancel() {
    if (this._timer !== null) this._clearTimeout(this._timer);
    this._timer = null;
  }
}
