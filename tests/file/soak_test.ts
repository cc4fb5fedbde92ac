// CI's short soak (the long one is `deno task soak`): workers loop
// acquire/release on two locks while a killer SIGKILLs holders, SIGSTOPs
// workers and deletes lock files by hand; the shared log must show mutual
// exclusion, broken only by deletions that every holder concerned
// reported (LockLostError through lock.signal or release), no error, and
// no litter after one clean acquire. Workers of the runtime running the
// tests; under Deno with RUNLOCK_INTEROP_SCRATCH (scripts/test_npm.ts),
// Deno, Node and Bun workers together.
import assert from "node:assert/strict";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { runtime, tempDir } from "../_helpers.ts";
import { soak, summary } from "../_soak.ts";

const seconds = Number(process.env.RUNLOCK_SOAK_SECONDS ?? 3);
const scratch = process.env.RUNLOCK_INTEROP_SCRATCH;
// The CommonJS copy of the compiled suite runs the same worker code as the
// ES module copy: soak once per runtime.
const cjsCopy = import.meta.url.includes("/tests-cjs/");

function workers(): { runtime: string; command: string[] | undefined }[] {
  if (runtime !== "deno" || !scratch) {
    return Array.from({ length: 4 }, () => ({ runtime, command: undefined }));
  }
  const fixture = join(scratch, "tests-esm", "fixtures", "soak_worker.js");
  const bun = join(scratch, "node_modules", ".bin", "bun");
  return [
    { runtime: "deno", command: undefined },
    { runtime: "node", command: ["node", fixture] },
    { runtime: "bun", command: [bun, fixture] },
    { runtime: "deno", command: undefined },
    { runtime: "node", command: ["node", fixture] },
    { runtime: "bun", command: [bun, fixture] },
  ];
}

describe("soak", {
  skip: cjsCopy && "soaked once per runtime, in the ESM copy",
}, () => {
  test(`workers SIGKILLed, SIGSTOPped and their files deleted for ${seconds} s and until each happened (100 acquisitions, 3 kills, 3 stops, 3 deletions): no silent overlap, every loss reported, no error, no litter`, async () => {
    const { dir, cleanup } = tempDir();
    try {
      // Past `seconds`, the soak goes on until the run holds these events:
      // a loaded machine makes fewer of them per second.
      const minimum = { acquisitions: 100, kills: 3, stops: 3, deletions: 3 };
      const report = await soak({
        seconds,
        locks: 2,
        workers: workers(),
        dir,
        every: 40,
        minimum,
      });
      console.log(summary(report));
      assert.deepEqual(report.violations, []);
      assert.equal(report.overlapsUnexplained, 0);
      assert.equal(report.lossesWithoutDeletion, 0);
      assert.equal(report.errors, 0);
      assert.deepEqual(report.leftAfterClean, []);
      // The run did what it says (it fails here only if the soak's
      // deadline passed first), and every deletion of a held file was
      // reported.
      assert.ok(
        report.acquisitions >= minimum.acquisitions,
        `${report.acquisitions}`,
      );
      assert.ok(report.kills >= minimum.kills, `${report.kills} kills`);
      assert.ok(report.stops >= minimum.stops, `${report.stops} stops`);
      assert.ok(
        report.deletions >= minimum.deletions,
        `${report.deletions} deletions`,
      );
      // Every deletion was reported by its holder, or is the documented
      // release window matched by a successor on the same lock: analyse()
      // makes any other silent deletion a violation (checked above).
    } finally {
      cleanup();
    }
  });
});
