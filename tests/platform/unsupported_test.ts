// The file locks run on Linux x86_64 only, where these tests run: on any
// other platform, importing them throws UnsupportedPlatformError, and the
// PostgreSQL entry point still loads. Real processes of the runtime under
// test, whose platform a preloaded script fakes before the library loads
// (Deno: a `Deno` whose `build` says so; Node and Bun: `process.platform`
// and `process.arch`).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import process from "node:process";
import { pathToFileURL } from "node:url";
import { describe, test } from "node:test";
import { cliCommand, runtime, tempDir } from "../_helpers.ts";

declare const Deno: { execPath(): string } | undefined;

/** The library's and the PostgreSQL backend's entry points, as URLs. */
function entries(): { library: string; postgres: string } {
  if (runtime === "deno") {
    return {
      library: new URL("../../mod.ts", import.meta.url).href,
      postgres: new URL("../../src/postgres/mod.ts", import.meta.url).href,
    };
  }
  const require = createRequire(import.meta.url);
  return {
    library: pathToFileURL(require.resolve("runlock")).href,
    postgres: pathToFileURL(require.resolve("runlock/postgres")).href,
  };
}

/** A preloaded script that makes process.platform and arch say so. */
function fakeNode(dir: string, os: string, arch: string): string[] {
  const fake = join(dir, "fake.cjs");
  writeFileSync(
    fake,
    `Object.defineProperty(process, "platform", { value: ${
      JSON.stringify(os)
    } });
Object.defineProperty(process, "arch", { value: ${JSON.stringify(arch)} });
`,
  );
  return runtime === "bun" ? ["--preload", fake] : ["--require", fake];
}

/**
 * Imports both entry points in a process whose platform says `os` and
 * `arch` (Node's names); returns what it printed: the library's error, and
 * whether the PostgreSQL entry loaded.
 */
function importAs(os: string, arch: string) {
  const { dir, cleanup } = tempDir();
  try {
    const { library, postgres } = entries();
    const main = join(dir, "main.mjs");
    writeFileSync(
      main,
      `const out = {};
try {
  await import(${JSON.stringify(library)});
  out.library = "loaded";
} catch (err) {
  out.library = { name: err.name, os: err.os, arch: err.arch, message: err.message };
}
try {
  await import(${JSON.stringify(postgres)});
  out.postgres = "loaded";
} catch (err) {
  out.postgres = String(err);
}
console.log(JSON.stringify(out));
`,
    );
    let argv: string[];
    if (runtime === "deno") {
      const denoOs = os === "win32" ? "windows" : os;
      const denoArch = arch === "arm64" ? "aarch64" : "x86_64";
      const fake = join(dir, "fake.mjs");
      writeFileSync(
        fake,
        `const real = Deno;
const build = { ...real.build, os: ${JSON.stringify(denoOs)}, arch: ${
          JSON.stringify(denoArch)
        } };
Object.defineProperty(globalThis, "Deno", {
  value: new Proxy(real, { get: (t, k) => k === "build" ? build : Reflect.get(t, k) }),
  configurable: true,
  writable: true,
});
`,
      );
      argv = [
        Deno!.execPath(),
        "run",
        "--quiet",
        "--allow-all",
        "--preload",
        fake,
        main,
      ];
    } else {
      argv = [process.execPath, ...fakeNode(dir, os, arch), main];
    }
    const r = spawnSync(argv[0], argv.slice(1), { encoding: "utf8" });
    assert.equal(r.status, 0, `${r.stdout}${r.stderr}`);
    return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
  } finally {
    cleanup();
  }
}

describe("platform", () => {
  for (
    const [os, arch] of [["darwin", "arm64"], ["linux", "arm64"], [
      "win32",
      "x64",
    ]]
  ) {
    test(`importing the file locks on ${os} ${arch} throws UnsupportedPlatformError naming it; the PostgreSQL entry loads under Deno (the npm package shares the library's error classes, and installs on Linux x86_64 only)`, () => {
      const out = importAs(os, arch);
      assert.equal(
        out.library.name,
        "UnsupportedPlatformError",
        JSON.stringify(out),
      );
      assert.match(out.library.message, /run on Linux on x86_64/);
      assert.ok(out.library.message.includes(`this is `), out.library.message);
      if (runtime === "deno") assert.equal(out.postgres, "loaded");
      else assert.match(out.postgres, /^UnsupportedPlatformError: /);
    });
  }

  test(
    "the runlock command on macOS says so in one line, exit 2, for every command, no stack trace",
    {
      // Deno runs src/cli.ts, whose static imports load the file locks
      // before any of its code runs.
      skip: runtime === "deno",
    },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const [exe, bin] = cliCommand();
        for (const args of [["--version"], ["status", "x.lock"]]) {
          const r = spawnSync(
            exe,
            [...fakeNode(dir, "darwin", "arm64"), bin, ...args],
            { encoding: "utf8" },
          );
          assert.equal(r.status, 2, r.stderr);
          assert.equal(r.stdout, "");
          assert.match(
            r.stderr,
            /^runlock: runlock's file locks run on Linux on x86_64[^\n]*darwin[^\n]*\n$/,
          );
        }
      } finally {
        cleanup();
      }
    },
  );

  test("on Linux x86_64 (this machine, faked the same way) the file locks load", () => {
    assert.deepEqual(importAs("linux", "x64"), {
      library: "loaded",
      postgres: "loaded",
    });
  });
});
