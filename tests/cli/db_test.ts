// The runlock CLI with --db (or RUNLOCK_DATABASE_URL): status, run and wait
// on the PostgreSQL backend, against a real server started by the test
// (tests/fixtures/pg_cluster.ts) or RUNLOCK_TEST_PG_URL, with real processes
// and pg_terminate_backend. Without PostgreSQL binaries (and no URL) the
// tests skip with a loud message, except under CI=true, where that fails.
// Under Node and Bun they run the package's bin, once the npm package ships
// `runlock/postgres`; until then they skip there, saying so.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  Background,
  cli,
  cliCommand,
  cliPgTestable,
  cliRuntime,
  type Result,
  start,
} from "../_cli.ts";
import { delay, tempDir } from "../_helpers.ts";
import {
  type Cluster,
  freePort,
  psql,
  startCluster,
} from "../fixtures/pg_cluster.ts";

const testable = cliPgTestable("the CLI's --db");

let counter = 0;
/** A lock name no other test (or earlier run) uses. */
function unique(label: string): string {
  return `cli/${process.pid}-${Date.now().toString(36)}/${label}/${counter++}`;
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

/** The shell loop of a command that runs until the file "$1" exists. */
const UNTIL_DONE =
  'echo ready; while [ ! -e "$1" ]; do sleep 0.05; done; exit "${2:-0}"';

/**
 * The CLI in the background with PGAPPNAME=`app`: its database sessions
 * carry that application name, by which the test finds them (never by a
 * pid it read in a record).
 */
function startNamed(app: string, ...args: string[]): Background {
  return new Background(["env", `PGAPPNAME=${app}`, ...cliCommand(), ...args]);
}

/** An application name no other test (or earlier run) uses. */
function appName(label: string): string {
  return `runlock-test-${process.pid}-${label}-${counter++}`;
}

/** Polls the server until `condition()` holds, for up to 20 s. */
async function until(condition: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (!condition()) {
    if (Date.now() >= deadline) throw new Error(`timed out: ${what}`);
    await delay(20);
  }
}

/**
 * The server processes of the sessions named `app` that hold (`granted`)
 * or wait for (not `granted`) an advisory lock.
 */
function advisoryBackends(url: string, app: string, granted: boolean): string {
  return psql(
    url,
    `SELECT coalesce(string_agg(l.pid::text, ' ' ORDER BY l.pid), '') FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted = ${granted} AND a.application_name = :'app'`,
    { app },
  );
}

/** Advisory locks the server process `backend` holds. */
function advisoryLocksOf(url: string, backend: number): number {
  return Number(psql(
    url,
    `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = ${backend}`,
  ));
}

describe("runlock --db (PostgreSQL)", {
  skip: !testable,
}, () => {
  let cluster: Cluster;
  let url: string;
  before(async () => {
    cluster = await startCluster();
    url = cluster.url;
  });
  after(() => cluster?.stop());

  test("status, run and wait: the output, JSON and exit codes of file locks; run holds a session while the command runs, with the command line and --meta in the record", async () => {
    const { dir, cleanup } = tempDir();
    const name = unique("same-output");
    const done = join(dir, "done");
    const db = `--db=${url}`;
    let wrapper: Background | undefined;
    try {
      assert.deepEqual(cli("status", db, name), {
        code: 1,
        stdout: "free\n",
        stderr: "",
      });
      wrapper = start(
        "run",
        db,
        "--meta",
        "job=7",
        name,
        "--",
        "sh",
        "-c",
        UNTIL_DONE,
        "sh",
        done,
      );
      await wrapper.line(/^ready$/);
      const cmd = `sh -c '${UNTIL_DONE}' sh ${done}`;

      const status = cli("status", db, name);
      assert.equal(status.code, 0, status.stderr);
      assert.equal(status.stderr, "");
      assert.match(
        status.stdout,
        new RegExp(
          `^held by pid ${wrapper.pid} on ${hostname()} since \\d\\d:\\d\\d:\\d\\d \\(\\d+s ago\\): `,
        ),
      );
      assert.ok(status.stdout.endsWith(`: ${cmd}\n  job=7\n`), status.stdout);

      const info = JSON.parse(cli("status", "--json", db, name).stdout);
      assert.equal(info.state, "held");
      assert.equal(info.path, name);
      assert.equal(info.pid, wrapper.pid);
      assert.equal(info.host, hostname());
      assert.deepEqual(info.meta, { cmd, job: "7" });
      assert.equal(info.runtime, cliRuntime);
      assert.match(info.fence, /^\d+$/, "a bigint, as a string");
      assert.equal(info.reason, null);
      assert.equal(info.pidValidHere, null, "a record names no boot or pidns");
      assert.equal(
        advisoryLocksOf(url, info.backendPid),
        1,
        "run's session holds the advisory lock",
      );

      const refused = cli("run", db, name, "--", "touch", join(dir, "ran"));
      assert.equal(refused.code, 75);
      assert.equal(
        refused.stderr,
        `runlock: ${name}: another run is active as pid ${wrapper.pid} on ${hostname()}; wait for it or stop it\n`,
      );
      assert.equal(existsSync(join(dir, "ran")), false);

      const timedOut = cli("wait", "--timeout=0.3", db, name);
      assert.equal(timedOut.code, 1);
      assert.match(
        timedOut.stderr,
        new RegExp(
          `^runlock: timed out after 0\\.3s: ${name} is still held by pid ${wrapper.pid} on `,
        ),
      );

      // RUNLOCK_DATABASE_URL instead of --db.
      const env = { RUNLOCK_DATABASE_URL: url };
      const age = /\(\d+s ago\)/;
      assert.equal(
        cliEnv(env, "status", name).stdout.replace(age, ""),
        status.stdout.replace(age, ""),
      );
      const waiting = appName("wait");
      const waiter = new Background([
        "env",
        `RUNLOCK_DATABASE_URL=${url}`,
        `PGAPPNAME=${waiting}`,
        ...cliCommand(),
        "wait",
        name,
      ]);
      // It looked, and found the lock held: its session ran the inspection.
      await until(
        () =>
          psql(
            url,
            `SELECT count(*) FROM pg_stat_activity WHERE application_name = :'app' AND query LIKE '%holder_application%'`,
            { app: waiting },
          ) !== "0",
        "the waiter's inspection",
      );
      assert.ok(waiter.running, "waits while held");
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 0, wrapper.stderr());
      assert.equal((await waiter.exited).code, 0, waiter.stderr());
      assert.equal(advisoryLocksOf(url, info.backendPid), 0, "released");
      assert.deepEqual(cli("status", db, name), {
        code: 1,
        stdout: "free\n",
        stderr: "",
      });
      // A lock name is not a path: nothing was written in the directory.
      assert.equal(existsSync(name.split("/")[0]), false);
    } finally {
      writeFileSync(done, "");
      await wrapper?.kill();
      cleanup();
    }
  });

  test("run --wait --db takes the lock the moment the holder's command ends", async () => {
    const { dir, cleanup } = tempDir();
    const name = unique("handover");
    const done = join(dir, "done");
    const db = `--db=${url}`;
    const first = start(
      "run",
      db,
      name,
      "--",
      "sh",
      "-c",
      UNTIL_DONE,
      "sh",
      done,
    );
    let second: Background | undefined;
    try {
      await first.line(/^ready$/);
      const app = appName("second");
      second = startNamed(
        app,
        "run",
        "--wait",
        db,
        name,
        "--",
        "echo",
        "second ran",
      );
      // Waiting: its session blocks in pg_advisory_lock.
      await until(
        () => advisoryBackends(url, app, false) !== "",
        "the second run waiting in pg_advisory_lock",
      );
      assert.equal(second.lines.length, 0, "still waiting");
      writeFileSync(done, "");
      assert.equal((await first.exited).code, 0);
      assert.equal((await second.exited).code, 0, second.stderr());
      assert.deepEqual(second.lines, ["second ran"]);
      assert.equal(second.stderr(), "", "no waiting line without a terminal");
    } finally {
      writeFileSync(done, "");
      await first.kill();
      await second?.kill();
      cleanup();
    }
  });

  test("the session ended by pg_terminate_backend while the command runs: said on stderr at once (measured), the command keeps running; --on-lost=term sends it SIGTERM", async () => {
    const { dir, cleanup } = tempDir();
    const db = `--db=${url}`;
    const done = join(dir, "done");
    const name = unique("lost");
    const app = appName("lost");
    const wrapper = startNamed(
      app,
      "run",
      db,
      name,
      "--",
      "sh",
      "-c",
      UNTIL_DONE,
      "sh",
      done,
      "4",
    );
    // (It ends when "term-done" exists, so that a test that fails leaves
    // nothing to kill.)
    const termDone = join(dir, "term-done");
    const trapping =
      'trap "echo got TERM; exit 9" TERM; echo ready; while [ ! -e "$1" ]; do sleep 0.05; done';
    const termName = unique("lost-term");
    const termApp = appName("lost-term");
    const term = startNamed(
      termApp,
      "run",
      "--on-lost=term",
      db,
      termName,
      "--",
      "sh",
      "-c",
      trapping,
      "sh",
      termDone,
    );
    /**
     * The server process of the session of the run named `app` that holds
     * its lock (found by the name the test gave it, not in a record).
     */
    const sessionOf = (app: string): number => {
      const backend = advisoryBackends(url, app, true);
      assert.match(backend, /^\d+$/, "one session holds the lock");
      return Number(backend);
    };
    const terminate = (backend: number) =>
      assert.equal(
        psql(url, `SELECT pg_terminate_backend(${backend})`),
        "t",
        "terminated",
      );
    try {
      await wrapper.line(/^ready$/);
      await term.line(/^ready$/);
      const info = JSON.parse(cli("status", "--json", db, name).stdout);
      const backend = sessionOf(app);
      assert.equal(backend, info.backendPid, "the session its record names");
      const before = performance.now();
      terminate(backend);
      await wrapper.stderrMatch(/lost the lock/);
      const ms = performance.now() - before;
      console.log(
        `run --db (${cliRuntime}) said the lock was lost ${
          ms.toFixed(1)
        } ms after pg_terminate_backend returned`,
      );
      assert.match(
        wrapper.stderr(),
        new RegExp(
          `^runlock: lost the lock while the command runs: .*${name}.*The command keeps running, without the lock`,
        ),
      );
      // The command ends only now, when told to: its code coming through
      // means that run went on after the loss, and did not stop it.
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 4, "the command's code");
      assert.equal(wrapper.stderr().match(/lost the lock/g)?.length, 1);

      terminate(sessionOf(termApp));
      await term.line(/^got TERM$/);
      assert.equal((await term.exited).code, 9, term.stderr());
      assert.match(
        term.stderr(),
        /lost the lock while the command runs: .*Sending SIGTERM to the command \(--on-lost=term\)/,
      );
    } finally {
      writeFileSync(done, "");
      writeFileSync(termDone, "");
      await wrapper.kill();
      await term.kill();
      cleanup();
    }
  });

  test("a server that refuses the connection or the password: exit 2 at once, naming the server and user, never the password; run runs nothing", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const port = await freePort();
      const marker = join(dir, "ran");
      const dead = `--db=postgres://app:hunter2-secret@127.0.0.1:${port}/app`;
      for (
        const args of [
          ["status", dead, "x"],
          ["wait", dead, "x"],
          ["run", dead, "x", "--", "touch", marker],
        ]
      ) {
        const r = cli(...args);
        assert.equal(r.code, 2, `${args[0]}: ${r.stderr}`);
        assert.equal(r.stdout, "");
        assert.equal(
          r.stderr,
          `runlock: x: cannot connect to PostgreSQL at 127.0.0.1:${port}, database "app", user "app": connection refused (is the server running, and listening there?)\n`,
        );
      }
      assert.equal(existsSync(marker), false, "the command never ran");
      if (cluster.passwordRole) {
        const { user } = cluster.passwordRole;
        const wrong = cli(
          "status",
          `--db=postgres://${user}:wr0ng-pass@127.0.0.1:${cluster.port}/postgres`,
          "x",
        );
        assert.equal(wrong.code, 2);
        assert.match(wrong.stderr, /password authentication failed/);
        assert.ok(!wrong.stderr.includes("wr0ng-pass"), wrong.stderr);
      }
    } finally {
      cleanup();
    }
  });

  const canUnshare = process.getuid?.() === 0 &&
    spawnSync("unshare", ["--uts", "true"]).status === 0;
  test(
    "a holder on another host (its own UTS namespace and host name): status says so on stderr, `kill N` here would hit another process; --json says pidValidHere false, host",
    {
      skip: canUnshare ? false : "needs root and unshare(1) --uts",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const db = `--db=${url}`;
      const done = join(dir, "done");
      const name = unique("elsewhere");
      const holder = new Background([
        "unshare",
        "--uts",
        "sh",
        "-c",
        'hostname build-elsewhere-7 && exec "$@"',
        "sh",
        ...cliCommand(),
        "run",
        db,
        name,
        "--",
        "sh",
        "-c",
        UNTIL_DONE,
        "sh",
        done,
      ]);
      try {
        await holder.line(/^ready$/);
        const r = cli("status", db, name);
        assert.equal(r.code, 0, r.stderr);
        assert.match(
          r.stdout,
          new RegExp(`^held by pid ${holder.pid} on build-elsewhere-7 since `),
        );
        assert.equal(
          r.stderr,
          `runlock: pid ${holder.pid} is a process on build-elsewhere-7, not on this host (another machine, or a container with a host name of its own): \`kill ${holder.pid}\` here would hit another process\n`,
        );
        const info = JSON.parse(cli("status", "--json", db, name).stdout);
        assert.equal(info.pidValidHere, false);
        assert.equal(info.pidElsewhere, "host");
        writeFileSync(done, "");
        assert.equal((await holder.exited).code, 0, holder.stderr());
      } finally {
        writeFileSync(done, "");
        await holder.kill();
        cleanup();
      }
    },
  );

  const hasStrace = spawnSync("sh", ["-c", "command -v strace"]).status === 0;
  test(
    "the PostgreSQL client is loaded only with --db: file-lock commands never open its files (strace)",
    {
      skip: !hasStrace
        ? "needs strace(1)"
        : process.env.RUNLOCK_CLI
        ? "a single binary has the client inside: no file to see opened"
        : false,
    },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const trace = join(dir, "trace");
        // The client's code: pg/<version>/lib/... in Deno's npm cache, or
        // node_modules/pg/lib/... for Node and Bun.
        const client = /\/pg\/(?:\d[^/]*\/)?(?:lib|esm)\//;
        const traced = (...args: string[]) => {
          const r = spawnSync("strace", [
            "-f",
            "-e",
            "trace=open,openat",
            "-o",
            trace,
            ...cliCommand(),
            ...args,
          ], { encoding: "utf8" });
          return { code: r.status, opened: readFileSync(trace, "utf8") };
        };
        const path = join(dir, "run.lock");
        for (
          const args of [
            ["status", path],
            ["run", path, "--", "true"],
            ["wait", path],
            ["ls", dir],
          ]
        ) {
          const { code, opened } = traced(...args);
          assert.ok(code === 0 || code === 1, `${args[0]} exited ${code}`);
          assert.doesNotMatch(opened, client, args[0]);
        }
        const withDb = traced("status", `--db=${url}`, unique("strace"));
        assert.equal(withDb.code, 1);
        assert.match(withDb.opened, client, "the positive control");
      } finally {
        cleanup();
      }
    },
  );
});
