// What PgBouncer's settings do to server sessions, seen through runlock:
// in session mode, with or without server_reset_query, one client after
// another gets the lock (a lock session stays in a transaction, and
// PgBouncer drops a server session its client left in one), and a
// SIGKILLed holder's lock is free at once; through a transaction pooler,
// where acquires are refused, probes still read who holds a lock. Needs PostgreSQL's binaries and PgBouncer
// (skipped with the reason otherwise; under CI=true a missing PgBouncer
// fails).
import assert from "node:assert/strict";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { HeldError, pgLocks, PoolerError } from "../../src/postgres/mod.ts";
import { Child } from "../_helpers.ts";
import { type Cluster, startCluster } from "../fixtures/pg_cluster.ts";
import { pgBinariesAvailable } from "../fixtures/pg_available.ts";
import {
  type Pooler,
  poolersAvailable,
  startPgBouncer,
} from "../fixtures/pg_poolers.ts";

const why = !pgBinariesAvailable
  ? "no PostgreSQL binaries"
  : poolersAvailable(["pgbouncer"]);
if (why !== undefined) {
  if (process.env.CI === "true") throw new Error(`cannot run: ${why}`);
  console.error(`PgBouncer session tests skipped: ${why}`);
}

describe("PgBouncer's server sessions", { skip: why !== undefined }, () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster();
  });
  after(() => cluster?.stop());
  let n = 0;
  const fresh = () => `pooled/${process.pid}-${Date.now().toString(36)}/${n++}`;
  const bouncer = (mode: "session" | "transaction", extra: string[] = []) =>
    startPgBouncer({
      backend: { host: cluster.host, port: cluster.port },
      mode,
      // One server session: each client gets the one the last one had.
      extra: ["default_pool_size = 1", ...extra],
    });

  /** Two clients, one after the other, through `pooler`: their fences. */
  async function oneAfterTheOther(pooler: Pooler, name: string) {
    const outcomes: string[] = [];
    for (let i = 0; i < 2; i++) {
      const locks = pgLocks(pooler.url, { maxIdleSessions: 0 });
      try {
        const lock = await locks.acquire(name);
        outcomes.push(`fence ${lock.fence}`);
        await lock.release();
      } catch (err) {
        outcomes.push(err instanceof PoolerError ? "refused" : String(err));
        if (!(err instanceof PoolerError)) throw err;
        assert.match(
          (err as Error).message,
          /already bound to another runlock client/,
        );
      } finally {
        // The client's connections end: the pooler keeps the server session.
        await locks.end();
      }
    }
    return outcomes;
  }

  test("in session mode with its default server_reset_query, each client after another gets the lock on the same server session", async () => {
    await using pooler = await bouncer("session");
    assert.deepEqual(await oneAfterTheOther(pooler, fresh()), [
      "fence 1",
      "fence 2",
    ]);
  });

  test("in session mode with server_reset_query empty, each client after another gets the lock: a lock session leaves its server session in a transaction, which PgBouncer drops with its client instead of handing it on", async () => {
    await using pooler = await bouncer("session", ["server_reset_query ="]);
    assert.deepEqual(await oneAfterTheOther(pooler, fresh()), [
      "fence 1",
      "fence 2",
    ]);
  });

  test("in session mode with server_reset_query empty, a SIGKILLed holder's lock is free at once: PgBouncer drops the server session its client left in a transaction", async () => {
    // Room for the holder's probe session beside its lock session.
    await using pooler = await bouncer("session", [
      "server_reset_query =",
      "default_pool_size = 4",
    ]);
    const name = fresh();
    const holder = new Child("pg_child.ts", ["hold", pooler.url, name]);
    try {
      const acquired = await holder.next();
      assert.equal(acquired.event, "acquired", JSON.stringify(acquired));
      await using direct = pgLocks(cluster.url);
      await assert.rejects(direct.acquire(name), HeldError);
      await holder.kill("SIGKILL");
      // Without this, PgBouncer would keep the lock's server session, and
      // the lock, until its server_idle_timeout (600 s): the wait would
      // end with HeldError.
      const lock = await direct.acquire(name, { timeout: 30_000 });
      assert.ok(lock.fence > BigInt(acquired.fence as string));
      await lock.release();
    } finally {
      await holder.kill();
    }
  });

  test("through a transaction-mode pooler acquires are refused, but inspect, held and scan read a lock held on a direct connection", async () => {
    await using pooler = await bouncer("transaction", [
      "ignore_startup_parameters = extra_float_digits,options",
    ]);
    const name = fresh();
    await using direct = pgLocks(cluster.url);
    await using lock = await direct.acquire(name, { meta: { cmd: "sync" } });
    await using pooled = pgLocks(pooler.url);
    await assert.rejects(pooled.acquire(fresh()), PoolerError);
    const info = await pooled.inspect(name);
    assert.equal(info.state, "held");
    assert.equal(info.pid, process.pid);
    assert.equal(info.fence, lock.fence);
    assert.deepEqual(info.meta, { cmd: "sync" });
    assert.equal(await pooled.held(name), true);
    assert.deepEqual(
      (await pooled.scan({ prefix: name })).map((i) => i.path),
      [name],
    );
  });
});
