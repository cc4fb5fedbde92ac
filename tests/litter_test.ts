// Litter: a process killed between creating its temp file and linking it
// leaves the temp file; it is swept only once no live process holds it.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { describe, test } from "node:test";
import { acquire } from "../mod.ts";
import { createInterface } from "node:readline";
import { deadPid, holder, tempDir } from "./_helpers.ts";

/** A file in tests/fixtures (the .py fixtures are copied as they are). */
const fixturePath = (name: string) =>
  join(new URL(".", import.meta.url).pathname, "fixtures", name);

/**
 * The state a process leaves if it is killed between protocol steps 1 and 2:
 * a `.run.lock.<random>.tmp` holding a record, flocked by a live process.
 * fixtures/litter_holder.py plays that process: it takes the flock itself
 * and says so, so the same fixture serves every runtime under test. (Not
 * flock(1): its forked command shares the locked descriptor until it
 * closes it, so killing flock(1) did not always drop the lock at once, and
 * the next acquire rightly kept a temp file that was still locked.)
 */
async function litter(path: string): Promise<{ kill(): Promise<void> }> {
  const hex = randomBytes(8).toString("hex");
  const temp = join(dirname(path), `.${basename(path)}.${hex}.tmp`);
  writeFileSync(temp, `99999\nrunlock 1\n`, { flag: "wx" });
  const holder = spawn("python3", [fixturePath("litter_holder.py"), temp], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<void>((resolve) =>
    holder.on("exit", () => resolve())
  );
  const lines = createInterface({ input: holder.stdout! });
  await new Promise<void>((resolve, reject) => {
    lines.on("line", (line) => line === "held" && resolve());
    exited.then(() => reject(new Error(`litter_holder.py exited early`)));
  });
  return {
    async kill() {
      holder.kill("SIGKILL");
      await exited; // its descriptor, and so its flock, is gone now
    },
  };
}

describe("litter", () => {
  test("a temp file whose creator is alive is never swept", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const creator = await litter(path);
    try {
      const [temp] = readdirSync(dir);
      assert.match(temp, /^\.run\.lock\.[0-9a-f]{16}\.tmp$/);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), [temp]);
    } finally {
      await creator.kill();
      cleanup();
    }
  });

  test("a temp file left by a process SIGKILLed before its link is swept by the next acquire", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      const creator = await litter(path);
      await creator.kill();
      assert.equal(readdirSync(dir).length, 1);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("after any number of kills, one clean acquire and release leaves the directory as it was", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      writeFileSync(join(dir, "unrelated.txt"), "keep me");
      writeFileSync(join(dir, ".run.lock.notours.tmp"), "keep me too");
      const creators = await Promise.all(
        [1, 2, 3, 4, 5].map(() => litter(path)),
      );
      const first = await holder(path);
      await Promise.all([...creators, first].map((c) => c.kill()));
      assert.equal(readdirSync(dir).length, 8);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir).sort(), [
        ".run.lock.notours.tmp",
        "unrelated.txt",
      ]);
    } finally {
      cleanup();
    }
  });

  test("a stale takeover sweeps again, even in a process that swept this path before", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      await (await acquire(path)).release(); // this process's one-time sweep
      const creator = await litter(path);
      await creator.kill();
      writeFileSync(path, `${deadPid()}\nrunlock 1\n`); // and a crashed holder
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), []);
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });
});
