// Checks of what the caller passes (the URL: _url.ts).
import { GRACE_MS } from "./_clock.ts";
import type { PgLocksOptions } from "./types.ts";

/** Every option of pgLocks, with its default. */
const DEFAULTS = {
  schema: "public",
  keepalivesIdle: 10,
  keepalivesInterval: 3,
  keepalivesCount: 3,
  tcpUserTimeout: 15_000,
  heartbeatInterval: 2_000,
  heartbeatTimeout: 5_000,
  connectTimeout: 10_000,
  maxIdleSessions: 2,
  idleSessionTimeout: 0,
};

/**
 * A schema or role name, or a TypeError: at most 63 bytes, since the
 * server truncates (two schemas equal in their first 63 bytes would be one
 * table with two keys per name: two holders); no control character, which
 * could end a line of `pgSetupSql`'s SQL.
 */
export function checkIdentifier(
  value: unknown,
  what: string,
  action: string,
): string {
  if (
    typeof value !== "string" || value === "" ||
    new TextEncoder().encode(value).length > 63 ||
    // deno-lint-ignore no-control-regex
    /[\u0000-\u001f\u007f]/.test(value)
  ) {
    throw new TypeError(
      `Cannot ${action} as '${what}' must be a name of 1 to 63 bytes in UTF-8 without control characters: current value is ${
        shown(value, JSON.stringify)
      }`,
    );
  }
  return value;
}

/**
 * A lone UTF-16 surrogate: the client sends it as U+FFFD, so "a\ud800"
 * and "a\udbff" would be one lock.
 */
export const LONE_SURROGATE =
  /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** A valid lock name, or a TypeError naming the action. */
export function checkName(name: unknown, action: string): string {
  if (
    typeof name !== "string" || name === "" || name.length > 1024 ||
    name.includes("\0") || LONE_SURROGATE.test(name)
  ) {
    throw new TypeError(
      `Cannot ${action} as 'name' must be a string of 1 to 1024 characters without NUL or a lone UTF-16 surrogate: current value is ${
        shown(name, JSON.stringify)
      }`,
    );
  }
  return name;
}

/** A valid timeout in ms, or a RangeError. */
export function checkTimeout(timeout: unknown): number {
  const value = timeout ?? 0;
  if (typeof value !== "number" || Number.isNaN(value) || value < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(value)
      }`,
    );
  }
  return value;
}

/** Checks scan()'s and watch()'s `prefix` (`""`, the default, is all). */
export function checkPrefix(prefix: unknown, action: string): string {
  const value = prefix ?? "";
  if (
    typeof value !== "string" || value.length > 1024 ||
    value.includes("\0") || LONE_SURROGATE.test(value)
  ) {
    throw new TypeError(
      `Cannot ${action} as 'prefix' must be a string of at most 1024 characters without NUL or a lone UTF-16 surrogate: current value is ${
        shown(value)
      }`,
    );
  }
  return value;
}

/** Checks scan()'s and watch()'s `options`: undefined or an object. */
export function checkOptionsObject(
  options: unknown,
  action: string,
): Record<string, unknown> {
  if (options === undefined) return {};
  if (
    typeof options !== "object" || options === null || Array.isArray(options)
  ) {
    throw new TypeError(
      `Cannot ${action} as 'options' must be an object or undefined: current value is ${
        shown(options, String, false)
      }`,
    );
  }
  return options as Record<string, unknown>;
}

/** Checks an optional `signal`: an AbortSignal or undefined. */
export function checkSignal(
  signal: unknown,
  action: string,
): AbortSignal | undefined {
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot ${action} as 'signal' must be an AbortSignal: current value is ${
        String(signal)
      }`,
    );
  }
  return signal;
}

/** Checks watch()'s `interval` (ms, 1000 when undefined). */
export function checkInterval(interval: unknown, action: string): number {
  const value = interval ?? 1_000;
  if (typeof value !== "number" || !Number.isFinite(value) || value <= 0) {
    throw new TypeError(
      `Cannot ${action} as 'interval' must be a positive finite number of milliseconds: current value is ${
        shown(value, String, false)
      }`,
    );
  }
  return value;
}

/** The options with defaults filled in, or a TypeError/RangeError. */
export function checkOptions(
  options: PgLocksOptions | undefined,
): Options {
  const o = { ...DEFAULTS };
  for (const [k, v] of Object.entries(options ?? {})) {
    if (v === undefined) continue;
    if (!(k in DEFAULTS)) {
      throw new TypeError(`Cannot create pgLocks: unknown option '${k}'`);
    }
    (o as Record<string, unknown>)[k] = v;
  }
  checkIdentifier(o.schema, "schema", "create pgLocks");
  for (
    const k of [
      "keepalivesIdle",
      "keepalivesInterval",
      "keepalivesCount",
      "tcpUserTimeout",
      "heartbeatInterval",
      "heartbeatTimeout",
      "connectTimeout",
    ] as const
  ) {
    const v = o[k];
    if (!Number.isInteger(v) || v < 1 || v > 2_147_483_647) {
      throw new RangeError(
        `Cannot create pgLocks as '${k}' must be a positive integer: current value is ${
          String(v)
        }`,
      );
    }
  }
  // The server's idle limit must not end a live holder's session.
  const idle = o.idleSessionTimeout;
  if (
    !Number.isInteger(idle) || idle < 0 || idle > 2_147_483_647 ||
    (idle > 0 && idle <= o.heartbeatInterval + o.heartbeatTimeout)
  ) {
    throw new RangeError(
      `Cannot create pgLocks as 'idleSessionTimeout' must be 0 (off) or a whole number of milliseconds above 'heartbeatInterval' + 'heartbeatTimeout' (${
        o.heartbeatInterval + o.heartbeatTimeout
      }): current value is ${String(idle)}`,
    );
  }
  if (!Number.isInteger(o.maxIdleSessions) || o.maxIdleSessions < 0) {
    throw new RangeError(
      `Cannot create pgLocks as 'maxIdleSessions' must be a non-negative integer: current value is ${
        String(o.maxIdleSessions)
      }`,
    );
  }
  // The client must notice a broken path before the server can (which is
  // keepalivesIdle after the last packet, or tcpUserTimeout after unacked
  // data); we notice within interval + timeout + one event-loop turn.
  const serverEarliest = Math.min(o.keepalivesIdle * 1000, o.tcpUserTimeout);
  const ours = o.heartbeatInterval + o.heartbeatTimeout + GRACE_MS;
  if (ours >= serverEarliest) {
    throw new RangeError(
      `Cannot create pgLocks as 'heartbeatInterval' + 'heartbeatTimeout' (${
        o.heartbeatInterval + o.heartbeatTimeout
      } ms) must be less than the server's earliest detection of a dead client, ` +
        `min('keepalivesIdle', 'tcpUserTimeout') = ${serverEarliest} ms: ` +
        `otherwise lock.signal could abort after another process took the lock`,
    );
  }
  return o;
}

/** The options of one pgLocks object, defaults filled in. */
export type Options = typeof DEFAULTS;

/**
 * A value for a message: a string quoted (past 80 characters, when
 * `long`, its length), anything else as `other` writes it.
 */
function shown(
  value: unknown,
  other: (value: unknown) => string | undefined = String,
  long = true,
): string {
  if (typeof value !== "string") return String(other(value));
  return long && value.length > 80
    ? `a string of ${value.length} characters`
    : JSON.stringify(value);
}
