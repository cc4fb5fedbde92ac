// Bad lock files get a typed error naming the file, and are left exactly as
// they were: no write, no unlink, no rename, symlinks never followed.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  acquire,
  acquireSync,
  activePid,
  held,
  inspect,
  InvalidLockFileError,
  RunlockError,
} from "../../mod.ts";
import {
  Child,
  cliCommand,
  deadPid,
  fixtureCommand,
  tempDir,
} from "../_helpers.ts";

function snapshot(path: string): string {
  const s = lstatSync(path);
  let content = "";
  if (s.isFile()) content = readFileSync(path, "latin1");
  if (s.isSymbolicLink()) content = readlinkSync(path);
  return JSON.stringify([s.ino, s.mode, s.size, s.mtimeMs, s.nlink, content]);
}

async function assertRefused(path: string, reason: RegExp): Promise<void> {
  const before = snapshot(path);
  const check = (err: unknown) => {
    assert.ok(err instanceof InvalidLockFileError, String(err));
    assert.equal(err.path, path);
    assert.match(err.reason, reason);
    assert.ok(err.message.startsWith(`${path}: `), err.message);
    return true;
  };
  await assert.rejects(acquire(path), check);
  assert.throws(() => acquireSync(path), check);
  await assert.rejects(acquire(path, { timeout: 50 }), check);
  await assert.rejects(held(path), check);
  await assert.rejects(activePid(path), check);
  const info = await inspect(path);
  assert.equal(info.state, "invalid");
  assert.match(info.reason ?? "", reason);
  assert.equal(snapshot(path), before, "the file is left exactly as it was");
}

describe("bad lock files", () => {
  const contents: [string, string, RegExp][] = [
    ["garbage", "hello world\n", /not a PID/],
    ["zero (kill(0) would probe our own group)", "0\n", /not a PID/],
    ["minus one (kill(-1) would probe every process)", "-1\n", /not a PID/],
    ["a sign", "+5\n", /not a PID/],
    ["trailing junk", "12x\n", /not a PID/],
    ["leading zero", "0123\n", /not a PID/],
    ["padding", " 42\n", /not a PID/],
    ["a pid over 2^31-1", "2147483648\n", /not a PID/],
    ["a huge number", "99999999999999999999\n", /not a PID/],
    ["our marker with pid 0", "0\nrunlock 1\n", /not a PID/],
    [
      "more than 4 KiB",
      `${deadPid()}\nrunlock 1\n${"x".repeat(5000)}\n`,
      /larger than 4096/,
    ],
    ["binary", "\u0000\u0001\u0002", /not a PID/],
  ];
  for (const [name, content, reason] of contents) {
    test(`a file holding ${name} is refused as invalid and left untouched`, async () => {
      const { dir, cleanup } = tempDir();
      try {
        const path = join(dir, "run.lock");
        writeFileSync(path, content);
        await assertRefused(path, reason);
      } finally {
        cleanup();
      }
    });
  }

  test("a directory at the path is refused as invalid and left untouched", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      mkdirSync(path);
      writeFileSync(join(path, "inside"), "x");
      await assertRefused(path, /is a directory/);
    } finally {
      cleanup();
    }
  });

  test("a garbage file whose flock outlives its reader for a moment (a child forked meanwhile holds it until its exec) reads invalid once it is let go, not held", async () => {
    // Any thread that forks while runlock has the file open and locked to
    // read it (another test module of this very process, in a parallel
    // run) keeps that lock alive in the child until it calls exec. Here a
    // flock(1) that lets go as soon as the file `go` appears plays that
    // child, deterministically: the first look of each call happens under
    // the flock; the event loop stays blocked until the flock is gone, so
    // every later look happens after it.
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const go = join(dir, "go");
    writeFileSync(path, "not a pid\n");
    const before = snapshot(path);
    const holder = spawn("flock", [
      "--exclusive",
      path,
      "sh",
      "-c",
      'while [ ! -e "$0" ]; do sleep 0.01; done',
      go,
    ], { stdio: "ignore" });
    const isFree = () =>
      spawnSync("flock", ["--nonblock", "--shared", path, "true"]).status ===
        0;
    try {
      while (isFree()) spawnSync("sleep", ["0.01"]); // until flock(1) holds it
      const looking = inspect(path);
      const taking = acquire(path);
      const asking = held(path);
      writeFileSync(go, "");
      while (!isFree()) spawnSync("sleep", ["0.01"]); // until it let go
      const info = await looking;
      assert.equal(info.state, "invalid", JSON.stringify(info));
      await assert.rejects(taking, InvalidLockFileError);
      await assert.rejects(asking, InvalidLockFileError);
      assert.equal(
        snapshot(path),
        before,
        "the file is left exactly as it was",
      );
    } finally {
      holder.kill("SIGKILL");
      cleanup();
    }
  });

  test("a FIFO at the path is refused without hanging", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      assert.equal(spawnSync("mkfifo", [path]).status, 0);
      await assertRefused(path, /not a regular file/);
    } finally {
      cleanup();
    }
  });

  test("a UNIX socket at the path is refused as invalid, the same on every runtime", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const server = createServer();
    try {
      await new Promise<void>((resolve) => server.listen(path, resolve));
      await assertRefused(path, /not a regular file/);
    } finally {
      await new Promise((resolve) => server.close(resolve));
      cleanup();
    }
  });

  test("a terminal at the path is refused, and opening it never makes it the controlling terminal of a session leader (O_NOCTTY)", async (t) => {
    const { dir, cleanup } = tempDir();
    const pty = new Child("", [], undefined, [
      "python3",
      new URL("../fixtures/pty_slave.py", import.meta.url).pathname,
    ]);
    const path = join(dir, "run.lock");
    let mounted = false;
    try {
      const slave = String((await pty.next()).text);
      // The terminal itself at the lock's path: a bind mount (a device
      // node made with mknod would name the host's terminals in a
      // container, not this one).
      writeFileSync(path, "");
      mounted = spawnSync("mount", ["--bind", slave, path]).status === 0;
      if (!mounted) {
        t.skip("bind-mounting a terminal at the path needs root");
        return;
      }
      // A new session without a terminal, as a daemon's: the first
      // terminal it opens without O_NOCTTY becomes its own.
      const [cmd, args] = fixtureCommand("ctty.ts", [path]);
      const run = spawnSync("setsid", ["-w", cmd, ...args], {
        encoding: "utf8",
        timeout: 30_000,
      });
      assert.equal(run.status, 0, run.stderr);
      const result = JSON.parse(run.stdout.trim());
      assert.equal(result.tty, 0, "the terminal became the controlling one");
      assert.equal(result.acquire, "InvalidLockFileError");
      assert.equal(result.held, "InvalidLockFileError");
      assert.equal(result.inspect, "ok");
      assert.ok(lstatSync(path).isCharacterDevice(), "left as it was");
    } finally {
      if (mounted) spawnSync("umount", [path]);
      await pty.kill();
      cleanup();
    }
  });

  test("a directory at the path is never advised for removal: the message says what it is and to choose another path", async () => {
    const { dir, cleanup } = tempDir();
    try {
      await assert.rejects(acquire(dir + "/"), TypeError);
      const state = join(dir, "state");
      mkdirSync(state);
      await assert.rejects(acquire(state), (err) => {
        assert.ok(err instanceof InvalidLockFileError);
        assert.match(err.message, /is a directory/);
        assert.match(err.message, /[Cc]hoose another path/);
        assert.doesNotMatch(err.message, /remove it/);
        return true;
      });
    } finally {
      cleanup();
    }
  });

  test("a symlink at the path is never followed, and its target is never touched", async () => {
    const { dir, cleanup } = tempDir();
    try {
      // The target looks like a stale lock: following the link would take
      // it over and delete it.
      const target = join(dir, "target");
      writeFileSync(target, `${deadPid()}\nrunlock 1\n`);
      const path = join(dir, "run.lock");
      symlinkSync(target, path);
      const targetBefore = snapshot(target);
      await assertRefused(path, /symbolic link/);
      assert.equal(snapshot(target), targetBefore);
    } finally {
      cleanup();
    }
  });

  test("a dangling symlink at the path is refused, and nothing is created at its target", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      symlinkSync(join(dir, "nowhere"), path);
      await assertRefused(path, /symbolic link/);
      assert.throws(() => lstatSync(join(dir, "nowhere")), /ENOENT/);
    } finally {
      cleanup();
    }
  });
});

describe("a directory that refuses new files", () => {
  test("acquire('/proc/version') names the real cause, not a missing directory", async (t) => {
    if (!existsSync("/proc/version")) return t.skip("no /proc");
    await assert.rejects(acquire("/proc/version"), (err) => {
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /\/proc does not accept new files/);
      assert.doesNotMatch(err.message, /directory: /);
      return true;
    });
    assert.equal((await inspect("/proc/version")).state, "invalid");
  });

  test("acquire of a path in a missing directory under /proc fails at once with a RunlockError (Node's recursive mkdir spins there forever, deaf to SIGTERM)", async (t) => {
    if (!existsSync("/proc/self")) return t.skip("no /proc");
    // In a child: a spinning mkdir never returns (the Child's hang detector
    // would end the test), and the spin is not interruptible in-process.
    const c = new Child("child.ts", [
      "try",
      "/proc/runlock-no-such/x/run.lock",
    ]);
    const e = await c.next();
    assert.equal(e.event, "error", JSON.stringify(e));
    assert.equal(e.name, "RunlockError", JSON.stringify(e));
    assert.match(String(e.message), /\/proc\/runlock-no-such/);
    await c.exited;
  });
});

describe("bad arguments", () => {
  const badPaths: [string, unknown, RegExp][] = [
    ["empty", "", /'path' must be a non-empty string/],
    [
      "with a NUL",
      "a\0b.lock",
      /'path' must be a non-empty string without NUL/,
    ],
    ["not a string", 42, /'path' must be a non-empty string/],
    ["ending in /", "state/", /'path' must name a file/],
    ["ending in /.", "state/.", /'path' must name a file/],
    ["ending in /..", "state/..", /'path' must name a file/],
    [".", ".", /'path' must name a file/],
    ["..", "..", /'path' must name a file/],
    ["/", "/", /'path' must name a file/],
  ];
  for (const [name, path, message] of badPaths) {
    test(`a path ${name} is a TypeError from every entry point, before anything touches the disk`, async () => {
      const { dir, cleanup } = tempDir();
      const cwd = process.cwd();
      try {
        process.chdir(dir);
        const p = path as string;
        const check = (err: unknown) => {
          assert.ok(err instanceof TypeError, String(err));
          assert.match(err.message, message);
          return true;
        };
        await assert.rejects(acquire(p), check);
        assert.throws(() => acquireSync(p), check);
        await assert.rejects(inspect(p), check);
        await assert.rejects(held(p), check);
        await assert.rejects(activePid(p), check);
        assert.deepEqual(readdirSync(dir), []);
      } finally {
        process.chdir(cwd);
        cleanup();
      }
    });
  }

  test("the runlock command refuses an empty path as an error (exit 2), as the API does", () => {
    const [cmd, ...args] = cliCommand();
    const result = spawnSync(cmd, [...args, "status", ""], {
      encoding: "utf8",
    });
    assert.equal(result.status, 2, result.stderr);
    assert.match(result.stderr, /'path' must be a non-empty string/);
    assert.equal(result.stdout, "");
  });

  test("acquireSync's options have no signal (it could not honour one)", () => {
    const { dir, cleanup } = tempDir();
    try {
      const lock = acquireSync(join(dir, "run.lock"), {
        // @ts-expect-error: AcquireSyncOptions has no signal
        signal: AbortSignal.abort(),
      });
      lock.releaseSync();
    } finally {
      cleanup();
    }
  });

  test("acquire() rejects a bad path or timeout with a message naming the value", async () => {
    await assert.rejects(acquire(""), /'path' must be a non-empty string/);
    await assert.rejects(acquire("a/"), /'path' must name a file/);
    await assert.rejects(
      acquire("x.lock", { timeout: -1 }),
      /'timeout' must be a non-negative number of milliseconds: current value is -1/,
    );
    assert.throws(
      () => acquireSync("x.lock", { timeout: Number.NaN }),
      RangeError,
    );
  });
});
