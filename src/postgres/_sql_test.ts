// The guard of every statement that calls an advisory lock function (see
// `guarded` in _sql.ts), against a real server: run on a server session
// whose nonce is another client's, each fails with the guard's message
// and leaves that session's advisory locks alone, whatever plan the
// server makes of it (the first five executions of a prepared statement
// get custom plans, later ones may get a generic one). A Deno test beside
// the code it checks: the statements are internal, and the tests under
// tests/ use the public API only (they also run on Node and Bun).
import assert from "node:assert/strict";
import process from "node:process";
import { test } from "node:test";
import { startCluster } from "../../tests/fixtures/pg_cluster.ts";
import { pgServerAvailable } from "../../tests/fixtures/pg_available.ts";
import { queueStatements } from "./_queue_sql.ts";
import { GUARD_MARK, statements } from "./_sql.ts";

const why = pgServerAvailable ? undefined : "no PostgreSQL binaries";

test(
  "every statement that calls an advisory lock function fails on a server session another client claimed, under every plan_cache_mode, and leaves that session's locks alone",
  {
    skip: why,
  },
  async () => {
    const cluster = await startCluster();
    const pg = await import("npm:pg@8.23.1");
    const client = new (pg.default ?? pg).Client({
      connectionString: cluster.url,
    });
    await client.connect();
    try {
      const schema = `guard_${process.pid}`;
      const sql = statements(schema);
      const q = queueStatements(schema);
      await client.query(sql.ensureSchemaAndTable);
      const record = ["n", "8", 1, "h", "deno", "{}"];
      const cases: [string, string, unknown[]][] = [
        ["tryAcquire", sql.tryAcquire, record],
        ["waitAcquire", sql.waitAcquire, [...record, "100"]],
        ["release", sql.release, ["n", "1"]],
        ["unlockAll", sql.unlockAll, []],
        ["owned", sql.owned, ["0", "7"]],
        ["tryUnqueued", q.tryUnqueued, [...record, 5]],
        ["enqueue", q.enqueue, [5]],
        ["wait", q.wait, [...record, "100", 5, 1, null]],
        ["afterWait", q.afterWait, ["7", "0", "7", 5, 1]],
        ["unlockNode", q.unlockNode, [5, 1]],
      ];
      for (const mode of ["auto", "force_generic_plan", "force_custom_plan"]) {
        await client.query(`SET plan_cache_mode = ${mode}`);
        // This server session is another client's, and holds a lock of its.
        await client.query(
          "SELECT pg_catalog.set_config('runlock.session', 'theirs', false), pg_catalog.pg_advisory_lock(7)",
        );
        for (const [name, text, values] of cases) {
          for (let run = 0; run < 7; run++) {
            await assert.rejects(
              client.query({
                name: `${name}_${mode}`,
                text,
                values: [...values, "ours"],
              }),
              (err: Error) => err.message.includes(GUARD_MARK),
              `${name} under plan_cache_mode ${mode}, run ${run + 1}`,
            );
          }
        }
        const { rows } = await client.query(
          `SELECT pg_catalog.count(*)::integer AS n FROM pg_catalog.pg_locks
         WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()`,
        );
        assert.equal(rows[0].n, 1, `the other client's lock (${mode})`);
        await client.query("SELECT pg_catalog.pg_advisory_unlock_all()");
      }
      await client.query(`DROP SCHEMA "${schema}" CASCADE`);
    } finally {
      await client.end();
      cluster.stop();
    }
  },
);
