// A waiter whose session ends while the server is not quite back (see
// docs/postgres.md, "Waiting through a restart or a failover"): it
// connects again, whatever each reconnection meets meanwhile, until its
// own deadline; here a server that accepts connections too slowly to
// answer within connectTimeout (pre_auth_delay), one with no free
// connection (max_connections reached: 53300), and one that is down
// (connections refused) for longer than connectTimeout.
//
// Against a cluster of this file's own (it changes the server's settings
// and stops it), with a real server and real connections. The waiter runs
// in this process and reaches the server through a proxy that records
// each connection (fixtures/pg_count_proxy.ts): its failed reconnections
// are the events the tests wait for, and what the server said on each is
// what they check it met. Sessions are told apart by application_name.
import assert from "node:assert/strict";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { type PgLock, pgLocks } from "../../src/postgres/mod.ts";
import { Child, waitFor } from "../_helpers.ts";
import {
  type Cluster,
  psqlSession,
  startCluster,
} from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";
import {
  type Connection,
  type CountingProxy,
  countingProxy,
} from "../fixtures/pg_count_proxy.ts";
import { halt } from "../fixtures/pg_halt.ts";

const canStart = pgTestable({
  needs: "binaries",
  untested:
    "the reconnect tests, which start a cluster of their own, are NOT run",
});

/** The server's connection slots: few, so that a test can fill them. */
const MAX_CONNECTIONS = 12;

/**
 * The waiter's options: a short connectTimeout, so that a slow server
 * fails a reconnection within seconds, and a heartbeat scaled to it
 * (interval + timeout below the server's earliest detection of a dead
 * client, min(keepalivesIdle, tcpUserTimeout): 10 s by default).
 */
const WAITER = {
  connectTimeout: 2_000,
  heartbeatInterval: 500,
  heartbeatTimeout: 1_000,
};

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `reconnect/${process.pid}-${
    Date.now().toString(36)
  }/${label}/${counter++}`;
}

/** An application_name no other session uses (at most 63 bytes). */
function appName(label: string): string {
  return `rlr-${process.pid}-${counter++}-${label}`;
}

/** `url` with the sessions it opens named `app` in pg_stat_activity. */
function withApp(url: string, app: string): string {
  const u = new URL(url);
  u.searchParams.set("application_name", app);
  return u.href;
}

/**
 * A psql session opened now and kept: SQL for the moments when a new
 * connection would be slow (pre_auth_delay) or refused (no free slot).
 * `query` returns psql's unaligned output.
 */
function adminSession(url: string) {
  const session = psqlSession(url);
  let n = 0;
  return {
    async query(sql: string): Promise<string> {
      const mark = `query-done-${n++}`;
      session.output.length = 0;
      session.send(`${sql};\nSELECT '${mark}';`);
      const text = await session.until(new RegExp(`[\\s\\S]*${mark}\\n`));
      return text.slice(0, text.lastIndexOf(mark)).trim();
    },
    close: () => session.close(),
  };
}
type Admin = ReturnType<typeof adminSession>;

/** Advisory locks the sessions named `app` wait for (ungranted), any key. */
async function waiting(admin: Admin, app: string): Promise<number> {
  return Number(
    await admin.query(
      `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
         WHERE l.locktype = 'advisory' AND NOT l.granted
           AND a.application_name = '${app}'`,
    ),
  );
}

/** Ends every server session named `app`; resolves once they are gone. */
async function terminate(admin: Admin, app: string): Promise<void> {
  // The sessions are picked first (MATERIALIZED): in one WHERE clause the
  // server may call pg_terminate_backend before it compares the name, and
  // end every session.
  const ended = await admin.query(
    `WITH s AS MATERIALIZED (
       SELECT pid FROM pg_stat_activity WHERE application_name = '${app}'
     ) SELECT count(*) FROM s WHERE pg_terminate_backend(s.pid)`,
  );
  assert.ok(Number(ended) >= 1, `no session of ${app} to terminate`);
  await waitFor(
    async () =>
      await admin.query(
        `SELECT count(*) FROM pg_stat_activity WHERE application_name = '${app}'`,
      ) === "0",
    `the sessions of ${app} are gone`,
  );
}

/**
 * Sets a server setting (ALTER SYSTEM; `value` in the setting's unit, as
 * pg_settings shows it), or resets it, and waits until it is in force.
 */
async function setSystem(
  admin: Admin,
  name: string,
  value: string | undefined,
): Promise<void> {
  await admin.query(
    value === undefined
      ? `ALTER SYSTEM RESET ${name}`
      : `ALTER SYSTEM SET ${name} = '${value}'`,
  );
  await admin.query("SELECT pg_reload_conf()");
  // The postmaster rereads the file, then signals every backend to: once
  // this one has the value, the postmaster (and so every new
  // connection) has it too.
  const want = value ?? await admin.query(
    `SELECT boot_val FROM pg_settings WHERE name = '${name}'`,
  );
  await waitFor(
    async () =>
      await admin.query(
        `SELECT setting FROM pg_settings WHERE name = '${name}'`,
      ) === want,
    `${name} = ${want} in force`,
  );
}

/**
 * Waits for `condition` while `acquiring` (a waiter's acquire) must stay
 * pending: it settling first, with the lock or an error, ends the wait
 * and fails it with what it settled with.
 */
async function whileWaiting(
  acquiring: Promise<PgLock>,
  condition: () => boolean | Promise<boolean>,
  what: string,
): Promise<void> {
  let settled: { lock: PgLock } | { err: unknown } | undefined;
  acquiring.then((lock) => settled = { lock }, (err) => settled = { err });
  await waitFor(
    async () => settled !== undefined || await condition(),
    what,
    60_000,
  );
  if (settled === undefined) return;
  if ("err" in settled) throw settled.err;
  throw new Error(
    `the waiter took the lock (fence ${settled.lock.fence}) before ${what}`,
  );
}

/** A child process holding `name` (fixtures/pg_child.ts), and its fence. */
async function holder(
  url: string,
  name: string,
): Promise<{ child: Child; fence: bigint }> {
  const child = new Child("pg_child.ts", ["hold", url, name]);
  try {
    const got = await child.expect("acquired");
    return { child, fence: BigInt(got.fence as string) };
  } catch (err) {
    await child.kill();
    throw err;
  }
}

/** The connections opened through `proxy` from index `from` on that have closed. */
function failedSince(proxy: CountingProxy, from: number): Connection[] {
  return proxy.connections.slice(from).filter((c) => c.closed);
}

describe("postgres reconnection", { skip: !canStart }, () => {
  let cluster: Cluster;
  let url: string;
  before(async () => {
    // Its own cluster even when RUNLOCK_TEST_PG_URL is set: it changes
    // the server's settings and stops it. Without reserved slots, every
    // slot can be filled by hand.
    cluster = await startCluster({
      own: true,
      conf: [
        `max_connections = ${MAX_CONNECTIONS}`,
        "superuser_reserved_connections = 0",
      ],
    });
    url = cluster.url;
  });
  after(() => cluster?.stop());

  test("a waiter whose reconnections time out (the server is slow to accept them: pre_auth_delay) keeps trying while it has time, then waits again and takes the lock with a higher fence once the holder releases", async () => {
    const name = unique("slow");
    const app = appName("slow");
    const admin = adminSession(url);
    const proxy = await countingProxy(url);
    const controller = new AbortController();
    await using waiterLocks = pgLocks(withApp(proxy.url, app), WAITER);
    let held: Awaited<ReturnType<typeof holder>> | undefined;
    try {
      held = await holder(url, name);
      const acquiring = waiterLocks.acquire(name, {
        timeout: 60_000,
        signal: controller.signal,
      });
      acquiring.catch(() => {}); // awaited below, or aborted on failure
      await whileWaiting(
        acquiring,
        async () => await waiting(admin, app) > 0,
        "the waiter waits for the lock",
      );
      // Every new connection now waits 3 s (pre_auth_delay is in seconds)
      // before the server authenticates it:
      // longer than the waiter's connectTimeout (2 s).
      await setSystem(admin, "pre_auth_delay", "3");
      const from = proxy.connections.length;
      await terminate(admin, app);
      await whileWaiting(
        acquiring,
        () => failedSince(proxy, from).length >= 2,
        "two of the waiter's reconnections failed",
      );
      for (const c of failedSince(proxy, from)) {
        assert.equal(c.said, "", "a failed reconnection got no answer");
      }
      await setSystem(admin, "pre_auth_delay", undefined);
      await whileWaiting(
        acquiring,
        async () => await waiting(admin, app) > 0,
        "the waiter waits for the lock again",
      );
      held.child.send("release");
      await held.child.expect("released");
      await using lock = await acquiring;
      assert.ok(
        lock.fence > held.fence,
        `the waiter's fence ${lock.fence} must be above the holder's ${held.fence}`,
      );
      console.log(
        `slow server: ${
          failedSince(proxy, from).length
        } reconnections failed before the server was quick again`,
      );
    } finally {
      controller.abort();
      await held?.child.kill();
      await setSystem(admin, "pre_auth_delay", undefined);
      await admin.close();
      await proxy.close();
    }
  });

  test("a waiter whose reconnections meet a full server (max_connections reached: 53300 too many clients) keeps trying until a slot frees, then waits again and takes the lock with a higher fence once the holder releases", async () => {
    const name = unique("full");
    const app = appName("full");
    const admin = adminSession(url);
    const proxy = await countingProxy(url);
    const controller = new AbortController();
    const fillers: ReturnType<typeof psqlSession>[] = [];
    await using waiterLocks = pgLocks(withApp(proxy.url, app), WAITER);
    let held: Awaited<ReturnType<typeof holder>> | undefined;
    try {
      held = await holder(url, name);
      const acquiring = waiterLocks.acquire(name, {
        timeout: 60_000,
        signal: controller.signal,
      });
      acquiring.catch(() => {}); // awaited below, or aborted on failure
      await whileWaiting(
        acquiring,
        async () => await waiting(admin, app) > 0,
        "the waiter waits for the lock",
      );
      // The waiter's reconnection is held at the proxy while the slots its
      // sessions had are taken: it then meets a full server, with no race
      // between it and the fillers.
      proxy.park();
      const from = proxy.connections.length;
      await terminate(admin, app);
      const free = async () =>
        Number(
          await admin.query(
            `SELECT current_setting('max_connections')::int - count(*)
               FROM pg_stat_activity WHERE backend_type = 'client backend'`,
          ),
        );
      for (let n = await free(); n > 0; n--) {
        const filler = psqlSession(url);
        fillers.push(filler);
        filler.send("SELECT 'filler-in';");
        await filler.until(/filler-in/);
      }
      assert.equal(await free(), 0, "every connection slot is taken");
      proxy.open();
      await whileWaiting(
        acquiring,
        () => failedSince(proxy, from).length >= 2,
        "two of the waiter's reconnections failed",
      );
      for (const c of failedSince(proxy, from)) {
        assert.match(c.said, /C53300/, "a failed reconnection got 53300");
      }
      for (const filler of fillers.splice(0)) await filler.close();
      await whileWaiting(
        acquiring,
        async () => await waiting(admin, app) > 0,
        "the waiter waits for the lock again",
      );
      held.child.send("release");
      await held.child.expect("released");
      await using lock = await acquiring;
      assert.ok(
        lock.fence > held.fence,
        `the waiter's fence ${lock.fence} must be above the holder's ${held.fence}`,
      );
      console.log(
        `full server: ${
          failedSince(proxy, from).length
        } reconnections refused with 53300 before a slot freed`,
      );
    } finally {
      controller.abort();
      await held?.child.kill();
      proxy.open();
      for (const filler of fillers) await filler.close();
      await admin.close();
      await proxy.close();
    }
  });

  test("a waiter that had connected keeps trying while its server is down (connections refused) for longer than connectTimeout, and takes the lock, above the lost holder's fence, once the server is back", async () => {
    const name = unique("down");
    const app = appName("down");
    const controller = new AbortController();
    await using waiterLocks = pgLocks(withApp(url, app), WAITER);
    let held: Awaited<ReturnType<typeof holder>> | undefined;
    let started: (() => Promise<void>) | undefined;
    try {
      held = await holder(url, name);
      const acquiring = waiterLocks.acquire(name, {
        timeout: 60_000,
        signal: controller.signal,
      });
      acquiring.catch(() => {}); // awaited below, or aborted on failure
      const admin = adminSession(url);
      try {
        await whileWaiting(
          acquiring,
          async () => await waiting(admin, app) > 0,
          "the waiter waits for the lock",
        );
      } finally {
        await admin.close();
      }
      const halted = await halt(cluster, "fast");
      started = halted.start;
      const down = performance.now();
      // The stimulus is a length of time, not a synchronisation: the
      // server stays down (every reconnection refused at once) for twice
      // the waiter's connectTimeout, which is all a waiter that never
      // reached its server would retry for.
      await whileWaiting(
        acquiring,
        () => performance.now() - down > 2 * WAITER.connectTimeout,
        "the server has been down for twice connectTimeout",
      );
      await halted.start();
      await using lock = await acquiring;
      await held.child.expect("lost");
      assert.ok(
        lock.fence > held.fence,
        `the waiter's fence ${lock.fence} must be above the lost holder's ${held.fence}`,
      );
    } finally {
      controller.abort();
      await held?.child.kill();
      await started?.();
    }
  });
});
