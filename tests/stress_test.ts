// Stress: workers loop acquire/release while a killer SIGKILLs whoever holds
// the lock. Zero overlapping critical sections, zero errors, no litter.
// Bounded to a few seconds by default; RUNLOCK_STRESS_SECONDS runs longer
// (deno task stress).
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { test } from "node:test";
import { Child, delay, tempDir } from "./_helpers.ts";

const SECONDS = Number(process.env.RUNLOCK_STRESS_SECONDS ?? 4);
const WORKERS = Number(process.env.RUNLOCK_STRESS_WORKERS ?? 4);

test(`stress: ${WORKERS} workers loop acquire/release for ${SECONDS}s while holders are SIGKILLed: no overlap, no error, no litter`, async () => {
  const { dir, cleanup } = tempDir();
  const lockDir = join(dir, "state");
  const path = join(lockDir, "run.lock");
  const log = join(dir, "log");
  const owner = join(dir, "owner");
  const until = Date.now() + SECONDS * 1000;
  const args = [path, log, owner, String(until)];
  const workers = new Set<Child>();
  const killed = new Set<string>();
  const finished: Child[] = [];
  const spawnWorker = () => workers.add(new Child("stress_worker.ts", args));
  try {
    for (let i = 0; i < WORKERS; i++) spawnWorker();
    // The killer: every 50-150 ms, SIGKILL the worker named in the lock.
    while (Date.now() < until - 300) {
      await delay(50 + Math.random() * 100);
      let pid: string;
      try {
        pid = readFileSync(path, "utf8").split("\n")[0];
      } catch {
        continue;
      }
      const victim = [...workers].find((w) => String(w.pid) === pid);
      if (!victim) continue;
      killed.add(pid);
      workers.delete(victim);
      await victim.kill("SIGKILL");
      spawnWorker();
    }
    let rounds = 0;
    for (const w of workers) {
      const result = await w.next();
      assert.equal(
        result.event,
        "done",
        `${JSON.stringify(result)} ${w.stderr.join("")}`,
      );
      rounds += Number(result.rounds);
      assert.equal((await w.exited).code, 0);
      finished.push(w);
    }

    // Replay the log: each "enter" must follow the previous holder's
    // "leave", unless that holder was SIGKILLed inside.
    let inside: string | undefined;
    let enters = 0;
    for (const line of readFileSync(log, "utf8").trim().split("\n")) {
      const [what, pid] = line.split(" ");
      if (what === "enter") {
        assert.ok(
          inside === undefined || killed.has(inside),
          `${pid} entered while ${inside} was inside`,
        );
        inside = pid;
        enters++;
      } else {
        assert.equal(pid, inside, `${pid} left while ${inside} was inside`);
        inside = undefined;
      }
    }
    assert.ok(killed.size >= 3, `only ${killed.size} holders were killed`);
    assert.ok(enters >= rounds);

    // One clean acquire and release in a fresh process leaves nothing.
    const last = new Child("child.ts", ["try", path]);
    await last.expect("acquired");
    assert.equal((await last.exited).code, 0);
    assert.deepEqual(readdirSync(lockDir), []);
    console.log(
      `stress: ${enters} critical sections, ${killed.size} holders SIGKILLed, ` +
        `${workers.size + killed.size} worker processes, 0 overlaps`,
    );
  } finally {
    await Promise.all([...workers].map((w) => w.kill()));
    cleanup();
  }
});
