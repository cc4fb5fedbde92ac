/**
 * The `runlock` command: ask who holds a lock, guard a command with it, or
 * wait for it, from a shell or cron, with the same lock the library uses.
 *
 * ```sh
 * runlock status .state/run.lock            # exit 0 held, 1 free or stale, 2 invalid/error
 * runlock run .state/run.lock -- ./sync.sh  # exit 75 if another run holds it
 * runlock wait --timeout=60 .state/run.lock # exit 0 once free, 1 on timeout
 * ```
 *
 * Built on the public API only. Deno, from a clone: `deno run
 * --allow-read=.state --allow-write=.state --allow-sys=hostname src/cli.ts
 * ...`, plus `--allow-run --allow-env` for `run` (it starts the command with
 * runlock's environment); `status` and `wait` need only `--allow-read`.
 * npm: the `runlock` bin, and `import { main } from "runlock/cli"`.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import { constants } from "node:os";
import process from "node:process";
import {
  acquire,
  HeldError,
  inspect,
  type Inspection,
  type Lock,
} from "../mod.ts";
import { VERSION } from "./version.ts";

const EX_USAGE = 2;
const EX_TEMPFAIL = 75;

const USAGE = `usage:
  runlock status [--json] [--] <path>
  runlock run [--wait[=SECONDS]] [--conflict-exit-code=N] [--] <path> -- <command> [args...]
  runlock wait [--timeout=SECONDS] [--] <path>
  runlock --help | --version`;

const HELP =
  `runlock ${VERSION}: one run at a time per lock file, and everyone can see who.

${USAGE}

commands:
  status   Print who holds the lock: "held by pid N on HOST since T (Xm ago)",
           "free", or "stale: last holder pid N is gone".
           Exit 0 when a live run holds it, 1 when free or stale, 2 when the
           file is invalid or on error. --json prints the inspect() result.
  run      Take the lock, run the command in a session of its own with
           inherited stdio, forward every signal runlock gets to the
           command's process group (so one Ctrl-C reaches it once), release
           the lock when it exits, and exit with its exit code (128+N if it
           died of signal N). Ctrl-Z stops the command, then runlock.
           If another run holds the lock: exit 75 (or --conflict-exit-code)
           at once, or after waiting with --wait (forever) or --wait=SECONDS.
           A path that starts with "-" goes after "--": run -- -x.lock -- cmd.
           If runlock itself is SIGKILLed, the kernel drops the lock at once
           while the command goes on running unguarded; status then reports
           the lock stale with runlock's pid.
  wait     Wait until no live run holds the lock. Exit 0 then, 1 on timeout
           (saying on stderr who still holds it).

exit codes: 0 ok/held, 1 free/stale/timeout, 2 usage or error, 75 held by
another run (run), 126/127 command not executable/not found.`;

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
}

const stdio: CliIo = {
  out: (text) => process.stdout.write(text + "\n"),
  err: (text) => process.stderr.write(text + "\n"),
};

/** Parses `--name` and `--name=value` options up to the first non-option. */
function parse(
  args: string[],
  known: Record<string, "flag" | "value" | "optional">,
): { options: Map<string, string | true>; rest: string[] } {
  const options = new Map<string, string | true>();
  let i = 0;
  for (; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--") break;
    if (!arg.startsWith("--")) break;
    const eq = arg.indexOf("=");
    const name = eq < 0 ? arg.slice(2) : arg.slice(2, eq);
    const value = eq < 0 ? undefined : arg.slice(eq + 1);
    const kind = known[name];
    if (kind === undefined) throw new UsageError(`unknown option '${arg}'`);
    if (kind === "flag" && value !== undefined) {
      throw new UsageError(`option '--${name}' takes no value`);
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
  return { options, rest: args.slice(i) };
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

function onePath(args: string[], command: string): string {
  // A `--` before the path ends the options: the path may start with "-".
  const rest = args[0] === "--" ? args.slice(1) : args;
  if (rest.length === 0) {
    throw new UsageError(`${command}: missing <path>`);
  }
  if (rest.length > 1) {
    throw new UsageError(`${command}: unexpected argument '${rest[1]}'`);
  }
  return rest[0];
}

function ago(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ago`;
  return `${Math.floor(s / 86400)}d ago`;
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

/** One line describing an inspection, as `runlock status` prints it. */
function describeState(info: Inspection, now = new Date()): string {
  switch (info.state) {
    case "free":
      return "free";
    case "held": {
      if (info.pid === 0) {
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
      return line;
    }
    case "stale":
      return info.pid === 0
        ? "stale: an empty lock file that nobody holds"
        : `stale: last holder pid ${info.pid} is gone`;
    case "invalid":
      return `invalid: ${info.path}: ${info.reason}`;
  }
}

async function status(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, { json: "flag" });
  const path = onePath(rest, "status");
  const info = await inspect(path);
  if (options.has("json")) {
    io.out(JSON.stringify({
      ...info,
      started: info.started?.toISOString() ?? null,
      reason: info.reason ?? null,
    }));
  } else if (info.state === "invalid") {
    io.err(`runlock: ${describeState(info)}`);
  } else {
    io.out(describeState(info));
  }
  return info.state === "held" ? 0 : info.state === "invalid" ? 2 : 1;
}

async function wait(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, { timeout: "value" });
  const timeout = seconds("timeout", options.get("timeout"));
  const path = onePath(rest, "wait");
  const deadline = timeout === undefined
    ? Infinity
    : Date.now() + timeout * 1000;
  for (let interval = 5;; interval = Math.min(interval * 2, 100)) {
    const info = await inspect(path);
    if (info.state === "invalid") {
      throw new Error(`${path}: ${info.reason}`);
    }
    if (info.state !== "held") return 0;
    const left = deadline - Date.now();
    if (left <= 0) {
      io.err(
        `runlock: timed out after ${timeout}s: ${path} is still ${
          describeState(info)
        }`,
      );
      return 1;
    }
    await new Promise((resolve) =>
      setTimeout(resolve, Math.min(interval, left))
    );
  }
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
  const { options, rest: afterOptions } = parse(args, {
    wait: "optional",
    "conflict-exit-code": "value",
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
  const timeout = waitFor === undefined
    ? 0
    : waitFor === true
    ? Infinity
    : seconds("wait", waitFor)! * 1000;

  // One listener for every catchable signal, for the whole run, so that no
  // signal meets its default action (death, and the kernel drops the lock
  // while the command runs on unguarded). Before the command starts, a
  // signal whose default is to terminate stops the wait and runs nothing;
  // once it runs, every signal goes to the command's process group, and
  // runlock lives until the command exits, whatever it does with them.
  const stop = new AbortController();
  let child: ChildProcess | undefined;
  let exited = false;
  const onSignal = (signal: NodeJS.Signals) => {
    const running = child?.pid !== undefined && !exited;
    if (STOPS.has(signal)) {
      if (running) signalGroup(child!.pid!, "SIGSTOP");
      process.kill(process.pid, "SIGSTOP");
    } else if (running) {
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
  try {
    let lock: Lock;
    try {
      lock = await acquire(path, { timeout, signal: stop.signal });
    } catch (err) {
      if (err instanceof HeldError) {
        io.err(`runlock: ${err.message}`);
        return conflict;
      }
      if (stop.signal.aborted) {
        return 128 + signalNumber(String(stop.signal.reason));
      }
      throw err;
    }
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
      await lock.release();
    }
  } finally {
    for (const s of listening) process.off(s, onSignal);
  }
}

function signalNumber(name: string): number {
  return (constants.signals as Record<string, number>)[name] ?? 0;
}

/**
 * Runs the `runlock` command line and returns its exit code.
 *
 * @param args The arguments after the program name.
 * @param io Where output goes (defaults to stdout and stderr).
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
