// `runlock run` at a terminal: a real pseudo-terminal (python3's pty
// module, tests/fixtures/pty_run.py), real keypresses through the line
// discipline, and a command (tests/fixtures/tty_child.py) that counts the
// signals it receives. The terminal signals its whole foreground process
// group; `run` must not add a second copy of a keypress's signal, while a
// signal sent to `run` alone must still reach the command.
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  type Background,
  cli,
  cliCommand,
  fixture,
  processState,
  start,
  Terminal,
} from "../_cli.ts";
import { delay, tempDir } from "../_helpers.ts";

const runlock = cliCommand();
/**
 * A command that counts the signals it gets and answers "report" with the
 * counts (tests/fixtures/tty_child.py). Whatever a test leaves running,
 * Terminal.close() ends (pty_run.py reaps it).
 */
const child = ["python3", fixture("tty_child.py")];

/** Starts `runlock run <path> -- tty_child.py [mode]` as the terminal's job. */
function runAtTerminal(path: string, mode: string[] = []): Terminal {
  return new Terminal([...runlock, "run", path, "--", ...child, ...mode]);
}

async function commandPid(term: Terminal): Promise<number> {
  return Number((await term.waitFor(/ready pid=(\d+)/))[1]);
}

describe("runlock run at a terminal", () => {
  test("one Ctrl-C reaches the command once: a command that shuts down gracefully on SIGINT finishes its cleanup", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const term = runAtTerminal(path, ["graceful"]);
    try {
      await commandPid(term);
      term.type("\x03");
      assert.equal(await term.exit(), "exit 0", term.output);
      assert.equal(term.count(/got SIGINT/g), 1, term.output);
      assert.match(term.output, /clean exit/);
      assert.doesNotMatch(term.output, /force quit/);
      assert.equal(existsSync(path), false, "released");
    } finally {
      await term.close();
      cleanup();
    }
  });

  test("Ctrl-\\ reaches the command once and runlock keeps the lock; a SIGINT sent to runlock alone still reaches the command", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const term = runAtTerminal(path);
    try {
      const pid = await commandPid(term);
      const wrapper = await term.commandPid(); // runlock, the terminal's job
      term.type("\x1c");
      await term.waitFor(/got SIGQUIT 1/);
      // A second copy (from the terminal, to a command in its foreground
      // group) would be in before runlock forwards a signal sent after:
      // SIGUSR2, to runlock alone. Then the command's own counts.
      term.signal("SIGUSR2");
      await term.waitFor(/got SIGUSR2 1/);
      term.type("report\r");
      await term.waitFor(/report QUIT=1 USR2=1 size=24x80/);
      const status = cli("status", path);
      assert.equal(status.code, 0, `still held: ${status.stdout}`);
      const holder = Number(status.stdout.match(/^held by pid (\d+)/)![1]);
      assert.equal(holder, wrapper, "held by runlock");
      assert.notEqual(holder, pid, "not by the command");

      term.signal("SIGINT"); // to runlock alone, as `kill PID` does
      await term.waitFor(/got SIGINT 1/);
      term.signal("SIGUSR2");
      await term.waitFor(/got SIGUSR2 2/);
      term.type("report\r");
      await term.waitFor(/report INT=1 QUIT=1 USR2=2 size=24x80/);
      assert.equal(term.count(/got SIGQUIT/g), 1, term.output);
      assert.equal(term.count(/got SIGINT/g), 1, term.output);

      term.type("exit 4\r");
      assert.equal(await term.exit(), "exit 4", term.output);
      assert.equal(existsSync(path), false, "released");
    } finally {
      await term.close(); // (and whatever it left running)
      cleanup();
    }
  });

  test("a window resize reaches the command once, and it reads the new size from the terminal", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const term = runAtTerminal(path);
    try {
      await commandPid(term);
      term.resize(30, 100);
      await term.waitFor(/got SIGWINCH 1/);
      // A second copy would be in before a signal runlock forwards after.
      term.signal("SIGUSR2");
      await term.waitFor(/got SIGUSR2 1/);
      term.type("report\r");
      const report = await term.waitFor(/report (.*) size=(\S+)/);
      assert.equal(report[1], "USR2=1 WINCH=1");
      assert.equal(report[2], "30x100");
      term.type("exit 0\r");
      assert.equal(await term.exit(), "exit 0", term.output);
    } finally {
      await term.close(); // (and whatever it left running)
      cleanup();
    }
  });

  test("Ctrl-Z in a job-control shell stops the command and runlock, with the lock still held; fg continues both", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const quote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;
    const line = [...runlock, "run", path, "--", ...child].map(quote).join(" ");
    // An interactive POSIX shell, as in a terminal window: it puts each job
    // in a process group of its own and gives it the terminal.
    const term = new Terminal(["sh", "-i"], { PS1: "$ ", ENV: "" });
    let pid = 0;
    try {
      term.type(`${line}\r`);
      pid = await commandPid(term);
      term.type("\x1a");
      await term.waitFor(/Stopped/);
      // runlock stops the command's group before itself, but a stop takes
      // effect when the process next runs: on a loaded machine, after the
      // shell saw runlock stop.
      for (let i = 0; i < 200 && !/^T/.test(processState(pid)); i++) {
        await delay(25);
      }
      assert.match(processState(pid), /^T/, "the command is stopped");
      assert.equal(cli("status", path).code, 0, "the lock is still held");

      term.type("fg\r");
      await term.waitFor(/got SIGCONT 1/);
      assert.doesNotMatch(processState(pid), /^T/, "the command runs again");
      term.type("report\r");
      await term.waitFor(/report CONT=1 size=24x80/);

      term.type("exit 5\r");
      term.type("echo status=$?\r");
      await term.waitFor(/status=5/);
      assert.equal(existsSync(path), false, "released");
      term.type("exit\r");
      await term.exit();
    } finally {
      await term.close(); // (and whatever it left running)
      cleanup();
    }
  });
});

describe("waiting for the lock at a terminal", () => {
  /** What redraws the line: carriage return, erase to the end of the line. */
  const CLEAR = "\r\x1b[K";

  /** A run that holds `path` until `done` exists, with a command to show. */
  async function holding(path: string, done: string): Promise<Background> {
    const first = start(
      "run",
      path,
      "--",
      "sh",
      "-c",
      'echo ready; while [ ! -e "$1" ]; do sleep 0.05; done',
      "sh",
      done,
    );
    await first.line(/^ready$/);
    return first;
  }

  /** The states of the updating line: each redraw, without the escapes. */
  function redraws(output: string): string[] {
    return output.split("\r").map((s) => s.replaceAll("\x1b[K", ""))
      .filter((s) => s.startsWith("runlock: waiting"));
  }

  test("wait keeps one updating stderr line (how long, who holds it, what it runs) and clears it when the lock is free", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const first = await holding(path, done);
    const term = new Terminal([...runlock, "wait", path]);
    try {
      await term.waitFor(/waiting 2s for/);
      writeFileSync(done, "");
      assert.equal(await term.exit(), "exit 0", term.output);
      const lines = redraws(term.output);
      const who = `pid ${first.pid} on ${hostname()} runs sh -c 'echo ready;`;
      assert.ok(
        lines[0].startsWith(`runlock: waiting 0s for the lock: ${who}`),
        lines[0],
      );
      // One redraw per second waited, from 0s: a second may pass unseen
      // (a probe late on a busy machine), never one shown twice.
      const seconds = lines.map((l) =>
        Number(l.match(/^runlock: waiting (\d+)s for /)?.[1])
      );
      assert.equal(seconds[0], 0, lines[0]);
      assert.ok(
        seconds.every((n, i) => i === 0 || n > seconds[i - 1]),
        `the waited seconds grow with each redraw: ${seconds}`,
      );
      assert.ok(seconds.includes(2), `seconds: ${seconds}`);
      assert.ok(lines.every((l) => [...l].length <= 79), "fits 80 columns");
      assert.ok(lines[0].endsWith("…"), "cut to the width, not wrapped");
      assert.ok(
        term.output.endsWith(CLEAR),
        `cleared at the end: ${JSON.stringify(term.output.slice(-40))}`,
      );
      assert.ok(!term.output.includes("\n"), "never a second line");
    } finally {
      writeFileSync(done, "");
      await term.close();
      await first.kill();
      cleanup();
    }
  });

  test("run --wait shows the same line while it waits, and clears it before the command starts", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const first = await holding(path, done);
    const term = new Terminal([
      ...runlock,
      "run",
      "--wait",
      path,
      "--",
      "sh",
      "-c",
      "echo command ran",
    ]);
    try {
      await term.waitFor(/waiting 1s for/);
      writeFileSync(done, "");
      assert.equal(await term.exit(), "exit 0", term.output);
      const lines = redraws(term.output);
      assert.ok(lines.length >= 2, term.output);
      assert.ok(
        lines[0].startsWith(
          `runlock: waiting 0s for the lock: pid ${first.pid} on `,
        ),
        lines[0],
      );
      assert.ok(
        term.output.endsWith(`${CLEAR}command ran\r\n`),
        JSON.stringify(term.output.slice(-60)),
      );
    } finally {
      writeFileSync(done, "");
      await term.close();
      await first.kill();
      cleanup();
    }
  });

  test("with a wide terminal the line ends with what the holder runs; a refusal (no --wait) draws no line at all", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const first = await holding(path, done);
    const wide = new Terminal([
      "sh",
      "-c",
      'stty cols 300; exec "$@"',
      "sh",
      ...runlock,
      "wait",
      "--timeout=0.5",
      path,
    ]);
    const refused = new Terminal([...runlock, "run", path, "--", "true"]);
    try {
      assert.equal(await wide.exit(), "exit 1", wide.output);
      const line = redraws(wide.output)[0];
      assert.ok(line.endsWith(`sh ${done}`), line);
      assert.ok(
        wide.output.includes(`${CLEAR}runlock: timed out after 0.5s: `),
        "the line is cleared before the message",
      );
      assert.equal(await refused.exit(), "exit 75", refused.output);
      assert.ok(!refused.output.includes("waiting"), refused.output);
      assert.ok(!refused.output.includes(CLEAR), refused.output);
    } finally {
      writeFileSync(done, "");
      await wide.close();
      await refused.close();
      await first.kill();
      cleanup();
    }
  });
});
