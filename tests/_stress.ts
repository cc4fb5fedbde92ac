// The stress run shared by file/stress_test.ts (one runtime) and
// file/cross_runtime_test.ts (Deno, Node and Bun workers on one lock): workers
// loop acquire/release while a killer SIGKILLs whoever holds the lock.
import assert from "node:assert/strict";
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Child, delay, tempDir } from "./_helpers.ts";

/** What a stress run did. */
export interface StressResult {
  criticalSections: number;
  kills: number;
  processes: number;
}

/**
 * Runs workers for `seconds`, and on until `minKills` holders were killed
 * (a loaded machine kills fewer per second; it gives up after
 * 60 + 4 × seconds). `worker(i)` gives the command that starts the
 * i-th worker (stress_worker fixture of some runtime), or undefined for this
 * runtime's own. Asserts: no overlap, no error, no litter.
 */
export async function stress(
  seconds: number,
  workers: number,
  worker: (i: number) => string[] | undefined,
  finalCheck: string[] | undefined,
  minKills = 3,
): Promise<StressResult> {
  const { dir, cleanup } = tempDir();
  const lockDir = join(dir, "state");
  const path = join(lockDir, "run.lock");
  const log = join(dir, "log");
  const owner = join(dir, "owner");
  const until = Date.now() + seconds * 1000;
  const deadline = Date.now() + (60 + 4 * seconds) * 1000;
  // Workers run until this file exists.
  const stop = join(dir, "stop");
  const args = [path, log, owner, stop];
  const running = new Map<Child, number>();
  const killed = new Set<string>();
  let started = 0;
  const spawnWorker = (slot: number) => {
    running.set(
      new Child("stress_worker.ts", args, undefined, worker(slot)),
      slot,
    );
    started++;
  };
  try {
    for (let i = 0; i < workers; i++) spawnWorker(i);
    // The killer: every 50-150 ms, SIGKILL the worker named in the lock,
    // and start another of the same runtime in its place.
    while (
      Date.now() < until || (killed.size < minKills && Date.now() < deadline)
    ) {
      await delay(50 + Math.random() * 100);
      let pid: string;
      try {
        pid = readFileSync(path, "utf8").split("\n")[0];
      } catch {
        continue;
      }
      const victim = [...running.keys()].find((w) => String(w.pid) === pid);
      if (!victim) continue;
      const slot = running.get(victim)!;
      killed.add(pid);
      running.delete(victim);
      await victim.kill("SIGKILL");
      spawnWorker(slot);
    }
    writeFileSync(stop, "");
    for (const w of running.keys()) {
      const result = await w.next();
      assert.equal(
        result.event,
        "done",
        `${JSON.stringify(result)} ${w.stderr.join("")}`,
      );
      assert.equal((await w.exited).code, 0);
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
    assert.ok(
      killed.size >= minKills,
      `only ${killed.size} holders were killed before the deadline`,
    );

    // One clean acquire and release in a fresh process leaves nothing.
    const last = new Child("child.ts", ["try", path], undefined, finalCheck);
    await last.expect("acquired");
    assert.equal((await last.exited).code, 0);
    assert.deepEqual(readdirSync(lockDir), []);
    return { criticalSections: enters, kills: killed.size, processes: started };
  } finally {
    writeFileSync(stop, "");
    await Promise.all([...running.keys()].map((w) => w.kill()));
    cleanup();
  }
}
