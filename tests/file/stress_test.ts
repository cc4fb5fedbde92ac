// Stress: workers loop acquire/release while a killer SIGKILLs holders.
// Zero overlapping critical sections, zero errors, no litter. Bounded to a
// few seconds by default; RUNLOCK_STRESS_SECONDS runs longer
// (deno task stress).
import process from "node:process";
import { test } from "node:test";
import { runtime } from "../_helpers.ts";
import { stress } from "../_stress.ts";

const SECONDS = Number(process.env.RUNLOCK_STRESS_SECONDS ?? 4);
const WORKERS = Number(process.env.RUNLOCK_STRESS_WORKERS ?? 4);

test(`stress: ${WORKERS} workers loop acquire/release for ${SECONDS}s and until 3 holders were SIGKILLed: no overlap, no error, no litter`, async () => {
  const r = await stress(SECONDS, WORKERS, () => undefined, undefined);
  console.log(
    `stress (${runtime}): ${r.criticalSections} critical sections, ` +
      `${r.kills} holders SIGKILLed, ${r.processes} worker processes, 0 overlaps`,
  );
});
