// Which lock a name means, and which locks are this process's own, on the
// PostgreSQL backend, against a real server:
//
// - Each schema is its own namespace of names: `sync/main` in schema
//   `staging` and `sync/main` in schema `prod` are two locks, with two
//   advisory keys. The key of a name in schema `public` (the default) is
//   the one older versions used, SHA-256("runlock\0" + name), so an older
//   holder there still excludes this version; in any other schema it is
//   SHA-256("runlock\0" + schema + "\0" + name).
// - A lock this process holds is refused at once (HeldError,
//   `byThisProcess`) however the URL that took it was spelled (127.0.0.1,
//   localhost, the unix socket) and through whichever copy of the package
//   (the ES module and the CommonJS build in one Node process), instead of
//   waiting on itself; while a holder in another process whose record
//   happens to name our pid and host (another container) is waited for.
//
// "Waits on itself" is seen on the server, not on the clock: a session
// of ours waiting in pg_locks for a key this process holds.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { hostname } from "node:os";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { HeldError, type PgLock, pgLocks } from "../../src/postgres/mod.ts";
import { Child, runtime, waitFor } from "../_helpers.ts";
import {
  type Cluster,
  keyBySql,
  psql,
  psqlSession,
  startCluster,
} from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";

const hasServer = pgTestable({
  needs: "server",
  untested: "the PostgreSQL identity tests are NOT run",
  ciTest: "PostgreSQL is available to the PostgreSQL tests under CI=true",
});

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `identity/${process.pid}-${
    Date.now().toString(36)
  }/${label}/${counter++}`;
}

// Two schemas of this file's own (created on first use by runlock).
const SCHEMA_A = "runlock_identity_staging";
const SCHEMA_B = "runlock_identity_prod";

/** Sessions waiting (not granted) in pg_locks for any of these keys. */
function waiters(url: string, keys: string[]): number {
  return Number(psql(
    url,
    `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
       AND objsubid = 1
       AND ((classid::int8 << 32) | objid::int8)
         = ANY (string_to_array(:'keys', ',')::int8[])`,
    { keys: keys.join(",") },
  ));
}

/** The sessions holding (granted) the advisory lock on `key`. */
function holders(url: string, key: string): string[] {
  const out = psql(
    url,
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = :'key'::int8`,
    { key },
  );
  return out === "" ? [] : out.split("\n");
}

/**
 * Every key `name` has had or may have in `schema`: today's
 * (name only) and the per-schema one. A wait on either is a wait.
 */
function keysOf(url: string, name: string, schema = "public"): string[] {
  return [...new Set([keyBySql(url, name), keyBySql(url, name, schema)])];
}

/**
 * Runs an acquire that must not wait in the server's queue, and returns
 * how it settled. If a session of ours starts waiting for `keys` first, the
 * acquire is aborted and the test fails: it was waiting on a lock this
 * process holds, and would have waited out its timeout (with `Infinity`:
 * forever).
 */
async function withoutWaiting(
  url: string,
  keys: string[],
  acquire: (signal: AbortSignal) => Promise<PgLock>,
  what: string,
): Promise<{ lock?: PgLock; err?: unknown }> {
  const stop = new AbortController();
  let settled = false;
  const outcome = acquire(stop.signal).then(
    (lock) => ({ lock }),
    (err) => ({ err }),
  ).finally(() => settled = true);
  await waitFor(
    () => settled || waiters(url, keys) > 0,
    `${what}: settled, or waiting`,
  );
  if (!settled) {
    stop.abort(new Error("stopped by the test"));
    await outcome;
    assert.fail(
      `${what}: acquire() waits in the server's queue behind a lock this process holds (it would wait out its timeout, with Infinity forever)`,
    );
  }
  return await outcome;
}

/** Asserts a HeldError that says this process holds the lock. */
function assertByThisProcess(err: unknown, name: string): void {
  assert.ok(
    err instanceof Error && err.name === "HeldError",
    `expected HeldError, got ${err}`,
  );
  const held = err as HeldError;
  assert.equal(held.byThisProcess, true, held.message);
  assert.equal(held.pid, process.pid);
  assert.equal(held.path, name);
  assert.match(held.message, /this process \(pid \d+\) already holds it/);
}

/**
 * A psql session that does what a runlock process does when it takes a
 * lock: the advisory lock on `key`, then the record in `schema`'s table
 * naming `pid` and `host` (another version of runlock, or a process in
 * another container with our pid and host name).
 */
async function handHolder(
  url: string,
  schema: string,
  name: string,
  key: string,
  pid: number,
  host: string,
): Promise<{ backend: number; close(): Promise<void> }> {
  const hand = psqlSession(url);
  const lit = (s: string) => `'${s.replaceAll("'", "''")}'`;
  hand.send(
    `SELECT pg_advisory_lock(${key});
     INSERT INTO "${schema}".runlock_locks AS r
       (name, key, fence, pid, host, started, runtime, meta, backend_pid)
     VALUES (${lit(name)}, ${key}, 1, ${pid}, ${
      lit(host)
    }, clock_timestamp(), 'node', '{}', pg_backend_pid())
     ON CONFLICT (name) DO UPDATE SET key = EXCLUDED.key, fence = r.fence + 1,
       pid = EXCLUDED.pid, host = EXCLUDED.host, started = EXCLUDED.started,
       backend_pid = EXCLUDED.backend_pid;
     SELECT 'holding:' || pg_backend_pid();`,
  );
  const line = await hand.until(/holding:\d+/);
  return { backend: Number(line.slice(8)), close: () => hand.close() };
}

/** The same server through another spelling of its address, or undefined. */
function respelled(
  url: string,
  how: "localhost" | "socket",
): string | undefined {
  const u = new URL(url);
  if (how === "localhost") {
    if (u.hostname !== "127.0.0.1") return undefined;
    u.hostname = "localhost";
    return u.href;
  }
  // The unix socket the server listens on (a managed cluster's is in its
  // temp dir): postgres:///db?host=/dir&port=N&user=U.
  const dir = psql(url, "SHOW unix_socket_directories").split(",")[0].trim();
  if (dir === "") return undefined;
  const s = new URL(`postgres://${u.pathname}`);
  s.searchParams.set("host", dir);
  s.searchParams.set("port", u.port || "5432");
  if (u.username) s.searchParams.set("user", decodeURIComponent(u.username));
  if (u.password) {
    s.searchParams.set("password", decodeURIComponent(u.password));
  }
  return s.href;
}

describe(
  "postgres: which lock a name means, and which locks are this process's",
  {
    skip: !hasServer,
  },
  () => {
    let cluster: Cluster;
    let url: string;
    before(async () => {
      cluster = await startCluster();
      url = cluster.url;
      // Both schemas' tables exist, and public's (older versions' home).
      await Promise.all(["public", SCHEMA_A, SCHEMA_B].map(async (schema) => {
        await using locks = pgLocks(url, { schema });
        await (await locks.acquire(unique("warm-up"))).release();
      }));
    });
    after(() => cluster?.stop());

    test("while schema A's holder (another process) holds a name, through schema B it reads free and acquire() takes it at once; each schema's inspect shows its own holder and fence", async () => {
      const name = unique("two-schemas");
      const holder = new Child("pg_child.ts", [
        "hold",
        url,
        name,
        "0",
        JSON.stringify({ schema: SCHEMA_A }),
      ]);
      try {
        const got = await holder.expect("acquired");
        await using a = pgLocks(url, { schema: SCHEMA_A });
        await using b = pgLocks(url, { schema: SCHEMA_B });
        const before = await b.inspect(name);
        assert.equal(
          before.state,
          "free",
          `through schema B: ${before.state} (${before.reason})`,
        );
        assert.equal(before.foreign, false);
        assert.equal(await b.held(name), false);
        const taken = await b.acquire(name).catch((e) => e);
        assert.ok(!(taken instanceof Error), `acquire through B: ${taken}`);
        await using lock = taken as PgLock;
        const inB = await b.inspect(name);
        assert.equal(inB.state, "held");
        assert.equal(inB.pid, process.pid);
        assert.equal(inB.fence, lock.fence);
        const inA = await a.inspect(name);
        assert.equal(inA.state, "held");
        assert.equal(inA.pid, holder.pid);
        assert.equal(inA.fence, BigInt(got.fence as string));
        assert.equal(inA.backendPid, got.backendPid);
        assert.notEqual(inA.backendPid, inB.backendPid);
        await lock.release();
        assert.equal((await a.inspect(name)).state, "held");
      } finally {
        await holder.kill();
      }
    });

    test("in one process, acquire() through schema B with timeout Infinity, while this process holds the name through schema A, returns the lock at once instead of waiting on itself", async () => {
      const name = unique("one-process");
      await using a = pgLocks(url, { schema: SCHEMA_A });
      await using b = pgLocks(url, { schema: SCHEMA_B });
      await using _held = await a.acquire(name);
      const { lock, err } = await withoutWaiting(
        url,
        keysOf(url, name, SCHEMA_B),
        (signal) => b.acquire(name, { timeout: Infinity, signal }),
        "acquire through schema B",
      );
      assert.equal(err, undefined, String(err));
      assert.equal(await lock!.isOwned(), true);
      await lock!.release();
    });

    test('the advisory key of a name is SHA-256("runlock\\0" + name) in schema public, as older versions have it, so an older holder there excludes this version and this version\'s holder excludes it; in another schema it is SHA-256("runlock\\0" + schema + "\\0" + name)', async () => {
      const name = unique("keys");
      const oldKey = keyBySql(url, name);
      assert.equal(keyBySql(url, name, "public"), oldKey);
      const keyA = keyBySql(url, name, SCHEMA_A);
      assert.notEqual(keyA, oldKey);
      await using pub = pgLocks(url);
      await using a = pgLocks(url, { schema: SCHEMA_A });
      // This version's holders, in public and in A: pg_locks shows each key.
      {
        await using inPublic = await pub.acquire(name);
        await using inA = await a.acquire(name);
        const pubBackend = String((await pub.inspect(name)).backendPid);
        const aBackend = String((await a.inspect(name)).backendPid);
        assert.deepEqual(holders(url, oldKey), [pubBackend]);
        assert.deepEqual(holders(url, keyA), [aBackend]);
        // An older runlock on public tries the same key, and is refused.
        assert.equal(
          psql(url, `SELECT pg_try_advisory_lock(:'key'::int8)`, {
            key: oldKey,
          }),
          "f",
        );
        await inPublic.release();
        await inA.release();
      }
      // An older runlock holding the name on public (its key, its record):
      // this version's acquire on public is refused with the holder's pid;
      // schema A's is not its business.
      const other = process.pid + 1;
      const old = await handHolder(url, "public", name, oldKey, other, "elder");
      try {
        const err = await pub.acquire(name).catch((e) => e);
        assert.ok(err instanceof HeldError, String(err));
        assert.equal(err.pid, other);
        assert.equal(err.host, "elder");
        assert.equal(err.byThisProcess, false);
        const info = await pub.inspect(name);
        assert.equal(info.state, "held");
        assert.equal(info.backendPid, old.backend);
        await using inA = await a.acquire(name);
        assert.equal(inA.path, name);
      } finally {
        await old.close();
      }
    });

    for (const how of ["localhost", "socket"] as const) {
      test(
        `a lock held through 127.0.0.1 is refused at once with HeldError (byThisProcess) when this process acquires it through ${
          how === "socket" ? "the unix socket" : "localhost"
        }, with timeout 0 and Infinity; once released, it is taken that way`,
        async () => {
          const other = respelled(url, how);
          if (other === undefined) {
            // A server given by RUNLOCK_TEST_PG_URL on another host (or not
            // on 127.0.0.1): this spelling cannot reach it.
            console.error(`!!! no ${how} spelling of ${url}: not tested !!!`);
            return;
          }
          const name = unique(`spelling-${how}`);
          await using first = pgLocks(url);
          await using second = pgLocks(other);
          const lock = await first.acquire(name);
          const atOnce = await second.acquire(name).catch((e) => e);
          assertByThisProcess(atOnce, name);
          const { err } = await withoutWaiting(
            url,
            keysOf(url, name),
            (signal) => second.acquire(name, { timeout: Infinity, signal }),
            `acquire through ${how}`,
          );
          assertByThisProcess(err, name);
          await lock.release();
          await using again = await second.acquire(name);
          assert.equal(await again.isOwned(), true);
          // And the other way round.
          assertByThisProcess(await first.acquire(name).catch((e) => e), name);
        },
      );
    }

    test("a holder in another session whose record names this process's pid and host (a process in another container) is not taken for this process: acquire() waits for it and gets the lock when it goes", async () => {
      const name = unique("twin");
      const key = keyBySql(url, name);
      await using locks = pgLocks(url);
      const twin = await handHolder(
        url,
        "public",
        name,
        key,
        process.pid,
        hostname(),
      );
      let waiting: Promise<PgLock> | undefined;
      try {
        const err = await locks.acquire(name).catch((e) => e);
        assert.ok(err instanceof HeldError, String(err));
        assert.equal(err.byThisProcess, false, err.message);
        assert.equal(err.pid, process.pid);
        waiting = locks.acquire(name, { timeout: Infinity });
        waiting.catch(() => {});
        await waitFor(
          () => waiters(url, [key]) > 0,
          "acquire() waiting behind the twin",
        );
      } finally {
        await twin.close();
      }
      await using lock = await waiting!;
      assert.equal(await lock.isOwned(), true);
    });

    test(
      "the ES module and CommonJS copies of runlock/postgres in one process: a lock held through either is refused at once with HeldError (byThisProcess) by the other, and is taken by it once released",
      {
        // Only the npm package has two copies (tests-esm on Node and Bun).
        skip: runtime === "deno",
      },
      async () => {
        const spec = "runlock/postgres";
        const esm = await import(spec);
        const cjs = createRequire(import.meta.url)(spec);
        assert.notEqual(esm.pgLocks, cjs.pgLocks, "two copies of the package");
        const name = unique("copies");
        const viaEsm = esm.pgLocks(url);
        const viaCjs = cjs.pgLocks(url);
        try {
          for (
            const [holding, asking] of [[viaEsm, viaCjs], [viaCjs, viaEsm]]
          ) {
            const lock: PgLock = await holding.acquire(name);
            const atOnce = await asking.acquire(name).catch((e: unknown) => e);
            assertByThisProcess(atOnce, name);
            const { err } = await withoutWaiting(
              url,
              keysOf(url, name),
              (signal) => asking.acquire(name, { timeout: Infinity, signal }),
              "acquire through the other copy",
            );
            assertByThisProcess(err, name);
            await lock.release();
            const next: PgLock = await asking.acquire(name);
            await next.release();
          }
        } finally {
          await viaEsm.end();
          await viaCjs.end();
        }
      },
    );
  },
);
