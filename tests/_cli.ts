// Helpers for the CLI tests: the runlock command under test, run to
// completion or in the background, and a real pseudo-terminal to type on.
//
// The command under test: `src/cli.ts` under Deno, the installed package's
// bin under Node and Bun, or the program named by RUNLOCK_CLI (the
// `bun build --compile` binary; scripts/test_npm.ts runs the CLI tests
// against it under Deno).
import { spawn, spawnSync } from "node:child_process";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { cliCommand as runtimeCli, delay, runtime } from "./_helpers.ts";

/** The runlock command line under test. */
export function cliCommand(): string[] {
  const override = process.env.RUNLOCK_CLI;
  return override ? [override] : runtimeCli();
}

/** The runtime that runs the CLI under test (RUNLOCK_CLI is a Bun binary). */
export const cliRuntime: "deno" | "node" | "bun" = process.env.RUNLOCK_CLI
  ? "bun"
  : runtime;

const [cmd, ...pre] = cliCommand();

/** What a finished command printed. */
export interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI to completion. */
export function cli(...args: string[]): Result {
  const r = spawnSync(cmd, [...pre, ...args], {
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A file in tests/fixtures (the .py fixtures are copied as they are). */
export function fixture(name: string): string {
  return join(new URL(".", import.meta.url).pathname, "fixtures", name);
}

/** Starts the CLI in the background; lines of stdout arrive in `lines`. */
export function start(...args: string[]): Background {
  return new Background([cmd, ...pre, ...args]);
}

/** A process in the background whose stdout lines the test can wait for. */
export class Background {
  readonly child;
  readonly lines: string[] = [];
  #stderr = "";
  #waiters: (() => void)[] = [];
  readonly exited: Promise<{ code: number | null; signal: string | null }>;
  /** Resolves on "exit", not "close": a grandchild may keep the pipes. */
  readonly died: Promise<unknown>;

  constructor(argv: string[]) {
    this.child = spawn(argv[0], argv.slice(1), {
      stdio: ["ignore", "pipe", "pipe"],
    });
    createInterface({ input: this.child.stdout! }).on("line", (l) => {
      this.lines.push(l);
      this.#waiters.splice(0).forEach((w) => w());
    });
    this.child.stderr!.on("data", (d) => {
      this.#stderr += d;
      this.#waiters.splice(0).forEach((w) => w());
    });
    this.exited = new Promise((resolve) =>
      this.child.on("close", (code, signal) => resolve({ code, signal }))
    );
    this.died = new Promise((resolve) => this.child.on("exit", resolve));
  }

  get pid(): number {
    return this.child.pid!;
  }

  stderr(): string {
    return this.#stderr;
  }

  /** The first line matching `pattern`, waiting up to 20 s for it. */
  async line(pattern: RegExp): Promise<string> {
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const found = this.lines.find((l) => pattern.test(l));
      if (found) return found;
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(
      `no line matching ${pattern}: ${this.lines.join("|")} ${this.#stderr}`,
    );
  }

  /**
   * Waits up to 20 s until stderr matches `pattern`, and returns the match;
   * it wakes on each chunk, so a test can time when a message came.
   */
  async stderrMatch(pattern: RegExp): Promise<RegExpMatchArray> {
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline) {
      const m = this.#stderr.match(pattern);
      if (m) return m;
      await Promise.race([
        new Promise<void>((r) => this.#waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(
      `stderr never matched ${pattern}: ${this.#stderr} | ${
        this.lines.join("|")
      }`,
    );
  }

  /** How many lines match `pattern`. */
  count(pattern: RegExp): number {
    return this.lines.filter((l) => pattern.test(l)).length;
  }

  /**
   * Sends a signal to this process only (process.kill, not child.kill:
   * under Deno, child.kill makes the exit look like death by that signal
   * even when the process trapped it).
   */
  signal(name: NodeJS.Signals): void {
    process.kill(this.pid, name);
  }

  /** SIGKILLs the process if it still runs, and waits for it (cleanup). */
  async kill(): Promise<void> {
    killQuietly(this.pid);
    await this.exited;
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

  /** Ends the terminal (SIGKILLs its command if still running). */
  async close(): Promise<void> {
    this.proc.stdin!.end();
    await this.closed;
  }
}

/** A process's state letter from ps(1): "T" when stopped. */
export function processState(pid: number): string {
  const r = spawnSync("ps", ["-o", "stat=", "-p", String(pid)], {
    encoding: "utf8",
  });
  return r.stdout.trim();
}

/** Kills a process if it still exists (test cleanup). */
export function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // gone already
  }
}
