// protocol.js: the browser side of drover.terminal.v1 (see
// internal/wire/terminal): frames, control messages, subprotocols, the resize
// gate and the output queue. No DOM and no globals beyond TextEncoder and
// TextDecoder, and timers are injected, so node tests it directly.
import {
  CHANNELS, ERROR_CODES, MAX_COLS, MAX_ROWS, PROGRESS, SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX,
} from './codes.js';

/** ProtocolError: a frame or message the console cannot accept. */
export class ProtocolError extends Error {
  constructor(message) {
    super(message);
    this.name = 'ProtocolError';
  }
}

const validChannels = new Set(Object.values(CHANNELS));

/** encodeFrame returns a frame: the channel byte, then payload (Uint8Array). */
export function encodeFrame(channel, payload) {
  const out = new Uint8Array(1 + payload.length);
  out[0] = channel;
  out.set(payload, 1);
  return out;
}

/** encodeJSONFrame returns a frame whose payload is obj as JSON. */
export function encodeJSONFrame(channel, obj) {
  return encodeFrame(channel, new TextEncoder().encode(JSON.stringify(obj)));
}

/**
 * decodeFrame splits a binary message (ArrayBuffer or Uint8Array) into
 * {channel, payload}; payload aliases the message. It throws ProtocolError
 * for an empty message or an unknown channel.
 */
export function decodeFrame(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(data);
  if (bytes.length === 0) throw new ProtocolError('empty frame');
  if (!validChannels.has(bytes[0])) throw new ProtocolError(`unknown channel ${bytes[0]}`);
  return { channel: bytes[0], payload: bytes.subarray(1) };
}

/**
 * parseControl parses and validates a control payload (Uint8Array) and
 * returns the message object. Like the gateway it is strict about types,
 * progress values and required fields; an error message with a code this
 * version does not know is accepted (shown with the generic recovery text),
 * since hiding a newer gateway's reason would help nobody.
 */
export function parseControl(payload) {
  let msg;
  try {
    msg = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(payload));
  } catch (e) {
    throw new ProtocolError(`control message: ${e.message}`);
  }
  if (msg === null || typeof msg !== 'object' || Array.isArray(msg)) {
    throw new ProtocolError('control message is not an object');
  }
  switch (msg.type) {
    case 'status':
      if (!PROGRESS.includes(msg.state)) throw new ProtocolError(`unknown status state ${JSON.stringify(msg.state)}`);
      return { type: 'status', state: msg.state };
    case 'ready':
      if (typeof msg.session_id !== 'string' || msg.session_id === '') {
        throw new ProtocolError('ready message without session_id');
      }
      return { type: 'ready', session_id: msg.session_id };
    case 'exit':
      if (!Number.isInteger(msg.code)) throw new ProtocolError('exit message without an integer code');
      return { type: 'exit', code: msg.code };
    case 'error': {
      if (typeof msg.code !== 'string' || msg.code === '') {
        throw new ProtocolError('error message without a string code');
      }
      const known = Object.hasOwn(ERROR_CODES, msg.code);
      const retryable = typeof msg.retryable === 'boolean' ? msg.retryable
        : known && ERROR_CODES[msg.code].retryable;
      return {
        type: 'error', code: msg.code, message: typeof msg.message === 'string' ? msg.message : '', retryable,
      };
    }
    case 'ping':
    case 'pong':
      return { type: msg.type };
    default:
      throw new ProtocolError(`unknown control type ${JSON.stringify(msg.type)}`);
  }
}

const tchar = /^[0-9A-Za-z!#$%&'*+\-.^_`|~]+$/;

/**
 * clientProtocols returns the subprotocols to offer for token:
 * [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token]. It throws ProtocolError
 * when the token is not a valid subprotocol suffix (RFC 7230 tchars).
 */
export function clientProtocols(token) {
  if (typeof token !== 'string' || !tchar.test(token)) {
    throw new ProtocolError('terminal token is empty or not a valid subprotocol name');
  }
  return [SUBPROTOCOL, TOKEN_SUBPROTOCOL_PREFIX + token];
}

/**
 * terminalURL turns the token's url (a path such as
 * "/api/v1/terminal?allocation_id=...") into a ws: or wss: URL on the
 * page's origin (base is location.href). An absolute http(s) URL keeps its
 * host and has its scheme mapped.
 */
export function terminalURL(base, url) {
  const u = new URL(url, base);
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  else if (u.protocol !== 'ws:' && u.protocol !== 'wss:') {
    throw new ProtocolError(`terminal url has scheme ${u.protocol}`);
  }
  return u.toString();
}

/**
 * clampSize returns {cols, rows} as integers bounded to 1..MAX_COLS and
 * 1..MAX_ROWS, or null for a missing or zero dimension (a hidden element
 * measures zero; the gateway refuses it).
 */
export function clampSize(size) {
  if (!size) return null;
  const cols = Math.floor(Number(size.cols));
  const rows = Math.floor(Number(size.rows));
  if (!(cols >= 1) || !(rows >= 1)) return null;
  return { cols: Math.min(cols, MAX_COLS), rows: Math.min(rows, MAX_ROWS) };
}

function sameSize(a, b) {
  return !!a && !!b && a.cols === b.cols && a.rows === b.rows;
}

/**
 * ResizeGate decides which sizes reach the gateway. It starts held (no
 * resize may be sent before ready) and keeps only the latest size. open()
 * ends the hold, telling it the size the PTY started with, and sends the
 * latest size at once if it differs. After that, sizes are debounced:
 * delayMs after the last change the latest size is sent, unless it equals
 * the last one sent.
 */
export class ResizeGate {
  /**
   * @param {(size: {cols: number, rows: number}) => void} send
   * @param {{delayMs?: number, setTimeout?: Function, clearTimeout?: Function}} [opts]
   */
  constructor(send, opts = {}) {
    this._send = send;
    this._delay = opts.delayMs ?? 100;
    this._setTimeout = opts.setTimeout ?? ((f, ms) => setTimeout(f, ms));
    this._clearTimeout = opts.clearTimeout ?? ((id) => clearTimeout(id));
    this._held = true;
    this._stopped = false;
    this._latest = null;
    this._sent = null;
    this._timer = null;
  }

  /** set records size as the latest; it is sent later, never synchronously. */
  set(size) {
    const s = clampSize(size);
    if (!s || this._stopped) return;
    this._latest = s;
    if (this._held) return;
    if (this._timer !== null) this._clearTimeout(this._timer);
    this._timer = this._setTimeout(() => {
      this._timer = null;
      this._flush();
    }, this._delay);
  }

  /** open ends the hold; ptySize is the size the PTY has now. */
  open(ptySize) {
    if (this._stopped) return;
    this._held = false;
    this._sent = clampSize(ptySize);
    this._flush();
  }

  /** stop drops everything; later calls send nothing. */
  stop() {
    this._stopped = true;
    if (this._timer !== null) this._clearTimeout(this._timer);
    this._timer = null;
  }

  _flush() {
    if (this._stopped || this._held || !this._latest || sameSize(this._latest, this._sent)) return;
    this._sent = this._latest;
    this._send(this._latest);
  }
}

/**
 * OutputQueue feeds terminal output to xterm without ever dropping it.
 * write(chunk, done) is term.write: xterm calls done once it has parsed the
 * chunk. pending counts bytes handed to xterm and not yet parsed; above
 * high the queue keeps chunks itself and hands them over again once
 * pending falls below low. This keeps xterm's own buffer small (xterm
 * discards input past ~50 MB) but cannot slow the sender: a browser
 * WebSocket has no way to stop reading, so the only backpressure on the
 * node is TCP's, and a flood grows this queue. onBacklog(true|false) tells
 * the page when output is being held back.
 */
export class OutputQueue {
  /**
   * @param {(chunk: Uint8Array|string, done: () => void) => void} write
   * @param {{high?: number, low?: number, onBacklog?: (backlogged: boolean) => void}} [opts]
   */
  constructor(write, opts = {}) {
    this._write = write;
    this._high = opts.high ?? 1 << 20;
    this._low = opts.low ?? 256 << 10;
    this._onBacklog = opts.onBacklog ?? (() => {});
    this._pending = 0;
    this._queue = []; // [chunk, callback]
    this._queuedBytes = 0;
    this._backlogged = false;
  }

  /** pending is the number of bytes xterm has not parsed yet. */
  get pending() { return this._pending; }

  /** queued is the number of bytes held back in this queue. */
  get queued() { return this._queuedBytes; }

  /** push writes chunk after everything before it; cb runs once xterm parsed it. */
  push(chunk, cb) {
    if (this._queue.length === 0 && this._pending < this._high) {
      this._hand(chunk, cb);
      return;
    }
    this._queue.push([chunk, cb]);
    this._queuedBytes += chunk.length;
    this._setBacklog(true);
  }

  _hand(chunk, cb) {
    const n = chunk.length;
    this._pending += n;
    this._write(chunk, () => {
      this._pending -= n;
      if (cb) cb();
      this._drain();
    });
  }

  _drain() {
    while (this._queue.length > 0 && this._pending < this._low) {
      const [chunk, cb] = this._queue.shift();
      this._queuedBytes -= chunk.length;
      this._hand(chunk, cb);
    }
    if (this._queue.length === 0) this._setBacklog(false);
  }

  _setBacklog(b) {
    if (b === this._backlogged) return;
    this._backlogged = b;
    this._onBacklog(b);
  }
}
