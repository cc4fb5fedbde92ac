// The PostgreSQL backend behind the poolers and proxies it meets in the
// field, with real servers and real processes: PgBouncer in each pool
// mode, pgpool-II load balancing to a real streaming standby, and HAProxy
// (a plain TCP proxy) in front of a client that vanishes. An outside trial
// found two holders behind such middleboxes (fixed in fdee239, 30abadb);
// these tests fail on the code before them (60563eb).
//
// Workers loop on one name through the pooler (tests/fixtures/
// pg_loop_worker.ts) and append what they do to one log, which replayLog
// (tests/fixtures/pg_stress.ts) judges: no two believed holders at once,
// fences strictly increasing.
//
// The link cuts run a process in a network namespace of its own, joined to
// this one by veth pairs, and take one pair's interface down: packets
// vanish without an answer, as when a host or a path dies. They need root
// and `ip`, and are skipped (with the reason) otherwise. A missing pooler
// binary skips the tests that need it, and fails under CI=true (.ci/run
// installs PgBouncer, pgpool-II and HAProxy).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { pgLocks } from "../../src/postgres/mod.ts";
import {
  Child,
  delay,
  type Event,
  fixtureCommand,
  tempDir,
  waitFor,
} from "../_helpers.ts";
import {
  advisoryWaiters,
  type Cluster,
  keyBySql,
  psql,
  type Standby,
  startCluster,
  startStandby,
} from "../fixtures/pg_cluster.ts";
import {
  type Pooler,
  poolersAvailable,
  startHaproxy,
  startPgBouncer,
  startPgpool,
} from "../fixtures/pg_poolers.ts";
import { replayLog } from "../fixtures/pg_stress.ts";

/** The default heartbeat: a lost session is noticed within this. */
const HEARTBEAT_MS = 2_000 + 5_000; // heartbeatInterval + heartbeatTimeout
/** Slack for a loaded machine on the times the tests bound. */
const MARGIN_MS = 3_000;
/** How long the workers of one loop run (the run's length, not a wait). */
const LOOP_MS = 3_000;

/** Why `tools` cannot run here; under CI a missing one fails the file. */
function poolersMissing(
  tools: ("pgbouncer" | "pgpool" | "haproxy")[],
): string | undefined {
  const why = poolersAvailable(tools);
  if (why !== undefined && process.env.CI === "true") {
    throw new Error(
      `CI must run the tests through ${tools.join(", ")}: ${why}`,
    );
  }
  return why;
}

// ---------------------------------------------------------------------------
// Network namespaces: names and addresses per process, so that concurrent
// runs do not meet. A /30 of 10.213.0.0/16 per veth pair (the host-loss test
// uses the same /16, with another third octet for the same pid).

const tag = process.pid % 10_000;
const net = `10.213.${((process.pid >> 2) + 128) % 256}`;
const firstBlock = (tag % 21) * 3; // three /30 blocks of 64 per run

function ip(...args: string[]): string | undefined {
  const r = spawnSync("ip", args, { encoding: "utf8" });
  return r.status === 0
    ? undefined
    : `ip ${args.join(" ")}: ${r.stderr ?? ""}${r.error ?? ""}`.trim();
}

/** Why no network namespace can be made here, or undefined. */
function netnsMissing(): string | undefined {
  if (process.getuid?.() !== 0) return "network namespaces need root";
  const probe = `rlpprobe${tag}`;
  const failed = ip("netns", "add", probe);
  if (failed !== undefined) {
    return `cannot create a network namespace: ${failed}`;
  }
  ip("netns", "del", probe);
  return undefined;
}

/** One veth pair: `hostIp` here, `nsIp` inside the namespace. */
interface Link {
  hostIf: string;
  nsIf: string;
  hostIp: string;
  nsIp: string;
}

/** A namespace joined to this one by veth pairs. */
interface Netns {
  name: string;
  links: Link[];
  /** The command prefix that runs a command inside. */
  exec: string[];
  /** Takes link `i` down (its side in the namespace). */
  down(i: number): void;
  /** Brings link `i` up again. */
  up(i: number): void;
  /** Deletes the links (their peers go with them) and the namespace. */
  remove(): void;
}

/**
 * Makes namespace `rl<label><tag>` with one veth pair per block of
 * `blocks` (each a /30: .1 here, .2 there), or throws (after removing
 * what it made).
 */
function makeNetns(label: string, blocks: number[]): Netns {
  const name = `rl${label}${tag}`;
  const links = blocks.map((block, i): Link => ({
    hostIf: `rl${label}h${i}${tag}`,
    nsIf: `rl${label}n${i}${tag}`,
    hostIp: `${net}.${block * 4 + 1}`,
    nsIp: `${net}.${block * 4 + 2}`,
  }));
  const inNs = (...args: string[]) => ["netns", "exec", name, "ip", ...args];
  const remove = () => {
    for (const link of links) ip("link", "del", link.hostIf);
    ip("netns", "del", name);
  };
  const steps = [
    ["netns", "add", name],
    inNs("link", "set", "lo", "up"),
    ...links.flatMap((l) => [
      ["link", "add", l.hostIf, "type", "veth", "peer", "name", l.nsIf],
      ["link", "set", l.nsIf, "netns", name],
      ["addr", "add", `${l.hostIp}/30`, "dev", l.hostIf],
      ["link", "set", l.hostIf, "up"],
      inNs("addr", "add", `${l.nsIp}/30`, "dev", l.nsIf),
      inNs("link", "set", l.nsIf, "up"),
    ]),
  ];
  for (const step of steps) {
    const failed = ip(...step);
    if (failed !== undefined) {
      remove();
      throw new Error(failed);
    }
  }
  const must = (args: string[]) => {
    const failed = ip(...args);
    if (failed !== undefined) throw new Error(failed);
  };
  return {
    name,
    links,
    exec: ["ip", "netns", "exec", name],
    down: (i) => must(inNs("link", "set", links[i].nsIf, "down")),
    up: (i) => must(inNs("link", "set", links[i].nsIf, "up")),
    remove,
  };
}

/** JSON, bigints as strings (an Inspection's fence). */
const show = (value: unknown) =>
  JSON.stringify(value, (_k, v) => typeof v === "bigint" ? String(v) : v);

/** Fixture `name` run inside `ns`. */
function childIn(ns: Netns, name: string, args: string[]): Child {
  const [cmd, argv] = fixtureCommand(name, []);
  return new Child(name, args, undefined, [...ns.exec, cmd, ...argv]);
}

// ---------------------------------------------------------------------------
// The loop.

/** What a loop of workers did. */
interface Loop {
  enters: number;
  lost: number;
  /** The "refused" lines, by error name. */
  refused: Record<string, number>;
  /** Each worker's last event ("done" when it ended well). */
  ends: Event[];
  /** Each worker's stderr. */
  stderr: string[];
  /** The log's "enter", "leave" and "lost" lines. */
  entries: string[];
  /**
   * Server sessions holding the name's advisory lock once every worker
   * has ended (asked by psql on `direct`, from pg_locks).
   */
  heldAfter: number;
}

/**
 * Runs `workers` pg_loop_worker processes on one name through `url` for
 * LOOP_MS (from the moment all are running, and until each has tried at
 * least twice), then stops them and replays their log, which throws on
 * any overlap of believed holders or a fence out of order; `direct` is the
 * server's own URL, to ask it who holds the lock afterwards.
 */
async function loop(
  url: string,
  direct: string,
  label: string,
  workers = 5,
): Promise<Loop> {
  const { dir, cleanup } = tempDir();
  const log = join(dir, "log");
  const stop = join(dir, "stop");
  writeFileSync(log, "");
  const name = `poolers/${label}/${process.pid}`;
  const children = Array.from(
    { length: workers },
    () => new Child("pg_loop_worker.ts", [url, name, log, stop]),
  );
  try {
    await Promise.all(children.map((c) => c.expect("ready")));
    const started = Date.now();
    const tries = () => {
      const count = new Map<string, number>();
      for (const line of readFileSync(log, "utf8").split("\n")) {
        const [what, pid] = line.split(" ");
        if (what === "enter" || what === "refused" || what === "timeout") {
          count.set(pid, (count.get(pid) ?? 0) + 1);
        }
      }
      return children.every((c) => (count.get(String(c.pid)) ?? 0) >= 2);
    };
    await waitFor(tries, "every worker tried at least twice", 60_000);
    await delay(Math.max(0, LOOP_MS - (Date.now() - started)));
    writeFileSync(stop, "");
    const ends = await Promise.all(
      children.map((c) => c.next().catch((e) => ({ event: String(e) }))),
    );
    await Promise.all(children.map((c) => c.exited));
    const text = readFileSync(log, "utf8");
    const { enters, lost } = replayLog(text);
    const refused: Record<string, number> = {};
    const entries: string[] = [];
    for (const line of text.trim().split("\n")) {
      const [what, , error] = line.split(" ");
      if (what === "refused") refused[error] = (refused[error] ?? 0) + 1;
      else if (what !== "timeout" && line !== "") entries.push(line);
    }
    const key = keyBySql(direct, name);
    const heldAfter = Number(psql(
      direct,
      `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
         AND objsubid = 1
         AND classid = ((:'key'::bigint >> 32) & 4294967295)::oid
         AND objid = (:'key'::bigint & 4294967295)::oid`,
      { key },
    ));
    return {
      enters,
      lost,
      refused,
      ends,
      stderr: children.map((c) => c.stderr.join("")),
      entries,
      heldAfter,
    };
  } finally {
    writeFileSync(stop, "");
    await Promise.all(children.map((c) => c.kill()));
    cleanup();
  }
}

/** Checks that every worker of a loop ended well and the lock is free. */
function assertEnded(result: Loop): void {
  for (const [i, end] of result.ends.entries()) {
    assert.equal(end.event, "done", `${show(end)} ${result.stderr[i]}`);
  }
  assert.equal(
    result.heldAfter,
    0,
    "the lock is held after every worker ended",
  );
}

/** Checks a loop where every worker must take its turns, unrefused. */
function assertTookTurns(result: Loop): void {
  assert.deepEqual(
    result.refused,
    {},
    `acquires refused; the workers' ends:\n${result.ends.map(show).join("\n")}`,
  );
  assertEnded(result);
  assert.equal(result.lost, 0);
  for (const done of result.ends) {
    assert.ok((done.enters as number) >= 1, show(done));
  }
}

/**
 * Checks a loop through a transaction pooler: whatever it let through (a
 * second connection that was not handed the first one's server session,
 * under load, passes the check; the lock session then holds its server
 * session in a transaction) took its turn, as the replay checked; every
 * other acquire was refused with a PoolerError naming the fix; nothing is
 * left held.
 */
function assertRefusedOrTurns(result: Loop, mode: string): void {
  assertEnded(result);
  assert.equal(result.lost, 0, `${mode}: locks lost`);
  for (const name of Object.keys(result.refused)) {
    assert.equal(
      name,
      "PoolerError",
      `${mode}: refusals ${show(result.refused)}`,
    );
  }
  for (const done of result.ends) {
    const message = (done.messages as Record<string, string>).PoolerError;
    if (message === undefined) continue;
    assert.match(message, /pool_mode/, message);
    assert.match(message, /session/, message);
  }
}

/** Checks a loop where the pooler must refuse every acquire. */
function assertAllRefused(result: Loop, mode: string): void {
  assert.equal(
    result.enters,
    0,
    `${mode}: ${result.enters} acquires succeeded; the log (but its ` +
      `"refused" lines) and the workers' ends:\n${
        result.entries.slice(0, 20).join("\n")
      }\n${result.ends.map(show).join("\n")}\n` +
      `server sessions holding the lock after the workers ended: ${result.heldAfter}`,
  );
  assertEnded(result);
  assert.deepEqual(
    Object.keys(result.refused),
    ["PoolerError"],
    `${mode}: refusals ${show(result.refused)}`,
  );
  for (const done of result.ends) {
    assert.equal(done.timeouts, 0, show(done));
    assert.ok((done.refused as number) >= 2, show(done));
    const message = (done.messages as Record<string, string>).PoolerError;
    assert.match(message, /pool_mode/, message);
    assert.match(message, /session/, message);
  }
}

// ---------------------------------------------------------------------------

const noBouncer = poolersMissing(["pgbouncer"]);
if (noBouncer) console.error(`PgBouncer loop tests skipped: ${noBouncer}`);

describe("postgres backend through PgBouncer", { skip: noBouncer }, () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster({ own: true });
  });
  after(() => cluster?.stop());

  async function through(
    mode: "session" | "transaction" | "statement",
    extra?: string[],
  ): Promise<Loop> {
    await using bouncer = await startPgBouncer({
      backend: cluster,
      mode,
      extra,
    });
    const started = Date.now();
    const result = await loop(bouncer.url, cluster.url, `bouncer-${mode}`);
    console.log(
      `PgBouncer ${mode}${extra ? ` (${extra.join("; ")})` : ""}: ` +
        `${result.enters} critical sections, refusals ${
          JSON.stringify(result.refused)
        }, ${Date.now() - started} ms`,
    );
    return result;
  }

  test("through PgBouncer in session mode with its default settings (which refuse the startup options), workers looping on one name take turns: each enters, never two at once, fences increase, no acquire is refused", async () => {
    const result = await through("session");
    assertTookTurns(result);
  });

  test("through PgBouncer in transaction mode that ignores the startup options, workers looping on one name are refused with PoolerError naming pool_mode and session mode, and a lock the check let through under load is never held twice; nothing is left held", async () => {
    assertRefusedOrTurns(
      await through("transaction", [
        "ignore_startup_parameters = extra_float_digits,options",
      ]),
      "transaction, options ignored",
    );
  });

  test("through PgBouncer in transaction mode with its default settings, workers looping on one name are refused with PoolerError naming pool_mode and session mode, and a lock the check let through under load is never held twice; nothing is left held", async () => {
    assertRefusedOrTurns(await through("transaction"), "transaction");
  });

  test("through PgBouncer in statement mode, every acquire is refused with PoolerError naming pool_mode and session mode, and nobody enters", async () => {
    assertAllRefused(await through("statement"), "statement");
  });
});

// ---------------------------------------------------------------------------

const noPgpool = poolersMissing(["pgpool"]);
if (noPgpool) console.error(`pgpool-II tests skipped: ${noPgpool}`);
const noNetns = netnsMissing();
if (noNetns) {
  console.error(`pgpool-II and HAProxy link-cut tests skipped: ${noNetns}`);
}

// Topology, when namespaces can be made: pgpool-II runs in a namespace of
// its own, with two links to this one. Link 0 carries only pgpool ->
// primary (the primary also listens on its address here); link 1 carries
// pgpool -> standby (likewise) and the clients -> pgpool (it listens on
// its side of link 1). Cutting link 0 cuts pgpool from the primary alone,
// while clients still reach pgpool, and pgpool the standby. A waiter
// reaches the primary directly, on 127.0.0.1. Without namespaces, pgpool
// runs here on 127.0.0.1 and only the loop test runs.
describe(
  "postgres backend through pgpool-II load balancing to a streaming standby",
  {
    skip: noPgpool,
  },
  () => {
    let ns: Netns | undefined;
    let cluster: Cluster;
    let standby: Standby;
    let pgpool: Pooler;
    before(async () => {
      if (noNetns === undefined) {
        ns = makeNetns("pp", [firstBlock, firstBlock + 1]);
      }
      const [toPrimary, toStandby] = ns?.links ?? [];
      cluster = await startCluster({
        own: true,
        replication: true,
        listen: toPrimary ? [toPrimary.hostIp] : undefined,
        trust: ns ? ns.links.map((l) => `${l.nsIp}/32`) : undefined,
      });
      // The standby's pg_hba.conf is the primary's (pg_basebackup copies it).
      standby = await startStandby(cluster, {
        listen: toStandby ? [toStandby.hostIp] : undefined,
      });
      pgpool = await startPgpool({
        primary: {
          host: toPrimary?.hostIp ?? cluster.host,
          port: cluster.port,
        },
        standby: {
          host: toStandby?.hostIp ?? standby.host,
          port: standby.port,
        },
        loadBalance: true,
        // Node 1, the standby, is the load-balance node of every session.
        weights: [0, 1],
        listen: toStandby?.nsIp,
        wrap: ns?.exec,
        // No health check: its failover would end every client's
        // connection when the primary's link is cut, and abort the holder's
        // signal by another path than the one the cut test is about (the
        // heartbeat's own question to the primary).
        extra: ["health_check_period = 0"],
      });
    });
    after(async () => {
      await pgpool?.stop();
      standby?.stop();
      cluster?.stop();
      ns?.remove();
    });

    test("workers looping through pgpool-II, whose load-balance node is the standby, take turns on the primary: they enter, never two at once, fences increase, no acquire is refused", async () => {
      // The set-up that sends a lock's statements astray: a read that
      // calls no volatile function and reads no catalog (as SELECT 1 does)
      // goes to the standby, unless it starts with the hint.
      const port = (sql: string) => Number(psql(pgpool.url, sql));
      assert.equal(port("SELECT inet_server_port()"), standby.port);
      assert.equal(
        port("/*NO LOAD BALANCE*/ SELECT inet_server_port()"),
        cluster.port,
      );
      const started = Date.now();
      const result = await loop(pgpool.url, cluster.url, "pgpool", 4);
      console.log(
        `pgpool-II: ${result.enters} critical sections, refusals ${
          JSON.stringify(result.refused)
        }, ${Date.now() - started} ms`,
      );
      assertTookTurns(result);
    });

    test(
      "when pgpool-II's link to the primary is cut, the holder's signal aborts (LockLostError) within heartbeatInterval + heartbeatTimeout, while a waiter on the primary is still not granted the lock",
      {
        skip: noNetns,
      },
      async () => {
        const name = `poolers/pgpool-cut/${process.pid}`;
        await using locks = pgLocks(cluster.url);
        const holder = new Child("pg_child.ts", ["hold", pgpool.url, name]);
        let waiter: Child | undefined;
        try {
          const got = await holder.expect("acquired");
          const info = await locks.inspect(name);
          assert.equal(info.state, "held");
          assert.equal(info.pid, holder.pid);
          waiter = new Child("pg_child.ts", [
            "hold",
            cluster.url,
            name,
            "60000",
          ]);
          const granted = waiter.next();
          granted.catch(() => {});
          await waitFor(
            () => advisoryWaiters(cluster.url, name) === 1,
            "the waiter's session waiting on the primary",
          );
          const lost = holder.expect("lost");
          lost.catch(() => {});
          const cut = Date.now();
          ns!.down(0);
          const first = await Promise.race([
            lost.then((e) => ({ what: "lost", e })),
            granted.then((e) => ({ what: "waiter", e })),
          ]);
          assert.equal(
            first.what,
            "lost",
            `the waiter's acquire ended (${
              JSON.stringify(first.e)
            }) while the holder (fence ${got.fence}) still believed it held the lock`,
          );
          const aborted = Math.round((first.e.at as number) - cut);
          // The server has not handed the lock over: the waiter still waits.
          assert.equal(advisoryWaiters(cluster.url, name), 1);
          console.log(
            `pgpool-II, primary link cut: holder's signal aborted after ${aborted} ms ` +
              `(${first.e.name}), the waiter still waiting`,
          );
          assert.equal(first.e.name, "LockLostError", JSON.stringify(first.e));
          assert.ok(
            aborted <= HEARTBEAT_MS + MARGIN_MS,
            `aborted ${aborted} ms after the cut`,
          );
        } finally {
          await holder.kill();
          await waiter?.kill();
          ns!.up(0);
        }
      },
    );
  },
);

// ---------------------------------------------------------------------------

const noHaproxy = poolersMissing(["haproxy"]);
if (noHaproxy) console.error(`HAProxy test skipped: ${noHaproxy}`);

// Topology: HAProxy listens here on link 0's address and forwards to the
// server on 127.0.0.1; the holders run in the namespace and reach HAProxy
// over link 0. Cutting link 0 leaves HAProxy's connections to the server
// up: the server sees a client that simply stays silent, for as long as
// HAProxy's `timeout client` (30 min, Patroni's sample).
describe("postgres backend through HAProxy (a TCP proxy)", {
  skip: noHaproxy ?? noNetns,
}, () => {
  let ns: Netns;
  let cluster: Cluster;
  let haproxy: Pooler;
  before(async () => {
    ns = makeNetns("ph", [firstBlock + 2]);
    cluster = await startCluster({ own: true });
    haproxy = await startHaproxy({
      backend: { host: "127.0.0.1", port: cluster.port },
      listen: ns.links[0].hostIp,
      timeoutClient: "30m",
    });
  });
  after(async () => {
    await haproxy?.stop();
    cluster?.stop();
    ns?.remove();
  });

  test("a holder behind HAProxy whose link is cut: with idleSessionTimeout its signal aborts first, then the server ends its silent session and a waiter gets the lock within idleSessionTimeout, long before HAProxy's 30 min; without it the dead client's session keeps the lock", async () => {
    const IDLE_MS = 10_000;
    const bounded = `poolers/haproxy-idle/${process.pid}`;
    const unbounded = `poolers/haproxy-default/${process.pid}`;
    const url = `postgres://postgres@${
      ns.links[0].hostIp
    }:${haproxy.port}/postgres`;
    await using locks = pgLocks(cluster.url);
    const holders = [
      childIn(ns, "pg_child.ts", [
        "hold",
        url,
        bounded,
        "0",
        JSON.stringify({ idleSessionTimeout: IDLE_MS }),
      ]),
      childIn(ns, "pg_child.ts", ["hold", url, unbounded]),
    ];
    let waiter: Child | undefined;
    try {
      await Promise.all(holders.map((h) => h.expect("acquired")));
      for (const [i, name] of [bounded, unbounded].entries()) {
        const info = await locks.inspect(name);
        assert.equal(info.state, "held");
        assert.equal(info.pid, holders[i].pid);
      }
      waiter = new Child("pg_child.ts", [
        "hold",
        cluster.url,
        bounded,
        "60000",
      ]);
      const granted = waiter.next();
      granted.catch(() => {});
      await waitFor(
        () => advisoryWaiters(cluster.url, bounded) === 1,
        "the waiter's session waiting on the server",
      );
      const lost = holders.map((h) => h.expect("lost"));
      for (const l of lost) l.catch(() => {});
      const cut = Date.now();
      ns.down(0);
      const first = await Promise.race([
        lost[0].then((e) => ({ what: "lost", e })),
        granted.then((e) => ({ what: "waiter", e })),
      ]);
      assert.equal(
        first.what,
        "lost",
        `the waiter's acquire ended (${
          JSON.stringify(first.e)
        }) while the holder still believed it held the lock`,
      );
      const aborted = Math.round((first.e.at as number) - cut);
      const got = await granted;
      assert.equal(got.event, "acquired", JSON.stringify(got));
      const released = Math.round((got.at as number) - cut);
      const otherLost = await lost[1];
      const otherAborted = Math.round((otherLost.at as number) - cut);
      console.log(
        `HAProxy, link cut: with idleSessionTimeout ${IDLE_MS} ms the holder's signal ` +
          `aborted after ${aborted} ms and a waiter got the lock after ${released} ms; ` +
          `without it the holder's signal aborted after ${otherAborted} ms`,
      );
      assert.equal(first.e.name, "LockLostError", JSON.stringify(first.e));
      assert.ok(aborted < released, `${aborted} ms >= ${released} ms`);
      assert.ok(
        aborted <= HEARTBEAT_MS + MARGIN_MS,
        `aborted ${aborted} ms after the cut`,
      );
      assert.ok(
        released <= IDLE_MS + 2_000 + MARGIN_MS,
        `the waiter got the lock ${released} ms after the cut`,
      );
      // Without the option, at the same time, the lock is still held by
      // the dead client's session, which HAProxy keeps open.
      const info = await locks.inspect(unbounded);
      assert.equal(info.state, "held", show(info));
      assert.equal(info.pid, holders[1].pid);
      const backend = String(info.backendPid);
      assert.equal(
        psql(
          cluster.url,
          "SELECT count(*) FROM pg_stat_activity WHERE pid = :'pid'::int",
          { pid: backend },
        ),
        "1",
      );
      const refused = await locks.acquire(unbounded).catch((e) => e);
      assert.equal(refused.name, "HeldError", String(refused));
      assert.equal(refused.pid, holders[1].pid);
      // Clean up: end that session by hand; the lock is free then.
      psql(cluster.url, "SELECT pg_terminate_backend(:'pid'::int)", {
        pid: backend,
      });
      await waitFor(
        async () => (await locks.inspect(unbounded)).state !== "held",
        "the dead client's session ended by hand",
      );
      waiter.send("release");
      await waiter.expect("released");
    } finally {
      await Promise.all(holders.map((h) => h.kill()));
      await waiter?.kill();
    }
  });
});
