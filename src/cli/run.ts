/**
 * `runlock run`: takes the lock, runs the command under it in a session of
 * its own, forwards signals to it, and releases the lock when it exits.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants as fsConstants, statSync } from "node:fs";
import { process } from "../_process.ts";
import { redact } from "../_redact.ts";
import { metaOptions, parse, seconds, UsageError } from "./_args.ts";
import {
  type Backend,
  backend,
  databaseUrl,
  DB_HELP,
  DB_OPTIONS,
} from "./_backend.ts";
import type { HeldLock } from "../contract.ts";
import { clip, printable, printableErrors } from "./_format.ts";
import {
  handNumbers,
  lockDescriptor,
  nameChild,
  type Numbers,
} from "./_hand_on.ts";
import type { Command } from "./_help.ts";
import { type CliIo, Progress } from "./_io.ts";
import { envValue } from "./_permissions.ts";
import {
  HANDLED,
  HARMLESS,
  signalGroup,
  signalNumber,
  STOPS,
} from "./_signals.ts";

/**
 * The descriptor number the command gets the lock's descriptor at, unless
 * runlock was given one there itself (see handNumbers).
 */
const HANDED_FD = 9;

/**
 * `name` as execvp(3) finds it: itself when it has a `/`, else the first
 * executable file of that name in PATH (an empty entry is the working
 * directory), else `name` (sh then says it is not found).
 */
function onPath(name: string): string {
  if (name.includes("/")) return name;
  for (const dir of (envValue("PATH") ?? "/usr/bin:/bin").split(":")) {
    const path = `${dir === "" ? "." : dir}/${name}`;
    try {
      if (!statSync(path).isFile()) continue;
      accessSync(path, fsConstants.X_OK);
      return path;
    } catch {
      // Not there, or not executable: the next.
    }
  }
  return name;
}

/**
 * The command's descriptors: runlock's stdio, the lock's at `n.at`, the
 * flocked descriptors runlock was given at their own numbers, nothing
 * else (a descriptor runlock itself inherited elsewhere is left alone
 * where the runtime passes them on).
 */
function handedOn(fd: number, n: Numbers): ("inherit" | "ignore" | number)[] {
  const stdio: ("inherit" | "ignore" | number)[] = [
    "inherit",
    "inherit",
    "inherit",
  ];
  const last = Math.max(n.at, ...n.keep);
  while (stdio.length <= last) stdio.push("ignore");
  for (const kept of n.keep) stdio[kept] = kept;
  stdio[n.at] = fd;
  return stdio;
}

/** The exit code when another run holds the lock (EX_TEMPFAIL). */
const EX_TEMPFAIL = 75;
/** The longest command line `run` records as `meta.cmd`, in characters. */
const CMD_MAX = 200;
/** How often `run --wait` looks at the holder for the waiting line (ms). */
const PROGRESS_MS = 500;

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

async function run(args: string[], io: CliIo): Promise<number> {
  const { options, lists, rest: afterOptions } = parse(args, {
    wait: "optional",
    "conflict-exit-code": "value",
    "on-lost": "value",
    meta: "repeat",
    "no-cmd": "flag",
    ...DB_OPTIONS,
  }, "run");
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
  if (afterOptions[0] === "--" && !rest.includes("--")) {
    // `run -- ./sync.sh`: the one `--` is the command's, so the path is
    // missing (taking ./sync.sh for the path would then ask for a '--').
    throw new UsageError(
      `run: missing <path> before '--': runlock run <path> -- ${
        redact(rest[0])
      } ...`,
    );
  }
  const path = rest[0];
  if (rest[1] !== "--") {
    throw new UsageError(
      rest.length === 1
        ? "run: missing '--' before the command"
        : `run: missing '--' between <path> and the command, before '${
          redact(rest[1])
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
  // while the command runs on without it). Before the command starts, a
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
    locks.check(path);
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
      const what = printable(
        reason instanceof Error ? reason.message : String(reason),
      );
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
      // The lock's descriptor goes to the command as its fd 9
      // (HANDED_FD), as flock(1) hands on its own: if runlock itself dies
      // (SIGKILL, the OOM killer), the kernel keeps the flock for as long
      // as the command, or what it started with the descriptor open,
      // lives, and the next run is refused meanwhile (PROTOCOL.md,
      // "Handing the lock to a command"). Not fd 3, which tools write to
      // as their own (bats): a write there would land in the record.
      // A PostgreSQL lock is runlock's database session, which cannot be
      // handed on.
      const fd = lockDescriptor(lock);
      if (fd === null) {
        io.err(
          "runlock: cannot hand the lock's descriptor to the command " +
            "(its number could not be read from /proc with sh): " +
            "the lock lasts only as long as runlock itself",
        );
      }
      const options = {
        stdio: fd === undefined || fd === null
          ? "inherit" as const
          : handedOn(fd, handNumbers(HANDED_FD, fd)),
        detached: true,
      };
      let started: ChildProcess;
      try {
        started = spawn(command[0], command.slice(1), options);
      } catch (err) {
        // Bun throws what Node and Deno report as an "error" event, and a
        // file the kernel cannot execute (ENOEXEC: a script without #!)
        // is not run by sh there, as execvp(3) runs it for them.
        const error = err as Error & { code?: string };
        if (error.code !== "ENOEXEC") {
          io.err(
            `runlock: cannot run '${printable(command[0])}': ${
              whyNotStarted(command[0], error)
            }`,
          );
          return error.code === "ENOENT" ? 127 : 126;
        }
        started = spawn(
          "/bin/sh",
          [onPath(command[0]), ...command.slice(1)],
          options,
        );
      }
      child = started;
      if (started.pid !== undefined && typeof fd === "number") {
        const why = nameChild(lock, started.pid);
        if (why) {
          io.err(
            `runlock: could not write the command's pid into the lock file: ${
              printable(why)
            }`,
          );
        }
      }
      if (lock.signal.aborted) onAbort();
      else lock.signal.addEventListener("abort", onAbort, { once: true });
      return await new Promise<number>((resolve) => {
        started.on("error", (err: Error & { code?: string }) => {
          exited = true;
          io.err(
            `runlock: cannot run '${printable(command[0])}': ${
              whyNotStarted(command[0], err)
            }`,
          );
          resolve(err.code === "ENOENT" ? 127 : 126);
        });
        started.on("exit", (status, signal) => {
          exited = true;
          resolve(signal ? 128 + signalNumber(signal) : status ?? 1);
        });
      });
    } finally {
      lock.signal.removeEventListener("abort", onAbort);
      // The command has ended: what still holds the flock (a daemon it
      // started with fd 9 open) is no run, and a watch is told so.
      if (child?.pid !== undefined) nameChild(lock, 0);
      await release(lock, (err) => report(err, true));
    }
  } finally {
    for (const s of listening) process.off(s, onSignal);
    await locks?.end();
  }
}

/**
 * Why the command could not be started, in the shell's words ("command
 * not found", "permission denied"), not the runtime's (`spawn x ENOENT`,
 * which differs between Deno, Node and Bun).
 */
function whyNotStarted(
  command: string,
  err: Error & { code?: string },
): string {
  switch (err.code) {
    case "ENOENT":
      // A name is looked up in PATH; a path is not (as sh says them).
      return command.includes("/")
        ? "no such file or directory"
        : "command not found";
    case "EACCES":
    case "EPERM":
      return "permission denied";
    case "ENOEXEC":
      return "not an executable format";
    case "EISDIR":
      return "is a directory";
    default:
      // Whatever else the runtime says, without its "spawn CMD " prefix.
      return printable(
        err.message.replace(/^spawn(Sync)? \S+ /, "") || String(err.code),
      );
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
      io.err(`runlock: ${printable(err.message)}`);
      return "held";
    }
    if (options.signal.aborted) return "stopped";
    throw err;
  } finally {
    clearInterval(ticker);
    progress.done();
  }
}

/**
 * `runlock run [options] [--] <path|name> -- <command> [args...]`.
 */
export const runCommand: Command = {
  name: "run",
  usage:
    `runlock run [--wait[=SECONDS]] [--conflict-exit-code=N] [--on-lost=warn|term]
            [--meta KEY=VALUE]... [--no-cmd] [--db=URL [--schema=NAME]]
            [--] <path|name> -- <command> [args...]`,
  help: `Take the lock, run the command in a session of its own with
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
The command gets the lock's descriptor as fd 9, as with flock(1):
if runlock itself is SIGKILLed, the lock lives on for as long as
the command (or what it started with fd 9 open: start a daemon
with 9>&-) runs, and status names the command's pid; the next
run takes it once they end.
With --db the lock is runlock's database session, which ends with
runlock: the command then runs on without it.
${DB_HELP}
A role that may not create that table is told the SQL to run once.`,
  run: printableErrors(run),
};
