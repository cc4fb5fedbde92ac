/**
 * What the commands say about a lock: the one-line state, the warning for a
 * PID that does not mean the same process here, JSON, and times.
 *
 * @module
 */

import type { Inspection } from "../../mod.ts";
import { process } from "../_process.ts";
import { UsageError } from "./_args.ts";
import { granted } from "../platform/runtime.ts";
import { width } from "./_width.ts";

/**
 * An error whose message is runlock's own layout, printed as it is: what
 * came from outside was made printable where it was put in.
 */
export class Said extends Error {
  constructor(lines: string[], options?: ErrorOptions) {
    super(lines.join("\n"), options);
    this.name = "Said";
  }
}

/** A lock as the commands print it: a file lock's, or a PostgreSQL one's. */
export type Info = Inspection & { fence?: bigint; backendPid?: number };

/**
 * What must not reach a terminal as it is: control characters (ESC starts
 * a sequence that may retitle or clear the window), format characters
 * (bidirectional overrides), line and paragraph separators, lone
 * surrogates, and every space but the plain one.
 */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]|[^\P{Zs} ]/u;

/** One character inside printable()'s `$'...'`. */
export function escape(char: string): string {
  if (char === "\\") return "\\\\";
  if (char === "'") return "\\'";
  if (!UNPRINTABLE.test(char)) return char;
  if (char === "\n") return "\\n";
  if (char === "\r") return "\\r";
  if (char === "\t") return "\\t";
  const code = char.codePointAt(0)!;
  const hex = code.toString(16);
  return code < 0x80
    ? `\\x${hex.padStart(2, "0")}`
    : code <= 0xffff
    ? `\\u${hex.padStart(4, "0")}`
    : `\\U${hex.padStart(8, "0")}`;
}

/**
 * A name, path or record text as the CLI prints it for a person: as it is,
 * unless it holds an UNPRINTABLE character or begins with `$'`; then quoted
 * as bash reads `$'...'`, so that no text shows as another, no escape
 * sequence reaches the terminal, and a quoted path pasted into a shell
 * names the same file.
 */
export function printable(text: string): string {
  if (!UNPRINTABLE.test(text) && !text.startsWith("$'")) return text;
  let out = "$'";
  for (const char of text) out += escape(char);
  return out + "'";
}

/**
 * A command's run, with the messages of its errors made printable (a
 * library error names the lock as it is); a {@linkcode Said} is so already.
 */
export function printableErrors<A extends unknown[]>(
  run: (...args: A) => Promise<number>,
): (...args: A) => Promise<number> {
  return async (...args) => {
    try {
      return await run(...args);
    } catch (err) {
      if (!(err instanceof Error) || err instanceof Said) throw err;
      // The path quoted alone; the whole message if more needs quoting.
      const path = (err as { path?: unknown }).path;
      const quoted = typeof path === "string" && path !== ""
        ? err.message.replaceAll(path, () => printable(path))
        : err.message;
      const message = UNPRINTABLE.test(quoted) ? printable(quoted) : quoted;
      if (message === err.message) throw err;
      if (err instanceof UsageError) throw new UsageError(message);
      throw new Error(message, { cause: err });
    }
  };
}

/** `text` cut to `max` characters (code points), ending in "…" if cut. */
export function clip(text: string, max: number): string {
  const chars = [...text];
  return chars.length <= max ? text : chars.slice(0, max - 1).join("") + "…";
}

/** A time in the past as "7s ago", "3m ago", "2h ago", "4d ago". */
export function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** In how many ms {@linkcode ago} of an age of `ms` says something else. */
export function agoChangesIn(ms: number): number {
  const s = Math.max(0, Math.round(ms / 1000));
  const unit = s < 60 ? 1 : s < 3600 ? 60 : s < 86400 ? 3600 : 86400;
  const next = (Math.floor(s / unit) + 1) * unit;
  // ago() rounds: it says `next` from next - 0.5 s on.
  return Math.max(1, (next - 0.5) * 1000 - ms);
}

const pad = (n: number) => String(n).padStart(2, "0");

/** A duration as "7s", "3m05s", "2h04m". */
export function elapsed(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  return `${Math.floor(s / 3600)}h${pad(Math.floor(s / 60) % 60)}m`;
}

/** A local time as "09:52:11", with the date when it is not today. */
export function clock(date: Date, now: Date): string {
  const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${
    pad(date.getSeconds())
  }`;
  if (date.toDateString() === now.toDateString()) return time;
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${
    pad(date.getDate())
  } ${time}`;
}

/** One line describing a lock, as `runlock status` prints it. */
export function describeState(info: Info, now: Date = new Date()): string {
  const cmd = info.meta.cmd ? `: ${printable(info.meta.cmd)}` : "";
  const host = printable(info.host);
  switch (info.state) {
    case "free":
      return "free";
    case "held": {
      if (info.pid === 0) {
        // A PostgreSQL key held by a session that is not runlock's.
        if (info.backendPid !== undefined && info.reason) {
          return printable(info.reason);
        }
        return "held by a process that wrote no pid (flock(1) or similar)";
      }
      const handed = handedTo(info);
      let line = `held by pid ${handed || info.pid}`;
      if (host) line += ` on ${host}`;
      if (info.started) {
        line += ` since ${clock(info.started, now)} (${
          ago(now.getTime() - info.started.getTime())
        })`;
      }
      if (handed) {
        line += ` (the command of runlock pid ${info.pid}, which is gone)`;
      } else if (!info.foreign && gone(info)) {
        // `runlock run` handed the flock on (PROTOCOL.md, "Handing the lock
        // to a command").
        line += ` (pid ${info.pid} is gone: the command it ran, or what ` +
          `that started, holds the lock; fuser -v names it)`;
      }
      if (info.foreign) {
        // Deno's kill(pid, 0) needs --allow-run; without, held is assumed.
        line += granted({ name: "run" })
          ? " (a plain pidfile: liveness from kill(pid, 0))"
          : ` (a plain pidfile: runlock could not check that pid ${info.pid} is alive, as Deno needs --allow-run for kill(pid, 0); counted as held)`;
      }
      return line + cmd;
    }
    case "stale":
      return info.pid === 0
        ? "stale: an empty lock file that nobody holds"
        : `stale: last holder pid ${info.pid} is gone${cmd}`;
    case "invalid":
      return `invalid: ${printable(info.path)}: ${
        printable(info.reason ?? "")
      }`;
  }
}

/** The PID of the command a gone `runlock run` handed the lock to, or 0. */
function handedTo(info: Info): number {
  const child = info.child ?? 0;
  return info.state === "held" && child > 0 && !info.foreign &&
      gone(info, true)
    ? child
    : 0;
}

/**
 * Whether a held file lock's recorded PID is a process of this host that
 * is gone (ESRCH): the lock was handed on. False when that cannot be asked,
 * or the PID is (or, unless `unsure`, may be) another host's, boot's or
 * namespace's.
 */
function gone(info: Info, unsure = false): boolean {
  if (info.pid <= 0) return false;
  if (
    info.pidValidHere !== true && !(unsure && info.pidValidHere === undefined)
  ) {
    return false;
  }
  if (info.backendPid !== undefined) return false; // a PostgreSQL lock
  if (!granted({ name: "run" })) return false;
  try {
    process.kill(info.pid, 0);
    return false;
  } catch (err) {
    return (err as { code?: unknown })?.code === "ESRCH";
  }
}

/** Why the recorded PID must not be used from here, or undefined. */
export function pidWarning(info: Info): string | undefined {
  if (info.pidValidHere !== false || info.pid === 0) return undefined;
  const pid = info.pid;
  const kill = `\`kill ${pid}\` here would hit another process`;
  switch (info.pidElsewhere) {
    case "namespace":
      return `pid ${pid} belongs to another PID namespace (a container): ${kill}`;
    case "boot":
      return `pid ${pid} was recorded under another boot of a kernel (another machine sharing this file, or an earlier boot of this one): ${kill}`;
    case "host":
      return `pid ${pid} is a process on ${
        printable(info.host)
      }, not on this host (another machine, or a container with a host name of its own): ${kill}`;
    default:
      return `pid ${pid} does not name the same process here: ${kill}`;
  }
}

/**
 * The cells `runlock ls` prints for a lock, printable: state, pid, host,
 * age (at `now`), command (for `invalid`: what is wrong), path.
 */
export function lsCells(info: Info, now: number): string[] {
  return [
    info.state,
    info.pid === 0 ? "-" : String(handedTo(info) || info.pid),
    printable(info.host) || "-",
    info.started ? ago(now - info.started.getTime()) : "-",
    printable(
      info.state === "invalid" ? info.reason ?? "" : info.meta.cmd ?? "",
    ) || "-",
    printable(info.path),
  ];
}

/** Rows of cells as lines, each column but the last padded to its widest. */
export function alignRows(rows: readonly string[][]): string[] {
  const widths: number[] = [];
  for (const row of rows) {
    row.forEach((cell, i) => {
      widths[i] = Math.max(widths[i] ?? 0, width(cell));
    });
  }
  return rows.map((row) =>
    row.map((cell, i) =>
      i === row.length - 1 ? cell : cell + " ".repeat(widths[i] - width(cell))
    ).join("  ")
  );
}

/** An Info as JSON: dates as ISO strings, bigints as strings, no undefined. */
export function toJson(info: Info): Record<string, unknown> {
  const json: Record<string, unknown> = {
    ...info,
    started: info.started?.toISOString() ?? null,
    reason: info.reason ?? null,
    pidValidHere: info.pidValidHere ?? null,
    pidElsewhere: info.pidElsewhere ?? null,
  };
  if ("fence" in info) json.fence = info.fence?.toString() ?? null;
  return json;
}
