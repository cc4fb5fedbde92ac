// What the caller passes to pgLocks: options with their defaults, lock
// names, timeouts and the URL, checked before anything touches the
// database.
import { hostname } from "node:os";
import process from "node:process";
import { granted } from "./_deno.ts";
import { optionValue } from "./_sql.ts";
import type { PgLocksOptions } from "./types.ts";

/** Every option of pgLocks, with its default. */
export const DEFAULTS = {
  schema: "public",
  keepalivesIdle: 10,
  keepalivesInterval: 3,
  keepalivesCount: 3,
  tcpUserTimeout: 15_000,
  heartbeatInterval: 2_000,
  heartbeatTimeout: 5_000,
  connectTimeout: 10_000,
  maxIdleSessions: 2,
};

/** The heartbeat's deadline gets one more event-loop turn (see Session). */
export const HEARTBEAT_GRACE_MS = 25;

/** The runtime this copy runs on, as the record names it. */
export const runtime: string = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

let cachedHost: string | undefined;
/** This host's name, or "" when Deno may not read it. */
export function hostName(): string {
  if (cachedHost === undefined) {
    try {
      // Deno without --allow-sys=hostname records no host (no prompt).
      cachedHost = granted({ name: "sys", kind: "hostname" }) ? hostname() : "";
    } catch {
      cachedHost = "";
    }
  }
  return cachedHost;
}

/** What the caller's URL says, for messages (never the password). */
export interface Target {
  /** `host:port, database "db", user "u"`. */
  text: string;
  /** `host:port/database`: which locks a name means. */
  where: string;
  host: string;
  port: string;
  password: string;
  /**
   * The URL to connect with: the caller's, less the query parameters that
   * would override runlock's pinned session settings (see `urlSettings`).
   */
  connectUrl: string;
  /**
   * The `-c name=value` settings of the URL's `options` parameter, to send
   * before runlock's own (which win for the same name), written as the
   * startup "options" string needs them.
   */
  settings: Record<string, string>;
}

/**
 * Query parameters node-postgres acts on that would undo what a lock
 * session needs, with why: each overrides a setting runlock pins (they
 * are sent after the "options" string, and the server keeps the last
 * value), or breaks the client's reading of its rows. They are left out
 * of a lock session's URL; the caller's other sessions keep them.
 */
const DROPPED_PARAMS = [
  "statement_timeout", // would cut a wait, which is one long statement
  "lock_timeout", // the same; our waits set it per statement
  "idle_in_transaction_session_timeout",
  "query_timeout", // the client's own timer: it would reject a wait
  "client_encoding", // the client would decode UTF-8 (which it asks for) as another
  "binary", // binary rows: the statements are written for text ones
];

/**
 * Splits the URL's `options` parameter as the server does (at whitespace;
 * a backslash keeps the next character) and keeps its `-c name=value` and
 * `--name=value` settings, re-escaped. Anything else (a server switch, a
 * pooler's own option) is a TypeError: runlock sends the options itself.
 */
function urlSettings(
  options: string,
  url: string,
): Record<string, string> {
  const words: string[] = [];
  let word: string | undefined;
  for (let i = 0; i < options.length; i++) {
    const c = options[i];
    if (/\s/.test(c)) {
      if (word !== undefined) words.push(word);
      word = undefined;
    } else if (c === "\\" && i + 1 < options.length) {
      word = (word ?? "") + options[++i];
    } else {
      word = (word ?? "") + c;
    }
  }
  if (word !== undefined) words.push(word);
  const settings: Record<string, string> = {};
  for (let i = 0; i < words.length; i++) {
    const w = words[i];
    const setting = w === "-c"
      ? words[++i]
      : w.startsWith("-c")
      ? w.slice(2)
      : w.startsWith("--")
      ? w.slice(2)
      : undefined;
    const eq = setting?.indexOf("=") ?? -1;
    if (setting === undefined || eq <= 0) {
      throw new TypeError(
        `Cannot create pgLocks as the 'options' parameter of 'url' may hold only -c name=value settings (runlock sends its own session options): current value is ${
          JSON.stringify(redact(url))
        }`,
      );
    }
    settings[setting.slice(0, eq).replaceAll("-", "_")] = optionValue(
      setting.slice(eq + 1),
    );
  }
  return settings;
}

/** Checks and reads the caller's URL. */
export function parseUrl(url: unknown): Target {
  let u: URL;
  try {
    if (typeof url !== "string") throw new TypeError("not a string");
    u = new URL(url);
  } catch {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must be a postgres:// URL: current value is ${
        typeof url === "string" ? JSON.stringify(redact(url)) : String(url)
      }`,
    );
  }
  if (u.protocol !== "postgres:" && u.protocol !== "postgresql:") {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must start with postgres:// or postgresql://: current value is ${
        JSON.stringify(redact(url as string))
      }`,
    );
  }
  // A bad percent-escape (a literal `%` in a password) is the caller's
  // input: a TypeError now, naming the part, never the password itself.
  const decode = (part: string, what: string): string => {
    try {
      return decodeURIComponent(part);
    } catch {
      throw new TypeError(
        `Cannot create pgLocks as the ${what} in 'url' has a bad percent-escape (write a literal % as %25): current value is ${
          JSON.stringify(redact(url as string))
        }`,
      );
    }
  };
  const password = decode(u.password, "password");
  const host = u.searchParams.get("host") ?? (u.hostname || "localhost");
  const port = u.searchParams.get("port") ?? (u.port || "5432");
  const env = granted({ name: "env" })
    ? process.env
    : {} as Record<string, string | undefined>;
  const user = decode(u.username, "user name") || env.PGUSER || env.USER ||
    "";
  const database = decode(u.pathname.replace(/^\//, ""), "database name") ||
    user;
  // node-postgres takes every query parameter as a client option, and an
  // `options` parameter replaces the one runlock sends: its settings are
  // kept (sent first), the parameters that would undo a pinned setting
  // are dropped (DROPPED_PARAMS).
  const settings = urlSettings(
    u.searchParams.get("options") ?? "",
    url as string,
  );
  let connectUrl = url as string;
  const drop = ["options", ...DROPPED_PARAMS].filter((p) =>
    u.searchParams.has(p)
  );
  if (drop.length > 0) {
    for (const p of drop) u.searchParams.delete(p);
    connectUrl = u.toString();
  }
  return {
    text: `${host}:${port}, database ${JSON.stringify(database)}, user ${
      JSON.stringify(user)
    }`,
    where: `${host}:${port}/${database}`,
    host,
    port,
    password,
    connectUrl,
    settings,
  };
}

/** The URL with its password replaced by `***`, for messages. */
export function redact(url: string): string {
  return url.replace(/^([a-z]+:\/\/[^:@/]*:)[^@/]*@/i, "$1***@");
}

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
        typeof value === "string" && value.length > 80
          ? `a string of ${value.length} characters`
          : JSON.stringify(value)
      }`,
    );
  }
  return value;
}

/** A valid lock name, or a TypeError naming the action. */
export function checkName(name: unknown, action: string): string {
  if (
    typeof name !== "string" || name === "" || name.length > 1024 ||
    name.includes("\0")
  ) {
    throw new TypeError(
      `Cannot ${action} as 'name' must be a string of 1 to 1024 characters without NUL: current value is ${
        typeof name === "string" && name.length > 80
          ? `a string of ${name.length} characters`
          : JSON.stringify(name)
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
  const ours = o.heartbeatInterval + o.heartbeatTimeout + HEARTBEAT_GRACE_MS;
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
