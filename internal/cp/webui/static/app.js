// app.js: the console's home page: log in with an operator token, list
// allocations with their terminal and session links, create allocations.
import {
  APIError, byId, clearToken, describeError, enc, getToken, h, request, setToken, showText,
  takeLoginMessage, takeLoginNext,
} from './common.js';

const POLL_MS = 5000;
const TRANSITIONAL = new Set(['provisioning', 'releasing']);

const ui = {
  login: byId('login'),
  loginForm: byId('login-form'),
  loginToken: byId('login-token'),
  loginError: byId('login-error'),
  logout: byId('logout'),
  app: byId('app'),
  refresh: byId('alloc-refresh'),
  status: byId('alloc-status'),
  rows: byId('alloc-rows'),
  empty: byId('alloc-empty'),
  allocError: byId('alloc-error'),
  createForm: byId('create-form'),
  createUser: byId('create-username'),
  createHost: byId('create-host-id'),
  createInstance: byId('create-instance-id'),
  createKeys: byId('create-ssh-key'),
  createError: byId('create-error'),
  createResult: byId('create-result'),
  hostList: byId('create-host-list'),
  instanceList: byId('create-instance-list'),
};

let pollTimer = null;

/** showLogin shows the login form with message (may be ""). */
function showLogin(message) {
  stopPolling();
  clearToken();
  ui.app.hidden = true;
  ui.logout.hidden = true;
  ui.login.hidden = false;
  showText(ui.loginError, message);
  ui.loginToken.value = '';
  ui.loginToken.focus();
}

/** handleAuth returns true (after showing the login form) for a 401. */
function handleAuth(e) {
  if (e instanceof APIError && e.status === 401) {
    showLogin(`${e.message || 'The operator token was refused.'} (${e.code})`);
    return true;
  }
  return false;
}

function stopPolling() {
  if (pollTimer !== null) clearTimeout(pollTimer);
  pollTimer = null;
}

function allocRow(a) {
  const active = a.state === 'active';
  const open = h('button', {
    type: 'button', class: 'open-terminal', disabled: !active,
    title: active ? null : `Terminals open only on active allocations (this one is ${a.state}).`,
    text: 'Open terminal',
  });
  open.addEventListener('click', () => {
    location.assign(`terminal.html?allocation_id=${enc(a.id)}`);
  });
  const state = h('td', { class: 'alloc-state' },
    h('span', { class: `badge state-${a.state}`, text: a.state }),
    a.state_reason ? h('span', { class: 'hint alloc-state-reason', text: ` ${a.state_reason}` }) : null);
  return h('tr', { 'data-alloc-id': a.id, 'data-state': a.state },
    h('td', { class: 'alloc-id' }, h('code', { text: a.id })),
    h('td', { class: 'alloc-kind', text: a.kind }),
    h('td', { class: 'alloc-username', text: a.username }),
    h('td', { class: 'alloc-host', text: a.host_id || '' }),
    h('td', { class: 'alloc-instance', text: a.instance_id || '' }),
    state,
    h('td', { class: 'actions' }, open, ' ',
      h('a', { class: 'sessions-link', href: `sessions.html?allocation_id=${enc(a.id)}`, text: 'Sessions' })));
}

/** loadAllocations lists allocations; it reports whether the token worked. */
async function loadAllocations() {
  stopPolling();
  ui.status.textContent = 'Loading…';
  try {
    const { data } = await request('GET', '/api/v1/allocations');
    const list = Array.isArray(data) ? data : [];
    ui.rows.replaceChildren(...list.map(allocRow));
    ui.empty.hidden = list.length > 0;
    showText(ui.allocError, '');
    ui.status.textContent = `Updated ${new Date().toLocaleTimeString()}`;
    if (list.some((a) => TRANSITIONAL.has(a.state))) {
      pollTimer = setTimeout(loadAllocations, POLL_MS);
    }
    return true;
  } catch (e) {
    ui.status.textContent = '';
    if (handleAuth(e)) return false;
    showText(ui.allocError, `Could not list allocations: ${describeError(e)}`);
    return true;
  }
}

/** loadTargets fills the create form's suggestions; failures only log. */
async function loadTargets() {
  const fill = async (path, list, idField) => {
    try {
      const { data } = await request('GET', path);
      const items = Array.isArray(data) ? data : [];
      list.replaceChildren(...items.map((x) => h('option', { value: x[idField] })));
    } catch (e) {
      console.warn(`suggestions from ${path}:`, describeError(e));
    }
  };
  await Promise.all([
    fill('/api/v1/hosts', ui.hostList, 'host_id'),
    fill('/api/v1/instances', ui.instanceList, 'instance_id'),
  ]);
}

async function enterApp() {
  ui.login.hidden = true;
  showText(ui.loginError, '');
  if (!(await loadAllocations())) return;
  const next = takeLoginNext();
  if (next) {
    location.assign(next);
    return;
  }
  ui.app.hidden = false;
  ui.logout.hidden = false;
  loadTargets();
}

ui.loginForm.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const token = ui.loginToken.value.trim();
  if (!token) {
    showText(ui.loginError, 'Enter an operator token.');
    return;
  }
  setToken(token);
  await enterApp();
});

ui.logout.addEventListener('click', () => showLogin(''));
ui.refresh.addEventListener('click', () => loadAllocations());

ui.createForm.addEventListener('submit', async (ev) => {
  ev.preventDefault();
  showText(ui.createError, '');
  showText(ui.createResult, '');
  const host = ui.createHost.value.trim();
  const instance = ui.createInstance.value.trim();
  if ((host === '') === (instance === '')) {
    showText(ui.createError, 'Give either a host ID or an instance ID, not both.');
    return;
  }
  const body = { username: ui.createUser.value.trim() };
  if (host) body.host_id = host;
  if (instance) body.instance_id = instance;
  const keys = ui.createKeys.value.split('\n').map((k) => k.trim()).filter((k) => k !== '');
  if (keys.length > 0) body.ssh_authorized_keys = keys;
  try {
    const { data } = await request('POST', '/api/v1/allocations', { body });
    showText(ui.createResult, `Created allocation ${data.id} (${data.state}).`);
    ui.createForm.reset();
    await loadAllocations();
  } catch (e) {
    if (handleAuth(e)) return;
    const fields = e instanceof APIError && e.fields.length > 0
      ? ' ' + e.fields.map((f) => `${f.field}: ${f.message}`).join('; ') : '';
    showText(ui.createError, `Could not create the allocation: ${describeError(e)}${fields}`);
  }
});

// Start: with a token from earlier in this tab go straight in, else ask.
const message = takeLoginMessage();
if (getToken() && !message) {
  enterApp();
} else {
  showLogin(message);
}
