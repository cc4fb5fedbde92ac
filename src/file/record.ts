/**
 * The lock record (PROTOCOL.md, "The record"): line 1 the PID, line 2 the
 * marker `runlock 1`; a file without the marker is a foreign pidfile.
 *
 * @module
 */

/** Readers refuse records larger than this many bytes. */
export const MAX_RECORD_BYTES = 4096;

/** The largest valid PID (`pid_t` is a signed 32-bit integer). */
export const MAX_PID = 0x7fffffff;

/** A parsed lock file. */
export type Record =
  | { kind: "empty" }
  | {
    kind: "runlock";
    pid: number;
    host: string;
    started: Date | undefined;
    /** `runtime=`: `deno`, `node`, `bun`, ... or `""`. */
    runtime: string;
    /** `boot=`: the holder's Linux boot id, or `""`. */
    boot: string;
    /** `pidns=`: the inode of the holder's PID namespace, or `""`. */
    pidns: string;
    /** `meta.<key>=<value>` lines: the user fields. */
    meta: { [key: string]: string };
    /** `child=`: the command `runlock run` handed the lock to, or 0. */
    child: number;
    /** `child=` says the run released the lock ({@linkcode CHILD_RELEASED}). */
    released: boolean;
  }
  | { kind: "foreign"; pid: number }
  | { kind: "garbage"; reason: string };

/** This process's record before its `started=` line. */
export function recordHead(pid: number, host: string): string {
  return host ? `${pid}\nrunlock 1\nhost=${host}\n` : `${pid}\nrunlock 1\n`;
}

/** The record this process writes; `extra`: more `key=value\n` lines. */
export function formatRecord(
  head: string,
  started: Date,
  runtime: string,
  extra = "",
): string {
  return `${head}started=${started.toISOString()}\nruntime=${runtime}\n${extra}`;
}

/**
 * The `child=` line before the command has a PID: ten `-`, overwritten in
 * place by the PID in ten digits. A read during that write sees a mix, which
 * is no PID (a value counts only as ten digits).
 */
export const CHILD_LINE = "child=----------\n";

/**
 * The `child=` value `runlock run` writes just before its release: what
 * still holds the flock (what the command left running) is no run.
 */
export const CHILD_RELEASED = "released--";

/** The `child=` value: `pid` in ten digits, or {@linkcode CHILD_RELEASED} for 0. */
export function childDigits(pid: number): string {
  return pid === 0 ? CHILD_RELEASED : String(pid).padStart(10, "0");
}

/** A `child=` value as the protocol reads it: ten digits, 2 to MAX_PID. */
function childAt(text: string, from: number, to: number): number {
  if (to - from !== 10) return 0;
  const v = digits(text, from, 10);
  return v >= 2 && v <= MAX_PID ? v : 0;
}

// ASCII is decoded leniently: Deno's strict decoder costs 2.7 times as much
// (0.34 against 0.125 µs for 129 bytes). Anything else strictly, which stops
// at the first bad byte (a lenient decode of 4 KiB of them took 13-36 µs).
const lenient = new TextDecoder("utf-8");
const strict = new TextDecoder("utf-8", { fatal: true });

// The prefix keeps user fields apart from runlock's own keys.
const META_PREFIX = "meta.";
const META_KEY = /^[a-z0-9_.-]{1,64}$/;

/** The user fields' lines, in order (`meta` checked by `checkMeta`). */
export function metaLines(meta: { [key: string]: string }): string {
  let out = "";
  for (const [key, value] of Object.entries(meta)) {
    out += `${META_PREFIX}${key}=${value}\n`;
  }
  return out;
}

/** Whether every byte is below 0x80. */
function isAscii(bytes: Uint8Array): boolean {
  for (let i = 0; i < bytes.length; i++) if (bytes[i] > 0x7f) return false;
  return true;
}

/** `nl`, or before a CR there: the end of the line from `from` to `nl`. */
function lineEnd(text: string, from: number, nl: number): number {
  return nl > from && text.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
}

/**
 * `text` from `from` to `to` as a PID (decimal, no sign, no leading zero, 1
 * to MAX_PID), else 0: no caller can hand `kill` a 0 or a negative number.
 */
function pidAt(text: string, from: number, to: number): number {
  if (to - from < 1 || to - from > 10) return 0;
  const lead = text.charCodeAt(from);
  if (lead < 0x31 || lead > 0x39) return 0;
  let pid = 0;
  for (let i = from; i < to; i++) {
    const digit = text.charCodeAt(i) - 0x30;
    if (digit < 0 || digit > 9) return 0;
    pid = pid * 10 + digit;
  }
  return pid <= MAX_PID ? pid : 0;
}

/** Whether `text` from `from` to `to` is the marker: `runlock <1-9 digits>`. */
function markerAt(text: string, from: number, to: number): boolean {
  const digitCount = to - from - MARKER_WORD.length;
  if (digitCount < 1 || digitCount > 9) return false;
  if (!text.startsWith(MARKER_WORD, from)) return false;
  const lead = text.charCodeAt(from + MARKER_WORD.length);
  if (lead < 0x31 || lead > 0x39) return false;
  for (let i = from + MARKER_WORD.length + 1; i < to; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return false;
  }
  return true;
}

/** Line 2 of a record, before its version: `runlock <1-9 digits>`. */
export const MARKER_WORD = "runlock ";

/** The digits of `s` from `at`, `n` of them, or -1 if one is not a digit. */
function digits(s: string, at: number, n: number): number {
  let v = 0;
  for (let i = at; i < at + n; i++) {
    const c = s.charCodeAt(i) - 48;
    if (c < 0 || c > 9) return -1;
    v = v * 10 + c;
  }
  return v;
}

/** `new Date(value)`, read directly when in the form runlock writes. */
function parseStarted(value: string): Date {
  if (
    value.length === 24 && value[4] === "-" && value[7] === "-" &&
    value[10] === "T" && value[13] === ":" && value[16] === ":" &&
    value[19] === "." && value[23] === "Z"
  ) {
    const year = digits(value, 0, 4);
    const month = digits(value, 5, 2);
    const day = digits(value, 8, 2);
    const hour = digits(value, 11, 2);
    const minute = digits(value, 14, 2);
    const second = digits(value, 17, 2);
    const ms = digits(value, 20, 3);
    if (
      year >= 1000 && month >= 1 && month <= 12 && day >= 1 && hour >= 0 &&
      hour <= 23 && minute >= 0 && minute <= 59 && second >= 0 &&
      second <= 59 && ms >= 0
    ) {
      const date = new Date(
        Date.UTC(year, month - 1, day, hour, minute, second, ms),
      );
      if (date.getUTCDate() === day) return date;
    }
  }
  return new Date(value);
}

/**
 * Parses a lock file's bytes; never throws. Lines are read in place, without
 * an array or a regular expression (a probe parses a record per call).
 */
export function parseRecord(bytes: Uint8Array): Record {
  if (bytes.length === 0) return { kind: "empty" };
  if (bytes.length > MAX_RECORD_BYTES) {
    return {
      kind: "garbage",
      reason: `larger than ${MAX_RECORD_BYTES} bytes`,
    };
  }
  let text: string;
  try {
    text = isAscii(bytes) ? lenient.decode(bytes) : strict.decode(bytes);
  } catch {
    return { kind: "garbage", reason: "not UTF-8 text" };
  }
  const length = text.length;
  let nl = text.indexOf("\n");
  if (nl < 0) nl = length;
  let end = lineEnd(text, 0, nl);
  const pid = pidAt(text, 0, end);
  if (pid === 0) {
    const shown = JSON.stringify(text.slice(0, Math.min(end, 40)));
    return {
      kind: "garbage",
      reason: `first line ${shown} is not a PID from 1 to ${MAX_PID}`,
    };
  }
  let at = nl + 1;
  if (at < length) {
    nl = text.indexOf("\n", at);
    if (nl < 0) nl = length;
  }
  if (at >= length || !markerAt(text, at, lineEnd(text, at, nl))) {
    // A plain pidfile from another tool (pidfile(3), start-stop-daemon, ...).
    return { kind: "foreign", pid };
  }
  let host = "";
  let started: Date | undefined;
  let runtime = "";
  let boot = "";
  let pidns = "";
  let child = 0;
  let released = false;
  const meta: { [key: string]: string } = {};
  // The next `=`, searched again only once passed: linear time for a record
  // of many lines without one.
  let eq = -1;
  for (at = nl + 1; at < length; at = nl + 1) {
    nl = text.indexOf("\n", at);
    if (nl < 0) nl = length;
    if (eq < at) eq = text.indexOf("=", at);
    if (eq < 0) break;
    if (eq > nl) continue;
    end = lineEnd(text, eq + 1, nl);
    switch (eq - at) {
      case 4:
        if (text.startsWith("host", at)) {
          host = text.slice(eq + 1, end);
          continue;
        }
        if (text.startsWith("boot", at)) {
          boot = text.slice(eq + 1, end);
          continue;
        }
        break;
      case 5:
        if (text.startsWith("pidns", at)) {
          pidns = text.slice(eq + 1, end);
          continue;
        }
        if (text.startsWith("child", at)) {
          child = childAt(text, eq + 1, end);
          released = text.startsWith(CHILD_RELEASED, eq + 1) &&
            end - eq - 1 === CHILD_RELEASED.length;
          continue;
        }
        break;
      case 7:
        if (text.startsWith("started", at)) {
          const date = parseStarted(text.slice(eq + 1, end));
          if (!Number.isNaN(date.getTime())) started = date;
          continue;
        }
        if (text.startsWith("runtime", at)) {
          runtime = text.slice(eq + 1, end);
          continue;
        }
        break;
    }
    if (text.startsWith(META_PREFIX, at)) {
      const key = text.slice(at + META_PREFIX.length, eq);
      if (META_KEY.test(key) && key !== "__proto__") {
        meta[key] = text.slice(eq + 1, end);
      }
    }
  }
  return {
    kind: "runlock",
    pid,
    host,
    started,
    runtime,
    boot,
    pidns,
    meta,
    child,
    released,
  };
}
