// Test helpers: temp dirs, and child processes of the runtime under test
// that take the lock through the public API (tests/fixtures/child.ts).
import { spawn, spawnSync } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";

const here = new URL(".", import.meta.url).pathname;

/** A fresh temp directory, removed by the returned function. */
export function tempDir(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "runlock-test-"));
  // maxRetries: a directory whose last files are still being removed by a
  // process that has just exited reads ENOTEMPTY once in a while.
  return {
    dir,
    cleanup: () =>
      rmSync(dir, {
        recursive: true,
        force: true,
        maxRetries: 5,
        retryDelay: 50,
      }),
  };
}

declare const Deno: { execPath(): string } | undefined;

/** Which runtime runs the tests: "deno", "node" or "bun". */
export const runtime: "deno" | "node" | "bun" = typeof Deno !== "undefined"
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

/** A file in tests/fixtures (the .py fixtures are copied as they are). */
export function fixture(name: string): string {
  return join(here, "fixtures", name);
}

// Under Deno the fixtures are the .ts sources; under Node and Bun they are
// the .js files that scripts/build_npm.ts compiled next to these helpers.
const extension = import.meta.url.endsWith(".ts") ? ".ts" : ".js";

/**
 * The command line that runs a fixture under the runtime running the tests.
 * `denoFlags` replaces `--allow-all` for permission tests.
 */
export function fixtureCommand(
  name: string,
  args: string[],
  denoFlags: string[] = ["--allow-all"],
): [string, string[]] {
  const script = join(here, "fixtures", name.replace(/\.ts$/, extension));
  if (runtime === "deno") {
    return [Deno!.execPath(), [
      "run",
      "--quiet",
      ...denoFlags,
      script,
      ...args,
    ]];
  }
  return [process.execPath, [script, ...args]];
}

/**
 * The command line of the `runlock` CLI for the runtime under test: the
 * source under Deno, the installed package's `bin` under Node and Bun.
 */
export function cliCommand(): string[] {
  if (runtime === "deno") {
    const cli = join(here, "..", "src", "cli.ts");
    return [Deno!.execPath(), "run", "--quiet", "--allow-all", cli];
  }
  const pkg = createRequire(import.meta.url).resolve("runlock/package.json");
  const bin = JSON.parse(readFileSync(pkg, "utf8")).bin.runlock;
  return [process.execPath, join(dirname(pkg), bin)];
}

/** A JSON line a fixture printed. */
export interface Event {
  event: string;
  pid?: number;
  host?: string;
  [key: string]: unknown;
}

/** A running fixture with a queue of the JSON events it prints. */
/** How long a child may go without an event before the test calls it hung. */
export const HANG_MS = 180_000;

export class Child {
  readonly proc: ChildProcess;
  readonly stderr: string[] = [];
  #events: Event[] = [];
  #waiters: ((e: Event | undefined) => void)[] = [];
  #closed = false;
  #gone = false;
  readonly exited: Promise<{ code: number | null; signal: string | null }>;

  /**
   * Runs fixture `name` under the runtime running the tests, or, when
   * `command` is given, runs `command` followed by `args` (a fixture of
   * another runtime, for the cross-runtime tests).
   */
  constructor(
    name: string,
    args: string[],
    denoFlags?: string[],
    command?: string[],
  ) {
    const [cmd, argv] = command
      ? [command[0], [...command.slice(1), ...args]]
      : fixtureCommand(name, args, denoFlags);
    this.proc = spawn(cmd, argv, { stdio: ["pipe", "pipe", "pipe"] });
    createInterface({ input: this.proc.stdout! }).on("line", (line) => {
      let event: Event;
      try {
        event = JSON.parse(line);
      } catch {
        event = { event: "text", text: line };
      }
      const waiter = this.#waiters.shift();
      if (waiter) waiter(event);
      else this.#events.push(event);
    });
    this.proc.stderr!.on("data", (d) => this.stderr.push(String(d)));
    // "exit" comes with the reaping (before "close", which also waits for
    // the pipes): from then on the PID may name another process.
    this.proc.on("exit", () => this.#gone = true);
    this.exited = new Promise((resolve) => {
      this.proc.on("close", (code, signal) => {
        this.#closed = true;
        for (const w of this.#waiters.splice(0)) w(undefined);
        resolve({ code, signal });
      });
    });
  }

  get pid(): number {
    return this.proc.pid!;
  }

  /**
   * The next event; rejects if the child exits first. The timer only
   * detects a hang: what a child does before its next event (thousands of
   * locks, a server start) can take tens of seconds on a loaded machine,
   * so it is no measure of speed.
   */
  next(): Promise<Event> {
    const queued = this.#events.shift();
    if (queued) return Promise.resolve(queued);
    if (this.#closed) {
      return Promise.reject(
        new Error(`child exited before an event: ${this.stderr.join("")}`),
      );
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () =>
          reject(
            new Error(
              `no event in ${HANG_MS / 1000} s (a hang?): ${
                this.stderr.join("")
              }`,
            ),
          ),
        HANG_MS,
      );
      this.#waiters.push((e) => {
        clearTimeout(timer);
        if (e) resolve(e);
        else {
          reject(
            new Error(`child exited before an event: ${this.stderr.join("")}`),
          );
        }
      });
    });
  }

  /** Waits for an event named `name`, failing on anything else. */
  async expect(name: string): Promise<Event> {
    const e = await this.next();
    if (e.event !== name) {
      throw new Error(
        `expected ${name}, got ${JSON.stringify(e)} ${this.stderr.join("")}`,
      );
    }
    return e;
  }

  send(line: string): void {
    this.proc.stdin!.write(line + "\n");
  }

  /** Whether the child has not been seen to exit (its PID is still its). */
  get running(): boolean {
    return !this.#gone && this.proc.exitCode === null &&
      this.proc.signalCode === null;
  }

  /**
   * Sends `signal` to the child while it runs, and never after it exited
   * (its PID may name an unrelated process by then); returns whether it
   * was sent. Through process.kill, not ChildProcess.kill: under Deno, a
   * child sent one signal through ChildProcess.kill refuses every later
   * one, and its kill("SIGSTOP") reports a bogus exit.
   */
  signal(signal: NodeJS.Signals): boolean {
    if (!this.running) return false;
    try {
      process.kill(this.pid, signal);
      return true;
    } catch {
      return false; // exited in between
    }
  }

  /** Sends `signal` (SIGKILL by default) while it runs; resolves on exit. */
  kill(signal: NodeJS.Signals = "SIGKILL"): Promise<unknown> {
    if (this.running) this.proc.kill(signal);
    return this.exited;
  }
}

/**
 * Fixture `name` run under `strace -f -qq`, tracing `calls` (a comma list)
 * into the file `trace`.
 */
export function tracedFixture(
  name: string,
  args: string[],
  trace: string,
  calls: string,
): Child {
  const [cmd, argv] = fixtureCommand(name, args);
  return new Child("", [], undefined, [
    "strace",
    "-f",
    "-qq",
    "-o",
    trace,
    "-e",
    `trace=${calls}`,
    cmd,
    ...argv,
  ]);
}

/** Starts a fixture holding the lock at `path`; resolves once it holds it. */
export async function holder(path: string): Promise<Child> {
  const child = new Child("child.ts", ["hold", path]);
  await child.expect("acquired");
  return child;
}

/** Whether a process exists (for checking that a killed child is gone). */
export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as { code?: string }).code === "EPERM";
  }
}

/** Runs a command to completion (flock(1), sh) and returns its exit code. */
export function run(cmd: string, args: string[]): number {
  const result = spawnSync(cmd, args, { stdio: "ignore" });
  return result.status ?? -1;
}

/** Resolves after `ms` milliseconds. */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * A PID no process can have: above Linux's PID_MAX_LIMIT (2^22, the most
 * `kernel.pid_max` can be), yet a valid PID for a record (1 to 2^31-1).
 * (The PID of a process that has exited would do only until PIDs wrap,
 * which on a busy machine is minutes.)
 */
export function deadPid(): number {
  return 2 ** 22 + 1 + Math.floor(Math.random() * 2 ** 20);
}

/**
 * Polls `condition` every few milliseconds until it holds; throws naming
 * `what` if it still does not after `ms` (a hang detector, far above any
 * expected wait: the wait ends on the condition, never on the clock).
 */
export async function waitFor(
  condition: () => boolean | Promise<boolean>,
  what: string,
  ms = 30_000,
): Promise<void> {
  const end = Date.now() + ms;
  while (!(await condition())) {
    if (Date.now() > end) throw new Error(`${what}: not after ${ms} ms`);
    await delay(5);
  }
}

/**
 * Runs `fn` and returns the delays of the timers set (through the global
 * setTimeout) while it ran: how often a probe slept to look again.
 */
export async function countingTimers<T>(
  fn: () => Promise<T>,
): Promise<{ result: T; timers: number[] }> {
  const timers: number[] = [];
  const real = globalThis.setTimeout;
  globalThis.setTimeout = ((handler: () => void, ms?: number) => {
    timers.push(ms ?? 0);
    return real(handler, ms);
  }) as typeof setTimeout;
  try {
    return { result: await fn(), timers };
  } finally {
    globalThis.setTimeout = real;
  }
}
