// The PostgreSQL backend without its client module: node-postgres ("pg")
// is an optional peer dependency on npm, and a Deno project using runlock
// from a clone maps it itself. Without it, "runlock/postgres" still
// imports, and the first acquire says which module is missing and how to
// get it, never "cannot connect". No server is needed: the client is
// loaded before any connection.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cpSync, mkdirSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";
import process from "node:process";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { runtime, tempDir } from "./_helpers.ts";

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

/** A project that has runlock but not pg; returns the command that runs. */
function projectWithoutPg(dir: string): string[] {
  if (runtime === "deno") {
    // The sources, outside this checkout (whose deno.json maps "pg").
    const root = join(dirname(fileURLToPath(import.meta.url)), "..");
    cpSync(join(root, "src"), join(dir, "src"), { recursive: true });
    cpSync(join(root, "mod.ts"), join(dir, "mod.ts"));
    writeFileSync(join(dir, "deno.json"), "{}\n");
    writeFileSync(join(dir, "main.ts"), SCRIPT("./src/postgres/mod.ts"));
    return [process.execPath, "run", "--quiet", "--allow-all", "main.ts"];
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

test("without the pg module, acquire names the missing client and how to install it, not a connection failure", () => {
  const { dir, cleanup } = tempDir();
  const [cmd, ...args] = projectWithoutPg(dir);
  const r = spawnSync(cmd, args, { cwd: dir, encoding: "utf8" });
  cleanup();
  assert.equal(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim().split("\n").at(-1)!);
  assert.equal(out.name, "RunlockError", r.stdout);
  assert.match(out.message, /^sync\/main: runlock's PostgreSQL backend needs/);
  assert.match(out.message, /node-postgres \("pg"/);
  assert.match(
    out.message,
    runtime === "deno"
      ? /add "pg": "npm:pg@8\.23\.1" to the "imports" of your deno\.json$/
      : /install it: npm install pg \(or bun add pg\)$/,
  );
  assert.doesNotMatch(out.message, /cannot connect/);
});
