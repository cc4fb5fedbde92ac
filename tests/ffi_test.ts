// Node: when koffi (the FFI module runlock calls flock through) cannot be
// loaded, the error says so and why, instead of blaming the filesystem.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cpSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { runtime, tempDir } from "./_helpers.ts";

describe("the FFI module", {
  skip: runtime !== "node" &&
    "Node only: Deno has flock built in, Bun uses bun:ffi",
}, () => {
  test("a missing koffi gives a RunlockError that names koffi and the reason, not UnsupportedFilesystemError", () => {
    const { dir, cleanup } = tempDir();
    try {
      // The installed package, copied where no koffi can be found.
      const pkg = dirname(
        createRequire(import.meta.url).resolve("runlock/package.json"),
      );
      cpSync(pkg, join(dir, "node_modules", "runlock"), { recursive: true });
      const script = join(dir, "try.mjs");
      writeFileSync(
        script,
        `import { acquire } from "runlock";
try {
  await acquire(${JSON.stringify(join(dir, "run.lock"))});
  console.log(JSON.stringify({ ok: true }));
} catch (err) {
  console.log(JSON.stringify({ name: err.name, message: err.message }));
}
`,
      );
      const result = spawnSync(process.execPath, [script], {
        cwd: dir,
        encoding: "utf8",
      });
      const event = JSON.parse(result.stdout.trim());
      assert.equal(event.name, "RunlockError", result.stdout);
      assert.match(
        event.message,
        /cannot load koffi, which runlock uses to call flock\(2\)/,
      );
      assert.match(event.message, /Cannot find module 'koffi'/);
      assert.doesNotMatch(event.message, /filesystem/);
    } finally {
      cleanup();
    }
  });
});
