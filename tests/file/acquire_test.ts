// acquire/release across real processes: the record, HeldError, SIGKILL
// takeover, release safety, children, missing directories.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import {
  closeSync,
  constants,
  existsSync,
  linkSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  statSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  acquire,
  acquireSync,
  activePid,
  held,
  HeldError,
  inspect,
  LockLostError,
} from "../../mod.ts";
import {
  Child,
  deadPid,
  delay,
  holder,
  processExists,
  runtime,
  tempDir,
  waitFor,
} from "../_helpers.ts";

describe("the record", () => {
  test("the file's first line is the holder's pid, then the marker and key=value lines", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      await using lock = await acquire(path);
      const lines = readFileSync(path, "utf8").split("\n");
      assert.equal(lines[0], String(process.pid));
      assert.equal(lock.pid, process.pid);
      assert.equal(lines[1], "runlock 1");
      assert.ok(lines.includes(`host=${hostname()}`), lines.join("|"));
      const started = lines.find((l) => l.startsWith("started="))!;
      assert.equal(
        new Date(started.slice(8)).getTime(),
        lock.acquiredAt.getTime(),
      );
      for (const line of lines.slice(2).filter(Boolean)) {
        assert.match(line, /^[a-z]+=/);
      }
    } finally {
      cleanup();
    }
  });

  test('pgrep -F and kill -0 "$(head -n1 file)" find the holder', async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const child = await holder(path);
    try {
      const pgrep = spawnSync("pgrep", ["-F", path], { encoding: "utf8" });
      assert.equal(pgrep.stdout.trim(), String(child.pid));
      // kill -0 only asks whether the process exists: the test never sends
      // a real signal to a PID read back from a file (the holder is killed
      // through its handle).
      const sh = spawnSync("sh", [
        "-c",
        `pid=$(head -n1 "$1") && kill -0 "$pid" && printf %s "$pid"`,
        "sh",
        path,
      ], { encoding: "utf8" });
      assert.equal(sh.status, 0, sh.stderr);
      assert.equal(sh.stdout, String(child.pid));
      await child.kill("SIGKILL");
      const { signal } = await child.exited;
      assert.equal(signal, "SIGKILL");
    } finally {
      await child.kill();
      cleanup();
    }
  });

  test("the record is published whole: a reader polling the path never sees it partial", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    // Another process acquires and releases in a loop; we read as fast as
    // we can, until we have read 300 records. Every read is either nothing
    // or a complete record.
    const stop = join(dir, "stop");
    const churn = new Child("churn.ts", [path, stop]);
    try {
      let complete = 0;
      const deadline = Date.now() + 60_000; // a hang detector
      while (complete < 300) {
        assert.ok(churn.running, `churn exited: ${churn.stderr.join("")}`);
        assert.ok(Date.now() < deadline, `only ${complete} records read`);
        await delay(0);
        let text: string;
        try {
          text = readFileSync(path, "utf8");
        } catch {
          continue;
        }
        assert.match(text, /^[1-9][0-9]*\nrunlock 1\n(?:[a-z]+=.*\n)+$/);
        assert.ok(text.includes("\nruntime="), text);
        complete++;
      }
      writeFileSync(stop, "");
      await child_done(churn);
    } finally {
      await churn.kill();
      cleanup();
    }
  });
});

type Exit = { code: number | null; signal: string | null };

async function child_done(child: Child): Promise<void> {
  const { code } = await child.exited;
  assert.equal(code, 0, child.stderr.join(""));
}

describe("contention", () => {
  test("a second process gets HeldError with the holder's pid and host, and every probe agrees", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, ".state", "run.lock");
    const first = await holder(path);
    try {
      const second = new Child("child.ts", ["try", path]);
      const refused = await second.expect("held");
      assert.equal(refused.holder, first.pid);
      assert.equal(refused.host, hostname());
      assert.equal(
        refused.message,
        `${path}: another run is active as pid ${first.pid} on ${hostname()}; wait for it or stop it`,
      );
      assert.equal((await second.exited).code, 3);

      assert.equal(await held(path), true);
      assert.deepEqual(await activePid(path), { pid: first.pid, alive: true });
      const info = await inspect(path);
      assert.equal(info.state, "held");
      assert.equal(info.pid, first.pid);
      assert.equal(info.host, hostname());
      assert.ok(info.started instanceof Date);

      await assert.rejects(acquire(path), (err) => {
        assert.ok(err instanceof HeldError);
        assert.equal(err.pid, first.pid);
        assert.equal(err.path, path);
        return true;
      });
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("a second acquire in the same process is refused too", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      using _lock = acquireSync(path);
      assert.throws(() => acquireSync(path), (err) => {
        assert.ok(err instanceof HeldError);
        assert.equal(err.pid, process.pid);
        return true;
      });
    } finally {
      cleanup();
    }
  });
});

describe("crash recovery", () => {
  test("acquire() takes over a lock whose holder was SIGKILLed, and probes call it stale first", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      assert.equal((await first.kill("SIGKILL") as Exit).signal, "SIGKILL");
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(first.pid),
      );
      assert.equal(await held(path), false);
      assert.deepEqual(await activePid(path), { pid: first.pid, alive: false });
      const info = await inspect(path);
      assert.equal(info.state, "stale");
      assert.equal(info.pid, first.pid);

      const lock = await acquire(path);
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(process.pid),
      );
      assert.equal(await held(path), true);
      await lock.release();
      assert.equal(existsSync(path), false);
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("a record of ours whose pid now belongs to an unrelated live process is still stale (flock decides, not kill)", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    // `sleep` is alive and unrelated to the lock; the record names it but
    // nobody holds the flock, as after a crash and PID reuse. Ours, so that
    // it is ended through its handle.
    const sleeper = spawn("sleep", ["300"], { stdio: "ignore" });
    const exited = new Promise((r) => sleeper.on("exit", r));
    const livePid = sleeper.pid!;
    try {
      assert.ok(processExists(livePid));
      writeFileSync(path, `${livePid}\nrunlock 1\nhost=${hostname()}\n`);
      assert.equal(await held(path), false);
      assert.deepEqual(await activePid(path), { pid: livePid, alive: false });
      assert.equal((await inspect(path)).state, "stale");
      const lock = await acquire(path);
      assert.equal(lock.pid, process.pid);
      await lock.release();
    } finally {
      sleeper.kill("SIGKILL");
      await exited;
      cleanup();
    }
  });

  test("a record naming this very process but with no flock (a PID-1 container reboot) is stale", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      writeFileSync(path, `${process.pid}\nrunlock 1\n`);
      assert.equal((await inspect(path)).state, "stale");
      const lock = await acquire(path);
      await lock.release();
    } finally {
      cleanup();
    }
  });
});

describe("release", () => {
  test("release() is idempotent and removes the file", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path);
      assert.equal(lock.released, false);
      assert.equal(lock.isOwned(), true);
      await lock.release();
      await lock.release();
      lock.releaseSync();
      assert.equal(lock.released, true);
      assert.equal(lock.isOwned(), false);
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });

  test("release() never deletes a successor's file, and reports that ours was lost", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const lock = await acquire(path);
    let successor: Child | undefined;
    try {
      unlinkSync(path); // someone deletes ours behind our back
      assert.equal(lock.isOwned(), false);
      successor = await holder(path); // and another process takes the lock
      await assert.rejects(lock.release(), (err) => {
        assert.ok(err instanceof LockLostError);
        assert.equal(err.pid, process.pid);
        assert.match(err.message, /was replaced by another file/);
        return true;
      });
      await lock.release(); // idempotent: nothing more to report
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(successor.pid),
      );
      assert.equal(await held(path), true);
      successor.send("release");
      await successor.expect("released");
      assert.equal(existsSync(path), false);
    } finally {
      await successor?.kill();
      cleanup();
    }
  });

  test("release() of a lock whose file was deleted reports it as lost and removes nothing", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = acquireSync(path);
      renameSync(path, join(dir, "moved"));
      assert.throws(() => lock.releaseSync(), (err) => {
        assert.ok(err instanceof LockLostError);
        assert.match(err.message, /was deleted/);
        return true;
      });
      assert.ok(existsSync(join(dir, "moved")));
    } finally {
      cleanup();
    }
  });

  test("await using releases at the end of the block", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      {
        await using lock = await acquire(path);
        assert.equal(await held(lock.path), true);
      }
      assert.equal(existsSync(path), false);
      {
        using _lock = acquireSync(path);
      }
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });
});

describe("children", () => {
  test("a child process started by the holder never keeps the lock alive after the holder dies", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    // The grandchild reads one byte from this FIFO and exits: the test ends
    // it by writing that byte, never by a signal to a PID it did not spawn.
    const fifo = join(dir, "grandchild.fifo");
    assert.equal(spawnSync("mkfifo", [fifo]).status, 0);
    let writer: number | undefined;
    // A writer's non-blocking open succeeds only while a reader has the
    // FIFO open: the grandchild is alive.
    const openWriter = () => {
      try {
        writer = openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK);
        return true;
      } catch (err) {
        if ((err as { code?: string }).code === "ENXIO") return false;
        throw err;
      }
    };
    try {
      first.send(`spawn ${fifo}`);
      await first.expect("spawned");
      await first.kill("SIGKILL");
      await waitFor(openWriter, "the grandchild reading its FIFO");
      // Opened after the holder died: the grandchild outlives it.
      assert.equal(await held(path), false);
      const lock = await acquire(path);
      await lock.release();
    } finally {
      if (writer !== undefined || openWriter()) {
        writeSync(writer!, "x");
        closeSync(writer!);
      }
      cleanup();
    }
  });
});

describe("descriptors", () => {
  test("the holder's lock descriptor is close-on-exec (Linux /proc)", {
    skip: process.platform !== "linux",
  }, async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      const ino = statSync(path).ino;
      const dir = `/proc/${first.pid}/fd`;
      const fdsOf = (wanted: (fd: string) => boolean) =>
        readdirSync(dir).filter((fd) => {
          try {
            return wanted(`${dir}/${fd}`);
          } catch {
            return false; // Closed since the listing.
          }
        });
      // On Node and Bun the holder moves its descriptor once, just before
      // its watch begins: look at the one it keeps (a listing taken while
      // it moves may show both numbers, or neither).
      if (runtime !== "deno") {
        await waitFor(
          () =>
            fdsOf((fd) => readlinkSync(fd) === "anon_inode:inotify").length >
              0,
          "the holder's watch",
        );
      }
      const fds = fdsOf((fd) => statSync(fd).ino === ino);
      assert.equal(fds.length, 1, "exactly one descriptor holds the lock");
      const fdinfo = readFileSync(
        `/proc/${first.pid}/fdinfo/${fds[0]}`,
        "utf8",
      );
      const flags = parseInt(/^flags:\s*([0-7]+)/m.exec(fdinfo)![1], 8);
      const O_CLOEXEC = 0o2000000;
      assert.ok(flags & O_CLOEXEC, `flags ${flags.toString(8)} lack O_CLOEXEC`);
    } finally {
      await first.kill();
      cleanup();
    }
  });
});

describe("directories", () => {
  test("missing parent directories are created", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "a", "b", ".state", "run.lock");
      const lock = await acquire(path);
      assert.ok(statSync(join(dir, "a", "b", ".state")).isDirectory());
      await lock.release();
      assert.deepEqual(readdirSync(join(dir, "a", "b", ".state")), []);
    } finally {
      cleanup();
    }
  });

  test("a relative path works and is reported as given", async () => {
    const { dir, cleanup } = tempDir();
    const cwd = process.cwd();
    try {
      process.chdir(dir);
      const lock = await acquire(".state/run.lock");
      assert.equal(lock.path, ".state/run.lock");
      await assert.rejects(
        acquire(".state/run.lock"),
        /^HeldError: \.state\/run\.lock: this process \(pid \d+\) already holds it/,
      );
      await lock.release();
    } finally {
      process.chdir(cwd);
      cleanup();
    }
  });
});

describe("foreign pidfiles (seed policy)", () => {
  test("a plain pidfile naming a dead pid is stale and taken over", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.pid");
      const dead = deadPid();
      writeFileSync(path, `${dead}\n`);
      const info = await inspect(path);
      assert.equal(info.state, "stale");
      assert.equal(info.foreign, true);
      assert.equal(info.pid, dead);
      const lock = await acquire(path);
      await lock.release();
    } finally {
      cleanup();
    }
  });

  test("a plain pidfile naming a live pid is held, and left alone", async () => {
    const { dir, cleanup } = tempDir();
    const sleeper = new Child("sleep.ts", []);
    try {
      await sleeper.expect("ready");
      const path = join(dir, "run.pid");
      writeFileSync(path, `${sleeper.pid}\n`);
      assert.equal(await held(path), true);
      assert.deepEqual(await activePid(path), {
        pid: sleeper.pid,
        alive: true,
      });
      await assert.rejects(acquire(path), (err) => {
        assert.ok(err instanceof HeldError);
        assert.equal(err.pid, sleeper.pid);
        return true;
      });
      assert.equal(readFileSync(path, "utf8"), `${sleeper.pid}\n`);
    } finally {
      await sleeper.kill();
      cleanup();
    }
  });

  test("an empty file left by flock(1) or touch is stale and taken over", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      writeFileSync(path, "");
      assert.equal((await inspect(path)).state, "stale");
      assert.equal(await held(path), false);
      const lock = await acquire(path);
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(process.pid),
      );
      await lock.release();
    } finally {
      cleanup();
    }
  });
});

describe("hard links", () => {
  test("the lock's inode is the one the path names (link, not copy)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path);
      assert.equal(statSync(path).nlink, 1, "the temp name is gone");
      linkSync(path, join(dir, "other-name"));
      await lock.release();
      assert.ok(existsSync(join(dir, "other-name")));
    } finally {
      cleanup();
    }
  });
});
