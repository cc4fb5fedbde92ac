// Fences across a failover (docs/postgres.md, "Failover"): a standby that
// replicates asynchronously can miss the last acquisitions of a name before
// its primary dies; promoted, it must still never hand out a fence the old
// primary handed out. A fence is at least (t - 1) × 2^32 on the server's
// timeline t, which the promotion increases. And if the old primary comes
// back beside the new one (split brain), its fences stay below the new
// primary's: what fencing gives there.
//
// Against a primary and a streaming standby of this file's own (real
// servers, tests/fixtures/pg_cluster.ts): the standby is caught up, then
// halted, so it misses the primary's later writes; the primary crashes;
// the standby starts without its primary, replays what it has, and is
// promoted.
import assert from "node:assert/strict";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { type PgLocks, pgLocks } from "../../src/postgres/mod.ts";
import { waitFor } from "../_helpers.ts";
import {
  type Cluster,
  psql,
  type Standby,
  startCluster,
  startStandby,
} from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";
import { halt, type Halted } from "../fixtures/pg_halt.ts";

const canStart = pgTestable({
  needs: "binaries",
  untested:
    "the failover tests, which start a primary and a standby (pg_basebackup) of their own, are NOT run",
});

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `failover/${process.pid}-${
    Date.now().toString(36)
  }/${label}/${counter++}`;
}

/** Takes `name` through `locks` and releases it; returns its fence. */
async function fenceOf(locks: PgLocks, name: string): Promise<bigint> {
  const lock = await locks.acquire(name);
  await lock.release();
  return lock.fence;
}

/** The documented floor of fences on timeline 2: (2 - 1) × 2^32. */
const TIMELINE_2_FLOOR = 2n ** 32n;

describe("postgres failover", { skip: !canStart }, () => {
  let primary: Cluster;
  let standby: Standby;
  let crashed: Halted;
  const name = unique("lagging");
  /** The fences the old primary handed out for `name`, in order. */
  const old: bigint[] = [];
  before(async () => {
    primary = await startCluster({ own: true, replication: true });
    standby = await startStandby(primary);
    {
      await using locks = pgLocks(primary.url);
      for (let i = 0; i < 3; i++) old.push(await fenceOf(locks, name));
      // The standby has the first three; halted, it misses the next two,
      // as an asynchronous standby misses the writes its primary
      // committed last before it died.
      await standby.catchUp();
      standby.halt();
      for (let i = 0; i < 2; i++) old.push(await fenceOf(locks, name));
    }
    crashed = await halt(primary, "immediate");
    await standby.start({ follow: false });
    standby.promote();
    await waitFor(
      () => psql(standby.url, "SELECT pg_is_in_recovery()") === "f",
      "the promoted standby accepts writes",
    );
  });
  after(() => {
    standby?.stop();
    primary?.stop();
  });

  test("fences never repeat across a promotion of a lagging asynchronous standby: the first acquire on the promoted server is above every fence the old primary handed out, also the two the standby never saw", async () => {
    for (let i = 1; i < old.length; i++) {
      assert.equal(old[i], old[i - 1] + 1n, `old fences ${old.join(", ")}`);
    }
    await using locks = pgLocks(standby.url);
    // The scenario: the promoted server saw the third acquisition, not
    // the fourth and fifth.
    assert.equal((await locks.inspect(name)).fence, old[2]);
    const fence = await fenceOf(locks, name);
    assert.ok(
      fence > old[4],
      `the promoted server's fence ${fence} must be above the old primary's last, ${
        old[4]
      } (fences of the old primary: ${old.join(", ")})`,
    );
  });

  test("on the promoted server (timeline 2), a name never acquired before gets a fence above every fence of the old timeline and above the documented floor, (2 - 1) × 2^32, and its fences still step by one", async () => {
    assert.equal(
      psql(
        standby.url,
        "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
      ),
      "00000002",
      "the promoted server writes timeline 2",
    );
    await using locks = pgLocks(standby.url);
    const fresh = unique("fresh");
    const first = await fenceOf(locks, fresh);
    const second = await fenceOf(locks, fresh);
    assert.ok(
      first > TIMELINE_2_FLOOR,
      `the first fence ${first} of a new name on timeline 2 must be above ${TIMELINE_2_FLOOR}`,
    );
    assert.ok(
      old.every((f) => first > f),
      `the first fence ${first} must be above every fence of timeline 1 (${
        old.join(", ")
      })`,
    );
    assert.equal(second, first + 1n, "fences step by one within a timeline");
  });

  test("split brain: the old primary, restarted after the promotion, keeps handing out its own fences, each below the new primary's, so a store that has seen a fence of the new primary refuses the old primary's holders", async () => {
    await crashed.start();
    await using oldLocks = pgLocks(primary.url);
    await using newLocks = pgLocks(standby.url);
    const fromOld = await fenceOf(oldLocks, name);
    assert.equal(
      fromOld,
      old[4] + 1n,
      "the old primary goes on from its own last fence",
    );
    const fromNew = await fenceOf(newLocks, name);
    const againOld = await fenceOf(oldLocks, name);
    // A store that keeps the highest fence it has seen and refuses any
    // lower one: after the new primary's holder wrote, every holder of
    // the old primary is refused, however many times it acquires.
    for (const f of [fromOld, againOld]) {
      assert.ok(
        f < fromNew,
        `the old primary's fence ${f} must be below the new primary's ${fromNew}`,
      );
    }
  });
});
