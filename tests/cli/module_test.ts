// The CLI as a module: `import { main } from "@runlock/runlock/cli"` under
// Deno, and "runlock/cli" from the npm package under Node and Bun (ES
// module and CommonJS: scripts/build_npm.ts points the import at each).
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { type CliIo, main } from "@runlock/runlock/cli";
import { holder, tempDir } from "../_helpers.ts";

function capture(): { io: CliIo; out: string[]; err: string[] } {
  const out: string[] = [];
  const err: string[] = [];
  return { io: { out: (t) => out.push(t), err: (t) => err.push(t) }, out, err };
}

describe("runlock/cli as a module", () => {
  test("main() answers status in-process through the given io", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      const { io, out, err } = capture();
      assert.equal(await main(["status", path], io), 0);
      assert.match(out[0], new RegExp(`^held by pid ${first.pid} `));
      assert.deepEqual(err, []);
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("main() runs a command under the lock and takes its signal listeners away afterwards", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const signals = ["SIGINT", "SIGTERM", "SIGUSR2", "SIGWINCH"] as const;
    const before = signals.map((s) => process.listenerCount(s));
    try {
      const { io } = capture();
      const code = await main(
        ["run", path, "--", "sh", "-c", `test -s "${path}" && exit 3`],
        io,
      );
      assert.equal(code, 3, "the command saw the lock file and exited 3");
      assert.equal(existsSync(path), false, "released");
      assert.deepEqual(signals.map((s) => process.listenerCount(s)), before);
    } finally {
      cleanup();
    }
  });
});
