// An idle watch does nothing between changes: no re-scan (no directory
// listing, no flock test of a held run) while nothing happens. Shown under
// strace, as a property of the watcher's system calls over 2.5 s of quiet,
// not as a time or a CPU figure. Deno's watch says when it lost events
// (since 2.9.0), so there too the only periodic work left is a look at the
// directory itself (its removal can go unreported), never a listing.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { test } from "node:test";
import { holder, tempDir, tracedFixture } from "../_helpers.ts";

function skip(): string | false {
  if (process.platform !== "linux") return "strace is Linux only";
  const r = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"]);
  const why = r.error || r.status !== 0 ? "strace cannot trace here" : false;
  if (why && process.env.CI === "true") throw new Error(why);
  return why;
}

test(
  "an idle watch of two held runs lists no directory and tests no flock between changes",
  {
    skip: skip(),
  },
  async () => {
    const { dir, cleanup } = tempDir();
    const trace = `${dir}.trace`;
    const holders = [
      await holder(join(dir, "a.lock")),
      await holder(join(dir, "b.lock")),
    ];
    try {
      const watcher = tracedFixture(
        "watcher.ts",
        ["idle", dir],
        trace,
        "getdents64,flock,statx,newfstatat,stat,lstat",
      );
      try {
        assert.deepEqual(await watcher.next(), { event: "first", n: 2 });
        assert.deepEqual(await watcher.next(), { event: "idle", changes: 0 });
        await watcher.exited;
      } finally {
        await watcher.kill();
      }
      const lines = readFileSync(trace, "utf8").split("\n");
      const begin = lines.findIndex((l) => l.includes("/.idle-begin"));
      const end = lines.findIndex((l) => l.includes("/.idle-end"));
      assert.ok(begin >= 0 && end > begin, "both marks are in the trace");
      // A listing during the watch's start shows that the trace sees them.
      assert.ok(
        lines.slice(0, begin).some((l) => /getdents64\(/.test(l)),
        "the first batch's listing is in the trace",
      );
      const quiet = lines.slice(begin + 1, end)
        .filter((l) => /\b(getdents64|flock)\(/.test(l));
      assert.deepEqual(quiet, [], "no listing and no flock while idle");
    } finally {
      for (const h of holders) await h.kill();
      spawnSync("rm", ["-f", trace]);
      cleanup();
    }
  },
);
