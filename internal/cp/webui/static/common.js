// common.js: what every console page shares: the operator token in
// sessionStorage, calls to the operator API with it, the API's error
// envelope, and small DOM helpers that never parse HTML.

const TOKEN_KEY = 'drover.operator_token';
const LOGIN_MESSAGE_KEY = 'drover.login_message';
const LOGIN_NEXT_KEY = 'drover.login_next';

/** getToken returns the operator token of this tab, or "". */
export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

/** setToken stores the operator token for this tab only. */
export function setToken(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
}

/** clearToken forgets the operator token. */
export function clearToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** APIError is a failed API call, read from the error envelope. */
export class APIError extends Error {
  constructor({ status, code, message, correlationId = '', retryable = false, fields = [] }) {
    super(message);
    this.name = 'APIError';
    this.status = status; // 0: no HTTP response (network error, abort)
    this.code = code;
    this.correlationId = correlationId;
    this.retryable = retryable;
    this.fields = fields;
  }
}

/** newCorrelationID returns a fresh X-Correlation-ID value. */
export function newCorrelationID() {
  const b = new Uint8Array(12);
  crypto.getRandomValues(b);
  return 'cid_ui_' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

/**
 * request calls the operator API with the tab's bearer token and a fresh
 * correlation id. It resolves to {data, correlationId, status}: data is the
 * parsed JSON body (or the text with opts.text). Any non-2xx answer rejects
 * with an APIError from the error envelope; so does a network failure
 * (status 0, code "network_error").
 */
export async function request(method, path, opts = {}) {
  const cid = newCorrelationID();
  const headers = { 'X-Correlation-ID': cid, Accept: opts.text ? '*/*' : 'application/json' };
  const token = getToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  let body;
  if (opts.body !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(opts.body);
  }
  let resp;
  try {
    resp = await fetch(path, {
      method, headers, body, signal: opts.signal, credentials: 'same-origin', cache: 'no-store',
    });
  } catch (e) {
    throw new APIError({
      status: 0, code: 'network_error', message: `${method} ${path}: ${e.message}`,
      correlationId: cid, retryable: true,
    });
  }
  const correlationId = resp.headers.get('X-Correlation-ID') || cid;
  const text = await resp.text();
  if (!resp.ok) throw errorFromResponse(resp.status, resp.statusText, text, correlationId);
  if (opts.text) return { data: text, correlationId, status: resp.status };
  let data = null;
  if (text !== '') {
    try {
      data = JSON.parse(text);
    } catch (e) {
      throw new APIError({
        status: resp.status, code: 'invalid_response', message: `${method} ${path}: ${e.message}`, correlationId,
      });
    }
  }
  return { data, correlationId, status: resp.status };
}

/** errorFromResponse reads the {"error": {...}} envelope, or makes one up. */
export function errorFromResponse(status, statusText, text, correlationId) {
  let env = null;
  try {
    env = JSON.parse(text).error;
  } catch {
    env = null;
  }
  if (env && typeof env === 'object' && typeof env.code === 'string') {
    return new APIError({
      status,
      code: env.code,
      message: typeof env.message === 'string' ? env.message : '',
      correlationId: env.correlation_id || correlationId,
      retryable: env.retryable === true || status === 429 || status >= 500,
      fields: Array.isArray(env.fields) ? env.fields : [],
    });
  }
  return new APIError({
    status,
    code: `http_${status}`,
    message: `${status} ${statusText}${text ? ': ' + text.slice(0, 200) : ''}`,
    correlationId,
    retryable: status === 429 || status >= 500,
  });
}

/**
 * toLogin sends the browser to the login form with message, remembering the
 * current page so login can return to it.
 */
export function toLogin(message) {
  clearToken();
  sessionStorage.setItem(LOGIN_MESSAGE_KEY, message);
  const here = location.pathname.split('/').pop() + location.search;
  sessionStorage.setItem(LOGIN_NEXT_KEY, here);
  location.assign('index.html');
}

/** takeLoginMessage returns and forgets the message toLogin left. */
export function takeLoginMessage() {
  const m = sessionStorage.getItem(LOGIN_MESSAGE_KEY) || '';
  sessionStorage.removeItem(LOGIN_MESSAGE_KEY);
  return m;
}

/**
 * takeLoginNext returns and forgets the page toLogin came from, if it is
 * one of the console's own pages (never another origin or path).
 */
export function takeLoginNext() {
  const n = sessionStorage.getItem(LOGIN_NEXT_KEY) || '';
  sessionStorage.removeItem(LOGIN_NEXT_KEY);
  return /^(terminal|sessions|replay)\.html\?[A-Za-z0-9_=&%.-]*$/.test(n) ? n : '';
}

/** describeError formats an error for a message line. */
export function describeError(e) {
  if (e instanceof APIError) {
    return `${e.code}: ${e.message}${e.correlationId ? ` (correlation id ${e.correlationId})` : ''}`;
  }
  return String(e && e.message ? e.message : e);
}

/**
 * h creates an element. attrs: "text" sets textContent, "class" the class
 * name, "hidden"/"disabled" booleans, anything else an attribute (null and
 * undefined skipped). children: nodes or strings (as text).
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === 'text') el.textContent = String(v);
    else if (k === 'class') el.className = v;
    else if (k === 'hidden' || k === 'disabled') el[k] = !!v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** byId returns the element with id, throwing if the page lacks it. */
export function byId(id) {
  const el = document.getElementById(id);
  if (!el) throw new Error(`page has no #${id}`);
  return el;
}

/** showText sets el's text and shows it, or hides it for "". */
export function showText(el, text) {
  el.textContent = text;
  el.hidden = text === '';
}

/** fmtTime formats an RFC 3339 time for people; "" for none. */
export function fmtTime(s) {
  if (!s) return '';
  const d = new Date(s);
  return Number.isNaN(d.getTime()) ? String(s) : d.toLocaleString();
}

/** param returns query parameter name of the page URL, or "". */
export function param(name) {
  return new URLSearchParams(location.search).get(name) || '';
}

/** enc percent-encodes one path segment or query value. */
export const enc = encodeURIComponent;
