// Host loss: the holder runs in its own network namespace, joined to the
// server's by a veth pair, and the link is cut (the interface goes down, so
// packets vanish without an answer, as when a host loses power). With the
// default keepalive and heartbeat settings, the holder's lock.signal must
// abort before the server hands the lock to a waiter, and the server must
// release it in seconds. Needs root, `ip` and network namespaces, and
// PostgreSQL binaries; skipped (with the reason) otherwise.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { pgLocks } from "../../src/postgres/mod.ts";
import { Child, fixtureCommand, waitFor } from "../_helpers.ts";
import { type Cluster, psql, startCluster } from "../fixtures/pg_cluster.ts";
import { pgBinariesAvailable } from "../fixtures/pg_available.ts";

const tag = process.pid % 10_000;
const ns = `rlns${tag}`;
const hostIf = `rlh${tag}`;
const nsIf = `rln${tag}`;
// A /30 of 10.213.0.0/16 per run, so concurrent runs do not meet.
const net = `10.213.${(process.pid >> 2) % 256}`;
const hostIp = `${net}.${(tag % 63) * 4 + 1}`;
const nsIp = `${net}.${(tag % 63) * 4 + 2}`;

function ip(...args: string[]): { ok: boolean; err: string } {
  const r = spawnSync("ip", args, { encoding: "utf8" });
  return { ok: r.status === 0, err: `${r.stderr ?? ""}${r.error ?? ""}` };
}

/** Why the test cannot run here, or undefined when it can. */
function unavailable(): string | undefined {
  if (!pgBinariesAvailable) return "no PostgreSQL binaries";
  if (process.getuid?.() !== 0) return "network namespaces need root";
  const probe = ip("netns", "add", ns);
  if (!probe.ok) return `cannot create a network namespace: ${probe.err}`;
  return undefined;
}

const why = unavailable();
if (why !== undefined) console.error(`postgres host-loss test skipped: ${why}`);

function setUpLink(): void {
  const steps = [
    ["link", "add", hostIf, "type", "veth", "peer", "name", nsIf],
    ["link", "set", nsIf, "netns", ns],
    ["addr", "add", `${hostIp}/30`, "dev", hostIf],
    ["link", "set", hostIf, "up"],
    ["netns", "exec", ns, "ip", "addr", "add", `${nsIp}/30`, "dev", nsIf],
    ["netns", "exec", ns, "ip", "link", "set", nsIf, "up"],
    ["netns", "exec", ns, "ip", "link", "set", "lo", "up"],
  ];
  for (const step of steps) {
    const r = ip(...step);
    if (!r.ok) throw new Error(`ip ${step.join(" ")}: ${r.err}`);
  }
}

describe("postgres backend, host loss", { skip: why }, () => {
  let cluster: Cluster;
  before(async () => {
    setUpLink();
    cluster = await startCluster({
      own: true,
      listen: [hostIp],
      trust: [`${nsIp}/32`],
    });
  });
  after(() => {
    cluster?.stop();
    ip("link", "del", hostIf); // also removes the peer
    ip("netns", "del", ns);
  });

  test("a holder whose host vanishes loses the lock: its signal aborts first, then the server hands the lock to a waiter, with the default settings (the times printed)", async () => {
    const name = `hostloss/${process.pid}`;
    const remoteUrl = `postgres://postgres@${hostIp}:${cluster.port}/postgres`;
    const [cmd, argv] = fixtureCommand("pg_child.ts", []);
    const holder = new Child(
      "pg_child.ts",
      ["hold", remoteUrl, name],
      undefined,
      ["ip", "netns", "exec", ns, cmd, ...argv],
    );
    await using locks = pgLocks(cluster.url);
    try {
      const got = await holder.expect("acquired");
      const info = await locks.inspect(name);
      assert.equal(info.state, "held");
      assert.equal(info.pid, holder.pid);
      const waiting = locks.acquire(name, { timeout: 120_000 });
      // The link goes down once the waiter's session waits on the server.
      await waitFor(
        () =>
          psql(
            cluster.url,
            `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%pg_advisory_lock(%'`,
          ) !== "0",
        "the waiter's session waiting in pg_advisory_lock",
      );
      const lost = holder.expect("lost");
      lost.catch(() => {});
      const cut = Date.now();
      const down = ip("netns", "exec", ns, "ip", "link", "set", nsIf, "down");
      assert.ok(down.ok, down.err);
      const lock = await waiting;
      const released = Date.now() - cut;
      const aborted = Math.round((await lost).at as number - cut);
      console.log(
        `host loss with the defaults: holder's signal aborted after ${aborted} ms, ` +
          `server released the lock to a waiter after ${released} ms`,
      );
      assert.ok(aborted < released, `${aborted} ms >= ${released} ms`);
      assert.ok(lock.fence > BigInt(got.fence as string));
      await lock.release();
    } finally {
      await holder.kill();
    }
  });
});
