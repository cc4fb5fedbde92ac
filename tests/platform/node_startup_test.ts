// What importing runlock costs a Node start: it loads none of the Node
// code that runlock never runs. An ES module import of `node:fs`,
// `node:process` or `node:util` builds a facade that reads every export,
// and so loads Node's streams, its diagnostic report and its argument
// parser; a random draw at import loads Web Crypto. Shown on Node's own
// list of the internal modules it loaded (process.moduleLoadList), in a
// fresh process that imports the installed package, as an ES module and
// as CommonJS. The time itself is the benchmark's (docs/performance.md).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { runtime, tempDir } from "../_helpers.ts";

// Streams, the diagnostic report, Web Crypto, parseArgs and MIME types.
const UNUSED =
  /^NativeModule (stream|internal\/(streams|fs\/streams|process\/report|crypto|util\/parse_args|mime)\b)/;

describe("importing runlock on Node", {
  skip: runtime !== "node" &&
    "Node only: process.moduleLoadList is Node's (and the npm package's)",
}, () => {
  const scripts = {
    "an ES module": [
      "import.mjs",
      `const before = new Set(process.moduleLoadList);
const { acquire } = await import("runlock");
if (typeof acquire !== "function") process.exit(3);
console.log(JSON.stringify(process.moduleLoadList.filter((m) => !before.has(m))));
`,
    ],
    "CommonJS": [
      "require.cjs",
      `const before = new Set(process.moduleLoadList);
const { acquire } = require("runlock");
if (typeof acquire !== "function") process.exit(3);
console.log(JSON.stringify(process.moduleLoadList.filter((m) => !before.has(m))));
`,
    ],
  };
  for (const [kind, [file, source]] of Object.entries(scripts)) {
    test(`as ${kind} loads no streams, diagnostic report or Web Crypto`, () => {
      const { dir, cleanup } = tempDir();
      try {
        // The installed package, linked where a script can import it.
        const pkg = dirname(
          createRequire(import.meta.url).resolve("runlock/package.json"),
        );
        mkdirSync(join(dir, "node_modules"));
        symlinkSync(pkg, join(dir, "node_modules", "runlock"), "dir");
        const script = join(dir, file);
        writeFileSync(script, source);
        const result = spawnSync(process.execPath, [script], {
          cwd: dir,
          encoding: "utf8",
        });
        assert.equal(result.status, 0, result.stderr);
        const loaded: string[] = JSON.parse(result.stdout.trim());
        assert.ok(loaded.length > 0, "the list is Node's: it grows at import");
        assert.deepEqual(loaded.filter((m) => UNUSED.test(m)), []);
      } finally {
        cleanup();
      }
    });
  }
});
