// Waiting for a PostgreSQL lock: an abort settles
// the acquire at once wherever it lands, a waiter with time left rides out
// a server restart, and waiters are served in the order they started
// waiting even though each waits in slices of a few seconds. Against a
// cluster of this file's own (it restarts it), with real processes.
//
// Waiters are told apart by their application_name (a URL parameter the
// client sends), so the checks below read pg_locks and pg_stat_activity
// for exactly the sessions of one waiter, whatever keys it waits on.
import assert from "node:assert/strict";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { pgLocks } from "../../src/postgres/mod.ts";
import { RunlockError } from "../../src/postgres/mod.ts";
import { Child, type Event, waitFor } from "../_helpers.ts";
import {
  type Cluster,
  freePort,
  psql,
  startCluster,
} from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";
import { holdingProxy } from "../fixtures/pg_wait_proxy.ts";

const canStart = pgTestable({
  needs: "binaries",
  untested: "the wait tests, which restart a cluster of their own, are NOT run",
});

/** How long one wait statement may block (src/postgres: WAIT_SLICE_MS). */
const WAIT_SLICE_MS = 5_000;

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `test/${process.pid}-${Date.now().toString(36)}/${label}/${counter++}`;
}

/** An application_name no other session uses (at most 63 bytes). */
function appName(label: string): string {
  return `rlw-${process.pid}-${counter++}-${label}`;
}

/** `url` with the sessions it opens named `app` in pg_stat_activity. */
function withApp(url: string, app: string): string {
  const u = new URL(url);
  u.searchParams.set("application_name", app);
  return u.href;
}

/** Advisory locks the sessions named `app` wait for (ungranted), any key. */
function waiting(url: string, app: string): number {
  return Number(psql(
    url,
    `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
       WHERE l.locktype = 'advisory' AND NOT l.granted
         AND a.application_name = :'app'`,
    { app },
  ));
}

/**
 * For each of `apps` whose session is blocked on a lock right now, when
 * its current statement started; and the server's clock (ms since 1970).
 */
function waitStarts(
  url: string,
  apps: string[],
): { starts: Map<string, number>; now: number } {
  const out = psql(
    url,
    `SELECT a.application_name,
            extract(epoch FROM a.query_start) * 1000,
            extract(epoch FROM clock_timestamp()) * 1000
       FROM pg_stat_activity a
      WHERE a.wait_event_type = 'Lock' AND a.wait_event = 'advisory'
        AND a.application_name = ANY (string_to_array(:'apps', ','))`,
    { apps: apps.join(",") },
  );
  const starts = new Map<string, number>();
  let now = Number(
    psql(url, `SELECT extract(epoch FROM clock_timestamp()) * 1000`),
  );
  for (const line of out === "" ? [] : out.split("\n")) {
    const [app, start, at] = line.split("|");
    starts.set(app, Number(start));
    now = Number(at);
  }
  return { starts, now };
}

function child(mode: string, url: string, name: string, ...rest: string[]) {
  return new Child("pg_child.ts", [mode, url, name, ...rest]);
}

describe("postgres waiting", { skip: !canStart }, () => {
  let cluster: Cluster;
  let url: string;
  before(async () => {
    // Its own cluster even when RUNLOCK_TEST_PG_URL is set: it restarts it.
    cluster = await startCluster({ own: true });
    url = cluster.url;
  });
  after(() => cluster?.stop());

  /**
   * A waiter (this process, through a holding proxy) is aborted while the
   * statement that contains `marker` is held back on its way to the
   * server; once the cancel connection it may send has been closed by the
   * server (if `afterCancel`), the statement is let through. Returns how
   * long the acquire took to settle from then.
   */
  async function abortWhileHeld(
    marker: string,
    afterCancel: boolean,
  ): Promise<number> {
    const name = unique("abort");
    const holder = child("hold", url, name);
    const proxy = await holdingProxy(url);
    try {
      const got = await holder.expect("acquired");
      const app = appName("abort");
      await using locks = pgLocks(withApp(proxy.url, app));
      const controller = new AbortController();
      const held = proxy.holdOn(marker);
      const settled = locks.acquire(name, {
        timeout: Infinity,
        signal: controller.signal,
      }).then(
        (lock) => ({ lock, err: undefined }),
        (err: unknown) => ({ lock: undefined, err }),
      );
      const early = await Promise.race([held.then(() => undefined), settled]);
      assert.equal(early, undefined, `settled before ${marker} was sent`);
      const reason = new Error("shutting down");
      controller.abort(reason);
      if (afterCancel) {
        // The cancel reached the server before the statement did: the
        // server ignores it (the backend is idle).
        await waitFor(
          () => proxy.cancels.closed >= 1,
          "the server closed the waiter's cancel connection",
        );
      }
      const t0 = performance.now();
      proxy.release();
      const { lock, err } = await settled;
      const ms = performance.now() - t0;
      await lock?.release();
      assert.equal(err, reason, `acquire settled with ${String(err)}`);
      // The promise: an abort settles the acquire before the slice, the
      // longest one wait statement blocks, would have ended on its own.
      assert.ok(
        ms < WAIT_SLICE_MS,
        `the abort was seen only ${ms.toFixed(0)} ms after the statement ` +
          `was let through: the wait ran on (its ${WAIT_SLICE_MS} ms slice)`,
      );
      await waitFor(
        () => waiting(url, app) === 0,
        "the aborted waiter left no session waiting on the server",
      );
      const info = await locks.inspect(name);
      assert.equal(info.state, "held");
      assert.equal(info.pid, holder.pid);
      assert.equal(String(info.fence), String(got.fence));
      return ms;
    } finally {
      proxy.release();
      await holder.kill();
      await proxy.close();
    }
  }

  test("an abort fired while the try statement is on its way settles the acquire with the signal's reason before a wait slice could end, and leaves no session waiting", async () => {
    const ms = await abortWhileHeld("pg_try_advisory_lock", false);
    console.log(
      `abort during the try statement: settled ${
        ms.toFixed(1)
      } ms after it was let through`,
    );
  });

  test("an abort whose cancel reaches the server before the wait statement does settles the acquire before the wait slice ends (the server ignored that cancel)", async () => {
    const ms = await abortWhileHeld("set_config('lock_timeout'", true);
    console.log(
      `abort before the wait statement: settled ${
        ms.toFixed(1)
      } ms after it was let through`,
    );
  });

  test("a waiter with time left rides out a server restart, fast and immediate: it reconnects, keeps waiting and takes the lock with a higher fence, while the holder loses its lock", async () => {
    const name = unique("restart");
    const holder = child("hold", url, name);
    const waiters: Child[] = [];
    try {
      let fence = BigInt((await holder.expect("acquired")).fence as string);
      let current = holder;
      for (const mode of ["fast", "immediate"] as const) {
        const app = appName(mode);
        const waiter = child("hold", withApp(url, app), name, "60000");
        waiters.push(waiter);
        await waitFor(
          () => waiting(url, app) > 0,
          `the waiter (${app}) waits for the lock`,
        );
        cluster.restart(mode);
        const restarted = performance.timeOrigin + performance.now();
        const lost = await current.expect("lost");
        assert.equal(lost.name, "LockLostError", JSON.stringify(lost));
        const got = await waiter.expect("acquired");
        const next = BigInt(got.fence as string);
        assert.ok(next > fence, `fence ${next} after ${fence}`);
        console.log(
          `restart ${mode}: the waiter took the lock ${
            ((got.at as number) - restarted).toFixed(0)
          } ms after pg_ctl restart returned (fence ${fence} -> ${next})`,
        );
        fence = next;
        current = waiter;
      }
    } finally {
      await holder.kill();
      for (const w of waiters) await w.kill();
    }
  });

  test("an acquire with a long timeout at a port where no server ever answered fails after connectTimeout, naming the server, instead of retrying until its timeout", async () => {
    const port = await freePort();
    await using locks = pgLocks(
      `postgres://postgres@127.0.0.1:${port}/postgres`,
      {
        connectTimeout: 1_000,
      },
    );
    const started = performance.now();
    // The lock's timeout (10 min) is the behaviour's bound: it must not be
    // what ends the acquire.
    const err = await locks.acquire(unique("refused"), { timeout: 600_000 })
      .catch((e) => e);
    assert.ok(err instanceof RunlockError, String(err));
    assert.match(
      err.message,
      new RegExp(`127\\.0\\.0\\.1:${port}.*connection refused`),
    );
    console.log(`refused after ${Math.round(performance.now() - started)} ms`);
  });

  test("waiters take the lock in the order they started waiting, also after the first one's wait slice ran out and it waited again", async () => {
    const name = unique("fifo");
    const holder = child("hold", url, name);
    const apps = [appName("w0"), appName("w1"), appName("w2")];
    const waiters: Child[] = [];
    try {
      await holder.expect("acquired");
      for (const [i, app] of apps.entries()) {
        if (i === 1) {
          // Offset the slices: the second waiter starts once the first has
          // waited 1.5 s (the server's clock), so the first one's slice
          // runs out well before the second one's.
          await waitFor(() => {
            const { starts, now } = waitStarts(url, [apps[0]]);
            return now - (starts.get(apps[0]) ?? now) >= 1_500;
          }, "the first waiter has waited 1.5 s");
        }
        waiters.push(child("hold", withApp(url, app), name, "60000"));
        await waitFor(
          () => waiting(url, app) > 0,
          `waiter ${i} (${app}) waits for the lock`,
          60_000,
        );
      }
      // Hand the lock over once the first waiter has begun a new wait
      // statement (its slice ran out) more recently than the second one,
      // with at least a second left in the second one's slice: the moment
      // a waiter that re-enters the server's queue is behind those that
      // came after it.
      let seen = "";
      await waitFor(
        () => {
          const { starts, now } = waitStarts(url, apps.slice(0, 2));
          const [a, b] = [starts.get(apps[0]), starts.get(apps[1])];
          seen = `${a} ${b} ${now}`;
          return a !== undefined && b !== undefined && a > b &&
            now - b < WAIT_SLICE_MS - 1_000;
        },
        "the first waiter started a new slice after the second",
        60_000,
      );
      console.log(`first waiter re-entered: ${seen}`);
      holder.send("release");
      await holder.expect("released");
      const order: number[] = [];
      const next = new Map<number, Promise<Event>>(
        waiters.map((w, i) => [i, w.next()]),
      );
      while (next.size > 0) {
        const [i, e] = await Promise.race(
          [...next].map(([i, p]) => p.then((e) => [i, e] as const)),
        );
        next.delete(i);
        assert.equal(e.event, "acquired", JSON.stringify(e));
        order.push(i);
        waiters[i].send("release");
        await waiters[i].expect("released");
      }
      assert.deepEqual(
        order,
        [0, 1, 2],
        `the waiters took the lock in the order ${order.join(", ")}`,
      );
    } finally {
      await holder.kill();
      for (const w of waiters) await w.kill();
    }
  });
});
