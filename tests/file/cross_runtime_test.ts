// Cross-runtime: Deno, Node and Bun processes on one lock file exclude each
// other, report each other's pid, and take over each other's crashed runs.
// Runs under Deno when scripts/test_npm.ts points RUNLOCK_INTEROP_SCRATCH at
// the scratch project holding the installed npm package and its compiled
// fixtures; skipped otherwise.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { Child, fixtureCommand, holder, tempDir } from "../_helpers.ts";
import { stress } from "../_stress.ts";

const scratch = process.env.RUNLOCK_INTEROP_SCRATCH;
// A `bun build --compile` binary of fixtures/child.ts, copied to a directory
// with no node_modules: proof that the single binary is self-contained.
const binary = process.env.RUNLOCK_INTEROP_BINARY;
// The same for the runlock CLI (bin/runlock.js of the npm package).
const cliBinary = process.env.RUNLOCK_INTEROP_CLI;
const isDeno = "Deno" in globalThis;

type Runtime = "deno" | "node" | "bun";
const RUNTIMES: Runtime[] = ["deno", "node", "bun"];

/** The command that runs fixture `name` under `runtime`. */
function command(runtime: Runtime, name: string): string[] {
  if (runtime === "deno") {
    const [cmd, argv] = fixtureCommand(name, []);
    return [cmd, ...argv];
  }
  const script = join(
    scratch!,
    "tests-esm",
    "fixtures",
    name.replace(/\.ts$/, ".js"),
  );
  const bin = runtime === "node"
    ? "node"
    : join(scratch!, "node_modules", ".bin", "bun");
  return [bin, script];
}

function child(runtime: Runtime, args: string[]): Child {
  return new Child("child.ts", args, undefined, command(runtime, "child.ts"));
}

describe("cross-runtime", { skip: !scratch || !isDeno }, () => {
  for (const a of RUNTIMES) {
    for (const b of RUNTIMES) {
      if (a === b) continue;
      test(`a ${a} holder makes a ${b} contender get HeldError with its pid; after SIGKILL the ${b} process takes over`, async () => {
        const { dir, cleanup } = tempDir();
        const path = join(dir, "run.lock");
        const first = child(a, ["hold", path]);
        try {
          const held = await first.expect("acquired");
          assert.equal(held.pid, first.pid);

          const refused = await child(b, ["try", path]).expect("held");
          assert.equal(refused.holder, first.pid);
          assert.equal(refused.host, hostname());

          const seenByB = await child(b, ["probe", path]).expect("probe");
          assert.equal(seenByB.state, "held");
          assert.equal(seenByB.holder, first.pid);
          const seenByA = await child(a, ["probe", path]).expect("probe");
          assert.equal(seenByA.state, "held");

          await first.kill("SIGKILL");
          const stale = await child(b, ["probe", path]).expect("probe");
          assert.equal(stale.state, "stale");
          assert.equal(stale.holder, first.pid);
          const second = child(b, ["hold", path]);
          const took = await second.expect("acquired");
          assert.equal(took.pid, second.pid);
          const seenAgain = await child(a, ["probe", path]).expect("probe");
          assert.equal(seenAgain.holder, second.pid);
          second.send("release");
          await second.expect("released");
          await second.kill();
        } finally {
          await first.kill();
          cleanup();
        }
      });
    }
  }

  test("a runlock holder in this process is seen held from Node and Bun", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      for (const b of ["node", "bun"] as const) {
        const seen = await child(b, ["probe", path]).expect("probe");
        assert.equal(seen.state, "held");
        assert.equal(seen.holder, first.pid);
      }
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("mixed stress: Deno, Node and Bun workers, holders SIGKILLed (3 at least): no overlap, no error, no litter", async () => {
    const seconds = Number(process.env.RUNLOCK_STRESS_SECONDS ?? 6);
    const r = await stress(
      seconds,
      6,
      (i) => command(RUNTIMES[i % 3], "stress_worker.ts"),
      command("node", "child.ts"),
    );
    console.log(
      `mixed stress: ${r.criticalSections} critical sections, ${r.kills} holders ` +
        `SIGKILLed, ${r.processes} worker processes (deno, node, bun), 0 overlaps`,
    );
  });

  test(
    "a bun --compile single binary takes the lock, and excludes and is excluded by Deno",
    {
      skip: !binary,
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const compiled = new Child("child.ts", ["hold", path], undefined, [
        binary!,
      ]);
      try {
        const took = await compiled.expect("acquired");
        assert.equal(took.pid, compiled.pid);
        const refused = await child("deno", ["try", path]).expect("held");
        assert.equal(refused.holder, compiled.pid);
        await compiled.kill("SIGKILL");
        const first = await holder(path);
        const excluded = new Child("child.ts", ["try", path], undefined, [
          binary!,
        ]);
        assert.equal((await excluded.expect("held")).holder, first.pid);
        const status = new Child("child.ts", ["probe", path], undefined, [
          binary!,
        ]);
        assert.equal((await status.expect("probe")).state, "held");
        await first.kill();
      } finally {
        await compiled.kill();
        cleanup();
      }
    },
  );

  test(
    "the runlock CLI as a bun --compile binary: status and run against a lock held by a Deno process",
    {
      skip: !cliBinary,
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const first = await holder(path);
      try {
        const status = spawnSync(cliBinary!, ["status", path], {
          encoding: "utf8",
        });
        assert.equal(status.status, 0, status.stderr);
        assert.match(
          status.stdout,
          new RegExp(`^held by pid ${first.pid} on ${hostname()} since `),
        );
        const marker = join(dir, "ran");
        const refused = spawnSync(cliBinary!, [
          "run",
          path,
          "--",
          "touch",
          marker,
        ], {
          encoding: "utf8",
        });
        assert.equal(refused.status, 75);
        assert.match(
          refused.stderr,
          new RegExp(`another run is active as pid ${first.pid}`),
        );
        assert.equal(existsSync(marker), false);
        first.send("release");
        await first.expect("released");
        const ran = spawnSync(cliBinary!, [
          "run",
          path,
          "--",
          "sh",
          "-c",
          `touch ${marker}; exit 4`,
        ], {
          encoding: "utf8",
        });
        assert.equal(ran.status, 4, ran.stderr);
        assert.ok(existsSync(marker));
      } finally {
        await first.kill();
        cleanup();
      }
    },
  );
});
