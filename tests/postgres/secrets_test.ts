// What the PostgreSQL backend prints about its URL and its server: never a
// password (whatever characters it holds, escaped or not, in the URL's user
// part or its query, or in a string that is no URL at all), through the
// library (message and stack), the CLI's --db= and RUNLOCK_DATABASE_URL
// (stdout and stderr, --json too); the server's hint kept in the message
// made from its error; and a server without TLS asked for TLS said in one
// line, with no warning of the client's on stderr. Real servers (one of
// them with TLS, one with a small lock table) and real processes. Without
// PostgreSQL binaries (and no URL) the tests skip with a loud message,
// except under CI=true, where that fails.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, chownSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { pgLocks, RunlockError } from "../../src/postgres/mod.ts";
import { cli, cliCommand, cliPgTestable, type Result } from "../_cli.ts";
import {
  type Cluster,
  freePort,
  psql,
  psqlSession,
  startCluster,
} from "../fixtures/pg_cluster.ts";
import { pgBinariesAvailable, pgTestable } from "../fixtures/pg_available.ts";

const hasServer = pgTestable({
  needs: "server",
  untested: "the PostgreSQL backend's secrets are NOT tested",
  ciTest: "PostgreSQL is available to the secrets tests under CI=true",
});
const cliTestable = hasServer && cliPgTestable("the CLI's --db secrets");
const ownClusters = pgBinariesAvailable;
const hasOpenssl = spawnSync("openssl", ["version"]).status === 0;

/**
 * Every secret below holds "Zq" between its special characters, so that
 * any piece of one that reaches the output shows as a "Zq".
 */
const MARK = /Zq/;

/**
 * URLs (and strings that are no URL) whose password must never be printed,
 * on a port where nothing listens: each fails at pgLocks() or at its first
 * connection.
 */
function secretUrls(port: number): string[] {
  const at = `127.0.0.1:${port}`;
  return [
    // Unescaped "/", "+", "=" (base64), "?", "#", "@", ":" and a space.
    `postgres://app:Zq/cZq@${at}/db`,
    `postgres://app:Zq9+Zq/Zq==@${at}/db`,
    `postgres://app:p@Zq:w/Zq@${at}/db`,
    `postgres://app:Zq?Zq#Zq@${at}/db`,
    `postgres://app:Zq#Zq@${at}/db`,
    `postgres://app:Zq@Zq@${at}/db`,
    `postgres://app:Zq:Zq@${at}/db`,
    `postgres://app:Zq Zq@${at}/db`,
    // Digits, then "/": a URL parser's host "app" and port 00731.
    `postgres://app:00731/Zq@${at}/db`,
    // A bad percent-escape; then escaped right.
    `postgres://app:Zq%Zq@${at}/db`,
    `postgres://app:Zq%2FZq%40Zq@${at}/db`,
    // In the query, with an unescaped "&", and with a percent-escaped key.
    `postgres://app@${at}/db?password=Zq&Zq`,
    `postgres://app@${at}/db?pass%77ord=Zq`,
    // The 'options' parameter refused, the password before or in the query.
    `postgres://app:Zq/Zq@${at}/db?options=--bad`,
    `postgres://app:Zq@${at}/db?options=--bad`,
    `postgres://app@${at}/db?password=Zq/Zq&options=-cfoo`,
    // No URL: no scheme, another scheme, libpq's key=value form.
    `app:Zq/Zq@${at}/db`,
    `app:Zq@${at}/db`,
    `http://app:Zq/Zq@${at}/db`,
    `host=127.0.0.1 port=${port} user=app password=Zq`,
  ];
}

/** The error pgLocks(url) or its first acquire ends with. */
async function failure(url: unknown): Promise<Error> {
  let locks: ReturnType<typeof pgLocks>;
  try {
    locks = pgLocks(url as string);
  } catch (err) {
    return err as Error;
  }
  try {
    await (await locks.acquire("x")).release();
  } catch (err) {
    return err as Error;
  } finally {
    await locks.end();
  }
  throw new Error(`${String(url)} connected`);
}

/** The CLI with extra environment variables. */
function cliEnv(env: Record<string, string>, ...args: string[]): Result {
  const [cmd, ...pre] = cliCommand();
  const r = spawnSync(cmd, [...pre, ...args], {
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1", ...env },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Asserts that nothing of a secret is in `text`. */
function noSecret(text: string, what: string): void {
  assert.doesNotMatch(text, MARK, `${what} printed a password:\n${text}`);
  assert.doesNotMatch(text, /00731/, `${what} printed a password:\n${text}`);
}

describe("PostgreSQL URL secrets and server advice", {
  skip: !hasServer,
}, () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster();
  });
  after(() => cluster?.stop());

  test("pgLocks() never prints a password, whatever characters it holds and however it is escaped, in its error's message or stack", async () => {
    const port = await freePort();
    for (const url of secretUrls(port)) {
      const err = await failure(url);
      noSecret(`${err.message}\n${err.stack}`, JSON.stringify(url));
      // The message still says what is wrong.
      assert.match(
        err.message,
        /postgres:\/\/|percent|'options'|connection refused/,
        err.message,
      );
    }
    // What the URLs with "/", "?", "#" unescaped say: percent-encode.
    const slash = await failure(`postgres://app:Zq/cZq@127.0.0.1:${port}/db`);
    assert.ok(slash instanceof TypeError);
    assert.equal(
      slash.message,
      `Cannot create pgLocks as 'url' has an '@' after its host, so what it names as the host, port or database may be part of a password: write a '/', '?', '#' or '@' of a password (or of a query value) percent-encoded (%2F, %3F, %23, %40): current value is "postgres://app:***@127.0.0.1:${port}/db"`,
    );
    const bare = await failure(`app:Zq@127.0.0.1:${port}/db`);
    assert.match(bare.message, /current value is "app:\*\*\*@127\.0\.0\.1:/);
    // A URL object (not a string) is not printed either.
    const object = await failure(new URL(`postgres://app:Zq@127.0.0.1/db`));
    assert.ok(object instanceof TypeError);
    noSecret(`${object.message}\n${object.stack}`, "a URL object");
    // Escaped right, the URL connects (refused here), naming the server.
    const escaped = await failure(
      `postgres://app:Zq%2FZq%40Zq@127.0.0.1:${port}/db`,
    );
    assert.ok(escaped instanceof RunlockError, String(escaped));
    assert.match(escaped.message, /connection refused/);
  });

  test("a wrong password with escaped special characters fails naming the user, never the password, in message or stack", async (t) => {
    // The fixture's role that needs a password (pg_hba.conf), on its
    // clusters; an outside server may not have it.
    const user = cluster.passwordRole?.user ?? "runlock_pw";
    const exists = psql(
      cluster.url,
      "SELECT count(*) FROM pg_roles WHERE rolname = :'user'",
      { user },
    );
    if (exists !== "1") return t.skip(`no role ${user} that needs a password`);
    const err = await failure(
      `postgres://${user}:Zq%2FZq%40Zq%3AZq@127.0.0.1:${cluster.port}/postgres`,
    );
    assert.ok(err instanceof RunlockError, String(err));
    assert.match(err.message, /password authentication failed/);
    assert.match(err.message, new RegExp(`user "${user}"`));
    noSecret(`${err.message}\n${err.stack}`, "a wrong password");
  });

  test(
    "the CLI never prints the password of --db=, of RUNLOCK_DATABASE_URL or of an argument in the wrong place, on stdout or stderr, with --json too",
    {
      skip: !cliTestable,
    },
    async () => {
      const port = await freePort();
      const urls = secretUrls(port).filter((_, i) => i % 3 === 0);
      for (const url of urls) {
        for (
          const [what, r] of [
            ["--db", cli("status", `--db=${url}`, "x")],
            ["--json --db", cli("status", "--json", `--db=${url}`, "x")],
            [
              "RUNLOCK_DATABASE_URL",
              cliEnv({ RUNLOCK_DATABASE_URL: url }, "wait", "x"),
            ],
          ] as const
        ) {
          assert.equal(r.code, 2, `${what} ${url}: ${r.stderr}`);
          assert.equal(r.stdout, "");
          assert.match(r.stderr, /^runlock: /);
          noSecret(r.stdout + r.stderr, `${what} ${JSON.stringify(url)}`);
        }
      }
      const url = `postgres://app:Zq/Zq@127.0.0.1:${port}/db`;
      for (
        const args of [
          ["status", "x", `--db=${url}`], // an option after the path
          ["run", "x", `--db=${url}`, "--", "true"],
          ["status", `--dburl=${url}`, "x"], // an unknown option
          [url, "status", "x"], // the URL for a command
          [`--db=${url}`, "status", "x"], // the option before the command
          ["help", url],
          ["run", "--meta", url, "x", "--", "true"],
        ]
      ) {
        const r = cli(...args);
        assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
        noSecret(r.stdout + r.stderr, args.join(" "));
      }
    },
  );

  test(
    "a server error's hint is kept in the message: out of shared memory (53200) says to increase max_locks_per_transaction, for a lock, a probe and a connection",
    {
      skip: ownClusters
        ? false
        : "needs PostgreSQL binaries for a cluster of its own",
    },
    async () => {
      // max_locks_per_transaction × (max_connections + max_prepared_xacts)
      // entries in the shared lock table: filled below by one session.
      const small = await startCluster({
        own: true,
        conf: ["max_locks_per_transaction = 10"],
      });
      const locks = pgLocks(small.url);
      const filler = psqlSession(small.url);
      try {
        // A session kept for the next acquire, and the probe session.
        await (await locks.acquire("warm")).release();
        await locks.inspect("warm");
        // Session-level advisory locks survive the subtransaction the
        // EXCEPTION block rolls back: the table stays full.
        filler.send(
          `DO $$ BEGIN FOR i IN 1..10000000 LOOP BEGIN PERFORM pg_advisory_lock(1, i); ` +
            `EXCEPTION WHEN out_of_memory THEN RAISE NOTICE 'full at %', i; EXIT; END; END LOOP; END $$;`,
        );
        await filler.until(/full at \d+/, 60_000);
        const hint =
          /out of shared memory \(53200\); hint: You might need to increase max_locks_per_transaction\./;
        const acquired = await locks.acquire("x").catch((e) => e);
        assert.ok(acquired instanceof RunlockError, String(acquired));
        assert.match(acquired.message, /^x: cannot acquire the lock: /);
        assert.match(acquired.message, hint);
        const probed = await locks.inspect("y").catch((e) => e);
        assert.ok(probed instanceof RunlockError, String(probed));
        assert.match(probed.message, hint);
        const other = pgLocks(small.url);
        const connected = await other.acquire("z").catch((e) => e);
        await other.end();
        assert.ok(connected instanceof RunlockError, String(connected));
        assert.match(connected.message, /^z: cannot connect to PostgreSQL at /);
        assert.match(connected.message, hint);
      } finally {
        await locks.end();
        await filler.close();
        small.stop();
      }
    },
  );

  test(
    "sslmode=require (or prefer, or PGSSLMODE) against a server without TLS: one line saying so and what to do, and no warning of the client's on stderr",
    {
      skip: !cliTestable,
    },
    () => {
      if (psql(cluster.url, "SHOW ssl") !== "off") return; // an outside server
      const prefix =
        `runlock: x: cannot connect to PostgreSQL at 127.0.0.1:${cluster.port}, database "postgres", user "postgres": ` +
        `the server does not accept SSL (TLS) connections, which `;
      const fix =
        ": use sslmode=disable for a server without TLS, or enable ssl on the server\n";
      const sep = cluster.url.includes("?") ? "&" : "?";
      const require = cli(
        "status",
        `--db=${cluster.url}${sep}sslmode=require`,
        "x",
      );
      assert.deepEqual(require, {
        code: 2,
        stdout: "",
        stderr: `${prefix}sslmode=require in the URL asks for${fix}`,
      });
      const prefer = cli(
        "status",
        `--db=${cluster.url}${sep}sslmode=prefer`,
        "x",
      );
      assert.equal(
        prefer.stderr,
        `${prefix}sslmode=prefer in the URL asks for (node-postgres reads prefer as require, with no fallback)${fix}`,
      );
      const env = cliEnv(
        { PGSSLMODE: "require" },
        "status",
        `--db=${cluster.url}`,
        "x",
      );
      assert.equal(env.stderr, `${prefix}PGSSLMODE=require asks for${fix}`);
      // sslmode=disable connects.
      const disable = cli(
        "status",
        `--db=${cluster.url}${sep}sslmode=disable`,
        "x",
      );
      assert.deepEqual(disable, { code: 1, stdout: "free\n", stderr: "" });
    },
  );

  test(
    "against a server with TLS, sslmode=require still verifies its certificate (a self-signed one is refused, as with verify-full), with no warning; sslmode=no-verify connects over TLS",
    {
      skip: !ownClusters || !hasOpenssl
        ? "needs PostgreSQL binaries and openssl"
        : false,
    },
    async () => {
      const dir = mkdtempSync(join(tmpdir(), "runlock-tls-"));
      chmodSync(dir, 0o755);
      const key = join(dir, "server.key");
      const crt = join(dir, "server.crt");
      const made = spawnSync("openssl", [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        key,
        "-out",
        crt,
        "-days",
        "1",
        "-subj",
        "/CN=127.0.0.1",
      ], { encoding: "utf8" });
      assert.equal(made.status, 0, made.stderr);
      chmodSync(key, 0o600);
      // As root the cluster runs as the postgres user, which must own its key.
      if (process.getuid?.() === 0) {
        const id = (flag: string) =>
          Number(
            spawnSync("id", [flag, "postgres"], { encoding: "utf8" }).stdout,
          );
        chownSync(key, id("-u"), id("-g"));
      }
      const tls = await startCluster({
        own: true,
        conf: [
          "ssl = on",
          `ssl_cert_file = '${crt}'`,
          `ssl_key_file = '${key}'`,
        ],
      });
      try {
        for (const mode of ["require", "verify-ca", "verify-full"]) {
          const err = await failure(`${tls.url}?sslmode=${mode}`);
          assert.ok(err instanceof RunlockError, String(err));
          assert.match(err.message, /self[- ]signed certificate/, mode);
        }
        const locks = pgLocks(`${tls.url}?sslmode=no-verify`);
        try {
          const lock = await locks.acquire("tls");
          const { backendPid } = await locks.inspect("tls");
          assert.equal(
            psql(
              tls.url,
              `SELECT ssl FROM pg_stat_ssl WHERE pid = ${backendPid}`,
            ),
            "t",
          );
          await lock.release();
        } finally {
          await locks.end();
        }
        if (cliTestable) {
          const r = cli("status", `--db=${tls.url}?sslmode=require`, "x");
          assert.equal(r.code, 2);
          assert.equal(r.stdout, "");
          assert.match(
            r.stderr,
            /^runlock: x: cannot connect to PostgreSQL at .*: self[- ]signed certificate\b[^\n]*\(DEPTH_ZERO_SELF_SIGNED_CERT\)\n$/,
          );
        }
      } finally {
        tls.stop();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
