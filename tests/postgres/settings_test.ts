// The PostgreSQL backend on servers, roles and databases with ordinary,
// non-default settings: every role here is configured with ALTER ROLE ... SET
// or ALTER DATABASE ... SET, as a DBA would, and runlock must keep its promises
// on each: at most one holder, a fence that grows across crashes, dates that
// are Dates, and errors that say what to do. One throwaway cluster of this
// file's own (it restarts it, crashes it and turns it into a standby); its
// tests run one after another.
import assert from "node:assert/strict";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { spawnSync } from "node:child_process";
import { createServer, type Server, type Socket } from "node:net";
import {
  type PgLock,
  type PgLocks,
  pgLocks,
  pgSetupSql,
  RunlockError,
} from "../../src/postgres/mod.ts";
import { Child, waitFor } from "../_helpers.ts";
import { cli } from "../_cli.ts";
import { type Cluster, psql, startCluster } from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";

// This file restarts and crashes its server: it needs the binaries, even
// when RUNLOCK_TEST_PG_URL names a server.
const canRun = pgTestable({
  needs: "binaries",
  untested: "the backend on non-default server settings is NOT tested",
  ciTest:
    "PostgreSQL binaries are available to the settings tests under CI=true",
});

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `settings/${process.pid}-${
    Date.now().toString(36)
  }/${label}/${counter++}`;
}

function child(mode: string, url: string, name: string, ...rest: string[]) {
  return new Child("pg_child.ts", [mode, url, name, ...rest]);
}

/**
 * Sessions of `user` waiting for an advisory lock. This cluster is this
 * file's and its tests run one at a time, so every waiter of that role is
 * the test's (and the count needs no key formula).
 */
function waitersOf(url: string, user: string): number {
  return Number(psql(
    url,
    `SELECT count(*) FROM pg_catalog.pg_locks l
       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND NOT l.granted AND a.usename = :'user'`,
    { user },
  ));
}

/**
 * Advisory locks on bigint keys (objsubid 1: lock names, not the waiting
 * queue's two-int4 nodes) granted to sessions of `user`.
 */
function grantedTo(url: string, user: string): number {
  return Number(psql(
    url,
    `SELECT count(*) FROM pg_catalog.pg_locks l
       JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
        AND a.usename = :'user'`,
    { user },
  ));
}

/** Starts `server` on a free port of 127.0.0.1. */
function listen(server: Server): Promise<Server> {
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve(server))
  );
}

/** The port `server` listens on. */
function port(server: Server): number {
  return (server.address() as { port: number }).port;
}

/** Resolves when the signal aborts (keeping the process alive meanwhile). */
function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  // A held lock's socket does not keep the process alive (by design).
  const keepAlive = setInterval(() => {}, 1_000);
  return new Promise<void>((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  ).finally(() => clearInterval(keepAlive));
}

describe("postgres backend on non-default server, role and database settings", {
  skip: !canRun,
}, () => {
  let cluster: Cluster;
  let url: string;
  /** The URL of `role` on database `db` of this cluster. */
  const as = (role: string, db = "postgres") =>
    `postgres://${role}@127.0.0.1:${cluster.port}/${db}`;
  /**
   * A login role with `settings` (ALTER ROLE ... SET), owning a schema of
   * its own name, where its locks live; returns its URL.
   */
  const role = (name: string, settings: string[] = []): string => {
    psql(
      url,
      [
        `CREATE ROLE ${name} LOGIN`,
        `CREATE SCHEMA ${name} AUTHORIZATION ${name}`,
        ...settings.map((s) => `ALTER ROLE ${name} SET ${s}`),
        "",
      ].join(";\n"),
    );
    return as(name);
  };

  before(async () => {
    cluster = await startCluster({
      own: true,
      conf: [
        // The WAL writer writes an asynchronous commit out within this
        // delay (the default is 200 ms; 10 s is the most it allows): a
        // crash inside it loses the commit. Ten seconds make "inside"
        // certain instead of likely, for case 1. The fence must survive
        // whatever the delay.
        "wal_writer_delay = '10s'",
        // Few connections, so that filling the server takes a moment.
        "max_connections = 30",
      ],
    });
    url = cluster.url;
  });
  after(() => cluster?.stop());

  // Case 9.
  test("a role whose search_path puts its own pg_try_advisory_lock, pg_advisory_lock, pg_advisory_unlock_all, pg_locks and + before pg_catalog still gets one holder at a time, a growing fence and a true inspect: runlock calls pg_catalog's", async () => {
    const user = "rl_evil";
    const evil = role(user);
    // Impostors that record each call and lie about the lock; they win
    // over pg_catalog's for any statement that leaves the names bare.
    psql(
      url,
      `CREATE SCHEMA evil;
       GRANT USAGE ON SCHEMA evil TO PUBLIC;
       CREATE TABLE evil.calls (fn text);
       GRANT INSERT, SELECT ON evil.calls TO PUBLIC;
       CREATE FUNCTION evil.pg_try_advisory_lock(bigint) RETURNS boolean
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_try_advisory_lock'); SELECT true $$;
       CREATE FUNCTION evil.pg_advisory_lock(bigint) RETURNS void
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_lock') $$;
       CREATE FUNCTION evil.pg_try_advisory_lock(integer, integer) RETURNS boolean
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_try_advisory_lock(int, int)'); SELECT true $$;
       CREATE FUNCTION evil.pg_advisory_lock(integer, integer) RETURNS void
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_lock(int, int)') $$;
       CREATE FUNCTION evil.pg_advisory_unlock(integer, integer) RETURNS boolean
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_unlock(int, int)'); SELECT true $$;
       CREATE FUNCTION evil.pg_advisory_unlock(bigint) RETURNS boolean
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_unlock'); SELECT true $$;
       CREATE FUNCTION evil.pg_advisory_unlock_all() RETURNS void
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_advisory_unlock_all') $$;
       CREATE FUNCTION evil.pg_backend_pid() RETURNS integer
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('pg_backend_pid'); SELECT pg_catalog.pg_backend_pid() $$;
       CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('clock_timestamp'); SELECT pg_catalog.clock_timestamp() $$;
       CREATE FUNCTION evil.set_config(text, text, boolean) RETURNS text
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('set_config'); SELECT pg_catalog.set_config($1, $2, $3) $$;
       CREATE FUNCTION evil.to_regclass(text) RETURNS regclass
         LANGUAGE sql AS $$ INSERT INTO evil.calls VALUES ('to_regclass'); SELECT pg_catalog.to_regclass($1) $$;
       CREATE FUNCTION evil.keep(bigint, integer) RETURNS bigint
         LANGUAGE sql AS $$ SELECT $1 $$;
       CREATE OPERATOR evil.+ (LEFTARG = bigint, RIGHTARG = integer, FUNCTION = evil.keep);
       CREATE VIEW evil.pg_locks AS SELECT * FROM pg_catalog.pg_locks WHERE false;
       GRANT SELECT ON evil.pg_locks TO PUBLIC;
       ALTER ROLE ${user} SET search_path = evil, pg_catalog;`,
    );
    assert.equal(
      psql(
        evil,
        "SELECT pg_try_advisory_lock(1); SELECT count(*) FROM evil.calls",
      ),
      "t\n1",
      "the impostor wins for bare names in this role's sessions",
    );

    psql(url, "TRUNCATE evil.calls");
    const options = { schema: user };
    const json = JSON.stringify(options);
    const name = unique("shadowed");
    await using locks = pgLocks(evil, options);
    const first = await locks.acquire(name);
    const waiter = child("hold", evil, name, "30000", json);
    try {
      const refused = await child("try", evil, name, "0", json).expect("held");
      assert.equal(refused.holder, process.pid);
      assert.equal(grantedTo(url, user), 1, "one advisory lock, ours");
      const info = await locks.inspect(name);
      assert.equal(info.state, "held");
      assert.equal(info.pid, process.pid);
      assert.equal(info.fence, first.fence);
      // A waiter really waits (pg_catalog.pg_advisory_lock), and gets the
      // lock when we release it (pg_catalog.pg_advisory_unlock_all), with
      // a higher fence (pg_catalog's +).
      await waitFor(
        () => waitersOf(url, user) >= 1,
        "the waiter waits in pg_advisory_lock",
        120_000, // a hang detector: a child starts on a loaded machine
      );
      await first.release();
      const got = await waiter.expect("acquired");
      assert.ok(
        BigInt(got.fence as string) > first.fence,
        `fence ${got.fence} after ${first.fence}`,
      );
      waiter.send("release");
      await waiter.expect("released");
      const again = await locks.acquire(name);
      assert.ok(again.fence > BigInt(got.fence as string));
      await again.release();
      assert.equal(grantedTo(url, user), 0, "released means unlocked");
    } finally {
      await waiter.kill();
    }
    assert.equal(
      psql(
        url,
        "SELECT count(*) || ':' || coalesce(string_agg(DISTINCT fn, ','), '') FROM evil.calls",
      ),
      "0:",
      "runlock called an impostor",
    );
  });

  // Case 10: DateStyle (and TimeZone, which ISO output carries as an offset).
  test("acquiredAt and inspect().started are real Dates (the record's time) for roles with DateStyle 'SQL, DMY', and 'German' with TimeZone 'Asia/Kathmandu'", async () => {
    const roles = [
      { user: "rl_sql_dmy", style: "SQL, DMY", zone: undefined },
      { user: "rl_german", style: "German", zone: "Asia/Kathmandu" },
    ];
    for (const { user, style, zone } of roles) {
      const u = role(user, [
        `DateStyle = '${style}'`,
        ...(zone ? [`TimeZone = '${zone}'`] : []),
      ]);
      assert.match(
        psql(u, "SHOW DateStyle"),
        new RegExp(`^${style.split(",")[0]}`),
      );
      const name = unique(user);
      await using locks = pgLocks(u, { schema: user });
      await using lock = await locks.acquire(name);
      const recorded = Number(psql(
        url,
        `SELECT floor(extract(epoch FROM started) * 1000) FROM ${user}.runlock_locks WHERE name = :'name'`,
        { name },
      ));
      assert.ok(
        lock.acquiredAt instanceof Date,
        `${style}: acquiredAt is ${lock.acquiredAt}`,
      );
      assert.equal(lock.acquiredAt.getTime(), recorded, style);
      const info = await locks.inspect(name);
      assert.ok(
        info.started instanceof Date,
        `${style}: started is ${info.started}`,
      );
      assert.equal(info.started.getTime(), recorded, style);
    }
  });

  // A guard, not a fix of runlock's: node-postgres sends client_encoding
  // UTF8 in every startup packet (pg-protocol's serializer), which wins
  // over the role's and the database's encoding. Were that to change,
  // names and meta would be stored mangled and read as another's.
  test("a role with client_encoding 'LATIN1' records a non-ASCII name and meta as they are: another role's inspect finds them held", async () => {
    const user = "rl_latin1";
    const u = role(user, ["client_encoding = 'LATIN1'"]);
    assert.equal(psql(u, "SHOW client_encoding"), "LATIN1");
    const name = unique("café-ü-€");
    const meta = { cmd: "naïve ☃" };
    await using locks = pgLocks(u, { schema: user });
    await using lock = await locks.acquire(name, { meta });
    assert.equal(
      psql(
        url,
        `SELECT name || ' ' || (meta->>'cmd') FROM ${user}.runlock_locks WHERE fence = :'fence'`,
        { fence: String(lock.fence) },
      ),
      `${name} ${meta.cmd}`,
    );
    await using other = pgLocks(url, { schema: user }); // a UTF8 session
    const info = await other.inspect(name);
    assert.equal(info.state, "held");
    assert.equal(info.foreign, false, info.reason);
    assert.equal(info.pid, process.pid);
    assert.deepEqual(info.meta, meta);
    assert.deepEqual((await locks.inspect(name)).meta, meta);
  });

  // The URL is the caller's, but node-postgres would let its `options`
  // replace every pinned setting, and its statement_timeout (sent after
  // them) override ours.
  test("settings in the URL do not undo the pinned ones: its options' DateStyle leaves acquiredAt a Date, its statement_timeout and query_timeout cut no wait, and its other parameters (application_name) still apply", async () => {
    const user = "rl_urlopts";
    const plain = role(user);
    const options = encodeURIComponent("-c DateStyle=German");
    const u = `${plain}?options=${options}&statement_timeout=200` +
      `&application_name=from%20the%20url&query_timeout=300`;
    const json = JSON.stringify({ schema: user });
    const name = unique("urlopts");
    await using locks = pgLocks(plain, { schema: user });
    const first = await locks.acquire(name);
    const waiter = child("hold", u, name, "60000", json);
    try {
      // Waiting past both timeouts: its wait statement has run for 1 s.
      await waitFor(
        async () => {
          if (!waiter.running) {
            const said = await waiter.next().catch((e) => e);
            throw new Error(`the waiter exited: ${JSON.stringify(said)}`);
          }
          return Number(psql(
            url,
            `SELECT count(*) FROM pg_catalog.pg_stat_activity
              WHERE usename = :'user' AND wait_event_type = 'Lock'
                AND application_name = 'from the url'
                AND now() - query_start > interval '1 s'`,
            { user },
          )) >= 1;
        },
        "the waiter waits past statement_timeout and query_timeout",
        120_000, // a hang detector: a child starts on a loaded machine
      );
      await first.release();
      const got = await waiter.expect("acquired");
      assert.ok(BigInt(got.fence as string) > first.fence);
      waiter.send("release");
      await waiter.expect("released");
    } finally {
      await waiter.kill();
    }
    await using viaUrl = pgLocks(u, { schema: user });
    await using lock = await viaUrl.acquire(unique("urlopts-date"));
    assert.ok(
      lock.acquiredAt instanceof Date,
      `acquiredAt is ${lock.acquiredAt}`,
    );
    assert.ok(Number.isFinite(lock.acquiredAt.getTime()));
    assert.throws(
      () => pgLocks(`${plain}?options=endpoint%3Dep-1`),
      /may hold only -c name=value settings/,
    );
  });

  // Case 10: privileges.
  test("a role that may not create runlock's table gets a RunlockError naming the table, the grant that fixes it and the DDL to run once; `runlock db-setup` prints that DDL, and with only SELECT, INSERT and UPDATE on the table the role takes locks", async () => {
    const user = "rl_nocreate";
    psql(url, `CREATE ROLE ${user} LOGIN`);
    const u = as(user);
    const name = unique("nocreate");
    // PostgreSQL 15+: no CREATE on schema public for non-owners.
    {
      await using locks = pgLocks(u);
      const err = await locks.acquire(name).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      const m = err.message;
      assert.match(m, /"public"\.runlock_locks/, m);
      assert.match(m, /permission denied for schema public/, m);
      assert.match(m, /GRANT CREATE ON SCHEMA "public" TO "rl_nocreate"/, m);
      assert.match(m, /CREATE TABLE IF NOT EXISTS "public"\.runlock_locks/, m);
      assert.match(m, /runlock db-setup/, m);
      // Probes need no table: free, and nothing created.
      assert.equal((await locks.inspect(name)).state, "free");
    }
    // A schema that does not exist: creating it needs CREATE on the database.
    {
      await using locks = pgLocks(u, { schema: "rl_absent" });
      const err = await locks.acquire(name).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      const m = err.message;
      assert.match(m, /schema "rl_absent"/, m);
      assert.match(
        m,
        /GRANT CREATE ON DATABASE "postgres" TO "rl_nocreate"/,
        m,
      );
      assert.match(m, /CREATE SCHEMA "rl_absent"/, m);
    }
    // Another schema: CREATE SCHEMA too; no role, no grants; usage errors.
    const ops = cli("db-setup", "--schema=ops");
    assert.equal(ops.code, 0, ops.stderr);
    assert.match(ops.stdout, /CREATE SCHEMA "ops";/);
    assert.doesNotMatch(ops.stdout, /^GRANT/m);
    const bad = cli("db-setup", "--schema=", "extra");
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /db-setup/);
    // The DDL, printed by the CLI, run once by the owner (here: postgres).
    const setup = cli("db-setup", `--db=${u}`);
    assert.equal(setup.code, 0, setup.stderr);
    assert.match(
      setup.stdout,
      /CREATE TABLE IF NOT EXISTS "public"\.runlock_locks/,
    );
    assert.match(
      setup.stdout,
      /GRANT SELECT, INSERT, UPDATE ON "public"\.runlock_locks TO "rl_nocreate"/,
    );
    psql(url, setup.stdout);
    psql(url, setup.stdout); // idempotent
    assert.equal(
      psql(
        url,
        `SELECT pg_catalog.has_table_privilege('rl_nocreate', 'public.runlock_locks', 'DELETE')::text || ' ' ||
                pg_catalog.has_schema_privilege('rl_nocreate', 'public', 'CREATE')::text`,
      ),
      "false false",
    );
    await using locks = pgLocks(u);
    const lock = await locks.acquire(name);
    assert.equal((await locks.inspect(name)).state, "held");
    await lock.release();
    await using next = await locks.acquire(name);
    assert.ok(next.fence > lock.fence);
  });

  // The schema's bytes, not its characters: the server cuts a name to 63.
  test("a schema name over 63 bytes in UTF-8 (33 characters of 'ü') is a TypeError before anything touches the database, so two names the server cuts to one table never get two keys; 63 bytes are accepted", async () => {
    const long = "ü".repeat(31) + "ab"; // 64 bytes, 33 characters
    for (const schema of [long, "ü".repeat(31) + "ac"]) {
      assert.throws(
        () => pgLocks(url, { schema }),
        (e: Error) => e instanceof TypeError && /63 bytes/.test(e.message),
      );
      assert.throws(
        () => pgSetupSql({ schema }),
        (e: Error) => e instanceof TypeError && /63 bytes/.test(e.message),
      );
    }
    assert.throws(() => pgSetupSql({ role: long }), TypeError);
    const fits = "ü".repeat(31) + "a"; // 63 bytes
    await using locks = pgLocks(url, { schema: fits });
    await using lock = await locks.acquire(unique("63-bytes"));
    assert.equal(
      psql(
        url,
        "SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname = :'s'",
        { s: fits },
      ),
      "1",
    );
    assert.ok(lock.fence >= 1n);
  });

  // The setup SQL is run as an owner: a name must not end a comment line.
  test("schema and role names with control characters are TypeErrors (pgLocks, pgSetupSql, `runlock db-setup` exit 2), and the setup SQL names nothing in its comments: a schema with quotes, a backslash, '--' and '$runlock$' runs clean under psql ON_ERROR_STOP, twice", () => {
    const injected = "a\nSELECT 666 AS injected;";
    for (const schema of [injected, "a\rb", "a\u007fb", "a\u0000b"]) {
      assert.throws(
        () => pgLocks(url, { schema }),
        (e: Error) =>
          e instanceof TypeError && /control characters/.test(e.message),
      );
      assert.throws(() => pgSetupSql({ schema }), TypeError);
    }
    assert.throws(() => pgSetupSql({ role: "app\nx" }), TypeError);
    const refused = cli("db-setup", `--schema=${injected}`);
    assert.equal(refused.code, 2, refused.stdout);
    assert.equal(refused.stdout, "");
    assert.match(refused.stderr, /control characters/);
    const odd = `it's "q" \\ -- $runlock$ x`;
    const sql = pgSetupSql({ schema: odd, role: "rl_odd'role" });
    for (const line of sql.split("\n").filter((l) => l.startsWith("--"))) {
      assert.ok(!line.includes("it's") && !line.includes("rl_odd"), line);
    }
    psql(url, `CREATE ROLE "rl_odd'role" LOGIN`);
    const printed = cli(
      "db-setup",
      `--schema=${odd}`,
      `--db=${as(encodeURIComponent("rl_odd'role"))}`,
    );
    assert.match(printed.stdout, /TO "rl_odd'role";/);
    assert.equal(printed.code, 0, printed.stderr);
    for (const text of [sql, sql, printed.stdout]) psql(url, text);
    assert.equal(
      psql(
        url,
        `SELECT pg_catalog.has_table_privilege('rl_odd''role', pg_catalog.quote_ident(:'s') || '.runlock_locks', 'UPDATE')`,
        { s: odd },
      ),
      "t",
    );
  });

  // CREATE SCHEMA IF NOT EXISTS checks CREATE on the database first.
  test("`runlock db-setup --schema=S` runs clean under psql ON_ERROR_STOP as the owner of an existing schema S who may not create schemas, and creates S when run by a role that may", () => {
    psql(
      url,
      `CREATE ROLE rl_owner2 LOGIN;
       CREATE SCHEMA rl_ops2 AUTHORIZATION rl_owner2;
       CREATE ROLE rl_ops2_user LOGIN;
       CREATE ROLE rl_dbcreator LOGIN;
       GRANT CREATE ON DATABASE postgres TO rl_dbcreator;`,
    );
    const existing = cli(
      "db-setup",
      "--schema=rl_ops2",
      `--db=${as("rl_ops2_user")}`,
    );
    assert.equal(existing.code, 0, existing.stderr);
    psql(as("rl_owner2"), existing.stdout);
    psql(as("rl_owner2"), existing.stdout);
    const fresh = cli("db-setup", "--schema=rl_new3");
    assert.equal(fresh.code, 0, fresh.stderr);
    psql(as("rl_dbcreator"), fresh.stdout);
    psql(as("rl_dbcreator"), fresh.stdout);
    assert.equal(
      psql(
        url,
        `SELECT string_agg(n.nspname || ':' || pg_catalog.pg_get_userbyid(c.relowner), ',' ORDER BY n.nspname)
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relname = 'runlock_locks' AND n.nspname IN ('rl_ops2', 'rl_new3')`,
      ),
      "rl_new3:rl_dbcreator,rl_ops2:rl_owner2",
    );
  });

  // Decided on the error's code, not the server's words.
  test("connect errors whose server message says 'timeout' (a role timeout_svc, a database session_timeouts, a URL setting deadlock_timeout a role may not set) are reported as the server's error, not 'no answer within'; a server that never answers is", async () => {
    psql(url, "CREATE ROLE rl_plain LOGIN");
    const cases: [string, RegExp][] = [
      [as("timeout_svc"), /role "timeout_svc" does not exist/],
      [as("postgres", "session_timeouts"), /database "session_timeouts"/],
      [
        `${as("rl_plain")}?options=${
          encodeURIComponent("-c deadlock_timeout=2s")
        }`,
        /permission denied to set parameter "deadlock_timeout"/,
      ],
    ];
    for (const [u, expected] of cases) {
      await using locks = pgLocks(u);
      const err = await locks.acquire(unique("timeout-words")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, expected);
      assert.doesNotMatch(err.message, /no answer within/);
    }
    // A listener that accepts and never says a word.
    const sockets: Socket[] = [];
    const silent = await listen(createServer((s) => void sockets.push(s)));
    try {
      await using locks = pgLocks(
        `postgres://postgres@127.0.0.1:${port(silent)}/postgres`,
        { connectTimeout: 300 },
      );
      const err = await locks.acquire(unique("silent")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /no answer within 300 ms/);
    } finally {
      for (const s of sockets) s.destroy();
      silent.close();
    }
  });

  // PostgreSQL 13 is not installed here: a listener that answers the
  // startup packet with the error PostgreSQL 13 sends for runlock's
  // "-c idle_session_timeout=0" (FATAL 42704), byte for byte.
  test("a server that refuses idle_session_timeout at startup (42704, as PostgreSQL 13 does) is reported as older than PostgreSQL 14", async () => {
    const enc = new TextEncoder();
    const field = (t: string, v: string) => [
      t.charCodeAt(0),
      ...enc.encode(v),
      0,
    ];
    const body = [
      ...field("S", "FATAL"),
      ...field("V", "FATAL"),
      ...field("C", "42704"),
      ...field(
        "M",
        'unrecognized configuration parameter "idle_session_timeout"',
      ),
      0,
    ];
    const msg = new Uint8Array(5 + body.length);
    msg[0] = "E".charCodeAt(0);
    new DataView(msg.buffer).setInt32(1, 4 + body.length);
    msg.set(body, 5);
    const pg13 = await listen(
      createServer((s) =>
        s.once("data", () => {
          s.write(msg);
          s.end();
        })
      ),
    );
    try {
      await using locks = pgLocks(
        `postgres://postgres@127.0.0.1:${port(pg13)}/postgres`,
      );
      const err = await locks.acquire(unique("pg13")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /older than PostgreSQL 14/, err.message);
    } finally {
      pg13.close();
    }
  });

  // The advice for 42501 says which kind of refusal it was.
  test("privilege errors say what refused: a row-level security policy (not grants), SELECT only for a probe, and the role the session runs as for a user with ALTER ROLE ... SET role; the CREATE advice quotes --schema for the shell", async () => {
    // Row-level security, forced on the owner too.
    const rls = role("rl_rls");
    {
      await using locks = pgLocks(rls, { schema: "rl_rls" });
      await (await locks.acquire(unique("rls-create"))).release();
    }
    psql(
      url,
      `ALTER TABLE rl_rls.runlock_locks ENABLE ROW LEVEL SECURITY;
       ALTER TABLE rl_rls.runlock_locks FORCE ROW LEVEL SECURITY;
       CREATE POLICY nothing ON rl_rls.runlock_locks USING (true) WITH CHECK (false);`,
    );
    {
      await using locks = pgLocks(rls, { schema: "rl_rls" });
      const err = await locks.acquire(unique("rls")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /row-level security policy/);
      assert.match(err.message, /not a missing grant/, err.message);
      assert.doesNotMatch(err.message, /needs USAGE/, err.message);
    }
    // A probe without SELECT.
    psql(
      url,
      "CREATE ROLE rl_noselect LOGIN; GRANT USAGE ON SCHEMA rl_rls TO rl_noselect",
    );
    {
      await using locks = pgLocks(as("rl_noselect"), { schema: "rl_rls" });
      const err = await locks.inspect(unique("probe")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(
        err.message,
        /SELECT on its runlock_locks table, nothing more/,
      );
      assert.doesNotMatch(err.message, /INSERT|UPDATE/, err.message);
    }
    // Sessions of rl_sw run as rl_team, which has no grants.
    psql(
      url,
      `CREATE ROLE rl_team NOLOGIN;
       CREATE ROLE rl_sw LOGIN IN ROLE rl_team;
       CREATE SCHEMA rl_swops;
       CREATE TABLE rl_swops.runlock_locks (LIKE rl_rls.runlock_locks INCLUDING ALL);
       GRANT USAGE ON SCHEMA rl_swops TO rl_sw;
       GRANT SELECT, INSERT, UPDATE ON rl_swops.runlock_locks TO rl_sw;
       ALTER ROLE rl_sw SET role = 'rl_team';`,
    );
    {
      await using locks = pgLocks(as("rl_sw"), { schema: "rl_swops" });
      const err = await locks.acquire(unique("sw")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /permission denied/);
      assert.match(err.message, /current_user/, err.message);
      assert.match(err.message, /ALTER ROLE \.\.\. SET role/, err.message);
    }
    // CREATE refused in an existing schema with a space in its name.
    psql(
      url,
      `CREATE SCHEMA "My Ops"; CREATE ROLE rl_myops LOGIN;
       GRANT USAGE ON SCHEMA "My Ops" TO rl_myops`,
    );
    {
      await using locks = pgLocks(as("rl_myops"), { schema: "My Ops" });
      const err = await locks.acquire(unique("myops")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      const command = /`runlock db-setup --db=URL([^`]*)`/.exec(err.message);
      assert.ok(command, err.message);
      const words = spawnSync("sh", ["-c", `printf '%s\\n' ${command[1]}`], {
        encoding: "utf8",
      }).stdout;
      assert.equal(words, "--schema=My Ops\n", err.message);
    }
    // Refused before creating anything (no USAGE on the schema).
    psql(url, "CREATE ROLE rl_myops2 LOGIN");
    {
      await using locks = pgLocks(as("rl_myops2"), { schema: "My Ops" });
      const err = await locks.acquire(unique("myops2")).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /permission denied for schema My Ops/);
      const command = /`runlock db-setup --db=URL([^`]*)`/.exec(err.message);
      assert.ok(command, err.message);
      const words = spawnSync("sh", ["-c", `printf '%s\\n' ${command[1]}`], {
        encoding: "utf8",
      }).stdout;
      assert.equal(words, "--schema=My Ops\n", err.message);
    }
  });

  // node-postgres reads PGDATABASE, PGPORT, ?user= ...; so must runlock.
  test("the server, database and user runlock names are those node-postgres connects to: PGDATABASE for a URL without one (a lock of the same name in another database is not 'held by this process'), PGPORT, and ?user= over the URL's user", async () => {
    psql(url, "CREATE DATABASE rl_envdb");
    const name = unique("envdb");
    const env = process.env;
    const saved = { PGDATABASE: env.PGDATABASE, PGPORT: env.PGPORT };
    const restore = () => {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete env[k];
        else env[k] = v;
      }
    };
    let inEnvDb: PgLock;
    let a: PgLocks;
    try {
      env.PGDATABASE = "rl_envdb";
      a = pgLocks(`postgres://postgres@127.0.0.1:${cluster.port}`);
      inEnvDb = await a.acquire(name);
    } finally {
      restore();
    }
    try {
      assert.equal(
        psql(
          as("postgres", "rl_envdb"),
          "SELECT count(*) FROM public.runlock_locks WHERE name = :'name'",
          { name },
        ),
        "1",
        "the client connected to PGDATABASE",
      );
      await using b = pgLocks(as("postgres"));
      await using other = await b.acquire(name);
      assert.ok(other.fence >= 1n);
    } finally {
      await inEnvDb.release();
      await a.end();
    }
    try {
      env.PGPORT = String(cluster.port);
      await using c = pgLocks("postgres://postgres@127.0.0.1/rl_nosuchdb");
      const err = await c.acquire(name).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /database "rl_nosuchdb" does not exist/);
      assert.ok(
        err.message.includes(`127.0.0.1:${cluster.port}, database`),
        err.message,
      );
    } finally {
      restore();
    }
    await using d = pgLocks(`${as("nobody")}?user=rl_query_user`);
    const err = await d.acquire(name).catch((e) => e);
    assert.ok(err instanceof RunlockError, String(err));
    assert.match(err.message, /role "rl_query_user" does not exist/);
    assert.match(err.message, /user "rl_query_user"/, err.message);
  });

  test("a URL with ?replication=database (or PGREPLICATION) still takes locks: lock sessions are ordinary sessions; a URL whose options set transaction_isolation is a TypeError naming it", async () => {
    const name = unique("replication");
    {
      await using locks = pgLocks(`${url}?replication=database`);
      await using lock = await locks.acquire(name);
      assert.ok(lock.fence >= 1n);
    }
    const saved = process.env.PGREPLICATION;
    try {
      process.env.PGREPLICATION = "database";
      await using locks = pgLocks(url);
      await using lock = await locks.acquire(name);
      assert.ok(lock.fence >= 2n);
    } finally {
      if (saved === undefined) delete process.env.PGREPLICATION;
      else process.env.PGREPLICATION = saved;
    }
    assert.throws(
      () =>
        pgLocks(
          `${url}?options=${
            encodeURIComponent("-c transaction_isolation=serializable")
          }`,
        ),
      (e: Error) =>
        e instanceof TypeError && /transaction_isolation/.test(e.message),
    );
  });

  test("`runlock db-setup --db=URL` grants to the role node-postgres connects as: ?user= over the URL's user, PGUSER for a URL without one", () => {
    const query = cli("db-setup", "--db=postgres://nobody@db/app?user=rl_q");
    assert.equal(query.code, 0, query.stderr);
    assert.match(query.stdout, /TO "rl_q";/);
    assert.doesNotMatch(query.stdout, /nobody/);
    const saved = process.env.PGUSER;
    try {
      process.env.PGUSER = "rl_from_env";
      const fromEnv = cli("db-setup", "--db=postgres://db/app");
      assert.equal(fromEnv.code, 0, fromEnv.stderr);
      assert.match(fromEnv.stdout, /TO "rl_from_env";/);
      const empty = cli("db-setup", "--db=postgres://@/app");
      assert.equal(empty.code, 0, empty.stderr);
      assert.match(empty.stdout, /TO "rl_from_env";/);
    } finally {
      if (saved === undefined) delete process.env.PGUSER;
      else process.env.PGUSER = saved;
    }
  });

  // Case 2: isolation.
  test("every waiter takes the lock in turn, with a growing fence, when the role has default_transaction_isolation 'repeatable read' or the database 'serializable' (3 waiters each)", async () => {
    const rr = role("rl_rr", [
      "default_transaction_isolation = 'repeatable read'",
    ]);
    psql(url, "CREATE DATABASE rl_serializable");
    psql(
      url,
      "ALTER DATABASE rl_serializable SET default_transaction_isolation = 'serializable'",
    );
    const ser = as("postgres", "rl_serializable");
    assert.equal(
      psql(rr, "SHOW default_transaction_isolation"),
      "repeatable read",
    );
    assert.equal(
      psql(ser, "SHOW default_transaction_isolation"),
      "serializable",
    );
    const handOff = async (u: string, user: string, schema: string) => {
      const name = unique(`iso-${schema}`);
      const json = JSON.stringify({ schema });
      await using locks = pgLocks(u, { schema });
      const first = await locks.acquire(name);
      const waiters = Array.from(
        { length: 3 },
        () => child("hold", u, name, "60000", json),
      );
      try {
        await waitFor(
          () => waitersOf(url, user) >= 3,
          `3 waiters of ${user} in pg_advisory_lock`,
          120_000, // a hang detector: six children start on a loaded machine
        );
        // Each waiter's first event: "acquired", or the error it died of.
        const pending = new Map(
          waiters.map((w) => [w, w.next().then((e) => ({ w, e }))]),
        );
        await first.release();
        let last = first.fence;
        while (pending.size > 0) {
          const { w, e } = await Promise.race(pending.values());
          pending.delete(w);
          assert.equal(e.event, "acquired", `${schema}: ${JSON.stringify(e)}`);
          const fence = BigInt(e.fence as string);
          assert.ok(fence > last, `${schema}: fence ${fence} after ${last}`);
          last = fence;
          w.send("release");
          await w.expect("released");
        }
      } finally {
        for (const w of waiters) await w.kill();
      }
    };
    await Promise.all([
      handOff(rr, "rl_rr", "rl_rr"),
      handOff(ser, "postgres", "public"),
    ]);
  });

  // Case 2: read-only default.
  test("a role with default_transaction_read_only = on creates the table, takes, inspects and releases locks", async () => {
    const user = "rl_readonly";
    const u = role(user, ["default_transaction_read_only = on"]);
    assert.equal(psql(u, "SHOW default_transaction_read_only"), "on");
    const name = unique("readonly");
    await using locks = pgLocks(u, { schema: user });
    const lock = await locks.acquire(name);
    assert.equal((await locks.inspect(name)).state, "held");
    await lock.release();
    assert.equal((await locks.inspect(name)).state, "free");
    await using next = await locks.acquire(name);
    assert.ok(next.fence > lock.fence);
  });

  test("a role whose default sets runlock's own setting (runlock.session) still takes, inspects and releases locks: a new session is no client's, whatever the role says", async () => {
    const user = "rl_claimed";
    const u = role(user, ["\"runlock.session\" = 'someone'"]);
    assert.equal(psql(u, "SHOW runlock.session"), "someone");
    const name = unique("claimed");
    await using locks = pgLocks(u, { schema: user });
    const lock = await locks.acquire(name);
    assert.equal((await locks.inspect(name)).state, "held");
    await lock.release();
    await using next = await locks.acquire(name);
    assert.ok(next.fence > lock.fence);
  });

  // Case 10: no free connection.
  test("at max_connections, acquire and inspect fail with a RunlockError saying the server has no free connection and that each needs a session of its own", async () => {
    const schema = "rl_full";
    const held: PgLock[] = [];
    await using locks = pgLocks(url, { schema });
    let refused: unknown;
    try {
      for (let i = 0; i < 100 && refused === undefined; i++) {
        try {
          held.push(await locks.acquire(unique(`full-${i}`)));
        } catch (err) {
          refused = err;
        }
      }
      assert.ok(held.length >= 10, `only ${held.length} locks`);
      assert.ok(refused instanceof RunlockError, String(refused));
      const a = refused.message;
      assert.match(a, /no free connection/, a);
      assert.match(a, /max_connections/, a);
      assert.match(a, /each held lock needs a session of its own/, a);
      await using probe = pgLocks(url, { schema });
      const err = await probe.inspect(held[0].path).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      assert.match(err.message, /no free connection/, err.message);
      assert.match(
        err.message,
        /inspect needs a session of its own/,
        err.message,
      );
    } finally {
      for (const lock of held) await lock.release();
    }
    await using probe = pgLocks(url, { schema });
    assert.equal((await probe.inspect(held[0].path)).state, "free");
  });

  // Case 2: a server that truly cannot write.
  test("on a hot standby (a server in recovery), acquire fails with a RunlockError saying the server is read-only and runlock needs the primary", async () => {
    const schema = "rl_standby";
    const name = unique("standby");
    {
      await using locks = pgLocks(url, { schema });
      await (await locks.acquire(name)).release();
    }
    cluster.restartAsStandby();
    try {
      assert.equal(psql(url, "SELECT pg_catalog.pg_is_in_recovery()"), "t");
      await using locks = pgLocks(url, { schema });
      const err = await locks.acquire(name).catch((e) => e);
      assert.ok(err instanceof RunlockError, String(err));
      const m = err.message;
      assert.match(m, /read-only/, m);
      assert.match(m, /standby|recovery/, m);
      assert.match(m, /primary/, m);
    } finally {
      cluster.promote();
    }
    await using locks = pgLocks(url, { schema });
    await using lock = await locks.acquire(name);
    assert.ok(lock.fence >= 2n);
  });

  // Case 1.
  test("with synchronous_commit = off on the role, every fence handed out survives a postmaster crash (SIGQUIT): each next holder's fence is higher (3 crashes)", async () => {
    const user = "rl_async";
    const u = role(user, ["synchronous_commit = off"]);
    assert.equal(psql(u, "SHOW synchronous_commit"), "off");
    const name = unique("crash");
    const options = { schema: user };
    {
      // The table and a first record, made durable by a checkpoint, so
      // that a lost table cannot stand in for a lost fence.
      await using locks = pgLocks(u, options);
      await (await locks.acquire(name)).release();
      psql(url, "CHECKPOINT");
    }
    const fences: bigint[] = [];
    for (let round = 0; round <= 3; round++) {
      const locks = pgLocks(u, options);
      const lock = await locks.acquire(name, { timeout: 30_000 });
      const highest = fences.reduce((a, b) => a > b ? a : b, 0n);
      fences.push(lock.fence);
      assert.ok(
        lock.fence > highest,
        `fences handed out: ${fences.join(", ")} (after crash ${round})`,
      );
      if (round < 3) {
        // Right after acquire returned: the fence is the client's now.
        cluster.restart("immediate");
        await aborted(lock.signal);
        await lock.release().catch(() => {}); // LockLostError, once
      } else {
        await lock.release();
      }
      await locks.end();
    }
    console.log(`fences across 3 crashes: ${fences.join(", ")}`);
  });
});
