/**
 * The lock record: what the file says about its holder.
 *
 * ```
 * 4242
 * runlock 1
 * host=build-7
 * started=2026-11-30T09:52:11.000Z
 * ```
 *
 * Line 1 is the PID, so `pgrep -F`, `pkill -F` and systemd's `PIDFile=` work.
 * Line 2 marks the record as governed by flock. A file without the marker is
 * a foreign pidfile written by some other tool.
 *
 * @module
 */

/** Readers refuse records larger than this many bytes. */
export const MAX_RECORD_BYTES = 4096;

/** The largest valid PID (`pid_t` is a signed 32-bit integer). */
export const MAX_PID = 0x7fffffff;

const MARKER = /^runlock [1-9][0-9]{0,8}$/;
const PID = /^[1-9][0-9]{0,9}$/;

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
  }
  | { kind: "foreign"; pid: number }
  | { kind: "garbage"; reason: string };

/**
 * Parses a PID as the protocol allows it: decimal, no sign, no leading zero,
 * no padding, 1 to 2147483647. Returns 0 for anything else, so no caller can
 * ever hand `kill` a 0 or a negative number.
 */
export function parsePid(text: string): number {
  if (!PID.test(text)) return 0;
  const pid = Number(text);
  return pid <= MAX_PID ? pid : 0;
}

/**
 * The part of this process's record that is the same for every lock:
 * everything before the `started=` line.
 */
export function recordHead(pid: number, host: string): string {
  return host ? `${pid}\nrunlock 1\nhost=${host}\n` : `${pid}\nrunlock 1\n`;
}

/**
 * Formats the record this process writes when it takes a lock; `extra` is
 * more `key=value` lines, each ending in a newline.
 */
export function formatRecord(
  head: string,
  started: Date,
  runtime: string,
  extra = "",
): string {
  return `${head}started=${started.toISOString()}\nruntime=${runtime}\n${extra}`;
}

const decoder = new TextDecoder("utf-8", { fatal: true });

// User fields are written as `meta.<key>=<value>`: readers that do not know
// them (other tools, older runlock versions) ignore keys they do not know,
// and the prefix keeps them apart from runlock's own keys.
const META_PREFIX = "meta.";
const META_KEY = /^[a-z0-9_.-]{1,64}$/;

/**
 * The `key=value` lines of the user fields, in the order given; `meta` was
 * checked by `checkMeta`.
 */
export function metaLines(meta: { [key: string]: string }): string {
  let out = "";
  for (const [key, value] of Object.entries(meta)) {
    out += `${META_PREFIX}${key}=${value}\n`;
  }
  return out;
}

/** A line without its trailing CR, if any. */
function chomp(line: string): string {
  return line.endsWith("\r") ? line.slice(0, -1) : line;
}

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

/**
 * `new Date(value)`, read directly where it is the form runlock writes
 * (`2026-11-30T09:52:11.000Z`, a year from 1000 to 9999) and every field
 * is in range; anything else goes to `new Date`, as before.
 */
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

/** Parses a lock file's bytes. Never throws. */
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
    text = decoder.decode(bytes);
  } catch {
    return { kind: "garbage", reason: "not UTF-8 text" };
  }
  const lines = text.split("\n");
  if (lines.at(-1) === "") lines.pop();
  const first = chomp(lines[0] ?? "");
  const pid = parsePid(first);
  if (pid === 0) {
    const shown = JSON.stringify(first.slice(0, 40));
    return {
      kind: "garbage",
      reason: `first line ${shown} is not a PID from 1 to ${MAX_PID}`,
    };
  }
  if (lines.length < 2 || !MARKER.test(chomp(lines[1]))) {
    // A plain pidfile from another tool (pidfile(3), start-stop-daemon, ...).
    return { kind: "foreign", pid };
  }
  let host = "";
  let started: Date | undefined;
  let runtime = "";
  let boot = "";
  let pidns = "";
  const meta: { [key: string]: string } = {};
  for (let i = 2; i < lines.length; i++) {
    const line = lines[i];
    const eq = line.indexOf("=");
    if (eq < 0) continue;
    const key = line.slice(0, eq);
    const value = chomp(line.slice(eq + 1));
    switch (key) {
      case "host":
        host = value;
        break;
      case "started": {
        const date = parseStarted(value);
        if (!Number.isNaN(date.getTime())) started = date;
        break;
      }
      case "runtime":
        runtime = value;
        break;
      case "boot":
        boot = value;
        break;
      case "pidns":
        pidns = value;
        break;
      default:
        if (
          key.startsWith(META_PREFIX) && META_KEY.test(key.slice(5)) &&
          key !== "meta.__proto__"
        ) {
          meta[key.slice(5)] = value;
        }
    }
  }
  return { kind: "runlock", pid, host, started, runtime, boot, pidns, meta };
}
