// One contract, two backends: the behaviours a file lock and a PostgreSQL
// lock share, written once and run against each (filelock's lesson: a
// suite per backend lets them drift). Each backend is an adapter over its
// public API and its child fixture (tests/fixtures/child.ts for files,
// tests/fixtures/pg_child.ts for PostgreSQL), which print the same events.
import assert from "node:assert/strict";
import { hostname } from "node:os";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import * as files from "../mod.ts";
import { HeldError, type PgLocks, pgLocks } from "../src/postgres/mod.ts";
import { Child, tempDir, waitFor } from "./_helpers.ts";
import {
  advisoryWaiters,
  type Cluster,
  startCluster,
} from "./fixtures/pg_cluster.ts";
import { pgServerAvailable } from "./fixtures/pg_available.ts";
import {
  type Pooler,
  poolersAvailable,
  startPgBouncer,
} from "./fixtures/pg_poolers.ts";

/** What both backends' locks have. */
interface AnyLock extends AsyncDisposable {
  readonly path: string;
  readonly pid: number;
  readonly acquiredAt: Date;
  readonly released: boolean;
  isOwned(): boolean | Promise<boolean>;
  release(): Promise<void>;
}

interface Inspected {
  state: string;
  pid: number;
  host: string;
  started: Date | undefined;
}

/** A backend under test, through its public API. */
interface Backend {
  label: string;
  start(): Promise<void>;
  stop(): Promise<void>;
  /** A fresh lock name (a path for files). */
  fresh(): string;
  acquire(
    name: string,
    options?: { timeout?: number; signal?: AbortSignal },
  ): Promise<AnyLock>;
  inspect(name: string): Promise<Inspected>;
  held(name: string): Promise<boolean>;
  activePid(name: string): Promise<{ pid: number; alive: boolean }>;
  /** A child process of this runtime that takes the lock: "hold" or "try". */
  child(mode: "hold" | "try", name: string, timeout?: number): Child;
  /** Resolves once an acquire this process began is waiting for `name`. */
  waiting(name: string): Promise<void>;
}

function fileBackend(): Backend {
  let dir = "";
  let cleanup = () => {};
  let n = 0;
  return {
    label: "file",
    start() {
      ({ dir, cleanup } = tempDir());
      return Promise.resolve();
    },
    stop() {
      cleanup();
      return Promise.resolve();
    },
    fresh: () => `${dir}/lock-${n++}.lock`,
    acquire: (name, options) => files.acquire(name, options),
    inspect: (name) => files.inspect(name),
    held: (name) => files.held(name),
    activePid: (name) => files.activePid(name),
    child: (mode, name, timeout) =>
      new Child("child.ts", [
        mode,
        name,
        ...(timeout ? [String(timeout)] : []),
      ]),
    // acquire() makes its first attempt before it returns: a refused one
    // is waiting by then.
    waiting: () => Promise.resolve(),
  };
}

/**
 * PostgreSQL, reached directly or, with `pooled`, through PgBouncer in
 * session mode with its default settings (which refuse the startup
 * packet's `options`).
 */
function pgBackend(pooled = false): Backend {
  let cluster: Cluster;
  let bouncer: Pooler | undefined;
  let url = "";
  let locks: PgLocks;
  let n = 0;
  return {
    label: pooled ? "postgres through PgBouncer, session mode" : "postgres",
    async start() {
      cluster = await startCluster();
      url = cluster.url;
      if (pooled) {
        bouncer = await startPgBouncer({
          backend: { host: cluster.host, port: cluster.port },
          mode: "session",
        });
        url = bouncer.url;
      }
      locks = pgLocks(url);
    },
    async stop() {
      await locks?.end();
      await bouncer?.stop();
      cluster?.stop();
    },
    fresh: () => `contract/${process.pid}-${Date.now().toString(36)}/${n++}`,
    acquire: (name, options) => locks.acquire(name, options),
    inspect: (name) => locks.inspect(name),
    held: (name) => locks.held(name),
    activePid: (name) => locks.activePid(name),
    child: (mode, name, timeout) =>
      new Child("pg_child.ts", [
        mode,
        url,
        name,
        ...(timeout ? [String(timeout)] : []),
      ]),
    // The server shows the wait: a session waiting for this name's key.
    waiting: (name) =>
      waitFor(
        () => advisoryWaiters(cluster.url, name) > 0,
        `a session waiting for the lock of ${name}`,
      ),
  };
}

const hasPg = pgServerAvailable;

const noBouncer = poolersAvailable(["pgbouncer"]);
if (noBouncer !== undefined) {
  // CI installs PgBouncer (.ci/run): there, its absence is a failure.
  if (process.env.CI === "true") throw new Error(`no PgBouncer: ${noBouncer}`);
  console.error(`contract through PgBouncer skipped: ${noBouncer}`);
}

for (
  const backend of [fileBackend(), pgBackend(), pgBackend(true)]
) {
  const skip = backend.label.startsWith("postgres") &&
    (!hasPg || (backend.label !== "postgres" && noBouncer !== undefined));
  describe(`contract (${backend.label})`, { skip }, () => {
    before(() => backend.start());
    after(() => backend.stop());

    test("acquire() holds the lock: held, activePid and inspect name this process until release(), which is idempotent", async () => {
      const name = backend.fresh();
      assert.deepEqual(await backend.activePid(name), { pid: 0, alive: false });
      assert.equal((await backend.inspect(name)).state, "free");
      const lock = await backend.acquire(name);
      assert.equal(lock.path, name);
      assert.equal(lock.pid, process.pid);
      assert.ok(lock.acquiredAt instanceof Date);
      assert.equal(await lock.isOwned(), true);
      assert.equal(await backend.held(name), true);
      assert.deepEqual(await backend.activePid(name), {
        pid: process.pid,
        alive: true,
      });
      const info = await backend.inspect(name);
      assert.equal(info.state, "held");
      assert.equal(info.pid, process.pid);
      assert.equal(info.host, hostname());
      assert.ok(info.started instanceof Date);
      await lock.release();
      assert.equal(lock.released, true);
      assert.equal(await lock.isOwned(), false);
      await lock.release();
      assert.equal(await backend.held(name), false);
      assert.equal((await backend.inspect(name)).state, "free");
    });

    test("another process gets HeldError with the holder's pid and host; after the holder's SIGKILL the lock reads stale and the next acquire takes it", async () => {
      const name = backend.fresh();
      const holder = backend.child("hold", name);
      try {
        await holder.expect("acquired");
        const refused = await backend.child("try", name).expect("held");
        assert.equal(refused.holder, holder.pid);
        assert.equal(refused.host, hostname());
        const err = await backend.acquire(name).catch((e) => e);
        assert.ok(err instanceof HeldError, String(err));
        assert.equal(err.pid, holder.pid);
        await holder.kill("SIGKILL");
        // PostgreSQL ends the session once it reads the EOF.
        let info = await backend.inspect(name);
        await waitFor(
          async () => (info = await backend.inspect(name)).state !== "held",
          "the killed holder's lock let go",
        );
        assert.equal(info.state, "stale");
        assert.equal(info.pid, holder.pid);
        assert.deepEqual(await backend.activePid(name), {
          pid: holder.pid,
          alive: false,
        });
        await using lock = await backend.acquire(name);
        assert.equal(lock.pid, process.pid);
      } finally {
        await holder.kill();
      }
    });

    test("locks are not reentrant: acquiring a lock this process holds fails with HeldError (byThisProcess) without waiting out its timeout", async () => {
      const name = backend.fresh();
      await using lock = await backend.acquire(name);
      const t0 = performance.now();
      const err = await backend.acquire(name, { timeout: 60_000 }).catch((e) =>
        e
      );
      assert.ok(err instanceof HeldError, String(err));
      assert.equal(err.byThisProcess, true);
      assert.equal(err.pid, process.pid);
      assert.ok(
        performance.now() - t0 < 60_000,
        "it did not wait out its timeout",
      );
      await lock.release();
      await using again = await backend.acquire(name);
      assert.equal(again.pid, process.pid);
    });

    test("await using releases at the end of the block", async () => {
      const name = backend.fresh();
      {
        await using _lock = await backend.acquire(name);
        assert.equal(await backend.held(name), true);
      }
      assert.equal(await backend.held(name), false);
    });

    test("acquire() with a timeout waits for the holder's release, and fails with HeldError when it does not come", async () => {
      const name = backend.fresh();
      const holder = backend.child("hold", name);
      try {
        await holder.expect("acquired");
        const t0 = performance.now();
        const err = await backend.acquire(name, { timeout: 200 }).catch((e) =>
          e
        );
        assert.ok(err instanceof HeldError, String(err));
        assert.ok(performance.now() - t0 >= 190);
        const waiting = backend.acquire(name, { timeout: 60_000 });
        await backend.waiting(name);
        holder.send("release");
        await holder.expect("released");
        await using lock = await waiting;
        assert.equal(lock.pid, process.pid);
      } finally {
        await holder.kill();
      }
    });

    test("an AbortSignal stops the wait with its reason; an aborted signal fails at once", async () => {
      const name = backend.fresh();
      const holder = backend.child("hold", name);
      try {
        await holder.expect("acquired");
        const reason = new Error("stop");
        const controller = new AbortController();
        const waiting = backend.acquire(name, {
          timeout: Infinity,
          signal: controller.signal,
        });
        await backend.waiting(name);
        controller.abort(reason);
        await assert.rejects(waiting, (e) => e === reason);
        await assert.rejects(
          backend.acquire(name, { signal: AbortSignal.abort(reason) }),
          (e) => e === reason,
        );
        assert.equal(await backend.held(name), true);
      } finally {
        await holder.kill();
      }
    });

    test("a negative timeout is a RangeError and an empty name a TypeError, before anything is opened", async () => {
      await assert.rejects(
        backend.acquire(backend.fresh(), { timeout: -1 }),
        RangeError,
      );
      await assert.rejects(backend.acquire(""), TypeError);
    });
  });
}
