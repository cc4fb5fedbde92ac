// A process does not hold a lock it has not taken (a plain pidfile naming
// our own PID is stale), and a lock it has taken is not taken twice (locks
// are not reentrant: the second acquire fails at once, saying so).
import assert from "node:assert/strict";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
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
} from "../../mod.ts";
import { Worker } from "node:worker_threads";
import { countingTimers, tempDir } from "../_helpers.ts";

describe("a plain pidfile naming this process's own pid", () => {
  test("is stale: probes say so and acquire takes it over at once, even with timeout Infinity", async () => {
    const { dir, cleanup } = tempDir();
    try {
      // A container's service is PID 1 on every boot: the pidfile it left
      // last time names the PID it has now.
      const path = join(dir, "service.pid");
      writeFileSync(path, `${process.pid}\n`);
      const info = await inspect(path);
      assert.equal(info.state, "stale");
      assert.equal(info.foreign, true);
      assert.equal(await held(path), false);
      assert.deepEqual(await activePid(path), {
        pid: process.pid,
        alive: false,
      });
      const lock = await acquire(path, { timeout: Infinity });
      assert.equal((await inspect(path)).state, "held");
      await lock.release();
      writeFileSync(path, `${process.pid}\n`);
      acquireSync(path, { timeout: Infinity }).releaseSync();
    } finally {
      cleanup();
    }
  });
});

function bySelf(since: Date) {
  return (err: unknown) => {
    assert.ok(err instanceof HeldError, String(err));
    assert.equal(err.byThisProcess, true);
    assert.equal(err.pid, process.pid);
    assert.equal(err.started?.getTime(), since.getTime());
    assert.match(
      err.message,
      new RegExp(
        `this process \\(pid ${process.pid}\\) already holds it since ${since.toISOString()}; runlock locks are not reentrant`,
      ),
    );
    return true;
  };
}

describe("acquiring a lock this process already holds", () => {
  test("fails at once with HeldError saying this very process holds it, since when (async and sync, even with timeout Infinity)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path);
      // At once: the async one sets no timer to poll again (a wait would),
      // and the sync one returns before its timeout could have run out.
      const { timers } = await countingTimers(() =>
        assert.rejects(
          acquire(path, { timeout: Infinity }),
          bySelf(lock.acquiredAt),
        )
      );
      assert.deepEqual(timers, [], "no poll: it did not wait");
      const started = performance.now();
      assert.throws(
        () => acquireSync(path, { timeout: 60_000 }),
        bySelf(lock.acquiredAt),
      );
      assert.ok(
        performance.now() - started < 60_000,
        "it did not wait out its timeout",
      );
      assert.equal(lock.isOwned(), true, "the held lock is untouched");
      await lock.release();
      const again = await acquire(path);
      await again.release();
    } finally {
      cleanup();
    }
  });

  test("is recognised through another path to the same file (relative, symlinked directory)", async () => {
    const { dir, cleanup } = tempDir();
    const cwd = process.cwd();
    try {
      mkdirSync(join(dir, "state"));
      symlinkSync(join(dir, "state"), join(dir, "link"));
      await using lock = await acquire(join(dir, "state", "run.lock"));
      await assert.rejects(
        acquire(join(dir, "link", "run.lock"), { timeout: 5_000 }),
        bySelf(lock.acquiredAt),
      );
      process.chdir(join(dir, "state"));
      assert.throws(() => acquireSync("run.lock"), bySelf(lock.acquiredAt));
    } finally {
      process.chdir(cwd);
      cleanup();
    }
  });
});

describe("another copy of runlock in the same process", () => {
  test("a worker thread acquiring a lock its process holds fails at once as held by this process, even with timeout Infinity", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      await using lock = await acquire(path);
      const ext = import.meta.url.endsWith(".ts") ? ".ts" : ".js";
      const worker = new Worker(
        new URL(`../fixtures/reentry_worker${ext}`, import.meta.url),
        { workerData: { path, timeout: Infinity } },
      );
      try {
        const answer = await new Promise<Record<string, unknown>>(
          (resolve, reject) => {
            worker.once("message", resolve);
            worker.once("error", reject);
          },
        );
        assert.equal(answer.event, "held", JSON.stringify(answer));
        assert.equal(answer.byThisProcess, true);
        assert.equal(answer.pid, process.pid);
        assert.match(
          String(answer.message),
          /this process \(pid \d+\) already holds it/,
        );
        assert.equal(lock.isOwned(), true);
      } finally {
        await worker.terminate();
      }
    } finally {
      cleanup();
    }
  });
});
