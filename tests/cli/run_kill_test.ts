// `runlock run` hands its lock's descriptor on to its command, as flock(1)
// does: when runlock's own process is SIGKILLed (an operator's kill -9,
// the OOM killer, a supervisor that kills the main PID), the command keeps
// the flock, so no second run starts beside it; once the command ends, the
// next run takes the lock at once. Real processes: the CLI under test (on
// Deno, Node, Bun and the compiled binary, see tests/_cli.ts), and its
// command, a shell that waits on a FIFO until the test writes to it.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import {
  closeSync,
  constants,
  mkdirSync,
  openSync,
  readFileSync,
  statSync,
  writeSync,
} from "node:fs";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { type Change, watch } from "../../mod.ts";
import {
  Background,
  cli,
  cliCommand,
  cliRuntime,
  type Result,
  start,
} from "../_cli.ts";
import { tempDir, waitFor } from "../_helpers.ts";

declare const Deno: { execPath(): string } | undefined;

const hasMkfifo = spawnSync("mkfifo", ["--version"]).status === 0;

/**
 * Writes a line to `fifo` for the command that reads it; never blocks: with
 * no reader left (a failed start), there is nothing to end.
 */
function release(fifo: string): void {
  let fd: number;
  try {
    fd = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
  } catch {
    return; // ENXIO: no reader
  }
  try {
    writeSync(fd, "go\n");
  } finally {
    closeSync(fd);
  }
}

/**
 * The changes a watch() of `dir` reports, as they come, with a way to wait
 * for the first of a kind.
 */
function watching(dir: string) {
  const stop = new AbortController();
  const changes: Change[] = [];
  const wakers: (() => void)[] = [];
  let begun = () => {};
  const ready = new Promise<void>((resolve) => (begun = resolve));
  const ended = (async () => {
    for await (const batch of watch(dir, { signal: stop.signal })) {
      changes.push(...batch);
      begun();
      for (const wake of wakers.splice(0)) wake();
    }
  })();
  return {
    changes,
    /** Resolves once the watch has given its first batch. */
    ready,
    async first(kind: Change["kind"]): Promise<number> {
      while (!changes.some((c) => c.kind === kind)) {
        await new Promise<void>((resolve) => wakers.push(resolve));
      }
      return changes.findIndex((c) => c.kind === kind);
    },
    async stop() {
      stop.abort();
      await ended;
    },
  };
}

/**
 * `runlock run <lock> -- sh -c 'echo ready $$; read x < <fifo>'` started
 * by `begin`, SIGKILLed once the command runs; then what a second run,
 * status and a watch of the directory say while the command lives, and
 * what a run and the watch say once the test has ended the command
 * through its FIFO. `reader` runs the second run, status and ls.
 */
async function killedRunner(
  begin: (lock: string, command: string[]) => {
    ready: Promise<number>;
    kill(): Promise<void>;
  },
  reader: (...args: string[]) => Result = cli,
): Promise<void> {
  const { dir, cleanup } = tempDir();
  // The FIFO stays out of the watched directory: Deno's directory watch
  // (notify-rs) blocks for good in an open of a FIFO there.
  const locks = join(dir, "locks");
  mkdirSync(locks);
  const lock = join(locks, "run.lock");
  const fifo = join(dir, "fifo");
  assert.equal(spawnSync("mkfifo", [fifo]).status, 0);
  let ended = false;
  // The command may not have opened its FIFO yet when it says "ready": the
  // open for writing completes when it does.
  const end = async () => {
    if (!ended) await writeFile(fifo, "go\n");
    ended = true;
  };
  const watcher = watching(locks);
  await watcher.ready;
  try {
    const runner = begin(lock, [
      "sh",
      "-c",
      'echo "ready $$"; read x < "$1"',
      "sh",
      fifo,
    ]);
    const command = await runner.ready;
    await watcher.first("started");
    const record = cli("status", "--json", lock);
    const runlockPid = JSON.parse(record.stdout).pid;
    assert.equal(JSON.parse(record.stdout).child, command, record.stdout);
    await runner.kill();
    const second = reader("run", lock, "--", "true");
    assert.equal(
      second.code,
      75,
      `a second run while the command lives: ${JSON.stringify(second)}`,
    );
    // The refusal and status name the live command, with runlock's pid.
    assert.match(
      second.stderr,
      new RegExp(
        `another run is active as pid ${command}, the command of runlock pid ${runlockPid} \\(gone\\)`,
      ),
    );
    const status = reader("status", lock);
    assert.equal(status.code, 0, JSON.stringify(status));
    assert.match(
      status.stdout,
      new RegExp(
        `^held by pid ${command} on .* \\(the command of runlock pid ${runlockPid}, which is gone\\)`,
      ),
    );
    const json = JSON.parse(reader("status", "--json", lock).stdout);
    assert.deepEqual([json.state, json.pid, json.child], [
      "held",
      runlockPid,
      command,
    ]);
    // ls names the live command in its pid column.
    const ls = reader("ls", locks);
    assert.match(ls.stdout, new RegExp(`^held +${command} `, "m"), ls.stdout);
    const before = watcher.changes.length;
    await end();
    // The watch saw no crash while the command held the lock: the run
    // ended (crashed: runlock's record is left) when the command did.
    const crashed = await watcher.first("crashed");
    assert.equal(
      crashed,
      before,
      `nothing between the kill and the command's end: ${
        JSON.stringify(watcher.changes.map((c) => c.kind))
      }`,
    );
    // At once: no --wait, and nothing to clean up by hand.
    const third = cli("run", lock, "--", "true");
    assert.equal(third.code, 0, JSON.stringify(third));
  } finally {
    if (!ended) release(fifo);
    await watcher.stop();
    cleanup();
  }
}

describe("runlock run SIGKILLed while its command runs", {
  skip: !hasMkfifo || process.platform !== "linux",
}, () => {
  test("the command keeps the lock: a second run exits 75 and status says held until the command ends, then the next run takes it at once", async () => {
    await killedRunner((lock, command) => {
      const runner = start("run", lock, "--", ...command);
      return {
        ready: runner.line(/^ready \d+$/).then((l) => Number(l.slice(6))),
        kill: async () => {
          runner.signal("SIGKILL");
          await runner.died;
        },
      };
    });
  });

  test(
    "under Deno with the install line's permissions (no FFI), for the run and its readers, the command keeps the lock and is named the same way",
    {
      skip: cliRuntime !== "deno" || process.env.RUNLOCK_CLI !== undefined,
    },
    async () => {
      await killedRunner((lock, command) => {
        const [deno, ...argv] = noFfiCli();
        const runner = spawn(deno, [...argv, "run", lock, "--", ...command], {
          stdio: ["ignore", "pipe", "inherit"],
        });
        const died = new Promise((r) => runner.on("exit", r));
        return {
          ready: new Promise<number>((resolve, reject) => {
            let out = "";
            runner.stdout!.on("data", (d) => {
              out += d;
              const m = /^ready (\d+)$/m.exec(out);
              if (m) resolve(Number(m[1]));
            });
            runner.on(
              "exit",
              () => reject(new Error(`runlock run ended: ${out}`)),
            );
          }),
          kill: async () => {
            runner.kill("SIGKILL");
            await died;
          },
        };
      }, (...args) => {
        // The readers with the install line's permissions too: Deno lets
        // them read no /proc/<pid>/fdinfo.
        const [deno, ...argv] = noFfiCli();
        const r = spawnSync(deno, [...argv, ...args], { encoding: "utf8" });
        return { code: r.status, stdout: r.stdout, stderr: r.stderr };
      });
    },
  );
});

describe("runlock run that cannot hand its lock on", () => {
  test(
    "under Deno without FFI and without sh (which reads the descriptor's number from /proc), run says the lock lasts only as long as itself, and the command still runs",
    {
      skip: cliRuntime !== "deno" || process.env.RUNLOCK_CLI !== undefined,
    },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const [deno, ...argv] = noFfiCli();
        const r = spawnSync(
          deno,
          [...argv, "run", join(dir, "run.lock"), "--", "/bin/echo", "ran"],
          { encoding: "utf8", env: { ...process.env, PATH: dir } },
        );
        assert.equal(r.status, 0, r.stderr);
        assert.equal(r.stdout, "ran\n");
        assert.match(
          r.stderr,
          /^runlock: cannot hand the lock's descriptor to the command .*: the lock lasts only as long as runlock itself\n$/,
        );
      } finally {
        cleanup();
      }
    },
  );
});

describe(
  "runlock run whose command leaves a process with the lock's descriptor",
  {
    skip: !hasMkfifo || process.platform !== "linux",
  },
  () => {
    test("a watch reports the run released, not lost, when runlock releases while that process keeps the flock of the removed file", async () => {
      const { dir, cleanup } = tempDir();
      const locks = join(dir, "locks");
      mkdirSync(locks);
      const lock = join(locks, "run.lock");
      // The daemon reads `daemon`, the command `command`.
      const daemon = join(dir, "daemon");
      const command = join(dir, "command");
      assert.equal(spawnSync("mkfifo", [daemon, command]).status, 0);
      const watcher = watching(locks);
      await watcher.ready;
      try {
        // The command starts a process that keeps fd 9 (a daemon that did
        // not close it), then ends when the test says.
        const run = start(
          "run",
          lock,
          "--",
          "sh",
          "-c",
          '(read x < "$1") >/dev/null 2>&1 & read y < "$2"',
          "sh",
          daemon,
          command,
        );
        await watcher.first("started");
        await writeFile(command, "go\n");
        assert.equal((await run.exited).code, 0);
        const at = await Promise.race([
          watcher.first("released"),
          watcher.first("lost"),
        ]);
        assert.equal(
          watcher.changes[at].kind,
          "released",
          JSON.stringify(watcher.changes.map((c) => c.kind)),
        );
        // The next run is not refused.
        assert.equal(cli("run", lock, "--", "true").code, 0);
      } finally {
        release(command);
        release(daemon);
        await watcher.stop();
        cleanup();
      }
    });
  },
);

/** The argv of `runlock` under Deno with the install line's permissions. */
function noFfiCli(): string[] {
  const cliTs = join(
    new URL(".", import.meta.url).pathname,
    "..",
    "..",
    "src",
    "cli.ts",
  );
  return [
    Deno!.execPath(),
    "run",
    "--quiet",
    "--allow-read",
    "--allow-write",
    "--allow-sys=hostname",
    "--allow-run",
    "--allow-env",
    cliTs,
  ];
}

describe("runlock run's record while its command runs", {
  skip: !hasMkfifo || process.platform !== "linux",
}, () => {
  for (const how of ["with FFI", "under Deno without FFI"] as const) {
    test(
      `${how}: a command that writes to fd 9 (as scripts for flock(1) do) appends to the record, never over it`,
      {
        skip: how === "under Deno without FFI" &&
          (cliRuntime !== "deno" || process.env.RUNLOCK_CLI !== undefined),
      },
      async () => {
        const { dir, cleanup } = tempDir();
        const lock = join(dir, "run.lock");
        // The command reads `fifo` before it writes to fd 9, and `ending`
        // before it ends.
        const fifo = join(dir, "fifo");
        const ending = join(dir, "ending");
        assert.equal(spawnSync("mkfifo", [fifo, ending]).status, 0);
        const command = [
          "sh",
          "-c",
          'echo "ready $$"; read x < "$1"; echo "pid=$$" >&9; echo written; ' +
          'read y < "$2"',
          "sh",
          fifo,
          ending,
        ];
        const runner = how === "with FFI"
          ? start("run", lock, "--", ...command)
          : new Background([...noFfiCli(), "run", lock, "--", ...command]);
        try {
          const pid = Number((await runner.line(/^ready \d+$/)).slice(6));
          // Once runlock has named the command in the record.
          await waitFor(
            () =>
              JSON.parse(cli("status", "--json", lock).stdout).child === pid,
            "the record names the command",
          );
          await writeFile(fifo, "go\n");
          await runner.line(/^written$/);
          const record = readFileSync(lock, "utf8");
          assert.match(record, new RegExp(`\\nchild=0*${pid}\\n`), record);
          assert.match(record, /\nmeta\.cmd=sh -c /, record);
          assert.ok(record.endsWith(`pid=${pid}\n`), record);
          await writeFile(ending, "go\n");
          assert.equal((await runner.exited).code, 0);
        } finally {
          release(fifo);
          release(ending);
          await runner.exited;
          cleanup();
        }
      },
    );
  }

  for (const how of ["with FFI", "under Deno without FFI"] as const) {
    test(
      `${how}: runlock given a locked descriptor at 9 itself (a run inside a run, a flock(1) script) hands its own lock on above it: SIGKILLed, its command keeps both locks`,
      {
        skip: how === "under Deno without FFI" &&
          (cliRuntime !== "deno" || process.env.RUNLOCK_CLI !== undefined),
      },
      async () => {
        const { dir, cleanup } = tempDir();
        const outer = join(dir, "outer.lock");
        const lock = join(dir, "run.lock");
        const fifo = join(dir, "fifo");
        assert.equal(spawnSync("mkfifo", [fifo]).status, 0);
        // sh takes the outer lock at its fd 9, as flock(1) scripts and an outer
        // `runlock run` do, and becomes runlock (exec): the same process.
        const runner = new Background([
          "sh",
          "-c",
          'exec 9>>"$1" && flock -n 9 && shift && exec "$@"',
          "sh",
          outer,
          ...(how === "with FFI" ? cliCommand() : noFfiCli()),
          "run",
          lock,
          "--",
          "sh",
          "-c",
          'echo "ready $$ $(cd /proc/$$/fd && stat -L -c %n:%i [0-9]* | tr "\\n" " ")"; ' +
          'read x < "$1"',
          "sh",
          fifo,
        ]);
        try {
          // The command's descriptors, as number:inode.
          const fds = new Map(
            (await runner.line(/^ready \d+ /)).trim().split(" ").slice(2).map((
              f,
            ) => f.split(":").map(Number) as [number, number]),
          );
          assert.equal(fds.get(9), statSync(outer).ino, "the outer lock at 9");
          const at = [...fds].find(([, ino]) => ino === statSync(lock).ino)
            ?.[0];
          assert.ok(at !== undefined && at > 9, `the lock above 9: ${at}`);
          runner.signal("SIGKILL");
          await runner.died;
          assert.equal(
            spawnSync("flock", ["-n", outer, "true"]).status,
            1,
            "the outer lock is still held, by the command",
          );
          assert.equal(cli("run", lock, "--", "true").code, 75);
          release(fifo);
          await runner.exited;
          assert.equal(spawnSync("flock", ["-n", outer, "true"]).status, 0);
          assert.equal(cli("run", lock, "--", "true").code, 0);
        } finally {
          release(fifo);
          await runner.exited;
          cleanup();
        }
      },
    );
  }

  test("runlock SIGKILLed, then its command ends while what it started holds fd 9: status names no command (its pid may be reused), and a run is still refused", async () => {
    const { dir, cleanup } = tempDir();
    const lock = join(dir, "run.lock");
    const daemon = join(dir, "daemon");
    const fifo = join(dir, "command");
    assert.equal(spawnSync("mkfifo", [daemon, fifo]).status, 0);
    const runner = start(
      "run",
      lock,
      "--",
      "sh",
      "-c",
      '(read x < "$1") >/dev/null 2>&1 & echo "ready $$"; read y < "$2"',
      "sh",
      daemon,
      fifo,
    );
    try {
      const pid = Number((await runner.line(/^ready \d+$/)).slice(6));
      await waitFor(
        () => JSON.parse(cli("status", "--json", lock).stdout).child === pid,
        "the record names the command",
      );
      runner.signal("SIGKILL");
      await runner.died;
      // The command ends; its background process keeps fd 9, and so the
      // lock, in the command's process group.
      await writeFile(fifo, "go\n");
      await waitFor(() => {
        try {
          process.kill(pid, 0);
          return false;
        } catch {
          return true;
        }
      }, "the command ended");
      const json = JSON.parse(cli("status", "--json", lock).stdout);
      assert.deepEqual(
        [json.state, json.child],
        ["held", 0],
        JSON.stringify(json),
      );
      const status = cli("status", lock);
      assert.doesNotMatch(status.stdout, new RegExp(`pid ${pid}\\b`));
      assert.match(status.stdout, /fuser -v names it/);
      const second = cli("run", lock, "--", "true");
      assert.equal(second.code, 75, JSON.stringify(second));
      assert.doesNotMatch(second.stderr, new RegExp(`pid ${pid}\\b`));
    } finally {
      release(fifo);
      release(daemon);
      await runner.exited;
      cleanup();
    }
  });
});
