// uicodes.js: error codes the console itself detects (no gateway error
// frame to carry them) and the operator API's token-mint error codes, each
// with the recovery text the terminal page shows. The gateway's codes live
// in codes.js, generated from internal/wire/terminal; these names must not clash
// with them (the node tests check).

/** How long the terminal page waits for ready or an error before giving up. */
export const CONNECT_TIMEOUT_MS = 45000;

/** Codes detected in the browser. */
export const UI_CODES = Object.freeze({
  terminal_ui_connecting_stuck: Object.freeze({
    retryable: true,
    recovery:
      'The terminal did not become ready within 45 seconds and the gateway sent no error. ' +
      'This is a bug or a network path that silently holds the connection: give an operator ' +
      'the correlation id and session id below, then retry.',
  }),
  terminal_token_mint_failed: Object.freeze({
    retryable: true,
    recovery:
      'The console could not get a terminal token from the Drover API. Check that the API is ' +
      'reachable and retry; if it keeps failing, give an operator the correlation id below.',
  }),
  terminal_gateway_upgrade_failed: Object.freeze({
    retryable: true,
    recovery:
      'The browser could not open the terminal WebSocket. A proxy in front of Drover may not ' +
      'pass WebSocket upgrades for /api/v1/terminal; an operator should check the route, then retry.',
  }),
  terminal_gateway_closed: Object.freeze({
    retryable: true,
    recovery:
      'The terminal gateway closed the connection before the terminal was ready, without ' +
      'saying why. Retry; if it persists, give an operator the close code and correlation id.',
  }),
  terminal_ui_no_allocation: Object.freeze({
    retryable: false,
    recovery: 'This page needs ?allocation_id=…; open the terminal from the allocation list.',
  }),
  terminal_connection_lost: Object.freeze({
    retryable: true,
    recovery:
      'The connection to the terminal was lost. The shell on the node has been ended; ' +
      'retry to open a new session.',
  }),
});

/** Error codes of POST /api/v1/allocations/{id}/terminal-token. */
export const MINT_CODES = Object.freeze({
  allocation_not_active: Object.freeze({
    retryable: true,
    recovery:
      'The allocation is not active: it is still being provisioned, has failed, or is being ' +
      'released. Wait until the allocation list shows it active, then retry.',
  }),
  allocation_not_bound: Object.freeze({
    retryable: false,
    recovery:
      'The allocation is not bound to a node yet, so there is nothing to open a terminal on. ' +
      'An operator should check the allocation and its host or instance.',
  }),
  not_found: Object.freeze({
    retryable: false,
    recovery: 'The allocation does not exist. Go back to the allocation list and pick another one.',
  }),
});

/**
 * lookupUICode returns {retryable, recovery} for a console or mint code, or
 * undefined when the code is neither.
 */
export function lookupUICode(code) {
  return Object.hasOwn(UI_CODES, code) ? UI_CODES[code]
    : Object.hasOwn(MINT_CODES, code) ? MINT_CODES[code] : undefined;
}
