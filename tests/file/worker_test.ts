// A lock taken in a Worker that is terminated while it holds it: the
// Worker's files are closed with it, so the kernel drops the flock and the
// process (or any other) can take the lock at once. And waiters in worker
// threads leave libuv's pool to the process's file reads. Real Workers of
// the runtime under test.
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";
import { Worker as ThreadWorker } from "node:worker_threads";
import { acquire, held } from "../../mod.ts";
import { delay, holder, runtime, tempDir, waitFor } from "../_helpers.ts";

/** tests/fixtures/worker_thread (.ts here, .js in the npm build's tests). */
const threadFixture = new URL(
  `../fixtures/worker_thread${import.meta.url.endsWith(".ts") ? ".ts" : ".js"}`,
  import.meta.url,
);

/** A worker_threads worker running the fixture; its messages in order. */
/**
 * Waits until no process holds `path` (a thread's descriptors close a
 * while after it ends on a busy machine), then takes it without waiting.
 */
async function takesOnceFree(path: string): Promise<void> {
  await waitFor(async () => !(await held(path)), "the lock freed");
  const lock = await acquire(path, { timeout: 0 });
  assert.equal(lock.isOwned(), true);
  await lock.release();
}

function thread(path: string, wait: boolean) {
  const worker = new ThreadWorker(threadFixture, {
    workerData: { path, wait },
  });
  const said: string[] = [];
  const waiters: (() => void)[] = [];
  worker.on("message", (m: string) => {
    said.push(m);
    waiters.splice(0).forEach((w) => w());
  });
  worker.on("error", (err) => {
    said.push(`error: ${err}`);
    waiters.splice(0).forEach((w) => w());
  });
  const says = async (what: string) => {
    while (!said.includes(what)) {
      if (said.some((m) => m.startsWith("error"))) assert.fail(said.join());
      await new Promise<void>((r) => waiters.push(r));
    }
  };
  /** "held", or the error that ended the worker's acquire. */
  const outcome = async () => {
    await new Promise<void>((resolve) => {
      const look = () =>
        said.some((m) => m === "held" || m.startsWith("error"))
          ? resolve()
          : waiters.push(look);
      look();
    });
    return said.find((m) => m === "held" || m.startsWith("error"))!;
  };
  return { worker, says, outcome };
}

declare const Worker: new (
  url: string,
  options: { type: "module" },
) => {
  onmessage: ((e: { data: unknown }) => void) | null;
  postMessage(message: unknown): void;
  terminate(): void;
};

describe("a Worker terminated while it holds a lock", () => {
  test(
    "its lock is free once the Worker has ended: the main thread takes it at once",
    {
      // Web Workers: Node has none (its worker threads are tested
      // below), and Bun's keep every descriptor they opened.
      skip: runtime !== "deno",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      try {
        const worker = new Worker(
          new URL("../fixtures/worker_holder.ts", import.meta.url).href,
          { type: "module" },
        );
        await new Promise<void>((resolve) => {
          worker.onmessage = () => resolve();
          worker.postMessage(path);
        });
        assert.equal(await held(path), true);
        worker.terminate();
        // The Worker's resources are closed as it ends, soon after
        // terminate() returns (on a busy machine, a while after): until
        // then this process holds the lock, and an acquire would fail at
        // once (not reentrant). Once it is free, the acquire takes it.
        await takesOnceFree(path);
      } finally {
        cleanup();
      }
    },
  );
});

describe("node:worker_threads", () => {
  test(
    "a worker thread terminated while it holds a lock leaves it free: the main thread takes it at once",
    {
      // Bun's Workers keep every descriptor they opened when they are
      // terminated (PROTOCOL.md, "Where it does not hold").
      skip: runtime === "bun",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      try {
        const { worker, says } = thread(path, false);
        await says("held");
        assert.equal(await held(path), true);
        await worker.terminate();
        await takesOnceFree(path);
      } finally {
        cleanup();
      }
    },
  );

  test(
    "waiters in four worker threads leave libuv's pool free: the main thread's file reads are served while they wait, and one of them gets the lock once it is free",
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const other = await holder(path);
      const threads = [0, 1, 2, 3].map(() => thread(path, true));
      try {
        await Promise.all(threads.map((t) => t.says("waiting")));
        // Four reads at once need four pool threads (libuv's default).
        // Were each worker's wait to keep one in poll(2) (up to 30 s a
        // wait), they would come only after it: 10 s is far beyond a
        // read of a few bytes, however busy the machine.
        const reads = Promise.all(
          [0, 1, 2, 3].map(() => readFile(join(dir, "run.lock"))),
        );
        const outcome = await Promise.race([
          reads.then(() => "read"),
          delay(10_000).then(() => "the pool is taken"),
        ]);
        assert.equal(outcome, "read");
        other.send("release");
        await other.expect("released");
        // One of them gets it. (The others, in the process that now holds
        // it, are refused: runlock locks are not reentrant.)
        const outcomes = threads.map((t) => t.outcome());
        await new Promise<void>((resolve, reject) => {
          let refused = 0;
          for (const o of outcomes) {
            o.then((what) =>
              what === "held"
                ? resolve()
                : ++refused === threads.length
                ? reject(new Error(what))
                : undefined
            );
          }
        });
      } finally {
        await Promise.all(threads.map((t) => t.worker.terminate()));
        await other.kill();
        cleanup();
      }
    },
  );
});
