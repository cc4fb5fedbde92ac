// A newcomer's first run, as the README's "Try it" says: in a fresh copy of
// the repository, with a fresh DENO_DIR (nothing cached), the demo line
// and the start of `deno task test` print no warning. Deno's task runner
// sets up the config's npm packages before any task, and without
// deno.json's `allowScripts.deny` prints a yellow box there about koffi's
// install script (koffi is for Node; Deno never loads it).
// Nothing may be downloaded for the demo either: `deno task` sets up every
// npm package of the config and the lockfile before any task, which is why
// the demo line is a `deno run` (and why deno.json has no import map: the
// sources name npm packages in full, scripts/_pins.ts). Needs the npm
// registry (a fresh DENO_DIR downloads what a task needs). Deno only: these
// are Deno tasks.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { deadPid, runtime } from "../_helpers.ts";
import { commandLines, readmeBlock } from "../_readme.ts";

const root = join(new URL(".", import.meta.url).pathname, "..", "..");

/** The repository's tracked files, copied as a fresh clone would have them. */
function freshCopy(): string {
  const dir = mkdtempSync(join(tmpdir(), "runlock-clone-"));
  const files = spawnSync("git", ["ls-files", "-z"], {
    cwd: root,
    encoding: "utf8",
  }).stdout.split("\0").filter(Boolean);
  assert.ok(files.includes("deno.json"), "git ls-files lists the repository");
  for (const file of files) {
    mkdirSync(dirname(join(dir, file)), { recursive: true });
    try {
      copyFileSync(join(root, file), join(dir, file));
    } catch {
      // deleted in the work tree, not yet committed
    }
  }
  return dir;
}

/** Runs `deno <args>` in `cwd` with a DENO_DIR of its own, empty. */
function denoFresh(cwd: string, args: string[]) {
  const denoDir = mkdtempSync(join(tmpdir(), "runlock-deno-dir-"));
  try {
    const r = spawnSync(process.execPath, args, {
      cwd,
      encoding: "utf8",
      env: { ...process.env, DENO_DIR: denoDir, NO_COLOR: "1" },
    });
    return { code: r.status, stdout: r.stdout, stderr: r.stderr };
  } finally {
    rmSync(denoDir, { recursive: true, force: true });
  }
}

describe("a newcomer's first run", { skip: runtime !== "deno" }, () => {
  test("the README's demo line from a fresh clone with nothing cached prints no warning, and locks the clone's .state/run.lock", () => {
    const [line] = commandLines(readmeBlock("try-it"));
    const prefix = "npx --yes deno@2.9.6 ";
    assert.ok(line.startsWith(prefix), line);
    const args = line.slice(prefix.length).replace(/\s+#.*$/, "").split(" ");
    assert.deepEqual(args, ["run", "--allow-all", "scripts/demo.ts"]);
    const dir = freshCopy();
    try {
      // A crashed run's file where the demo says it works: its first run
      // takes it over, and its last run releases it.
      mkdirSync(join(dir, ".state"));
      const stale = join(dir, ".state", "run.lock");
      writeFileSync(stale, `${deadPid()}\nrunlock 1\n`);
      const r = denoFresh(dir, args);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /one run at a time, and everyone could see who/);
      assert.match(
        r.stdout,
        /run A starts its work loop on \.state\/run\.lock\n/,
      );
      assert.equal(existsSync(stale), false, "the demo used .state/run.lock");
      assert.doesNotMatch(r.stderr, /warn|ignored build scripts/i, r.stderr);
      assert.doesNotMatch(r.stderr, /^Download /m, r.stderr);
      assert.doesNotMatch(r.stdout, / on \?| on $/m, "no empty host");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("the first task of `deno task test` with nothing cached prints no warning", () => {
    const dir = freshCopy();
    try {
      // Every task starts with the same setup of the npm packages; --help
      // stops right after it instead of running the suite inside itself.
      const r = denoFresh(dir, ["task", "test:unit", "--help"]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /Usage: deno test/);
      assert.doesNotMatch(r.stderr, /warn|ignored build scripts/i, r.stderr);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
