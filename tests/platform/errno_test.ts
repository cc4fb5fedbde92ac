// errno as Deno's FFI reads it: after the failed call, in a separate call,
// so that a signal handler running between the two (Deno's, under a flood
// of signals, whose write to a full pipe fails with EAGAIN) can leave its
// own errno there. strace's fault injection makes the protocol's link fail
// with EAGAIN once, as such a handler would leave it: the acquire makes
// the call again and answers as if nothing had come between. Real files,
// a real holder, the runtime under test (Deno: the FFI's *at() calls).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { fixtureCommand, holder, runtime, tempDir } from "../_helpers.ts";

const hasStrace = process.platform === "linux" &&
  spawnSync("sh", ["-c", "command -v strace"]).status === 0;

/** The fixture's answer, its first linkat failing with EAGAIN. */
function acquireOnce(path: string): { event: string; name?: string } {
  const [cmd, argv] = fixtureCommand("errno_once.ts", [path]);
  const r = spawnSync("strace", [
    "-f",
    "-qq",
    "-o",
    "/dev/null",
    "-e",
    "trace=linkat",
    "-e",
    "inject=linkat:error=EAGAIN:when=1",
    cmd,
    ...argv,
  ], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim());
}

describe("an EAGAIN left in errno between a failed call and its read", {
  skip: runtime !== "deno" || !hasStrace
    ? "Deno's FFI (Node's and Bun's read errno with the call), with strace(1)"
    : false,
}, () => {
  test("acquireSync of a free lock makes the link again and takes the lock", () => {
    const { dir, cleanup } = tempDir();
    try {
      assert.deepEqual(acquireOnce(join(dir, "run.lock")), {
        event: "acquired",
      });
    } finally {
      cleanup();
    }
  });

  test("acquireSync of a held lock makes the link again and answers HeldError, not 'link: EWOULDBLOCK'", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const h = await holder(path);
    try {
      const out = acquireOnce(path);
      assert.equal(out.event, "error");
      assert.equal(out.name, "HeldError", JSON.stringify(out));
    } finally {
      await h.kill();
      cleanup();
    }
  });
});
