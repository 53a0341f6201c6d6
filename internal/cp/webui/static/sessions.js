// sessions.js: the terminal sessions of one allocation
// (sessions.html?allocation_id=...), newest first, with each session's
// readiness timeline, outcome and a link to its recording.
import {
  APIError, byId, describeError, enc, fmtTime, getToken, h, param, request, showText, toLogin,
} from './common.js';

const ui = {
  alloc: byId('sessions-alloc'),
  openTerminal: byId('sessions-open-terminal'),
  refresh: byId('sessions-refresh'),
  status: byId('sessions-status'),
  error: byId('sessions-error'),
  rows: byId('sessions-rows'),
  empty: byId('sessions-empty'),
};

const allocationId = param('allocation_id');

function timeline(states) {
  const ol = h('ol', { class: 'timeline' });
  for (const s of Array.isArray(states) ? states : []) {
    ol.append(h('li', { 'data-state': s.state, 'data-elapsed-ms': s.elapsed_ms, title: fmtTime(s.at) },
      h('span', { class: 'hop', text: s.state }),
      h('span', { class: 'elapsed', text: ` ${s.elapsed_ms} ms` }),
      s.detail ? h('span', { class: 'hint', text: ` ${s.detail}` }) : null));
  }
  return ol;
}

function sessionRow(s) {
  const hasRecording = !!s.recording_url || s.recording_bytes > 0;
  const error = s.error_code
    ? h('span', {}, h('code', { text: s.error_code }), s.error_message ? h('span', { class: 'hint', text: ` ${s.error_message}` }) : null)
    : (s.close_reason ? h('span', { class: 'hint', text: s.close_reason }) : '');
  return h('tr', { 'data-session-id': s.id, 'data-state': s.state },
    h('td', { class: 'session-id' }, h('code', { text: s.id }),
      s.correlation_id ? h('div', { class: 'hint', text: `cid ${s.correlation_id}` }) : null),
    h('td', { class: 'session-state' }, h('span', { class: `badge state-${s.state}`, text: s.state })),
    h('td', { class: 'session-error' }, error),
    h('td', { class: 'session-created', title: s.created_at, text: fmtTime(s.created_at) }),
    h('td', { class: 'session-closed', title: s.closed_at || null, text: fmtTime(s.closed_at) }),
    h('td', { class: 'session-exit-code', text: s.exit_code === null || s.exit_code === undefined ? '' : s.exit_code }),
    h('td', { class: 'session-timeline' }, timeline(s.states)),
    h('td', { class: 'session-replay' }, hasRecording
      ? h('a', { class: 'replay-link', href: `replay.html?session_id=${enc(s.id)}`, text: 'Replay' })
      : h('span', { class: 'hint', text: 'no recording' })));
}

async function load() {
  ui.status.textContent = 'Loading…';
  try {
    const { data } = await request('GET', `/api/v1/allocations/${enc(allocationId)}/sessions`);
    const list = Array.isArray(data) ? data : [];
    ui.rows.replaceChildren(...list.map(sessionRow));
    ui.empty.hidden = list.length > 0;
    showText(ui.error, '');
    ui.status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    ui.status.textContent = '';
    if (e instanceof APIError && e.status === 401) {
      toLogin(`${e.message || 'The operator token was refused.'} (${e.code})`);
      return;
    }
    showText(ui.error, `Could not list sessions: ${describeError(e)}`);
  }
}

ui.alloc.textContent = allocationId;
ui.openTerminal.href = `terminal.html?allocation_id=${enc(allocationId)}`;
ui.refresh.addEventListener('click', load);
if (!getToken()) {
  toLogin('Log in to see terminal sessions.');
} else if (!allocationId) {
  showText(ui.error, 'This page needs ?allocation_id=…; open it from the allocation list.');
} else {
  load();
}
