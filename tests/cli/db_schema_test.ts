// The PostgreSQL CLI and its setup agree: the schema
// that `runlock db-setup --schema=S` prepares is the one run, status, wait
// and ls use with --schema=S or RUNLOCK_DATABASE_SCHEMA; and a role that
// may not create runlock's table is told, in plain lines, the SQL to run
// once, which pasted into psql as printed lets it take the lock.
//
// Real server (tests/fixtures/pg_cluster.ts or RUNLOCK_TEST_PG_URL), real
// roles without privileges, real CLI processes of the runtime under test
// (tests/_cli.ts), psql for what a person would paste. Without PostgreSQL
// the tests skip loudly (fail under CI=true), as cli/db_test does.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  atTerminal,
  type Background,
  cli,
  cliCommand,
  cliPgTestable,
  type Result,
  start,
} from "../_cli.ts";
import { tempDir } from "../_helpers.ts";
import { commandLines, docBlock } from "../_readme.ts";
import {
  type Cluster,
  findPgBin,
  psql,
  startCluster,
} from "../fixtures/pg_cluster.ts";

const testable = cliPgTestable("the CLI's --schema and setup advice");

/** A name (role, schema, database, lock) no other test or run uses. */
let counter = 0;
function unique(label: string): string {
  return `rl_${label}_${process.pid}_${Date.now().toString(36)}_${counter++}`;
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
 * The SQL lines of the advice that follow the line that ends with `lead`
 * (after one empty line), up to the next empty line or the end: exactly as
 * printed, indentation included, as a person would paste them.
 */
function sqlAfter(stderr: string, lead: string): string {
  const lines = stderr.split("\n");
  const at = lines.findIndex((l) => l.endsWith(lead));
  assert.ok(at >= 0, `no line ending with ${JSON.stringify(lead)}:\n${stderr}`);
  assert.equal(lines[at + 1], "", stderr);
  const end = lines.indexOf("", at + 2);
  return lines.slice(at + 2, end < 0 ? undefined : end).join("\n");
}

describe("runlock --db: the schema of db-setup, and the SQL a role needs", {
  skip: !testable,
}, () => {
  let cluster: Cluster;
  /** As the superuser, in a database. */
  let owner: (database?: string) => string;
  /** As `role`, in a database. */
  let as: (role: string, database?: string) => string;
  const roles: string[] = [];
  const databases: string[] = [];
  const schemas: string[] = [];
  before(async () => {
    cluster = await startCluster();
    const at = (role: string | undefined, database: string | undefined) => {
      const u = new URL(cluster.url);
      if (role !== undefined) u.username = role;
      if (database !== undefined) u.pathname = `/${database}`;
      return u.toString();
    };
    owner = (database) => at(undefined, database);
    as = (role, database) => at(role, database);
  });
  after(() => {
    try {
      for (const s of schemas) {
        psql(cluster.url, `DROP SCHEMA IF EXISTS ${s} CASCADE`);
      }
      for (const d of databases) {
        psql(cluster.url, `DROP DATABASE IF EXISTS ${d} WITH (FORCE)`);
      }
      for (const r of roles) {
        psql(cluster.url, `DROP OWNED BY ${r} CASCADE; DROP ROLE ${r}`);
      }
    } finally {
      cluster?.stop();
    }
  });

  /** A login role with no privilege beyond PUBLIC's. */
  function role(label: string): string {
    const name = unique(label);
    psql(cluster.url, `CREATE ROLE ${name} LOGIN`);
    roles.push(name);
    return name;
  }

  /**
   * A new database whose schema public the role may not create in: the
   * default since PostgreSQL 15 for every role but the owner, made so on
   * older servers too.
   */
  function database(label: string): string {
    const name = unique(label);
    psql(cluster.url, `CREATE DATABASE ${name}`);
    databases.push(name);
    psql(owner(name), "REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    return name;
  }

  test("run, status, wait and ls use the schema that db-setup --schema prepared, named by --schema or RUNLOCK_DATABASE_SCHEMA, for a role that may create nothing", async () => {
    const app = role("app");
    const schema = unique("ops");
    schemas.push(schema);
    const url = as(app);
    const db = `--db=${url}`;
    const env = { RUNLOCK_DATABASE_SCHEMA: schema };
    // db-setup prints it; the owner (here the superuser) runs it once.
    const setup = cli("db-setup", db, `--schema=${schema}`);
    assert.equal(setup.code, 0, setup.stderr);
    psql(owner(), setup.stdout);
    // The variable gives db-setup the same schema.
    assert.equal(cliEnv(env, "db-setup", db).stdout, setup.stdout);

    const { dir, cleanup } = tempDir();
    const done = join(dir, "done");
    const name = `sync/${unique("job")}`;
    let holder: Background | undefined;
    try {
      holder = start(
        "run",
        db,
        `--schema=${schema}`,
        name,
        "--",
        "sh",
        "-c",
        UNTIL_DONE,
        "sh",
        done,
      );
      await holder.line(/^ready$/);
      // The record is in the schema's table.
      assert.equal(
        psql(
          owner(),
          `SELECT count(*) FROM "${schema}".runlock_locks WHERE name = :'name'`,
          { name },
        ),
        "1",
      );

      for (
        const [how, r] of [
          ["--schema", cli("status", db, `--schema=${schema}`, name)],
          ["the variable", cliEnv(env, "status", db, name)],
        ] as const
      ) {
        assert.equal(r.code, 0, `status with ${how}: ${r.stderr}`);
        assert.match(r.stdout, new RegExp(`^held by pid ${holder.pid} `), how);
      }
      // With the variable, run sees the same lock: held, exit 75.
      const second = cliEnv(env, "run", db, name, "--", "true");
      assert.equal(second.code, 75, second.stderr);

      for (
        const r of [
          cli("ls", db, `--schema=${schema}`, "--json", "sync/"),
          cliEnv(env, "ls", db, "--json", "sync/"),
        ]
      ) {
        assert.equal(r.code, 0, r.stderr);
        const found = JSON.parse(r.stdout).find((
          i: { path: string },
        ) => i.path === name);
        assert.equal(found?.state, "held", r.stdout);
      }

      const waited = cli(
        "wait",
        db,
        `--schema=${schema}`,
        "--timeout=0.3",
        name,
      );
      assert.equal(waited.code, 1, waited.stderr);
      assert.match(waited.stderr, /timed out after 0\.3s/);

      writeFileSync(done, "");
      assert.equal((await holder.exited).code, 0, holder.stderr());
      const free = cliEnv(env, "wait", db, "--timeout=10", name);
      assert.equal(free.code, 0, free.stderr);
      assert.equal(
        cli("status", db, `--schema=${schema}`, name).stdout,
        "free\n",
      );
    } finally {
      writeFileSync(done, "");
      await holder?.kill();
      cleanup();
    }
  });

  test("docs/cli.md's --schema lines, run as written (db-setup piped to psql as the owner, run, then status with the variable) against a role that may create nothing", () => {
    const app = role("doc");
    const db = database("doc");
    const [cmd, ...pre] = cliCommand();
    const runlock = [cmd, ...pre].map((w) => `'${w.replaceAll("'", `'\\''`)}'`)
      .join(" ");
    const psqlBin = spawnSync("sh", ["-c", "command -v psql"], {
      encoding: "utf8",
    }).stdout.trim() || join(findPgBin()!, "psql");
    const lines = commandLines(docBlock("cli.md", "cli-schema"));
    assert.equal(lines.length, 3);
    const codes = lines.map((line) => {
      const sh = line
        .replaceAll("postgres://app@db-host/app", as(app, db))
        .replaceAll("postgres://owner@db-host/app", owner(db))
        .replace(/^runlock /, `${runlock} `)
        .replace(/\| psql /, `| '${psqlBin}' -q -v ON_ERROR_STOP=1 `)
        .replace(
          "RUNLOCK_DATABASE_SCHEMA=ops runlock ",
          `RUNLOCK_DATABASE_SCHEMA=ops ${runlock} `,
        )
        .replace("./sync.sh", "true");
      const r = spawnSync("sh", ["-c", sh], {
        encoding: "utf8",
        env: { ...process.env, NO_COLOR: "1" },
      });
      return `${r.status} ${r.stdout.trim().split("\n")[0]}`;
    });
    assert.deepEqual(
      codes.map((c) => c.split(" ")[0]),
      ["0", "0", "1"],
      codes.join("\n"),
    );
    assert.equal(codes[2], "1 free");
  });

  test("--schema is the PostgreSQL backend's: without a URL, empty, or not a name, it is a usage error that says so", () => {
    const url = `--db=${as("nobody")}`;
    const cases: [string[], RegExp][] = [
      [
        ["status", "--schema=ops", "x"],
        /^runlock: option '--schema' is the PostgreSQL backend's: give --db=URL/,
      ],
      [
        ["ls", "--schema=ops", "."],
        /^runlock: ls: option '--schema' is the PostgreSQL backend's: it needs --db=URL/,
      ],
      [
        ["wait", url, "--schema=", "x"],
        /^runlock: option '--schema' needs a name: --schema=NAME/,
      ],
      [
        ["run", url, "--schema=a\tb", "x", "--", "true"],
        /^runlock: option '--schema' must be a name of 1 to 63 bytes/,
      ],
    ];
    for (const [args, message] of cases) {
      const r = cli(...args);
      assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, message, args.join(" "));
    }
  });

  test("a role that may not create runlock's table in public is told in plain lines the SQL to run once, only the lock name quoted for the terminal; pasted into psql by the owner as printed, it lets the role take the lock", async () => {
    const app = role("nocreate");
    const db = database("fresh");
    const url = `--db=${as(app, db)}`;
    // A lock name with ESC: quoted, as bash reads $'...'; nothing else is.
    const name = "job\x1b[31m";
    const r = cli("run", url, name, "--", "echo", "ran");
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stdout, "", "the command did not run");
    const lines = r.stderr.split("\n");
    assert.equal(
      lines[0],
      `runlock: $'job\\x1b[31m': cannot acquire the lock:`,
    );
    assert.equal(
      lines[1],
      `PostgreSQL at ${cluster.host}:${cluster.port}, database "${db}", user "${app}"`,
    );
    assert.equal(
      r.stderr.split("$'").length,
      2,
      `one quoted part:\n${r.stderr}`,
    );
    assert.ok(!r.stderr.includes("\\n"), `no literal \\n:\n${r.stderr}`);
    assert.equal(
      lines[2],
      `refused to create runlock's table "public".runlock_locks,`,
    );
    assert.match(
      lines[3],
      /^which runlock creates on first use: .*\(42501\)\.$/,
    );
    assert.ok(
      lines.includes(`  GRANT CREATE ON SCHEMA "public" TO "${app}";`),
      r.stderr,
    );
    assert.ok(lines.includes("  runlock db-setup --db=URL"), r.stderr);

    // The DDL as printed, pasted into psql by the owner (here the superuser).
    const ddl = sqlAfter(r.stderr, "also prints:");
    assert.match(
      ddl,
      /^ {2}CREATE TABLE IF NOT EXISTS "public"\.runlock_locks \($/m,
    );
    assert.match(
      ddl,
      new RegExp(
        `^  GRANT SELECT, INSERT, UPDATE ON "public"\\.runlock_locks TO "${app}";$`,
        "m",
      ),
    );
    // docs/cli.md shows this message for sync/main, role and database
    // "app" on db-host: each of its lines is one the CLI prints, in order.
    const doc = docBlock("cli.md", "cli-schema-advice").text
      .replaceAll("db-host:5432", `${cluster.host}:${cluster.port}`)
      .replaceAll('database "app"', `database "${db}"`)
      .replaceAll('"app"', `"${app}"`)
      .split("\n").filter((l) => l !== "" && l !== "  ...");
    const shown = cli("run", url, "sync/main", "--", "true").stderr
      .split("\n");
    let from = 0;
    for (const line of doc) {
      const at = shown.indexOf(line, from);
      assert.ok(at >= 0, `docs/cli.md's line ${JSON.stringify(line)}`);
      from = at + 1;
    }
    // As a terminal of 80 columns shows it: the explanation broken to fit,
    // the SQL lines (indented) never broken, so pasted as shown they are
    // the same SQL.
    const narrow = await atTerminal(
      { COLUMNS: "" },
      "run",
      url,
      name,
      "--",
      "true",
    );
    assert.equal(narrow.code, 2, narrow.stderr);
    for (const line of narrow.stderr.split("\n")) {
      if (line.startsWith("  ")) continue;
      assert.ok([...line].length <= 80, `fits 80 columns: ${line}`);
    }
    const shownDdl = sqlAfter(narrow.stderr, "also prints:");
    assert.equal(shownDdl, ddl);
    psql(owner(db), shownDdl);
    const ok = cli("run", url, name, "--", "echo", "ran");
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(ok.stdout, "ran\n");
    assert.equal(ok.stderr, "");
    // The role still may not create anything: the grants were the minimum.
    assert.equal(
      psql(
        owner(db),
        `SELECT has_schema_privilege(:'role', 'public', 'CREATE')`,
        { role: app },
      ),
      "f",
    );
  });

  test("a role that may not create the schema --schema names is told the grant that lets it, on a line of its own; pasted into psql as printed, runlock then creates schema and table on first use", () => {
    const app = role("noschema");
    const db = database("grant");
    const schema = unique("jobs");
    const url = `--db=${as(app, db)}`;
    const r = cli("run", url, `--schema=${schema}`, "nightly", "--", "true");
    assert.equal(r.code, 2, r.stderr);
    assert.ok(!r.stderr.includes("$'"), r.stderr);
    assert.ok(
      r.stderr.split("\n").includes(
        `  runlock db-setup --db=URL --schema=${schema}`,
      ),
      r.stderr,
    );
    const grant = sqlAfter(r.stderr, "as the database's owner or a superuser:");
    assert.equal(grant, `  GRANT CREATE ON DATABASE "${db}" TO "${app}";`);
    psql(owner(db), grant);
    const ok = cliEnv(
      { RUNLOCK_DATABASE_SCHEMA: schema },
      "run",
      url,
      "nightly",
      "--",
      "true",
    );
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(
      psql(
        owner(db),
        `SELECT count(*) FROM "${schema}".runlock_locks WHERE name = 'nightly'`,
      ),
      "1",
    );
  });
});
