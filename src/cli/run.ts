/**
 * `runlock run`: takes the lock, runs the command under it in a session of
 * its own, forwards signals to it, and releases the lock when it exits.
 *
 * @module
 */

import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants as fsConstants, statSync } from "node:fs";
import type { HeldLock } from "../contract.ts";
import { process } from "../_process.ts";
import { redact } from "../_redact.ts";
import { metaOptions, parse, seconds, UsageError } from "./_args.ts";
import { type Backend, backend } from "./_backend.ts";
import { clip, escape, printable, printableErrors } from "./_format.ts";
import { handedOn, lockDescriptor, nameChild } from "./_hand_on.ts";
import type { Command } from "./_help.ts";
import { type CliIo, Progress } from "./_io.ts";
import { envValue } from "../platform/runtime.ts";
import { databaseUrl, DB_HELP, DB_OPTIONS } from "./_postgres.ts";
import {
  HANDLED,
  HARMLESS,
  signalGroup,
  signalNumber,
  STOPS,
} from "./_signals.ts";

/** The exit code when another run holds the lock (EX_TEMPFAIL). */
const EX_TEMPFAIL = 75;
/** The longest command line `run` records as `meta.cmd`, in characters. */
const CMD_MAX = 200;

/**
 * `name` as execvp(3) finds it in PATH (an empty entry is the working
 * directory), else `name` itself.
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

/** Characters sh takes literally in a word. */
const PLAIN_WORD = /^[A-Za-z0-9_@%+=:,./-]+$/;
/** What would break the record's one-line value. */
// deno-lint-ignore no-control-regex -- control characters are the point
const LINE_BREAKING = /[\x00-\x1f\x7f\x85\u2028\u2029]/;

/** One argument, quoted so that sh reads it back as it was. */
function shellWord(arg: string, first: boolean): string {
  // In the first word, "a=b" would be an assignment.
  if (PLAIN_WORD.test(arg) && !(first && arg.includes("="))) return arg;
  if (LINE_BREAKING.test(arg)) {
    // $'...' (bash, ksh, zsh, POSIX.1-2024 sh) spells them with escapes.
    // deno-lint-ignore no-control-regex -- control characters are the point
    return `$'${arg.replace(/[\\'\x00-\x1f\x7f\x85\u2028\u2029]/g, escape)}'`;
  }
  return `'${arg.replaceAll("'", `'\\''`)}'`;
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
  // A first `--` ends the options, so that a path may start with "-".
  const rest = afterOptions[0] === "--" ? afterOptions.slice(1) : afterOptions;
  if (rest.length === 0 || rest[0] === "--") {
    throw new UsageError("run: missing <path>");
  }
  if (afterOptions[0] === "--" && !rest.includes("--")) {
    // `run -- ./sync.sh`: the one `--` is the command's.
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
  // --meta after the command line, so that --meta cmd=... replaces it.
  const cmd = command.map((a, i) => shellWord(a, i === 0)).join(" ");
  const meta = {
    ...(options.has("no-cmd") ? {} : { cmd: clip(cmd, CMD_MAX) }),
    ...metaOptions(lists.get("meta") ?? []),
  };
  const url = databaseUrl(options);

  // Every catchable signal is listened to for the whole run: at its
  // default action runlock would die and the kernel drop the lock while
  // the command runs on. Before the command starts, one that would
  // terminate ends the wait; once it runs, each goes to its process group.
  const stop = new AbortController();
  const stopped = () => 128 + signalNumber(String(stop.signal.reason));
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
      // A runtime that refuses a signal leaves it at its default action.
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
    if (lock === "held") return conflict;
    if (lock === "stopped") return stopped();
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
    const cannotRun = (err: Error & { code?: string }) => {
      io.err(
        `runlock: cannot run '${printable(command[0])}': ${
          whyNotStarted(command[0], err)
        }`,
      );
      return err.code === "ENOENT" ? 127 : 126;
    };
    try {
      if (stop.signal.aborted) return stopped();
      // detached (setsid), as under dumb-init: the terminal signals only
      // runlock, which forwards each signal once to the command's group
      // (one Ctrl-C is one SIGINT), as it does one sent to runlock alone
      // (cron, systemd). The price: the command cannot open /dev/tty.
      // The lock's descriptor goes to the command as its fd 9, as flock(1)
      // hands on its own, so that the flock outlives a SIGKILLed runlock
      // (PROTOCOL.md, "Handing the lock to a command"). Not fd 3, which
      // tools write to as their own (bats): that would land in the record.
      const fd = lockDescriptor(lock);
      if (fd === null) {
        io.err(
          "runlock: cannot hand the lock's descriptor to the command " +
            "(its number could not be read from /proc with sh): " +
            "the lock lasts only as long as runlock itself",
        );
      }
      const options = {
        stdio: typeof fd === "number" ? handedOn(fd, 9) : "inherit" as const,
        detached: true,
      };
      let started: ChildProcess;
      try {
        started = spawn(command[0], command.slice(1), options);
      } catch (err) {
        // Bun throws what Node and Deno report as an "error" event, and
        // does not run a script without #! (ENOEXEC) with sh as execvp(3)
        // does.
        if ((err as { code?: string }).code !== "ENOEXEC") {
          return cannotRun(err as Error);
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
        started.on("error", (err) => {
          exited = true;
          resolve(cannotRun(err));
        });
        started.on("exit", (status, signal) => {
          exited = true;
          resolve(signal ? 128 + signalNumber(signal) : status ?? 1);
        });
      });
    } finally {
      lock.signal.removeEventListener("abort", onAbort);
      // What still holds the flock now (a daemon it started with fd 9
      // open) is no run, and a watch is told so.
      if (child?.pid !== undefined) nameChild(lock, 0);
      await release(lock, (err) => report(err, true));
    }
  } finally {
    for (const s of listening) process.off(s, onSignal);
    await locks?.end();
  }
}

/** Releases `lock`; a loss it finds is said, the exit code the command's. */
async function release(lock: HeldLock, lost: (err: Error) => void) {
  try {
    await lock.release();
  } catch (err) {
    if ((err as Error)?.name !== "LockLostError") throw err;
    lost(err as Error);
  }
}

/**
 * Why the command could not be started, in the shell's words, not the
 * runtime's (`spawn x ENOENT`, which differs between runtimes).
 */
function whyNotStarted(
  command: string,
  err: Error & { code?: string },
): string {
  switch (err.code) {
    case "ENOENT":
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
      return printable(
        err.message.replace(/^spawn(Sync)? \S+ /, "") || String(err.code),
      );
  }
}

/**
 * Takes the lock, drawing the waiting line on a terminal meanwhile.
 * "held": another run holds it (said on stderr); "stopped": a signal.
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
        // Not our own record, once acquire has taken the lock.
        if (info.pid !== process.pid) progress.update(info);
      }, () => {});
    };
    ticker = setInterval(tick, 500);
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
