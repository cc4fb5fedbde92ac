// One directory watch per directory per process, shared by every held lock
// and every waiter in it, dispatching each event to the locks of its name
// only; and what a lock sets up that it may never need (nothing until its
// signal is read).
import assert from "node:assert/strict";
import { statSync, unlinkSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { acquire, LockLostError } from "../../mod.ts";
import { Child, countingTimers, runtime, tempDir } from "../_helpers.ts";

/** Resolves once `signal` aborts (the test's own timer detects a hang). */
function aborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(
      () => reject(new Error("the signal did not abort within 30 s")),
      30_000,
    );
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

describe("one watch per directory", () => {
  test("200 locks held in one directory by one process make one watch, and each reports the deletion of its own file and no other's", async () => {
    const { dir, cleanup } = tempDir();
    // Node and Bun watch a held lock's directory: a check interval of an
    // hour leaves the watch as the only way to learn of a deletion within
    // the test. Deno's watch would keep the process alive, so a held lock
    // there only checks, on the shared timer.
    const interval = runtime === "deno" ? 100 : 3_600_000;
    const many = new Child("watch_many.ts", [
      "hold",
      dir,
      "200",
      String(interval),
    ]);
    try {
      await many.expect("held");
      many.send("watches");
      const seen = await many.expect("watches");
      // One inotify watch at most (none on Deno), and on Node one fs.watch
      // handle in all (there, 200 handles on one inotify watch before).
      assert.ok(Number(seen.watches) <= 1, JSON.stringify(seen));
      if (runtime === "node") assert.equal(seen.fsEvents, 1);
      unlinkSync(join(dir, "lock-7"));
      unlinkSync(join(dir, "lock-123"));
      const lost = [await many.expect("lost"), await many.expect("lost")];
      assert.deepEqual(lost.map((e) => e.i).sort(), [123, 7]);
      for (const e of lost) assert.equal(e.what, "was deleted");
      // No other lock reported a loss meanwhile: a release of one still
      // held is clean, and its answer comes after any loss event queued.
      many.send("release 8");
      assert.equal((await many.expect("released")).i, 8);
    } finally {
      await many.kill();
      cleanup();
    }
  });

  test(
    "a lock taken right after its name's release, beside another lock that keeps the directory's watch open, is never lost: our own unlink and link are no move (Node, Bun)",
    {
      skip: runtime === "deno" &&
        "Deno's held locks have no watch (it would keep the process alive)",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      try {
        const keep = await acquire(join(dir, "keep.lock"), {
          checkInterval: 5,
        });
        await new Promise((resolve) => setTimeout(resolve, 0)); // its watch
        const losses: string[] = [];
        for (let i = 0; i < 300; i++) {
          const lock = await acquire(join(dir, "run.lock"), {
            checkInterval: 1,
          });
          // Let the watch's queued events (the last release, this link)
          // arrive, before and after the lock's listener begins.
          await new Promise((resolve) => setImmediate(resolve));
          await new Promise((resolve) => setTimeout(resolve, i % 3));
          if (lock.signal.aborted) losses.push(String(lock.signal.reason));
          await lock.release().catch((err) => losses.push(String(err)));
        }
        assert.deepEqual(losses.slice(0, 3), []);
        assert.equal(keep.signal.aborted, false);
        await keep.release();
      } finally {
        cleanup();
      }
    },
  );

  test("20 waiters of one process on one lock share one watch, of the lock file itself (other names' events never reach them); a release wakes them", async () => {
    const { dir, cleanup } = tempDir();
    const holder = new Child("watch_many.ts", ["hold", dir, "1", "0"]);
    let waiter: Child | undefined;
    try {
      await holder.expect("held");
      waiter = new Child("watch_many.ts", ["wait", dir, "20"]);
      await waiter.expect("waiting");
      waiter.send("watches");
      const seen = await waiter.expect("watches");
      // The directory's watch (before) woke every waiting process at each
      // attempt of any other waiter (temp files made and removed).
      // Node and Bun on Linux: the lock file is watched once, by the close
      // watch (its close, unlink and renames, src/platform/_close_node.ts),
      // with no fs.watch beside it (there were two watches of the file).
      const ino = statSync(join(dir, "lock-0")).ino;
      const inos = seen.inos as number[];
      assert.deepEqual(inos, [ino]);
      if (runtime === "node") {
        assert.equal(seen.fsEvents, process.platform === "linux" ? 0 : 1);
      }
      holder.send("release 0");
      await holder.expect("released");
      // One of them gets it (the others wait on, now on our own lock).
      await waiter.expect("acquired");
    } finally {
      await waiter?.kill();
      await holder.kill();
      cleanup();
    }
  });
});

describe("nothing a lock may never need", () => {
  test("50 held locks with two check intervals share one timer, and each still finds its own loss", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const { result: locks, timers } = await countingTimers(async () => {
        const locks = [];
        for (let i = 0; i < 50; i++) {
          locks.push(
            await acquire(join(dir, `lock-${i}`), {
              checkInterval: i % 2 === 0 ? 20 : 30,
            }),
          );
        }
        // The shared timer's first turn: every lock starts watching.
        await new Promise((resolve) => setTimeout(resolve, 0));
        return locks;
      });
      // One timer armed for all 50 (and our own turn), re-armed when it
      // fires; before, every lock set an interval and a timeout of its own.
      assert.ok(timers.length <= 4, `${timers.length} timers: ${timers}`);
      const lost = [locks[10], locks[11]];
      const found = lost.map((lock) => aborted(lock.signal));
      for (const lock of lost) unlinkSync(lock.path);
      await Promise.all(found);
      for (const lock of locks) {
        assert.equal(lock.signal.aborted, lost.includes(lock), lock.path);
      }
      for (const lock of locks) {
        if (lost.includes(lock)) {
          await assert.rejects(lock.release(), LockLostError);
        } else await lock.release();
      }
    } finally {
      cleanup();
    }
  });

  test("acquire and release make no AbortController while the signal is never read", async () => {
    const { dir, cleanup } = tempDir();
    const Real = globalThis.AbortController;
    let made = 0;
    globalThis.AbortController = class extends Real {
      constructor() {
        super();
        made++;
      }
    };
    try {
      const lock = await acquire(join(dir, "run.lock"));
      await lock.release();
      assert.equal(made, 0);
    } finally {
      globalThis.AbortController = Real;
      cleanup();
    }
  });

  test("a loss found while the signal was never read is reported by the signal read later, and by release()", async () => {
    const { dir, cleanup } = tempDir();
    try {
      // Both locks start watching and checking in one turn of the shared
      // timer, a before b: the deletion of a's file, then of b's, is found
      // for a first (by the watch, in event order; by the checks, in
      // order), so once b's signal aborts, a's loss is known, unread.
      const a = await acquire(join(dir, "a.lock"), { checkInterval: 20 });
      const b = await acquire(join(dir, "b.lock"), { checkInterval: 20 });
      const bLost = aborted(b.signal);
      unlinkSync(a.path);
      unlinkSync(b.path);
      await bLost;
      const signal = a.signal;
      assert.equal(signal.aborted, true);
      assert.ok(signal.reason instanceof LockLostError, String(signal.reason));
      assert.equal(signal.reason.what, "was deleted");
      await assert.rejects(a.release(), LockLostError);
      assert.equal(a.signal, signal);
      await assert.rejects(b.release(), LockLostError);
    } finally {
      cleanup();
    }
  });
});
