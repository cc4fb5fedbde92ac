// What the caller passes: pgLocks's options with their defaults, lock
// names, timeouts, and the options of scan and watch, checked before
// anything touches the database (the URL: _url.ts).
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
 * A valid PostgreSQL name (a schema or a role), or a TypeError naming the
 * action: 1 to 63 bytes in UTF-8, since the server cuts a longer name to
 * its first 63 bytes (two schemas that differ only after them would be
 * one table, with two different keys for one lock name: two holders); and
 * no control character (U+0000-U+001F, U+007F), which could end a line
 * of the SQL that `pgSetupSql` prints.
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
 * A UTF-16 surrogate without its pair. PostgreSQL receives text as UTF-8,
 * where a lone surrogate has no encoding: the client sends U+FFFD in its
 * place, so "a\ud800" and "a\udbff" would be one name, one lock.
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

/**
 * Checks scan()'s and watch()'s `prefix`: a string of at most 1024
 * characters (a name's limit) without NUL or a lone UTF-16 surrogate (it
 * would reach the server as U+FFFD); `""` (the default) matches every
 * name.
 *
 * @param prefix The caller's value.
 * @param action What is refused, for the message (`scan the locks`).
 * @returns The prefix.
 * @throws {TypeError} it is not such a string.
 */
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

/**
 * Checks scan()'s and watch()'s `options`: undefined or an object (not
 * null, not an array, not a function).
 */
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

/**
 * Checks watch()'s `interval`: a positive finite number of milliseconds,
 * 1000 when undefined.
 */
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
  // A lock session's heartbeat runs every heartbeatInterval: the server's
  // idle limit must not end a live holder's session (nor before the
  // holder's own signal could abort: the ordering above).
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
  // The client must notice a broken path before the server can: the
  // server drops a silent client no earlier than keepalivesIdle after the
  // last packet (nothing is probed before), or tcpUserTimeout after data
  // it sent went unacknowledged; we notice within interval + timeout
  // (+ one event-loop turn) of the last answer.
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
 * The caller's value as a message shows it: a string quoted (one of more
 * than 80 characters, when `long`, by its length), anything else as
 * `other` writes it.
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
