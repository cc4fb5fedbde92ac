/**
 * The `runlock` command: ask who holds a lock, guard a command with it, wait
 * for it, or list every lock in a directory, from a shell or cron, with the
 * same lock the library uses: a lock file, or a PostgreSQL lock with `--db`.
 *
 * ```sh
 * runlock status .state/run.lock            # exit 0 held, 1 free or stale, 2 invalid/error
 * runlock run .state/run.lock -- ./sync.sh  # exit 75 if another run holds it
 * runlock wait --timeout=60 .state/run.lock # exit 0 once free, 1 on timeout
 * runlock ls --recursive .state             # one line per lock: state, pid, host, age, cmd, path
 * runlock run --db=postgres://app@db/app sync/main -- ./sync.sh   # the lock on PostgreSQL
 * runlock db-setup --db=postgres://app@db/app | psql postgres://owner@db/app  # the table, once
 * ```
 *
 * Built on the public API only; the PostgreSQL backend is imported only
 * when `--db` (or `RUNLOCK_DATABASE_URL`) asks for it. Deno, from a clone:
 * `deno run --allow-read=.state --allow-write=.state --allow-sys=hostname
 * src/cli.ts ...`, plus `--allow-run --allow-env` for `run` (it starts the
 * command with runlock's environment); `status`, `wait` and `ls` need only
 * `--allow-read`. With `--db`: `--allow-net=HOST:PORT --allow-env`, and
 * `--allow-sys=hostname` to record and compare the host; no `--allow-read`
 * or `--allow-write`. `RUNLOCK_DATABASE_URL` is read only when Deno grants
 * `--allow-env` for it. npm: the `runlock` bin, and
 * `import { main } from "runlock/cli"`.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import { statSync } from "node:fs";
import { constants, hostname } from "node:os";
import process from "node:process";
import { acquire, HeldError, inspect, type Inspection, scan } from "../mod.ts";
import { VERSION } from "./version.ts";

const EX_USAGE = 2;
const EX_TEMPFAIL = 75;

/** How often `run` checks that its lock file is still its own (ms). */
const LOSS_CHECK_MS = 200;
/** The longest command line `run` records as `meta.cmd`, in characters. */
const CMD_MAX = 200;
/** How often `run --wait` looks at the holder for the waiting line (ms). */
const PROGRESS_MS = 500;

const USAGE = `usage:
  runlock status [--json] [--db=URL] [--] <path|name>
  runlock run [--wait[=SECONDS]] [--conflict-exit-code=N] [--on-lost=warn|term]
              [--meta KEY=VALUE]... [--no-cmd] [--db=URL] [--] <path|name> -- <command> [args...]
  runlock wait [--timeout=SECONDS] [--db=URL] [--] <path|name>
  runlock ls [--json] [--recursive] [--] <dir>
  runlock db-setup [--db=URL] [--schema=NAME]
  runlock --help | --version`;

const HELP =
  `runlock ${VERSION}: one run at a time per lock file, and everyone can see who.

${USAGE}

commands:
  status   Print who holds the lock and what it runs:
             held by pid 4242 on build-7 since 09:52:11 (3m ago): ./sync.sh --full
           then one "  KEY=VALUE" line per other --meta field; or "free", or
           "stale: last holder pid N is gone". Warns on stderr when the live
           holder's pid does not mean the same process here (in another PID
           namespace, another kernel boot, on another host): do not kill it
           from here.
           Exit 0 when a live run holds it, 1 when free or stale, 2 when the
           file is invalid or on error. --json prints the inspect() result
           (with meta, bootId, pidNamespace, pidValidHere, pidElsewhere).
  run      Take the lock, run the command in a session of its own with
           inherited stdio, forward every signal runlock gets to the
           command's process group (so one Ctrl-C reaches it once), release
           the lock when it exits, and exit with its exit code (128+N if it
           died of signal N). Ctrl-Z stops the command, then runlock.
           If another run holds the lock: exit 75 (or --conflict-exit-code)
           at once, or after waiting with --wait (forever) or --wait=SECONDS.
           A path that starts with "-" goes after "--": run -- -x.lock -- cmd.
           The record says what runs: the command line as meta.cmd (quoted
           for sh, cut to ${CMD_MAX} characters), and each --meta KEY=VALUE
           (KEY: a-z 0-9 _ . -, up to 64; VALUE: one line; --meta cmd=...
           replaces the command line). The lock file is world-readable and
           outlives a crash, as ps shows a command line while it runs:
           --no-cmd keeps arguments that carry secrets out of it.
           If the lock is lost while the command runs (its file deleted or
           replaced; with --db, its database session ended), runlock says so
           on stderr at once and the command keeps running; --on-lost=term
           sends SIGTERM to the command's process group instead.
           If runlock itself is SIGKILLed, the kernel drops the lock at once
           while the command goes on running unguarded; status then reports
           the lock stale with runlock's pid.
  wait     Wait until no live run holds the lock. Exit 0 then, 1 on timeout
           (saying on stderr who still holds it).
  ls       One line per lock file in <dir> (any file name; --recursive: the
           whole tree, no symlinks followed): state, pid, host, age, command,
           path. Exit 0. --json prints an array of inspect() results.
  db-setup Print the SQL that creates the PostgreSQL backend's table
           (NAME.runlock_locks, default schema public) once, and grants the
           role of --db's URL what it needs to take locks (USAGE on the
           schema; SELECT, INSERT, UPDATE on the table). For a role that may
           not create the table on first use: run the SQL as the schema's
           owner, e.g. runlock db-setup --db=URL | psql OWNER_URL. Connects
           to nothing. Exit 0.

  On a terminal, run --wait and wait keep one updating line on stderr: who
  holds the lock, what it runs, and how long runlock has waited. Nothing of
  that when stderr is not a terminal.

PostgreSQL (--db=URL, or RUNLOCK_DATABASE_URL for status, run and wait):
  the positional argument is a lock name (sync/main), held through a
  database session on postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE, for
  runs on several hosts. Same output, JSON and exit codes (status --json
  adds fence and backendPid); run holds the session while the command runs.
  The URL is never printed. ls has no PostgreSQL form.

exit codes: 0 ok/held, 1 free/stale/timeout, 2 usage or error, 75 held by
another run (run), 126/127 command not executable/not found; run otherwise
exits with the command's code, also after a lost lock (stderr says so).`;

class UsageError extends Error {}

/**
 * Where {@linkcode main} writes: one line per call, without the newline.
 *
 * @example Capturing what the command prints
 * ```ts
 * import { type CliIo, main } from "@runlock/runlock/cli";
 * import assert from "node:assert/strict";
 *
 * const out: string[] = [];
 * const io: CliIo = { out: (t) => out.push(t), err: () => {} };
 * assert.equal(await main(["--version"], io), 0);
 * assert.match(out[0], /^runlock \d+\.\d+\.\d+$/);
 * ```
 */
export interface CliIo {
  /** The answer (stdout). */
  out(text: string): void;
  /** Messages and errors (stderr). */
  err(text: string): void;
  /**
   * An updating status line while waiting for a lock (who holds it, what
   * it runs, how long we have waited): each call replaces the previous
   * line, and `""` clears it. Leave it out where nobody watches a terminal;
   * the default has it only when stderr is a terminal.
   */
  status?(line: string): void;
}

/** The terminal line `status` last drew (its width, for TERM=dumb). */
let drawn = 0;

const stdio: CliIo = {
  out: (text) => process.stdout.write(text + "\n"),
  err: (text) => process.stderr.write(text + "\n"),
  ...(process.stderr.isTTY ? { status: drawLine } : {}),
};

/**
 * Redraws one line of stderr in place: carriage return, the text (cut to
 * the terminal's width, so that it never wraps onto a second line that a
 * carriage return cannot reach), and an erase to the end of the line (or,
 * on a terminal that knows no escape sequences, spaces over the rest).
 */
function drawLine(line: string): void {
  const width = Math.max(20, (process.stderr.columns || 80) - 1);
  const text = clip(line, width);
  const dumb = process.env.TERM === "dumb";
  const length = [...text].length;
  process.stderr.write(
    dumb
      ? `\r${text}${" ".repeat(Math.max(0, drawn - length))}${
        line === "" ? "\r" : ""
      }`
      : `\r${text}\x1b[K`,
  );
  drawn = length;
}

/** `text` cut to `max` characters (code points), ending in "…" if cut. */
function clip(text: string, max: number): string {
  const chars = [...text];
  return chars.length <= max ? text : chars.slice(0, max - 1).join("") + "…";
}

type Kind = "flag" | "value" | "optional" | "repeat";

/**
 * Parses `--name` and `--name=value` options up to the first non-option.
 * A "repeat" option (`--meta`) may be given several times, and takes its
 * value after "=" or as the next argument.
 */
function parse(
  args: string[],
  known: Record<string, Kind>,
): {
  options: Map<string, string | true>;
  lists: Map<string, string[]>;
  rest: string[];
} {
  const options = new Map<string, string | true>();
  const lists = new Map<string, string[]>();
  let i = 0;
  for (; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") break;
    if (!arg.startsWith("--")) break;
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
    let value = eq < 0 ? undefined : arg.slice(eq + 1);
    const kind = known[name];
    if (kind === undefined) throw new UsageError(`unknown option '${arg}'`);
    if (kind === "flag" && value !== undefined) {
      throw new UsageError(`option '--${name}' takes no value`);
    }
    if (kind === "repeat") {
      if (value === undefined) {
        const next = args[i + 1];
        if (next === undefined || next === "--") {
          throw new UsageError(
            `option '--${name}' needs KEY=VALUE: --${name} KEY=VALUE`,
          );
        }
        value = next;
        i++;
      }
      lists.set(name, [...lists.get(name) ?? [], value]);
      continue;
    }
    if (kind === "value" && value === undefined) {
      const next = args[i + 1] ?? "";
      throw new UsageError(
        /^\d+(\.\d*)?$/.test(next)
          ? `option '--${name}' takes its value after '=': write --${name}=${next}`
          : `option '--${name}' needs a value: --${name}=...`,
      );
    }
    options.set(name, value ?? true);
  }
  return { options, lists, rest: args.slice(i) };
}

function seconds(
  name: string,
  value: string | true | undefined,
): number | undefined {
  if (value === undefined || value === true) return undefined;
  const n = Number(value);
  if (value.trim() === "" || !Number.isFinite(n) || n < 0) {
    throw new UsageError(
      `option '--${name}' must be a non-negative number of seconds: current value is '${value}'`,
    );
  }
  return n;
}

function onePath(args: string[], command: string, what = "<path>"): string {
  // A `--` before the path ends the options: the path may start with "-".
  const rest = args[0] === "--" ? args.slice(1) : args;
  if (rest.length === 0) {
    throw new UsageError(`${command}: missing ${what}`);
  }
  if (rest.length > 1) {
    throw new UsageError(`${command}: unexpected argument '${rest[1]}'`);
  }
  return rest[0];
}

// The rules of the library's `meta` option (acquire and pgLocks check them
// too), checked here first so that a bad --meta is a usage error naming the
// key, before anything touches the disk or the network.
const META_KEY = /^[a-z0-9_.-]{1,64}$/;
/**
 * What a record's value may not hold: anything a reader could take for the
 * end of a line (LF, CR, VT, FF, NEL, U+2028, U+2029) and every other
 * control character but tab.
 */
// deno-lint-ignore no-control-regex -- control characters are the point
const META_BAD_VALUE = /[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]/;

/** The `--meta KEY=VALUE` options as an object. */
function metaOptions(values: string[]): Record<string, string> {
  const meta: Record<string, string> = Object.create(null);
  for (const item of values) {
    const eq = item.indexOf("=");
    if (eq < 0) {
      throw new UsageError(
        `option '--meta' takes KEY=VALUE: current value is '${item}'`,
      );
    }
    const key = item.slice(0, eq);
    const value = item.slice(eq + 1);
    if (!META_KEY.test(key)) {
      throw new UsageError(
        `option '--meta': the key '${key}' must be 1 to 64 of a-z 0-9 _ . -`,
      );
    }
    if (key === "__proto__") {
      throw new UsageError(`option '--meta': the key '${key}' is reserved`);
    }
    if (META_BAD_VALUE.test(value)) {
      throw new UsageError(
        `option '--meta': the value of '${key}' must be one line, without control characters`,
      );
    }
    if (Object.hasOwn(meta, key)) {
      throw new UsageError(`option '--meta': the key '${key}' is given twice`);
    }
    meta[key] = value;
  }
  return meta;
}

/** Characters sh takes literally in a word. */
const PLAIN_WORD = /^[A-Za-z0-9_@%+=:,./-]+$/;

/** One argument, quoted so that sh reads it back as it was. */
function shellWord(arg: string, first: boolean): string {
  // In the first word, "a=b" would be an assignment.
  if (PLAIN_WORD.test(arg) && !(first && arg.includes("="))) return arg;
  // Control characters and line separators (a newline above all) would
  // break the record's one-line value: $'...' (bash, ksh, zsh, POSIX.1-2024
  // sh) spells them with escapes.
  // deno-lint-ignore no-control-regex -- control characters are the point
  const special = /[\\'\x00-\x1f\x7f\x85\u2028\u2029]/g;
  // deno-lint-ignore no-control-regex -- control characters are the point
  if (/[\x00-\x1f\x7f\x85\u2028\u2029]/.test(arg)) {
    const escaped = arg.replace(special, (c) => {
      const named: Record<string, string> = {
        "\\": "\\\\",
        "'": "\\'",
        "\n": "\\n",
        "\r": "\\r",
        "\t": "\\t",
      };
      const code = c.charCodeAt(0);
      return named[c] ??
        (code < 0x80
          ? `\\x${code.toString(16).padStart(2, "0")}`
          : `\\u${code.toString(16).padStart(4, "0")}`);
    });
    return `$'${escaped}'`;
  }
  return `'${arg.replaceAll("'", `'\\''`)}'`;
}

/** The command line as `meta.cmd`: quoted for sh, cut to CMD_MAX. */
function commandLine(argv: string[]): string {
  return clip(argv.map((a, i) => shellWord(a, i === 0)).join(" "), CMD_MAX);
}

function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
}

/** A duration as "7s", "3m05s", "2h04m". */
function elapsed(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  const pad = (n: number) => String(n).padStart(2, "0");
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${pad(s % 60)}s`;
  return `${Math.floor(s / 3600)}h${pad(Math.floor(s / 60) % 60)}m`;
}

function clock(date: Date, now: Date): string {
  const pad = (n: number) => String(n).padStart(2, "0");
  const time = `${pad(date.getHours())}:${pad(date.getMinutes())}:${
    pad(date.getSeconds())
  }`;
  if (date.toDateString() === now.toDateString()) return time;
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${
    pad(date.getDate())
  } ${time}`;
}

/**
 * What the commands print about a lock: a file lock's Inspection, or a
 * PostgreSQL lock's, completed to the same fields (plus `fence` and
 * `backendPid`).
 */
type Info = Inspection & { fence?: bigint; backendPid?: number };

/** One line describing a lock, as `runlock status` prints it. */
function describeState(info: Info, now = new Date()): string {
  const cmd = info.meta.cmd ? `: ${info.meta.cmd}` : "";
  switch (info.state) {
    case "free":
      return "free";
    case "held": {
      if (info.pid === 0) {
        // A PostgreSQL key held by a session that is not runlock's.
        if (info.backendPid !== undefined && info.reason) return info.reason;
        return "held by a process that wrote no pid (flock(1) or similar)";
      }
      let line = `held by pid ${info.pid}`;
      if (info.host) line += ` on ${info.host}`;
      if (info.started) {
        line += ` since ${clock(info.started, now)} (${
          ago(now.getTime() - info.started.getTime())
        })`;
      }
      if (info.foreign) {
        line += " (a plain pidfile: liveness from kill(pid, 0))";
      }
      return line + cmd;
    }
    case "stale":
      return info.pid === 0
        ? "stale: an empty lock file that nobody holds"
        : `stale: last holder pid ${info.pid} is gone${cmd}`;
    case "invalid":
      return `invalid: ${info.path}: ${info.reason}`;
  }
}

/**
 * Why the recorded PID must not be used from here, or undefined when it
 * may (or when nothing says otherwise).
 */
function pidWarning(info: Info): string | undefined {
  if (info.pidValidHere !== false || info.pid === 0) return undefined;
  const pid = info.pid;
  const kill = `\`kill ${pid}\` here would hit another process`;
  switch (info.pidElsewhere) {
    case "namespace":
      return `pid ${pid} belongs to another PID namespace (a container): ${kill}`;
    case "boot":
      // A held lock from an earlier boot of this machine is impossible (its
      // flock died with that boot); a live one is another kernel's.
      return `pid ${pid} was recorded under another boot of a kernel (another machine sharing this file, or an earlier boot of this one): ${kill}`;
    case "host":
      return `pid ${pid} is a process on ${info.host}, not on this host (another machine, or a container with a host name of its own): ${kill}`;
    default:
      return `pid ${pid} does not name the same process here: ${kill}`;
  }
}

/** An Info as JSON: dates as ISO strings, bigints as strings, no undefined. */
function toJson(info: Info): Record<string, unknown> {
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

/** A held lock of either backend, as `run` uses it. */
interface HeldLock {
  readonly signal: AbortSignal;
  release(): Promise<void>;
}

/** Where the locks are: lock files, or a PostgreSQL database. */
interface Backend {
  inspect(name: string): Promise<Info>;
  acquire(
    name: string,
    options: {
      timeout: number;
      signal: AbortSignal;
      meta: Record<string, string>;
    },
  ): Promise<HeldLock>;
  /** Whether `err` says that another run holds the lock. */
  isHeld(err: unknown): err is Error;
  /** The longest pause between two probes of `wait`, in ms. */
  poll: number;
  /** Closes what the backend opened. */
  end(): Promise<void>;
}

const files: Backend = {
  inspect,
  // The periodic check is one lstat: every 200 ms, a lost lock is noticed
  // within 200 ms on every runtime (at once where a directory watch runs:
  // Node and Bun; Deno's would keep the process alive).
  acquire: (path, options) =>
    acquire(path, { ...options, checkInterval: LOSS_CHECK_MS }),
  isHeld: (err): err is Error => err instanceof HeldError,
  poll: 100,
  end: () => Promise.resolve(),
};

/** Whether Deno grants this (always true under Node and Bun). */
function granted(
  descriptor:
    | { name: "env"; variable: string }
    | { name: "sys"; kind: "hostname" },
): boolean {
  const deno = (globalThis as {
    Deno?: { permissions: { querySync(d: unknown): { state: string } } };
  }).Deno;
  return deno === undefined ||
    deno.permissions.querySync(descriptor).state === "granted";
}

/** A database URL, and where it came from (for messages). */
interface Url {
  text: string;
  from: "option '--db'" | "RUNLOCK_DATABASE_URL";
}

/** The database URL: --db=URL, else RUNLOCK_DATABASE_URL, else none. */
function databaseUrl(options: Map<string, string | true>): Url | undefined {
  const given = options.get("db");
  if (typeof given === "string") {
    if (given === "") {
      throw new UsageError("option '--db' needs a URL: --db=postgres://...");
    }
    return { text: given, from: "option '--db'" };
  }
  // Under Deno, without --allow-env, the variable is not read (no prompt).
  const variable = "RUNLOCK_DATABASE_URL";
  if (!granted({ name: "env", variable })) return undefined;
  const text = process.env[variable];
  return text ? { text, from: variable } : undefined;
}

/** This host's name, when it may be read without a prompt. */
function hostHere(): string {
  if (!granted({ name: "sys", kind: "hostname" })) return "";
  try {
    return hostname();
  } catch {
    return "";
  }
}

/**
 * The PostgreSQL backend, imported here and only here: file-lock users
 * never load it, nor its database client.
 */
async function database(url: Url): Promise<Backend> {
  const pg = await import("./postgres/mod.ts");
  let locks: ReturnType<typeof pg.pgLocks>;
  try {
    locks = pg.pgLocks(url.text);
  } catch (err) {
    // A URL that is not postgres://... (its password already blanked).
    throw new UsageError(`${url.from}: ${(err as Error).message}`);
  }
  const here = hostHere();
  return {
    async inspect(name) {
      const i = await locks.inspect(name);
      // A database record names no boot or PID namespace: the host is all
      // there is to compare, and only a difference is certain.
      const elsewhere = i.pid !== 0 && i.host !== "" && here !== "" &&
        i.host !== here;
      return {
        ...i,
        bootId: "",
        pidNamespace: "",
        pidValidHere: elsewhere ? false : undefined,
        pidElsewhere: elsewhere ? "host" : undefined,
      };
    },
    acquire: (name, options) => locks.acquire(name, options),
    // The class that module re-exports, which is runlock's own (one copy
    // under Deno; the npm build keeps it one copy too).
    isHeld: (err): err is Error =>
      err instanceof pg.HeldError || err instanceof HeldError,
    poll: 250,
    end: () => locks.end(),
  };
}

/** The backend the options ask for. */
function backend(url: Url | undefined): Promise<Backend> {
  return url === undefined ? Promise.resolve(files) : database(url);
}

/**
 * The updating "waiting" line on a terminal: redrawn when what it says
 * changes (the waited seconds, the holder), cleared when the wait ends.
 * Does nothing when `io` has no status line.
 */
class Progress {
  #io: CliIo;
  #start = Date.now();
  #text = "";
  #done = false;

  constructor(io: CliIo) {
    this.#io = io;
  }

  get enabled(): boolean {
    return this.#io.status !== undefined && !this.#done;
  }

  update(info: Info): void {
    if (!this.enabled || info.state !== "held") return;
    // Short, and the waited time first: the line is cut to the terminal's
    // width, what the holder runs matters more than when it started, and
    // the path is the one the user just typed.
    const where = info.host ? ` on ${info.host}` : "";
    const who = info.pid === 0
      ? describeState(info)
      : info.meta.cmd
      ? `pid ${info.pid}${where} runs ${info.meta.cmd}`
      : `held by pid ${info.pid}${where}`;
    const text = `runlock: waiting ${
      elapsed(Date.now() - this.#start)
    } for the lock: ${who}`;
    if (text === this.#text) return;
    this.#text = text;
    this.#io.status!(text);
  }

  done(): void {
    this.#done = true;
    if (this.#text !== "") this.#io.status!("");
    this.#text = "";
  }
}

async function status(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, { json: "flag", db: "value" });
  const name = onePath(rest, "status");
  const locks = await backend(databaseUrl(options));
  try {
    const info = await locks.inspect(name);
    if (options.has("json")) {
      io.out(JSON.stringify(toJson(info)));
    } else if (info.state === "invalid") {
      io.err(`runlock: ${describeState(info)}`);
    } else {
      io.out(describeState(info));
      if (info.state !== "free") {
        for (const [key, value] of Object.entries(info.meta).sort()) {
          if (key !== "cmd") io.out(`  ${key}=${value}`);
        }
      }
      const warning = pidWarning(info);
      if (warning) io.err(`runlock: ${warning}`);
    }
    return info.state === "held" ? 0 : info.state === "invalid" ? 2 : 1;
  } finally {
    await locks.end();
  }
}

async function wait(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, { timeout: "value", db: "value" });
  const timeout = seconds("timeout", options.get("timeout"));
  const name = onePath(rest, "wait");
  const locks = await backend(databaseUrl(options));
  const progress = new Progress(io);
  try {
    const deadline = timeout === undefined
      ? Infinity
      : Date.now() + timeout * 1000;
    for (let interval = 5;; interval = Math.min(interval * 2, locks.poll)) {
      const info = await locks.inspect(name);
      if (info.state === "invalid") {
        throw new Error(`${name}: ${info.reason}`);
      }
      if (info.state !== "held") return 0;
      progress.update(info);
      const left = deadline - Date.now();
      if (left <= 0) {
        progress.done();
        io.err(
          `runlock: timed out after ${timeout}s: ${name} is still ${
            describeState(info)
          }`,
        );
        return 1;
      }
      await new Promise((resolve) =>
        setTimeout(resolve, Math.min(interval, left))
      );
    }
  } finally {
    progress.done();
    await locks.end();
  }
}

/**
 * `db-setup`: the SQL that creates the PostgreSQL backend's table once,
 * with the grants the URL's role needs (pgSetupSql). Connects to nothing:
 * the URL only names the role.
 */
async function dbSetup(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, { db: "value", schema: "value" });
  if (rest.length > 0) {
    throw new UsageError(`db-setup: unexpected argument '${rest[0]}'`);
  }
  const url = databaseUrl(options);
  let role: string | undefined;
  if (url !== undefined) {
    let user = "";
    try {
      // The role the client connects as, as node-postgres works it out:
      // `?user=`, the URL's user, PGUSER, then the login name; an empty
      // host (`postgres://app@/db`) is the client's too.
      let u: URL;
      try {
        u = new URL(url.text);
      } catch {
        u = new URL(url.text.replace("@/", "@___DUMMY___/"));
      }
      if (u.protocol !== "postgres:" && u.protocol !== "postgresql:") {
        throw new TypeError("not postgres://");
      }
      const env = (variable: string) =>
        granted({ name: "env", variable }) ? process.env[variable] : undefined;
      user = u.searchParams.get("user") || decodeURIComponent(u.username) ||
        env("PGUSER") ||
        env(process.platform === "win32" ? "USERNAME" : "USER") || "";
    } catch {
      throw new UsageError(
        `${url.from}: needs a postgres://USER@HOST/DATABASE URL`,
      );
    }
    role = user === "" ? undefined : user;
  }
  const pg = await import("./postgres/mod.ts");
  let sql: string;
  try {
    sql = pg.pgSetupSql({ schema: options.get("schema") as string, role });
  } catch (err) {
    throw new UsageError(`db-setup: ${(err as Error).message}`);
  }
  io.out(sql.trimEnd());
  return 0;
}

async function ls(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, {
    json: "flag",
    recursive: "flag",
    db: "value",
  });
  if (options.has("db")) {
    throw new UsageError(
      "ls: lists the lock files in a directory; it has no PostgreSQL form " +
        "(the records are rows of the runlock_locks table)",
    );
  }
  const dir = onePath(rest, "ls", "<dir>");
  let kind: "directory" | "other" | "missing";
  try {
    kind = statSync(dir).isDirectory() ? "directory" : "other";
  } catch (err) {
    if ((err as { code?: string }).code !== "ENOENT") throw err;
    kind = "missing";
  }
  if (kind === "other") throw new Error(`ls: ${dir} is not a directory`);
  // A directory that does not exist (yet) holds no locks: an empty answer,
  // as scan() gives, for a UI that polls it; said on stderr for a person.
  if (kind === "missing" && !options.has("json")) {
    io.err(`runlock: ls: ${dir} does not exist: no locks`);
  }
  const found: Info[] = await scan(dir, {
    recursive: options.has("recursive"),
  });
  if (options.has("json")) {
    io.out(JSON.stringify(found.map(toJson)));
    return 0;
  }
  const now = Date.now();
  const rows = found.map((info) => [
    info.state,
    info.pid === 0 ? "-" : String(info.pid),
    info.host || "-",
    info.started ? ago(now - info.started.getTime()) : "-",
    info.state === "invalid" ? info.reason ?? "-" : info.meta.cmd || "-",
    info.path,
  ]);
  const widths = rows.reduce(
    (w, row) => w.map((n, i) => Math.max(n, [...row[i]].length)),
    [0, 0, 0, 0, 0, 0],
  );
  for (const row of rows) {
    io.out(
      row.map((cell, i) =>
        i === row.length - 1
          ? cell
          : cell + " ".repeat(widths[i] - [...cell].length)
      ).join("  "),
    );
  }
  for (const info of found) {
    const warning = pidWarning(info);
    if (warning) io.err(`runlock: ${info.path}: ${warning}`);
  }
  return 0;
}

/**
 * Signals `run` leaves alone, each on purpose (README, "Signals"):
 *
 * - SIGKILL and SIGSTOP cannot be caught.
 * - SIGCHLD reports runlock's own child; it is not meant for the command.
 * - SIGSEGV, SIGBUS, SIGFPE and SIGILL report a fault in runlock itself
 *   (native code, the FFI): a process in that state must not go on holding
 *   the lock, and Node's documentation warns that a listener for a real
 *   fault can hang the process. Deno does not let a program catch three of
 *   them at all.
 * - SIGPIPE is ignored by every runtime (a write to a closed pipe fails with
 *   EPIPE instead), and runlock keeps it ignored: listening would turn
 *   runlock's own EPIPE into a signal for the command, and removing the
 *   listener afterwards would leave SIGPIPE fatal.
 */
const NOT_HANDLED = new Set([
  "SIGKILL",
  "SIGSTOP",
  "SIGCHLD",
  "SIGSEGV",
  "SIGBUS",
  "SIGFPE",
  "SIGILL",
  "SIGPIPE",
]);

/**
 * Job-control stops. The command runs in its own session (see `run`), where
 * the kernel discards a stop signal whose action is the default one (its
 * process group is orphaned), so runlock stops the command's group with
 * SIGSTOP and then itself, and continues it on SIGCONT: what dumb-init does
 * in its setsid mode.
 */
const STOPS = new Set(["SIGTSTP", "SIGTTIN", "SIGTTOU"]);

/** Signals whose default action is to do nothing: they never end a wait. */
const HARMLESS = new Set(["SIGCONT", "SIGURG", "SIGWINCH", "SIGINFO"]);

/**
 * Every signal `run` listens to: one name per signal number (SIGIOT is
 * SIGABRT, SIGPOLL is SIGIO, SIGUNUSED is SIGSYS), so that no signal is
 * forwarded twice. Bun's JavaScriptCore takes SIGPWR to suspend threads: a
 * listener would never run, so runlock does not ask for one there.
 */
const HANDLED: NodeJS.Signals[] = (() => {
  const seen = new Set<number>();
  const names: NodeJS.Signals[] = [];
  const bun = "Bun" in globalThis;
  for (const [name, number] of Object.entries(constants.signals)) {
    if (seen.has(number)) continue;
    seen.add(number);
    if (NOT_HANDLED.has(name) || (bun && name === "SIGPWR")) continue;
    names.push(name as NodeJS.Signals);
  }
  return names;
})();

/** `kill(-pgid, signal)`; a group that is gone already is not an error. */
function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch (err) {
    if ((err as { code?: string }).code !== "ESRCH") throw err;
  }
}

async function run(args: string[], io: CliIo): Promise<number> {
  const { options, lists, rest: afterOptions } = parse(args, {
    wait: "optional",
    "conflict-exit-code": "value",
    "on-lost": "value",
    meta: "repeat",
    "no-cmd": "flag",
    db: "value",
  });
  const waitFor = options.get("wait");
  if (waitFor === true && /^\d+(\.\d*)?$/.test(afterOptions[0] ?? "")) {
    const n = afterOptions[0];
    throw new UsageError(
      `run: '--wait ${n}' waits without a time limit for a lock file named '${n}': ` +
        `write --wait=${n} for ${n} seconds (or ./${n} for a file named so)`,
    );
  }
  // `run [options] [--] <path> -- <command>`: a first `--` ends the options,
  // so that a path may start with "-".
  const rest = afterOptions[0] === "--" ? afterOptions.slice(1) : afterOptions;
  if (rest.length === 0 || rest[0] === "--") {
    throw new UsageError("run: missing <path>");
  }
  const path = rest[0];
  if (rest[1] !== "--") {
    throw new UsageError(
      rest.length === 1
        ? "run: missing '--' before the command"
        : `run: missing '--' between <path> and the command, before '${
          rest[1]
        }'`,
    );
  }
  const command = rest.slice(2);
  if (command.length === 0) {
    throw new UsageError("run: missing <command> after '--'");
  }
  let conflict = EX_TEMPFAIL;
  const code = options.get("conflict-exit-code");
  if (code !== undefined) {
    conflict = Number(code);
    if (!Number.isInteger(conflict) || conflict < 0 || conflict > 255) {
      throw new UsageError(
        `option '--conflict-exit-code' must be an integer from 0 to 255: current value is '${code}'`,
      );
    }
  }
  const onLost = options.get("on-lost") ?? "warn";
  if (onLost !== "warn" && onLost !== "term") {
    throw new UsageError(
      `option '--on-lost' must be 'warn' or 'term': current value is '${onLost}'`,
    );
  }
  const timeout = waitFor === undefined
    ? 0
    : waitFor === true
    ? Infinity
    : seconds("wait", waitFor)! * 1000;
  // What the run is, in the record: the command line (unless --no-cmd),
  // then the --meta fields (so that --meta cmd=... replaces it).
  const meta = {
    ...(options.has("no-cmd") ? {} : { cmd: commandLine(command) }),
    ...metaOptions(lists.get("meta") ?? []),
  };
  const url = databaseUrl(options);

  // One listener for every catchable signal, for the whole run, so that no
  // signal meets its default action (death, and the kernel drops the lock
  // while the command runs on unguarded). Before the command starts, a
  // signal whose default is to terminate stops the wait and runs nothing;
  // once it runs, every signal goes to the command's process group, and
  // runlock lives until the command exits, whatever it does with them.
  const stop = new AbortController();
  let child: ChildProcess | undefined;
  let exited = false;
  const running = () => child?.pid !== undefined && !exited;
  const onSignal = (signal: NodeJS.Signals) => {
    if (STOPS.has(signal)) {
      if (running()) signalGroup(child!.pid!, "SIGSTOP");
      process.kill(process.pid, "SIGSTOP");
    } else if (running()) {
      signalGroup(child!.pid!, signal);
    } else if (child === undefined && !HARMLESS.has(signal)) {
      if (!stop.signal.aborted) stop.abort(signal);
    }
  };
  const listening: NodeJS.Signals[] = [];
  for (const s of HANDLED) {
    try {
      process.on(s, onSignal);
      listening.push(s);
    } catch {
      // A runtime that refuses a signal (none of Deno, Node and Bun does
      // for this list on Linux) leaves it at its default action.
    }
  }
  let locks: Backend | undefined;
  try {
    locks = await backend(url);
    const lock = await take(locks, path, {
      timeout,
      signal: stop.signal,
      meta,
    }, io);
    if (typeof lock === "string") {
      if (lock === "held") return conflict;
      return 128 + signalNumber(String(stop.signal.reason));
    }
    // Loss of the lock while the command runs: said at once, once; the
    // command goes on (the default), or gets SIGTERM (--on-lost=term).
    let reported = false;
    const report = (reason: unknown, late: boolean) => {
      if (reported) return;
      reported = true;
      const what = reason instanceof Error ? reason.message : String(reason);
      io.err(
        late
          ? `runlock: lost the lock before the command ended: ${what}`
          : `runlock: lost the lock while the command runs: ${what}. ` +
            (onLost === "term"
              ? "Sending SIGTERM to the command (--on-lost=term)"
              : "The command keeps running, without the lock (--on-lost=term would stop it)"),
      );
    };
    const onAbort = () => {
      report(lock.signal.reason, false);
      if (onLost === "term" && running()) signalGroup(child!.pid!, "SIGTERM");
    };
    try {
      if (stop.signal.aborted) {
        return 128 + signalNumber(String(stop.signal.reason));
      }
      // detached: the command runs in a session and process group of its
      // own (setsid), as under dumb-init. The terminal then signals only
      // runlock, which forwards each signal once to the command's group:
      // one Ctrl-C is one SIGINT (in runlock's group the command got the
      // terminal's and runlock's), and a signal sent to runlock alone (cron,
      // systemd, kill PID) reaches the command the same way. The price: the
      // command has no controlling terminal (it still reads and writes the
      // terminal through its stdio, but cannot open /dev/tty).
      const started = spawn(command[0], command.slice(1), {
        stdio: "inherit",
        detached: true,
      });
      child = started;
      if (lock.signal.aborted) onAbort();
      else lock.signal.addEventListener("abort", onAbort, { once: true });
      return await new Promise<number>((resolve) => {
        started.on("error", (err: Error & { code?: string }) => {
          exited = true;
          io.err(`runlock: cannot run '${command[0]}': ${err.message}`);
          resolve(err.code === "ENOENT" ? 127 : 126);
        });
        started.on("exit", (status, signal) => {
          exited = true;
          resolve(signal ? 128 + signalNumber(signal) : status ?? 1);
        });
      });
    } finally {
      lock.signal.removeEventListener("abort", onAbort);
      await release(lock, (err) => report(err, true));
    }
  } finally {
    for (const s of listening) process.off(s, onSignal);
    await locks?.end();
  }
}

/**
 * Releases `run`'s lock. A loss that release() finds (it throws
 * LockLostError once) goes to `lost`: the exit code stays the command's.
 */
async function release(
  lock: HeldLock,
  lost: (err: Error) => void,
): Promise<void> {
  try {
    await lock.release();
  } catch (err) {
    if ((err as Error)?.name !== "LockLostError") throw err;
    lost(err as Error);
  }
}

/**
 * Takes the lock for `run`, drawing the waiting line on a terminal while
 * another run holds it. Returns the lock, or "held" when another run holds
 * it (said on stderr), or "stopped" when a signal ended the wait.
 */
async function take(
  locks: Backend,
  name: string,
  options: {
    timeout: number;
    signal: AbortSignal;
    meta: Record<string, string>;
  },
  io: CliIo,
): Promise<HeldLock | "held" | "stopped"> {
  const progress = new Progress(io);
  let ticker: ReturnType<typeof setInterval> | undefined;
  if (progress.enabled && options.timeout > 0) {
    const tick = () => {
      locks.inspect(name).then((info) => {
        // Our own record, once acquire has taken the lock, is not a holder
        // to wait for.
        if (info.pid !== process.pid) progress.update(info);
      }, () => {});
    };
    ticker = setInterval(tick, PROGRESS_MS);
    tick();
  }
  try {
    return await locks.acquire(name, options);
  } catch (err) {
    if (locks.isHeld(err)) {
      progress.done();
      io.err(`runlock: ${err.message}`);
      return "held";
    }
    if (options.signal.aborted) return "stopped";
    throw err;
  } finally {
    clearInterval(ticker);
    progress.done();
  }
}

function signalNumber(name: string): number {
  return (constants.signals as Record<string, number>)[name] ?? 0;
}

/**
 * Runs the `runlock` command line and returns its exit code.
 *
 * @param args The arguments after the program name.
 * @param io Where output goes (defaults to stdout and stderr, with the
 * waiting line when stderr is a terminal).
 * @returns The exit code.
 *
 * @example Asking for the status of a lock nobody holds
 * ```ts
 * import { main } from "@runlock/runlock/cli";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const lines: string[] = [];
 * const io = { out: (t: string) => lines.push(t), err: (t: string) => lines.push(t) };
 * assert.equal(await main(["status", `${dir}/run.lock`], io), 1);
 * assert.deepEqual(lines, ["free"]);
 * ```
 *
 * @example Listing the locks of a directory, one line each
 * ```ts
 * import { main } from "@runlock/runlock/cli";
 * import { acquire } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * await using _lock = await acquire(`${dir}/sync.lock`, { meta: { cmd: "./sync.sh --full" } });
 * const lines: string[] = [];
 * const io = { out: (t: string) => lines.push(t), err: (t: string) => lines.push(t) };
 * assert.equal(await main(["ls", dir], io), 0);
 * assert.equal(lines.length, 1);
 * assert.match(lines[0], new RegExp(`^held  ${Deno.pid}  .*  \\./sync\\.sh --full  ${dir}/sync\\.lock$`));
 * ```
 */
export async function main(args: string[], io: CliIo = stdio): Promise<number> {
  const [command, ...rest] = args;
  try {
    switch (command) {
      case "status":
        return await status(rest, io);
      case "run":
        return await run(rest, io);
      case "wait":
        return await wait(rest, io);
      case "ls":
        return await ls(rest, io);
      case "db-setup":
        return await dbSetup(rest, io);
      case "--help":
      case "-h":
      case "help":
        io.out(HELP);
        return 0;
      case "--version":
      case "-V":
        io.out(`runlock ${VERSION}`);
        return 0;
      case undefined:
        throw new UsageError("missing command");
      default:
        throw new UsageError(`unknown command '${command}'`);
    }
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`runlock: ${err.message}\n${USAGE}`);
      return EX_USAGE;
    }
    io.err(`runlock: ${err instanceof Error ? err.message : String(err)}`);
    return 2;
  }
}

if (import.meta.main) {
  // Not a top-level await: the npm package also ships this module as
  // CommonJS (`require("runlock/cli")`), which has none.
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
