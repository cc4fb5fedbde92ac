// Helpers for the CLI tests: the runlock command under test, run to
// completion or in the background, and a real pseudo-terminal to type on.
//
// The command under test: `src/cli.ts` under Deno, the installed package's
// bin under Node and Bun, or the program named by RUNLOCK_CLI (the
// `bun build --compile` binary; scripts/test_npm.ts runs the CLI tests
// against it under Deno).
import { spawn, spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import process from "node:process";
import { createInterface } from "node:readline";
import {
  cliCommand as runtimeCli,
  delay,
  fixture,
  runtime,
} from "./_helpers.ts";

export { fixture };
import { pgTestable } from "./fixtures/pg_available.ts";

/** The runlock command line under test. */
export function cliCommand(): string[] {
  const override = process.env.RUNLOCK_CLI;
  return override ? [override] : runtimeCli();
}

/** The runtime that runs the CLI under test (RUNLOCK_CLI is a Bun binary). */
export const cliRuntime: "deno" | "node" | "bun" = process.env.RUNLOCK_CLI
  ? "bun"
  : runtime;

/**
 * Whether the CLI under test has the PostgreSQL backend: always from a
 * clone (Deno) and in a `bun build --compile` binary of the bin (which
 * bundles the backend and pg); in the npm package once it exports
 * "./postgres".
 */
function cliHasPostgres(): boolean {
  if (cliRuntime === "deno" || process.env.RUNLOCK_CLI) return true;
  try {
    const pkg = createRequire(import.meta.url).resolve("runlock/package.json");
    return "./postgres" in JSON.parse(readFileSync(pkg, "utf8")).exports;
  } catch {
    return false;
  }
}

/**
 * Whether the `--db` tests of a file (`what` names them in messages) can
 * run here: a server (RUNLOCK_TEST_PG_URL, or PostgreSQL binaries for a
 * throwaway cluster) and a CLI with the backend. When they cannot, says so
 * loudly on stderr, and under CI=true adds a test that fails.
 */
export function cliPgTestable(what: string): boolean {
  const hasServer = pgTestable({
    needs: "server",
    untested: `${what} is NOT tested`,
    ciTest: `PostgreSQL is available to the ${what} tests under CI=true`,
  });
  if (!hasServer) return false;
  if (!cliHasPostgres()) {
    console.error(
      `the npm package does not export runlock/postgres: ${what} is NOT tested with this ${cliRuntime} bin`,
    );
    return false;
  }
  return true;
}

const [cmd, ...pre] = cliCommand();

// The directory the CLI runs in, not the test process's: under `deno test
// --parallel` every test file shares one process, and a test that chdirs into a
// temporary directory (file/path_pinning_test, file/bad_files_test) can leave a
// CLI spawned meanwhile in a directory removed under it ("Failed getting
// cwd"). Node and Bun run each test file in its own process.
const cliCwd = runtime === "deno"
  ? new URL("..", import.meta.url).pathname
  : undefined;

/** What a finished command printed. */
export interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI to completion. */
export function cli(...args: string[]): Result {
  return cliIn({}, ...args);
}

/** Runs the CLI to completion with `env` added to its environment. */
export function cliIn(env: Record<string, string>, ...args: string[]): Result {
  const r = spawnSync(cmd, [...pre, ...args], {
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1", ...env },
    cwd: cliCwd,
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Starts the CLI in the background; lines of stdout arrive in `lines`. */
export function start(...args: string[]): Background {
  return new Background([cmd, ...pre, ...args]);
}

/**
 * Starts the CLI in the background with a pipe for its stdin, which `run`
 * hands on to its command: the test writes lines to the command with
 * `send`, and `endInput` (or `kill`) closes it.
 */
export function startWithInput(...args: string[]): Background {
  return new Background([cmd, ...pre, ...args], { input: true });
}

/**
 * A process in the background whose stdout lines the test can wait for.
 *
 * It is signalled only through what the test spawned: `signal` while its
 * exit has not been seen, `kill` through the child handle. Nothing here
 * takes a pid from anywhere else.
 */
export class Background {
  readonly child;
  readonly lines: string[] = [];
  #stderr = "";
  #waiters: (() => void)[] = [];
  #gone = false;
  readonly exited: Promise<{ code: number | null; signal: string | null }>;
  /** Resolves on "exit", not "close": a grandchild may keep the pipes. */
  readonly died: Promise<unknown>;

  constructor(argv: string[], options: { input?: boolean } = {}) {
    this.child = spawn(argv[0], argv.slice(1), {
      stdio: [options.input ? "pipe" : "ignore", "pipe", "pipe"],
      cwd: cliCwd,
    });
    const wake = () => this.#waiters.splice(0).forEach((w) => w());
    createInterface({ input: this.child.stdout! }).on("line", (l) => {
      this.lines.push(l);
      wake();
    });
    this.child.stderr!.on("data", (d) => {
      this.#stderr += d;
      wake();
    });
    this.exited = new Promise((resolve) =>
      this.child.on("close", (code, signal) => resolve({ code, signal }))
    );
    this.died = new Promise((resolve) =>
      this.child.on("exit", (...args) => {
        this.#gone = true;
        wake();
        resolve(args);
      })
    );
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** Whether the process runs still (its exit has not been seen). */
  get running(): boolean {
    return !this.#gone && this.child.exitCode === null &&
      this.child.signalCode === null;
  }

  stderr(): string {
    return this.#stderr;
  }

  /**
   * Waits up to 20 s until `condition()` holds, looking again at each line,
   * chunk of stderr and exit; `what` names it in the error.
   */
  async until(condition: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + 20_000;
    while (!condition()) {
      if (Date.now() >= deadline) {
        throw new Error(
          `timed out waiting for ${what}: ${
            this.lines.join("|")
          } ${this.#stderr}`,
        );
      }
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
  }

  /** The first line matching `pattern`, waiting up to 20 s for it. */
  async line(pattern: RegExp): Promise<string> {
    let found: string | undefined;
    await this.until(
      () => (found = this.lines.find((l) => pattern.test(l))) !== undefined,
      `a line matching ${pattern}`,
    );
    return found!;
  }

  /**
   * Waits up to 20 s until stderr matches `pattern`, and returns the match;
   * it wakes on each chunk, so a test can time when a message came.
   */
  async stderrMatch(pattern: RegExp): Promise<RegExpMatchArray> {
    let m: RegExpMatchArray | null = null;
    await this.until(
      () => (m = this.#stderr.match(pattern)) !== null,
      `stderr matching ${pattern}`,
    );
    return m!;
  }

  /** How many lines match `pattern`. */
  count(pattern: RegExp): number {
    return this.lines.filter((l) => pattern.test(l)).length;
  }

  /**
   * Sends a signal to this process only (process.kill of the pid it was
   * spawned with, while its exit has not been seen; not child.kill: under
   * Deno, child.kill makes the exit look like death by that signal even
   * when the process trapped it).
   */
  signal(name: NodeJS.Signals): void {
    if (!this.running) {
      throw new Error(`not sending ${name}: pid ${this.pid} has exited`);
    }
    process.kill(this.pid, name);
  }

  /**
   * Sends `name` to `pid` only if that is a child of this process (its
   * parent in /proc/PID/stat is this process, whose exit has not been
   * seen): `run`'s command, which printed its own pid, and never a process
   * that got the number after the command was gone. Returns whether it
   * sent the signal.
   */
  signalChild(pid: number, name: NodeJS.Signals): boolean {
    if (!this.running) return false;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    } catch {
      return false; // gone
    }
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    if (ppid !== this.pid) return false;
    process.kill(pid, name);
    return true;
  }

  /** Writes a line to its stdin (started with an input pipe). */
  send(line: string): void {
    this.child.stdin!.write(line + "\n");
  }

  /** Closes its stdin, if it has one. */
  endInput(): void {
    this.child.stdin?.end();
  }

  /**
   * Cleanup: closes its stdin, SIGKILLs the process through its child
   * handle if it still runs (a handle whose process was reaped signals
   * nothing), and waits until its pipes close.
   */
  async kill(): Promise<void> {
    this.endInput();
    if (this.running) this.child.kill("SIGKILL");
    await this.exited;
  }
}

/**
 * Who reads a lock file, as inotify sees it (tests/fixtures/watch_reads.py):
 * each close of the file by a process that opened it to read, as a waiting
 * runlock's probe does, in the order it happened. The holder never reads
 * its own file, so while the test reads nothing there, each read is the
 * waiter looking at the lock (and, while the holder holds it, finding it
 * held). A read of a marker file by the test marks a moment in the same
 * queue: the reads after the mark came after that moment.
 */
export class Reads {
  readonly #watch: Background;
  readonly #marker: string;
  #marks = 0;

  private constructor(watch: Background, marker: string) {
    this.#watch = watch;
    this.#marker = marker;
  }

  /**
   * Starts watching `path` (it must exist), with `marker` (a file that is
   * created) for marks. Resolves once the watch is in place.
   */
  static async watch(path: string, marker: string): Promise<Reads> {
    writeFileSync(marker, "");
    const watch = new Background([
      "python3",
      fixture("watch_reads.py"),
      path,
      marker,
    ]);
    await watch.line(/^watching$/);
    return new Reads(watch, marker);
  }

  /** Marks this moment; returns the mark's place in the stream. */
  async mark(): Promise<number> {
    readFileSync(this.#marker);
    const nth = ++this.#marks;
    let at = -1;
    await this.#watch.until(() => {
      let seen = 0;
      at = this.#watch.lines.findIndex((l) => l === "read 1" && ++seen === nth);
      return at >= 0;
    }, `mark ${nth}`);
    return at;
  }

  /**
   * Waits (up to 20 s) until the lock file has been read `n` times after
   * the place `after` in the stream (0: since the watch began).
   */
  async reads(n: number, after = 0): Promise<void> {
    await this.#watch.until(
      () =>
        this.#watch.lines.slice(after).filter((l) => l === "read 0").length >=
          n,
      `${n} read(s) of the lock file`,
    );
  }

  /** Stops watching. */
  async stop(): Promise<void> {
    await this.#watch.kill();
  }
}

function hex(text: string): string {
  return [...new TextEncoder().encode(text)]
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}

/**
 * A command running in a real pseudo-terminal (tests/fixtures/pty_run.py):
 * it is the session leader and the terminal's foreground process group,
 * and what the test types goes through the terminal's line discipline, so
 * ^C, ^\ and ^Z become signals for the foreground group and a resize
 * becomes SIGWINCH, as at a real terminal.
 */
export class Terminal {
  readonly proc;
  #output = "";
  #status = "";
  #waiters: (() => void)[] = [];
  readonly closed: Promise<void>;

  constructor(argv: string[], env: Record<string, string> = {}) {
    this.proc = spawn("python3", [fixture("pty_run.py"), "--", ...argv], {
      stdio: ["pipe", "pipe", "pipe"],
      env: { ...process.env, NO_COLOR: "1", ...env },
    });
    const wake = () => this.#waiters.splice(0).forEach((w) => w());
    // Decoded as a stream: a character split between two reads of the
    // terminal stays one character, not two U+FFFD.
    this.proc.stdout!.setEncoding("utf8");
    this.proc.stdout!.on("data", (d) => {
      this.#output += d;
      wake();
    });
    this.proc.stderr!.on("data", (d) => {
      this.#status += d;
      wake();
    });
    this.closed = new Promise((resolve) =>
      this.proc.on("close", () => resolve())
    );
  }

  /** Everything the terminal showed so far (with \r\n line ends). */
  get output(): string {
    return this.#output;
  }

  /**
   * The pid of the command the terminal runs, as pty_run.py (which spawned
   * it) reports it.
   */
  async commandPid(): Promise<number> {
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const m = this.#status.match(/^pty: pid (\d+)$/m);
      if (m) return Number(m[1]);
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(`the terminal never said its command's pid`);
  }

  /**
   * Sends signal `name` to the terminal's command alone, by pty_run.py,
   * its parent, which has not reaped it (as `kill PID` from another
   * terminal would).
   */
  signal(name: NodeJS.Signals): void {
    this.proc.stdin!.write(`signal ${name}\n`);
  }

  /** Types `text` (a keypress such as "\x03" for Ctrl-C, or a line + "\r"). */
  type(text: string): void {
    this.proc.stdin!.write(`type ${hex(text)}\n`);
  }

  /** Changes the window size, as resizing a terminal window does. */
  resize(rows: number, cols: number): void {
    this.proc.stdin!.write(`resize ${rows} ${cols}\n`);
  }

  /** Waits up to 20 s until the output matches `pattern`. */
  async waitFor(pattern: RegExp): Promise<RegExpMatchArray> {
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const m = this.#output.match(pattern);
      if (m) return m;
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(
      `the terminal never showed ${pattern}:\n${this.#output}\n${this.#status}`,
    );
  }

  /** How many times `pattern` (with the g flag) appears in the output. */
  count(pattern: RegExp): number {
    return [...this.#output.matchAll(pattern)].length;
  }

  /** Waits for the command in the terminal to exit: "exit N" or "signal N". */
  async exit(): Promise<string> {
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const m = this.#status.match(/pty: (exit \d+|signal \d+)/);
      if (m) return m[1];
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(`the command never exited:\n${this.#output}`);
  }

  /**
   * Ends the terminal: pty_run.py SIGKILLs its command if it still runs,
   * and whatever the command left behind (its own children, re-parented to
   * pty_run.py, a child subreaper).
   */
  async close(): Promise<void> {
    this.proc.stdin!.end();
    await this.closed;
  }
}

/**
 * Runs the CLI to completion with its stderr on a real terminal of 80
 * columns (stdout to /dev/null), `env` added to its environment: what a
 * person at a terminal reads of its messages once it has exited, with
 * "\n" line ends.
 */
export async function atTerminal(
  env: Record<string, string>,
  ...args: string[]
): Promise<Result> {
  const t = new Terminal(
    ["sh", "-c", 'exec "$@" >/dev/null', "sh", cmd, ...pre, ...args],
    env,
  );
  try {
    const status = await t.exit();
    // The terminal's output may still be on its way after the exit: it is
    // whole once the terminal closes.
    await t.close();
    // Each line as the terminal shows it once done: what follows its last
    // carriage return (the "waiting" line redrawn and erased before it).
    const shown = t.output.split("\r\n").map((line) =>
      line.slice(line.lastIndexOf("\r") + 1).replaceAll("\x1b[K", "")
    );
    return {
      code: status.startsWith("exit ") ? Number(status.slice(5)) : null,
      stdout: "",
      stderr: shown.join("\n"),
    };
  } finally {
    await t.close();
  }
}

/** A process's state letter from ps(1): "T" when stopped. */
export function processState(pid: number): string {
  const r = spawnSync("ps", ["-o", "stat=", "-p", String(pid)], {
    encoding: "utf8",
  });
  return r.stdout.trim();
}
