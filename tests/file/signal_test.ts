// lock.signal: loss of the lock is an event. A held lock whose file is
// deleted or replaced aborts its signal within the check interval (at once
// where the directory is watched); a clean release never aborts it; a held
// lock never keeps the process alive.
import assert from "node:assert/strict";
import {
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { acquire, acquireSync, LockLostError } from "../../mod.ts";
import { Child, delay, holder, runtime, tempDir } from "../_helpers.ts";

/**
 * Resolves when `signal` aborts, with the time it did; rejects after 30 s
 * (a hang detector: the delay itself is printed, not asserted). It keeps
 * the event loop alive meanwhile: the lock's own check does not.
 */
function aborted(signal: AbortSignal): Promise<number> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return resolve(performance.now());
    const timer = setTimeout(
      () => reject(new Error("the signal did not abort within 30 s")),
      30_000,
    );
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve(performance.now());
    }, { once: true });
  });
}

/** The inotify watches this process has open (Linux), from /proc. */
function inotifyWatches(): number {
  let count = 0;
  for (const fd of readdirSync("/proc/self/fd")) {
    let target = "";
    try {
      target = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      continue;
    }
    if (target !== "anon_inode:inotify") continue;
    try {
      const info = readFileSync(`/proc/self/fdinfo/${fd}`, "utf8");
      count += info.split("\n").filter((l) => l.startsWith("inotify wd:"))
        .length;
    } catch {
      // Closed meanwhile.
    }
  }
  return count;
}

describe("lock.signal", () => {
  test("aborts with LockLostError ('was deleted') when the lock file is deleted (the delay printed against the check interval)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path, { checkInterval: 50 });
      assert.equal(lock.signal.aborted, false);
      const deleted = performance.now();
      unlinkSync(path);
      const at = await aborted(lock.signal);
      const reason = lock.signal.reason;
      assert.ok(reason instanceof LockLostError, String(reason));
      assert.equal(reason.what, "was deleted");
      assert.equal(reason.path, path);
      console.log(
        `deletion noticed after ${
          (at - deleted).toFixed(1)
        } ms (interval 50 ms, ${runtime})`,
      );
      await assert.rejects(lock.release(), LockLostError);
    } finally {
      cleanup();
    }
  });

  test("aborts naming the new holder when the file is replaced by another run's lock", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path, { checkInterval: 50 });
      // A careless cleanup removes our file; another run takes the lock.
      renameSync(path, join(dir, "moved-away"));
      const other = await holder(path);
      try {
        await aborted(lock.signal);
        const reason = lock.signal.reason as LockLostError;
        assert.ok(reason instanceof LockLostError);
        // Deleted first, then replaced: whichever the check saw first. (Deno
        // does not look who holds it now: its open could block on a FIFO.)
        if (reason.what === "was replaced by another file") {
          if (runtime === "deno") {
            assert.equal(reason.holder, undefined);
          } else {
            assert.equal(reason.holder?.pid, other.pid);
            assert.match(
              reason.message,
              new RegExp(`now held by pid ${other.pid}`),
            );
          }
        } else {
          assert.equal(reason.what, "was deleted");
        }
        await assert.rejects(lock.release(), LockLostError);
        assert.equal(
          readFileSync(path, "utf8").split("\n")[0],
          String(other.pid),
        );
      } finally {
        await other.kill();
      }
    } finally {
      cleanup();
    }
  });

  test("a replacement seen by the periodic check alone (no watch) names who holds it now (not on Deno, whose open could block on a swapped-in FIFO)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = acquireSync(path, { checkInterval: 100 });
      // Replace atomically: never a moment without a file.
      const other = await holder(join(dir, "other.lock"));
      try {
        renameSync(join(dir, "other.lock"), path);
        await aborted(lock.signal);
        const reason = lock.signal.reason as LockLostError;
        assert.equal(reason.what, "was replaced by another file");
        if (runtime !== "deno") assert.equal(reason.holder?.pid, other.pid);
        assert.throws(() => lock.releaseSync(), LockLostError);
      } finally {
        await other.kill();
      }
    } finally {
      cleanup();
    }
  });

  test("a clean release never aborts it, and nothing is watched after release", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const before = runtime === "deno" ? 0 : inotifyWatches();
      const lock = await acquire(path, { checkInterval: 20 });
      await delay(20); // the watch starts once the event loop turns
      if (runtime !== "deno") {
        assert.equal(inotifyWatches(), before + 1, "the directory is watched");
      }
      await lock.release();
      if (runtime !== "deno") {
        assert.equal(inotifyWatches(), before, "the watch is gone");
      }
      // A new file at the path after release is not our loss.
      writeFileSync(path, "1\n");
      await delay(120);
      assert.equal(lock.signal.aborted, false);
    } finally {
      cleanup();
    }
  });

  test("composes with abortable calls: setTimeout from node:timers/promises rejects with the LockLostError", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      await using lock = await acquire(path, { checkInterval: 50 });
      setTimeout(() => unlinkSync(path), 20);
      // Node's timers reject with an AbortError whose cause is the reason.
      await assert.rejects(
        sleep(60_000, "done", { signal: lock.signal }),
        (err: Error) => {
          const reason = err instanceof LockLostError ? err : err.cause;
          assert.ok(reason instanceof LockLostError, String(err));
          assert.equal(reason.what, "was deleted");
          return true;
        },
      );
    } catch (err) {
      // `await using` releases at the end of the block: the release reports
      // the same loss once.
      assert.ok(err instanceof LockLostError, String(err));
    } finally {
      cleanup();
    }
  });

  test("checkInterval 0 turns the lock's own checks off (no timer, no watch: only release finds a loss); a bad checkInterval is a RangeError", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      for (const checkInterval of [-1, Number.NaN, Infinity]) {
        await assert.rejects(acquire(path, { checkInterval }), RangeError);
      }
      assert.deepEqual(readdirSync(dir), []);
      const lock = await acquire(path, { checkInterval: 0 });
      await delay(20); // past the first look, once the event loop turned
      unlinkSync(path);
      await delay(100);
      // checkInterval 0: no timer and no watch, on every runtime.
      assert.equal(lock.signal.aborted, false);
      await assert.rejects(lock.release(), LockLostError);
      assert.equal(lock.signal.aborted, true, "release reports the loss");
    } finally {
      cleanup();
    }
  });
});

describe("losses that leave the file in place", () => {
  test("the lock's directory renamed and another made in its place (where a second run starts): the signal aborts", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const state = join(dir, "state");
      mkdirSync(state);
      const path = join(state, "run.lock");
      const lock = await acquire(path, { checkInterval: 50 });
      await delay(20); // past the first look
      renameSync(state, join(dir, "state.old"));
      mkdirSync(state);
      const other = await holder(path);
      try {
        await aborted(lock.signal);
        const reason = lock.signal.reason as LockLostError;
        assert.ok(reason instanceof LockLostError);
        assert.match(
          reason.what,
          /^(was moved away from its path|was deleted|was replaced)/,
          reason.message,
        );
      } finally {
        await other.kill();
      }
      await lock.release().catch(() => {});
    } finally {
      cleanup();
    }
  });

  test("the lock's directory renamed and another made in its place: isOwned() says so at once, and the signal aborts with it", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const state = join(dir, "state");
      mkdirSync(state);
      const path = join(state, "run.lock");
      // No periodic check in this test's time: isOwned() itself must look.
      const lock = await acquire(path, { checkInterval: 600_000 });
      assert.equal(lock.isOwned(), true);
      renameSync(state, join(dir, "state.old"));
      mkdirSync(state);
      assert.equal(lock.isOwned(), false);
      assert.ok(lock.signal.aborted);
      assert.match(
        (lock.signal.reason as LockLostError).what,
        /^was moved away from its path/,
      );
      await assert.rejects(lock.release(), LockLostError);
      assert.deepEqual(readdirSync(join(dir, "state.old")), []);
    } finally {
      cleanup();
    }
  });

  test("the lock's directory renamed and a symlink to it put in its place: the path still names the file, so the lock is kept", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const state = join(dir, "state");
      mkdirSync(state);
      const path = join(state, "run.lock");
      const lock = await acquire(path, { checkInterval: 600_000 });
      renameSync(state, join(dir, "state.old"));
      symlinkSync("state.old", state);
      assert.equal(lock.isOwned(), true);
      // Another run through the path meets this lock's file and its flock.
      const other = new Child("child.ts", ["try", path]);
      assert.equal((await other.expect("held")).holder, process.pid);
      assert.equal(lock.signal.aborted, false);
      await lock.release();
      assert.deepEqual(readdirSync(join(dir, "state.old")), []);
    } finally {
      cleanup();
    }
  });

  test(
    "the file moved aside and back while another run held the lock: the watch reports it (Node, Bun)",
    {
      skip: runtime === "deno" &&
        "Deno has no watch that lets the process exit; a periodic check cannot see a file that is back",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      try {
        const path = join(dir, "run.lock");
        const lock = await acquire(path, { checkInterval: 60_000 });
        await delay(20); // the watch is on
        renameSync(path, join(dir, "aside"));
        const other = new Child("child.ts", ["try", path]);
        await other.expect("acquired");
        await other.exited;
        renameSync(join(dir, "aside"), path);
        await aborted(lock.signal);
        assert.match(
          (lock.signal.reason as LockLostError).what,
          /^was (moved away and back|deleted)/,
        );
        await lock.release().catch(() => {});
      } finally {
        cleanup();
      }
    },
  );
});

describe("a held lock and the process's life", () => {
  test("a program that holds a lock and finishes exits on its own (the kernel drops the lock)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const child = new Child("signal.ts", ["end", path]);
      await child.expect("acquired");
      const started = Date.now();
      const { code } = await child.exited;
      assert.equal(code, 0);
      console.log(
        `exited ${Date.now() - started} ms after acquiring (${runtime})`,
      );
    } finally {
      cleanup();
    }
  });

  test("a holder whose file is deleted by hand learns it from its signal at once, in another process", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const child = new Child("signal.ts", ["watch", path, "200"]);
      await child.expect("acquired");
      const deleted = Date.now();
      unlinkSync(path);
      const lost = await child.expect("lost");
      assert.equal(lost.name, "LockLostError");
      assert.equal(lost.what, "was deleted");
      console.log(
        `another process noticed the deletion after ${
          Number(lost.at) - deleted
        } ms (interval 200 ms, ${runtime})`,
      );
      const { code } = await child.exited;
      assert.equal(code, 0, "and then exits on its own");
    } finally {
      cleanup();
    }
  });
});
