// The record is encoded once per meta and each acquire writes its start time
// into those bytes in place: every record must still be its own, whole.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { acquireSync, inspect } from "../../mod.ts";
import { delay, tempDir } from "../_helpers.ts";

function startedLine(path: string): string {
  const line = readFileSync(path, "utf8").split("\n").find((l) =>
    l.startsWith("started=")
  );
  assert.ok(line, `no started= line in ${path}`);
  return line.slice("started=".length);
}

describe("the record written from a reused encoding", () => {
  test("each acquire writes its own start time, also once the clock's second has changed", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const seconds = new Set<number>();
      // Two different seconds at least, a few acquires in each: the part of
      // the time kept per second must follow the clock.
      for (let i = 0; seconds.size < 2 || i < 6; i++) {
        const lock = acquireSync(path);
        try {
          const written = startedLine(path);
          assert.equal(written, lock.acquiredAt.toISOString());
          seconds.add(Math.floor(lock.acquiredAt.getTime() / 1000));
        } finally {
          lock.releaseSync();
        }
        await delay(150);
      }
    } finally {
      cleanup();
    }
  });

  test("locks with different meta in one process each write their own whole record", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const long = join(dir, "long.lock");
      const short = join(dir, "short.lock");
      const a = acquireSync(long, { meta: { job: "a-long-job-name" } });
      const b = acquireSync(short, { meta: { job: "b" } });
      a.releaseSync();
      // The long meta again, then the short one: no bytes of one record
      // may end up in the other.
      const c = acquireSync(long, { meta: { job: "a-long-job-name" } });
      const d = acquireSync(join(dir, "plain.lock"));
      for (
        const [lock, meta] of [
          [b, { job: "b" }],
          [c, { job: "a-long-job-name" }],
          [d, {}],
        ] as const
      ) {
        const info = await inspect(lock.path);
        assert.equal(info.state, "held");
        assert.deepEqual(info.meta, meta);
        assert.equal(info.started?.getTime(), lock.acquiredAt.getTime());
        const text = readFileSync(lock.path, "utf8");
        assert.ok(text.endsWith("\n"), JSON.stringify(text));
        assert.equal(text.split("\n").filter((l) => l === "").length, 1);
      }
      b.releaseSync();
      c.releaseSync();
      d.releaseSync();
    } finally {
      cleanup();
    }
  });
});
