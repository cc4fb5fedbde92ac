// PostgreSQL stress: workers loop acquire/release on one name while a
// killer SIGKILLs whoever holds it; zero overlapping critical sections
// (from an append-only log), fences strictly increasing, no error. One
// runtime by default; Deno, Node and Bun workers together when
// scripts/test_npm.ts points RUNLOCK_INTEROP_SCRATCH at the scratch project
// with the compiled fixtures (as for tests/file/cross_runtime_test.ts).
// RUNLOCK_STRESS_SECONDS and RUNLOCK_STRESS_WORKERS as for file locks.
import assert from "node:assert/strict";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { fixtureCommand, runtime } from "../_helpers.ts";
import { type Cluster, startCluster } from "../fixtures/pg_cluster.ts";
import { pgTestable } from "../fixtures/pg_available.ts";
import { pgStress } from "../fixtures/pg_stress.ts";

const SECONDS = Number(process.env.RUNLOCK_STRESS_SECONDS ?? 4);
const WORKERS = Number(process.env.RUNLOCK_STRESS_WORKERS ?? 4);
const hasServer = pgTestable({
  needs: "server",
  untested: "postgres stress is NOT run",
});
const scratch = process.env.RUNLOCK_INTEROP_SCRATCH;
const isDeno = "Deno" in globalThis;

/** The command that runs the stress worker under `rt`. */
function workerCommand(rt: "deno" | "node" | "bun"): string[] {
  if (rt === "deno") {
    const [cmd, argv] = fixtureCommand("pg_stress_worker.ts", []);
    return [cmd, ...argv];
  }
  const script = join(scratch!, "tests-esm", "fixtures", "pg_stress_worker.js");
  const bin = rt === "node"
    ? "node"
    : join(scratch!, "node_modules", ".bin", "bun");
  return [bin, script];
}

describe("postgres stress", { skip: !hasServer }, () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster();
  });
  after(() => cluster?.stop());

  test(`stress: ${WORKERS} workers loop acquire/release on one name for ${SECONDS}s while holders are SIGKILLed: no overlap, fences increase, no error`, async () => {
    const r = await pgStress(
      cluster.url,
      SECONDS,
      WORKERS,
      () => ({ label: runtime }),
    );
    console.log(
      `postgres stress (${runtime}): ${r.criticalSections} critical sections, ` +
        `${r.kills} holders SIGKILLed, ${r.processes} worker processes, 0 overlaps`,
    );
    assert.ok(r.criticalSections > r.kills);
  });

  test(
    "mixed stress: Deno, Node and Bun workers on one name with a killer: no overlap, fences increase, no error",
    {
      skip: !scratch || !isDeno,
    },
    async () => {
      const runtimes = ["deno", "node", "bun"] as const;
      const r = await pgStress(
        cluster.url,
        SECONDS,
        Math.max(WORKERS, 6),
        (i) => ({
          command: workerCommand(runtimes[i % 3]),
          label: runtimes[i % 3],
        }),
      );
      console.log(
        `postgres mixed stress: ${r.criticalSections} critical sections, ` +
          `${r.kills} holders SIGKILLed, workers ${
            JSON.stringify(r.byRuntime)
          }, 0 overlaps`,
      );
    },
  );
});
