// The short chaos run (the long one is `deno task chaos:postgres`): workers
// loop acquire -> write to a register guarded by the fence -> release on a
// server of their own, while a fault injector SIGKILLs and SIGSTOPs holders,
// SIGSTOPs waiters, ends holders' sessions, restarts the server fast and
// immediate, crashes the postmaster (SIGQUIT, SIGKILL), cuts a holder's
// link (as root), and the workers' role has synchronous_commit = off for
// half of the run. The log must keep every rule of
// tests/fixtures/chaos_check.ts. Under Deno only (the workers are separate
// processes: with RUNLOCK_INTEROP_SCRATCH, Deno, Node and Bun ones);
// RUNLOCK_CHAOS_SECONDS sets the length (default 20).
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { runtime } from "../_helpers.ts";
import { summary } from "../fixtures/chaos_check.ts";
import { chaos, KINDS, violationCount } from "../fixtures/chaos_run.ts";
import { pgBinariesAvailable } from "../fixtures/pg_available.ts";

const seconds = Number(process.env.RUNLOCK_CHAOS_SECONDS ?? 20);
const scratch = process.env.RUNLOCK_INTEROP_SCRATCH;
const skip = runtime !== "deno"
  ? "run under Deno (its workers are processes of any runtime)"
  : !pgBinariesAvailable
  ? "no PostgreSQL binaries (the run crashes a server of its own)"
  : false;
if (skip && runtime === "deno") {
  console.error(`postgres chaos skipped: ${skip}`);
}

/** Deno workers; with the scratch project, Node and Bun ones too. */
function workers(): { runtime: string; command: string[] | undefined }[] {
  const at = (...parts: string[]) => join(scratch ?? "", ...parts);
  const worker = at("tests-esm", "fixtures", "chaos_worker.js");
  const commands: Record<string, string[] | undefined> = {
    node: ["node", worker],
    bun: [at("node_modules", ".bin", "bun"), worker],
  };
  const runtimes = scratch ? ["deno", "node", "bun", "deno"] : [runtime];
  return Array.from({ length: 4 }, (_, i) => {
    const rt = runtimes[i % runtimes.length];
    return { runtime: rt, command: commands[rt] };
  });
}

/**
 * What the log says before each violation, for the run's output: the lines
 * of the worker it names and every fault and server line (those with no
 * acquisition), from 150 lines before it to 5 after. A violation seen once
 * in a CI run can then be read without a rerun.
 */
function around(
  log: string,
  report: { violations: { line: number; detail: string }[] },
): string {
  const lines = readFileSync(log, "utf8").split("\n");
  return report.violations.map((v) => {
    const worker = /^([\w-]+\.\d+)\.\d+ /.exec(v.detail)?.[1];
    const shown = lines
      .map((text, i) => ({ text, n: i + 1 }))
      .slice(Math.max(0, v.line - 151), v.line + 5)
      .filter(({ text }) =>
        text !== "" && (!text.includes('"acq"') ||
          (worker !== undefined && text.includes(`"${worker}"`)))
      );
    return [
      `--- the log around line ${v.line} (${worker ?? "every worker"}):`,
      ...shown.map(({ text, n }) => `${n}: ${text}`),
    ].join("\n");
  }).join("\n");
}

describe("postgres chaos", { skip }, () => {
  test(
    `a fenced register under ${seconds} s of random faults (${
      KINDS.join(", ")
    }, synchronous_commit = off on the role for half of it): fences only grow, the register accepts no stale write, every overlap is a loss the older holder reported, every loss has a fault behind it, every acquire ends with the lock or its timeout, none waits past its timeout by more than its slice of the faults`,
    async () => {
      const kept = mkdtempSync(join(tmpdir(), "runlock-chaos-log-"));
      const keepLog = join(kept, "log");
      let report: Awaited<ReturnType<typeof chaos>>;
      try {
        report = await chaos({
          seconds,
          workers: workers(),
          every: 1_200,
          phase: seconds / 2,
          say: (line) => console.log(line),
          keepLog,
        });
        if (report.violations.length > 0) {
          console.error(around(keepLog, report));
        }
      } finally {
        rmSync(kept, { recursive: true, force: true });
      }
      console.log(summary(report));
      if (report.netnsSkipped) {
        console.error(`*** cut-link fault skipped: ${report.netnsSkipped} ***`);
      }
      assert.deepEqual(report.violations, []);
      assert.equal(violationCount(report), 0);
      // The run did what it says (it goes on past `seconds` until it has).
      assert.deepEqual(report.kindsMissing, []);
      assert.ok(
        report.crashesWithSyncCommitOff >= 1,
        "no crash with synchronous_commit = off",
      );
      assert.ok(
        report.acquisitions > 100,
        `${report.acquisitions} acquisitions`,
      );
    },
  );
});
