// The PostgreSQL backend's client module: node-postgres ("pg") is an
// optional peer dependency on npm, and under Deno a full npm: specifier
// that needs no import map. Without it, "runlock/postgres" still imports,
// and the first acquire says which module is missing and how to get it,
// never "cannot connect". No server is needed: the client is loaded
// before any connection, and port 9 refuses.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cpSync, mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { runtime, tempDir } from "../_helpers.ts";

const SCRIPT = (entry: string) => `
import { pgLocks } from ${JSON.stringify(entry)};
const locks = pgLocks("postgres://app@127.0.0.1:9/app");
try {
  await locks.acquire("sync/main", { timeout: 0 });
  console.log(JSON.stringify({ acquired: true }));
} catch (err) {
  console.log(JSON.stringify({ name: err.constructor.name, message: err.message }));
}
`;

/** The sources, outside this checkout (whose deno.json has an import map). */
function denoProject(dir: string): void {
  const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
  cpSync(join(root, "src"), join(dir, "src"), { recursive: true });
  cpSync(join(root, "mod.ts"), join(dir, "mod.ts"));
  writeFileSync(join(dir, "deno.json"), "{}\n");
  writeFileSync(join(dir, "main.ts"), SCRIPT("./src/postgres/mod.ts"));
}

/** A project that has runlock but not pg; returns the command that runs. */
function projectWithoutPg(dir: string): string[] {
  if (runtime === "deno") {
    // An empty module cache that may not be filled: npm:pg cannot load.
    denoProject(dir);
    return [
      process.execPath,
      "run",
      "--quiet",
      "--cached-only",
      "--allow-all",
      "main.ts",
    ];
  }
  // The installed package (and koffi, its one dependency), copied into a
  // project whose node_modules has no pg.
  const require = createRequire(import.meta.url);
  const modules = join(dir, "node_modules");
  mkdirSync(modules);
  const runlock = dirname(require.resolve("runlock/package.json"));
  // koffi's exports hide its package.json: it sits beside runlock.
  for (const pkg of [runlock, join(dirname(runlock), "koffi")]) {
    cpSync(pkg, join(modules, basename(pkg)), {
      recursive: true,
      dereference: true,
    });
  }
  writeFileSync(join(dir, "main.mjs"), SCRIPT("runlock/postgres"));
  return [process.execPath, "main.mjs"];
}

function runIn(
  dir: string,
  [cmd, ...args]: string[],
  env: Record<string, string> = {},
): { name: string; message: string } {
  const r = spawnSync(cmd, args, {
    cwd: dir,
    encoding: "utf8",
    env: { ...process.env, ...env },
  });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout.trim().split("\n").at(-1)!);
}

test("without the pg module, acquire names the missing client and how to get it, not a connection failure", () => {
  const { dir, cleanup } = tempDir();
  const command = projectWithoutPg(dir);
  const out = runIn(
    dir,
    command,
    runtime === "deno" ? { DENO_DIR: join(dir, "deno-cache") } : {},
  );
  cleanup();
  assert.equal(out.name, "RunlockError", JSON.stringify(out));
  assert.match(out.message, /^sync\/main: runlock's PostgreSQL backend needs/);
  assert.match(out.message, /node-postgres \("pg"/);
  assert.match(
    out.message,
    runtime === "deno"
      ? /Deno downloads npm:pg@8\.23\.1 from the npm registry on first use$/
      : /install it with `npm install pg` \(or `bun add pg`\)$/,
  );
  assert.doesNotMatch(out.message, /cannot connect/);
});

test(
  "under Deno, the sources load the client without an import map of the user's (a clone, a deno install)",
  {
    skip: runtime !== "deno",
  },
  () => {
    const { dir, cleanup } = tempDir();
    denoProject(dir);
    const out = runIn(dir, [
      process.execPath,
      "run",
      "--quiet",
      "--allow-all",
      "main.ts",
    ]);
    cleanup();
    // The client loaded and tried the (closed) port.
    assert.match(out.message, /cannot connect to PostgreSQL at 127\.0\.0\.1:9/);
    assert.match(out.message, /connection refused/);
  },
);
