/**
 * Passwords out of what runlock prints: the one function every message
 * that may hold a database URL, or text derived from one, goes through
 * (the PostgreSQL backend's errors, the CLI's usage errors).
 *
 * @module
 */

/** How {@linkcode redact} reads its text. */
export interface RedactOptions {
  /**
   * Passwords known to the caller (the URL's, decoded, PGPASSWORD's),
   * replaced wherever they appear. Those shorter than 3 characters are
   * left to the rules below: replacing every "a" would garble the message,
   * and the rules already cover each known echo of a URL.
   */
  secrets?: readonly (string | undefined)[];
  /**
   * `"value"` (the default): `text` is one value a user gave for a URL
   * (`--db=`, RUNLOCK_DATABASE_URL, `pgLocks(url)`, an argument), so that
   * without a scheme it is still read as one (`app:secret@host/db`), and
   * only its end ends it (a password may hold spaces and quotes).
   * `"message"`: free text, where only a `scheme://` starts a URL, and a
   * user name with an "@" in it (Azure's `app@server`) is no password.
   */
  as?: "value" | "message";
}

const MASK = "***";

/** A URL's scheme and its "//". */
const SCHEME = /[a-z][a-z0-9+.-]*:\/\//gi;

/**
 * A `key=value` pair (a URL's query, a libpq `key=value` string), whose
 * key is read as node-postgres reads a query's: percent-decoded.
 */
const KEY_VALUE = /(^|[?&;\s])([^?&;\s=#]+)\s*=/g;

/**
 * `text` with every password it may hold replaced by `***`; everything
 * else kept, for the message to say what is wrong. Over-redacts rather
 * than leaks, whatever characters the password holds and however wrongly
 * they are escaped:
 *
 * - the URL's user information: from the first `:` after `scheme://` (or,
 *   for a value, after its start) to the LAST `@`, so that a password with
 *   `@`, `/`, `?`, `#`, `:` or spaces written unescaped goes whole;
 * - without an `@`: what follows a `:` after the host, unless it is a
 *   port (digits), since `app:secret` may be a URL whose `@host` is
 *   missing;
 * - a key with "pass" in it (`password=`, `sslpassword=`, `passfile=`,
 *   percent-escaped or not, in a query or a libpq `key=value` string):
 *   everything from its value to the end of the text, since an unescaped
 *   `&` may be part of the value;
 * - each of `secrets`, wherever it appears.
 *
 * @param text A URL, or a message that may contain one.
 * @param options The known secrets, and whether `text` is one value or a
 * message (see {@linkcode RedactOptions}).
 * @returns The text with `***` for each password.
 *
 * @example A password with unescaped "/" and "@", and one in the query
 * (the doc test imports `redact` itself)
 * ```ts
 * import assert from "node:assert/strict";
 *
 * assert.equal(
 *   redact("postgres://app:p@ss:w/rd@db.example/app"),
 *   "postgres://app:***@db.example/app",
 * );
 * assert.equal(
 *   redact("postgres://app@db/app?sslmode=require&password=x&y"),
 *   "postgres://app@db/app?sslmode=require&password=***",
 * );
 * assert.equal(redact("app:secret@db/app"), "app:***@db/app");
 * assert.equal(
 *   redact('failed: user "app@corp", see postgres://app:pw@h/db', {
 *     as: "message",
 *   }),
 *   'failed: user "app@corp", see postgres://app:***@h/db',
 * );
 * ```
 */
export function redact(text: string, options: RedactOptions = {}): string {
  const value = (options.as ?? "value") === "value";
  let out = text;
  // Longest first: a secret inside another must not split it.
  const secrets = [...new Set(options.secrets ?? [])]
    .filter((s): s is string => typeof s === "string" && s.length >= 3)
    .sort((a, b) => b.length - a.length);
  for (const secret of secrets) out = out.replaceAll(secret, MASK);
  out = redactKeys(out);
  // Each URL, from its scheme; a value without one is read as a URL
  // without its scheme (`app:secret@host/db`, `app:secret`).
  const starts: number[] = [];
  for (const m of out.matchAll(SCHEME)) starts.push(m.index + m[0].length);
  if (value && starts.length === 0) starts.push(0);
  let done = 0;
  let result = "";
  for (const start of starts) {
    if (start < done) continue;
    const [redacted, end] = redactUrl(out, start, value);
    result += out.slice(done, start) + redacted;
    done = end;
  }
  return result + out.slice(done);
}

/** Cuts the text after the first key that names a password. */
function redactKeys(text: string): string {
  for (const m of text.matchAll(KEY_VALUE)) {
    let key = m[2];
    try {
      key = decodeURIComponent(key.replaceAll("+", " "));
    } catch { /* a bad escape: read as written */ }
    if (/pass/i.test(key)) {
      return text.slice(0, m.index + m[0].length) + MASK;
    }
  }
  return text;
}

/**
 * The URL that starts (after its scheme) at `start`, with its password
 * masked, and where the part read ends.
 */
function redactUrl(
  text: string,
  start: number,
  value: boolean,
): [string, number] {
  const rest = text.slice(start);
  const at = rest.lastIndexOf("@");
  let user = "";
  if (at >= 0) {
    const colon = rest.indexOf(":");
    user = colon >= 0 && colon < at
      ? `${rest.slice(0, colon + 1)}${MASK}@`
      : rest.slice(0, at + 1);
  }
  const [host, end] = redactPort(rest.slice(at + 1), value);
  return [user + host, start + at + 1 + end];
}

/**
 * The host part at the start of `tail`, up to its end (`/`, `?`, `#`; in
 * a message also a space or a quote), with what follows a `:` masked
 * unless it is a port; and where it ends.
 */
function redactPort(tail: string, value: boolean): [string, number] {
  const found = tail.search(value ? /[/?#]/ : /[/?#\s'"`]/);
  const end = found < 0 ? tail.length : found;
  const host = tail.slice(0, end);
  // An IPv6 address's colons are inside its brackets.
  const colon = host.replace(/\[[^\]]*\]/g, (b) => "_".repeat(b.length))
    .indexOf(":");
  return [
    colon >= 0 && !/^\d*$/.test(host.slice(colon + 1))
      ? `${host.slice(0, colon + 1)}${MASK}`
      : host,
    end,
  ];
}
