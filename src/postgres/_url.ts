// The caller's URL: checked, and read as node-postgres reads it.
import { process } from "../_process.ts";
import { redact } from "../_redact.ts";
import { granted } from "../platform/runtime.ts";
import { optionValue } from "./_settings.ts";

/** What the caller's URL says, for messages (never the password). */
export interface Target {
  /** `host:port, database "db", user "u"`. */
  text: string;
  /** `host:port/database`: which locks a name means. */
  where: string;
  host: string;
  port: string;
  password: string;
  /** Every form of the password given, for {@linkcode redact} to mask. */
  secrets: string[];
  /** What asks for TLS (`sslmode=require in the URL`), or "". */
  tls: string;
  /** The caller's URL, less the parameters that undo pinned settings. */
  connectUrl: string;
  /** The URL's `options` settings, sent before runlock's own (which win). */
  settings: Record<string, string>;
}

/**
 * Query parameters left out of the URL to connect with: each would
 * override a pinned setting (sent after "options", the last value wins)
 * or break the client's reading of rows.
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
    const name = setting.slice(0, eq).replaceAll("-", "_");
    // The transaction_* settings apply to one transaction: at startup the
    // server refuses them (25001, "must be called before any query"), so
    // no session could open. default_transaction_* are the session's.
    if (/^transaction_(isolation|read_only|deferrable)$/i.test(name)) {
      throw new TypeError(
        `Cannot create pgLocks as the 'options' parameter of 'url' sets ${name}, which the server refuses at connection (25001; default_${name.toLowerCase()} is the session's setting, and runlock pins its own): current value is ${
          JSON.stringify(redact(url))
        }`,
      );
    }
    settings[name] = optionValue(setting.slice(eq + 1));
  }
  return settings;
}

/**
 * Checks the caller's URL and reads the server, database and user exactly
 * as node-postgres will (pg-connection-string's `parse`, then
 * ConnectionParameters: query parameters win over the URL's parts, empty
 * parts fall back to PG* variables if Deno grants --allow-env, then to
 * localhost, 5432, $USER), so messages, the `--allow-net` advice and the
 * registry of held locks name the server the client really uses.
 */
export function parseUrl(url: unknown): Target {
  if (typeof url === "string") checkAmbiguous(url);
  let u: URL;
  try {
    if (typeof url !== "string") throw new TypeError("not a string");
    u = new URL(url);
  } catch {
    u = undefined as unknown as URL;
  }
  if (
    typeof url === "string" && u === undefined &&
    /^postgres(ql)?:\/\/[^/?#]*@\//i.test(url)
  ) {
    // An empty host after the user (`postgres://app@/db`): node-postgres
    // reads it with a dummy host and connects to PGHOST or localhost.
    try {
      u = new URL(url.replace("@/", "@___DUMMY___/"));
    } catch { /* below */ }
  }
  if (u === undefined) {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must be a postgres:// URL: current value is ${
        typeof url === "string"
          ? JSON.stringify(redact(url))
          // Never String(url): a URL object prints its password.
          : url === null || typeof url !== "object" && typeof url !== "function"
          ? String(url)
          : `${Object.prototype.toString.call(url)} (not a string)`
      }`,
    );
  }
  const text = url as string;
  if (u.protocol !== "postgres:" && u.protocol !== "postgresql:") {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must start with postgres:// or postgresql://: current value is ${
        JSON.stringify(redact(text))
      }`,
    );
  }
  // A bad percent-escape: a TypeError naming the part, never the password.
  const decode = (
    part: string,
    what: string,
    how: (s: string) => string = decodeURIComponent,
  ): string => {
    try {
      return how(part);
    } catch {
      throw new TypeError(
        `Cannot create pgLocks as the ${what} in 'url' has a bad percent-escape (write a literal % as %25): current value is ${
          JSON.stringify(redact(text))
        }`,
      );
    }
  };
  decode(u.password, "password");
  decode(u.username, "user name");
  decode(u.pathname, "database name");
  const env = granted({ name: "env" })
    ? process.env
    : {} as Record<string, string | undefined>;
  const dummy = u.hostname === "___DUMMY___";
  // pg-connection-string passes a URL with a space or a bad `%` through
  // encodeURI (keeping `%` before two digits) and reads that.
  let p = u;
  if (/ |%[^a-f0-9]|%[a-f0-9][^a-f0-9]/i.test(text)) {
    try {
      const encoded = encodeURI(text).replace(/%25(\d\d)/g, "%$1");
      p = new URL(
        dummy ? encoded.replace("@/", "@___DUMMY___/") : encoded,
      );
    } catch { /* keep u */ }
  }
  const q = p.searchParams;
  const password = q.get("password") ||
    decode(p.password, "password") || env.PGPASSWORD || "";
  const hostname = (dummy ? "" : p.hostname).replace(/^\[(.+)\]$/, "$1");
  let pathname = p.pathname;
  let host = q.get("host") || "";
  if (host === "") host = decode(hostname, "host");
  else if (hostname !== "" && /^%2f/i.test(hostname)) {
    pathname = hostname + pathname;
  }
  host = host || env.PGHOST || "localhost";
  const port = String(
    Number.parseInt(q.get("port") || p.port || env.PGPORT || "5432", 10),
  );
  const defaultUser = process.platform === "win32" ? env.USERNAME : env.USER;
  const user = q.get("user") || decode(p.username, "user name") ||
    env.PGUSER || defaultUser || "";
  const path = pathname.slice(1);
  const database = (path ? decode(path, "database name", decodeURI) : "") ||
    env.PGDATABASE || user;
  // An `options` parameter would replace runlock's: its settings are sent
  // first instead.
  const settings = urlSettings(u.searchParams.get("options") ?? "", text);
  let connectUrl = text;
  const drop = ["options", ...DROPPED_PARAMS].filter((name) =>
    u.searchParams.has(name)
  );
  // A replication connection (`?replication=`, or PGREPLICATION) is a
  // walsender, which runs none of our statements (08P01):
  // `replication=false` (which wins over the variable) makes it ordinary.
  const replication = u.searchParams.has("replication") ||
    (env.PGREPLICATION ?? "") !== "";
  // What asks for TLS, as the client reads it; before sslmode is rewritten.
  const last = (name: string) => q.getAll(name).at(-1) ?? "";
  const tlsParam = ["sslmode", "ssl", "sslcert", "sslkey", "sslrootcert"]
    .find((name) =>
      last(name) !== "" &&
      !(name === "sslmode" && last(name) === "disable") &&
      // ssl=0 is off; any other value, "false" too, asks for TLS.
      !(name === "ssl" && last(name) === "0")
    ) ?? (last("sslnegotiation") === "direct" ? "sslnegotiation" : undefined);
  const tls = tlsParam !== undefined
    ? `${tlsParam}=${
      /^ssl(mode|negotiation)?$/.test(tlsParam) ? last(tlsParam) : "..."
    } in the URL`
    : !q.has("sslmode") && !q.has("ssl") && env.PGSSLMODE &&
        env.PGSSLMODE !== "disable"
    ? `PGSSLMODE=${env.PGSSLMODE}`
    : "";
  // pg-connection-string 2.x treats sslmode=prefer, require and verify-ca
  // as verify-full (unless uselibpqcompat=true), with a dozen-line warning
  // on stderr: asking for verify-full is the same TLS, without it.
  const sslmode = u.searchParams.getAll("sslmode").at(-1);
  const sslAlias = u.searchParams.getAll("uselibpqcompat").at(-1) !== "true" &&
    (sslmode === "prefer" || sslmode === "require" || sslmode === "verify-ca");
  if (drop.length > 0 || replication || sslAlias) {
    for (const name of drop) u.searchParams.delete(name);
    if (replication) u.searchParams.set("replication", "false");
    if (sslAlias) u.searchParams.set("sslmode", "verify-full");
    connectUrl = u.toString();
    if (dummy) connectUrl = connectUrl.replace("@___DUMMY___/", "@/");
  }
  // An IPv6 address is written in brackets before its port.
  const hostPort = host.includes(":") && !host.startsWith("/")
    ? `[${host}]:${port}`
    : `${host}:${port}`;
  return {
    text: `${hostPort}, database ${JSON.stringify(database)}, user ${
      JSON.stringify(user)
    }`,
    where: `${hostPort}/${database}`,
    host: host.includes(":") && !host.startsWith("/") ? `[${host}]` : host,
    port,
    password,
    secrets: [
      password,
      u.password,
      decode(u.password, "password"),
      p.password,
      decode(p.password, "password"),
      ...u.searchParams.getAll("password"),
      env.PGPASSWORD ?? "",
    ].filter((s) => s !== ""),
    tls,
    connectUrl,
    settings,
  };
}

/**
 * Refuses a URL with an "@" after the end of its host (a "/", "?" or "#")
 * and a ":" before it: `postgres://app:2024/x@db/app` is host "app", port
 * 2024, database "x@db/app" to node-postgres, while its writer meant the
 * password "2024/x", which messages naming the database would print.
 */
function checkAmbiguous(url: string): void {
  const scheme = /^postgres(ql)?:\/\//i.exec(url);
  if (scheme === null) return;
  const from = scheme[0].length;
  const hostEnd = url.slice(from).search(/[/?#]/);
  const at = url.lastIndexOf("@");
  if (hostEnd < 0 || at < from + hostEnd) return;
  if (!url.slice(from, at).includes(":")) return;
  throw new TypeError(
    `Cannot create pgLocks as 'url' has an '@' after its host, so what it names as the host, port or database may be part of a password: write a '/', '?', '#' or '@' of a password (or of a query value) percent-encoded (%2F, %3F, %23, %40): current value is ${
      JSON.stringify(redact(url))
    }`,
  );
}
