// replay.js: plays a terminal session's asciicast v2 recording
// (replay.html?session_id=...) in xterm at the recorded size, with the
// recorded timing at 1x, 2x or 10x, resizes included. #replay-state is
// loading, playing, done or failed.
import { Terminal } from './vendor/xterm.mjs';
import { Player, compressIdle, parseAsciicast } from './asciicast.js';
import {
  APIError, byId, describeError, enc, errorFromResponse, fmtTime, getToken, param, request, showText, toLogin,
} from './common.js';

// The dashboard (internal/cp/dashboard, /ui/sessions/{sid}/replay) serves
// this module on its own page: <body data-recording-url> is the dashboard's
// route to the recording (the session cookie stands in for the bearer
// token) and data-meta the session as the API shows it.
const dash = document.body.dataset.recordingUrl ? {
  recordingUrl: document.body.dataset.recordingUrl,
  sessionId: document.body.dataset.sessionId || '',
  meta: (() => {
    try {
      return JSON.parse(document.body.dataset.meta || 'null');
    } catch {
      return null;
    }
  })(),
} : null;

/** dashLoad fetches the recording through the dashboard. */
async function dashLoad() {
  const resp = await fetch(dash.recordingUrl, { credentials: 'same-origin', cache: 'no-store', redirect: 'error' });
  const text = await resp.text();
  if (!resp.ok) throw errorFromResponse(resp.status, resp.statusText, text, resp.headers.get('X-Correlation-ID') || '');
  return [dash.meta, text];
}

const ui = {
  back: byId('replay-back'),
  session: byId('replay-session'),
  state: byId('replay-state'),
  speed: byId('replay-speed'),
  skip: byId('replay-skip'),
  restart: byId('replay-restart'),
  info: byId('replay-info'),
  error: byId('replay-error'),
  container: byId('replay-container'),
};

const sessionId = dash ? dash.sessionId : param('session_id');
let state = 'loading';
let term = null;
let player = null;
let recording = null;

function setState(s) {
  state = s;
  ui.state.textContent = s;
  ui.state.dataset.state = s;
}

function failed(message) {
  setState('failed');
  showText(ui.error, message);
  ui.skip.disabled = true;
}

function start() {
  if (player) player.stop();
  const { header, events } = recording;
  term.reset();
  term.resize(header.width, header.height);
  setState('playing');
  ui.skip.disabled = false;
  ui.restart.disabled = false;
  player = new Player(compressIdle(events, header.idle_time_limit), {
    output: (data) => term.write(data),
    resize: ({ cols, rows }) => term.resize(cols, rows),
    // Wait for xterm to parse what was written, so "done" means drawn.
    done: () => term.write('', () => {
      setState('done');
      ui.skip.disabled = true;
    }),
  });
  player.setSpeed(Number(ui.speed.value));
  player.play();
}

async function load() {
  let meta;
  let text;
  try {
    [meta, text] = dash ? await dashLoad() : await Promise.all([
      request('GET', `/api/v1/terminal-sessions/${enc(sessionId)}`).then((r) => r.data),
      request('GET', `/api/v1/terminal-sessions/${enc(sessionId)}/recording`, { text: true }).then((r) => r.data),
    ]);
  } catch (e) {
    if (e instanceof APIError && e.status === 401) {
      if (dash) location.assign('/ui/login');
      else toLogin(`${e.message || 'The operator token was refused.'} (${e.code})`);
      return;
    }
    failed(`Could not load the recording: ${describeError(e)}`);
    return;
  }
  try {
    recording = parseAsciicast(text);
  } catch (e) {
    failed(`The recording is not valid asciicast v2: ${e.message}`);
    return;
  }
  const { header, events } = recording;
  if (!dash && meta && meta.allocation_id) {
    ui.back.href = `sessions.html?allocation_id=${enc(meta.allocation_id)}`;
  }
  const last = events.length > 0 ? events[events.length - 1].t : 0;
  ui.info.textContent = [
    meta && meta.username ? `user ${meta.username}` : '',
    meta && meta.mode ? `mode ${meta.mode}` : '',
    meta && meta.created_at ? `started ${fmtTime(meta.created_at)}` : '',
    `${header.width}×${header.height}`,
    `${events.length} events`,
    `${last.toFixed(1)} s`,
    meta && meta.exit_code !== undefined && meta.exit_code !== null ? `exit code ${meta.exit_code}` : '',
    meta && meta.error_code ? `error ${meta.error_code}` : '',
  ].filter((x) => x !== '').join(' · ');
  term = new Terminal({
    cols: header.width,
    rows: header.height,
    scrollback: 5000,
    disableStdin: true,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace',
    fontSize: 14,
  });
  term.open(ui.container);
  start();
}

ui.speed.addEventListener('change', () => { if (player) player.setSpeed(Number(ui.speed.value)); });
ui.skip.addEventListener('click', () => { if (player) player.skipToEnd(); });
ui.restart.addEventListener('click', () => { if (recording) start(); });

/** droverReplay is the page's test hook. */
window.droverReplay = {
  term: () => term,
  state: () => state,
  events: () => (recording ? recording.events.length : 0),
};

ui.session.textContent = sessionId;
if (!dash) document.title = `Replay ${sessionId} · Drover console`;
if (!dash && !getToken()) {
  toLogin('Log in to replay a terminal session.');
} else if (!sessionId) {
  failed('This page needs ?session_id=…; open it from a sessions list.');
} else {
  load();
}
