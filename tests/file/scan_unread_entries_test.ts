// What scan(), watch() and `runlock ls` leave out unread, and say so: a
// file named like runlock's temp files, and a name that is not UTF-8.
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { describe, test } from "node:test";
import { acquire, inspect, scan, type Skipped, watch } from "../../mod.ts";
import { cli, fixture } from "../_cli.ts";
import { Child, holder, tempDir } from "../_helpers.ts";

const TEMP_LIKE = ".x.lock.0123456789abcdef.tmp";

/**
 * Holds a lock at `<dir>/bad\xff/y.lock` (a directory whose name is not
 * UTF-8, which no JS string can name) as runlock does, with
 * tests/fixtures/record_holder.py; resolves once it holds it.
 */
async function badDirHolder(dir: string): Promise<Child> {
  const code = [
    "import os, sys",
    "d = os.fsdecode(os.fsencode(sys.argv[2]) + b'/bad\\xff')",
    "os.mkdir(d)",
    "script = sys.argv[1]",
    "sys.argv = [script, os.path.join(d, 'y.lock')]",
    "exec(compile(open(script).read(), script, 'exec'))",
  ].join("\n");
  const child = new Child("", [], undefined, [
    "python3",
    "-c",
    code,
    fixture("record_holder.py"),
    dir,
  ]);
  await new Promise<void>((resolve, reject) => {
    const lines = createInterface({ input: child.proc.stdout! });
    lines.once("line", () => resolve());
    child.proc.once("exit", () => reject(new Error("record_holder.py ended")));
  });
  return child;
}

describe("entries left out unread are reported", () => {
  test("scan() and ls report a live lock named like a temp file as skipped", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, TEMP_LIKE);
    const child = await holder(path);
    try {
      assert.equal((await inspect(path)).state, "held");
      const skipped: Skipped[] = [];
      const found = await scan(dir, { onSkip: (s) => skipped.push(s) });
      assert.deepEqual(found, []);
      assert.deepEqual(skipped, [{ path, reason: "temp name" }]);
      const r = cli("ls", dir);
      assert.equal(r.code, 0);
      assert.match(
        r.stderr,
        new RegExp(`skipped ${path.replaceAll(".", "\\.")}: named like`),
      );
    } finally {
      await child.kill();
      cleanup();
    }
  });

  test("watch() reports a live lock named like a temp file as skipped, once", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, TEMP_LIKE);
    const child = await holder(path);
    const stop = new AbortController();
    try {
      const skipped: Skipped[] = [];
      const batches = watch(dir, {
        signal: stop.signal,
        onSkip: (s) => skipped.push(s),
      })[Symbol.asyncIterator]();
      assert.deepEqual((await batches.next()).value, []);
      assert.deepEqual(skipped, [{ path, reason: "temp name" }]);
      await batches.return!();
    } finally {
      stop.abort();
      await child.kill();
      cleanup();
    }
  });

  test("a temp file of a lock whose name holds a line break is a temp file to scan(), watch() and the acquire's sweep alike", async () => {
    const { dir, cleanup } = tempDir();
    const name = "a\nb.lock";
    const path = join(dir, `.${name}.0123456789abcdef.tmp`);
    // A dead acquire's temp file: a record, no flock.
    writeFileSync(path, "4242\nrunlock 1\n");
    const stop = new AbortController();
    try {
      const skipped: Skipped[] = [];
      assert.deepEqual(await scan(dir, { onSkip: (s) => skipped.push(s) }), []);
      assert.deepEqual(skipped, [{ path, reason: "temp name" }]);
      skipped.length = 0;
      const batches = watch(dir, {
        signal: stop.signal,
        onSkip: (s) => skipped.push(s),
      })[Symbol.asyncIterator]();
      assert.deepEqual((await batches.next()).value, []);
      assert.deepEqual(skipped, [{ path, reason: "temp name" }]);
      await batches.return!();
      // The acquire of that name sweeps it as its own litter.
      const lock = await acquire(join(dir, name));
      await lock.release();
      assert.equal(existsSync(path), false, "the dead temp file was swept");
    } finally {
      stop.abort();
      cleanup();
    }
  });

  test("scan() and ls --recursive report a directory whose name is not UTF-8, and list a real lock once", async () => {
    const { dir, cleanup } = tempDir();
    const child = await badDirHolder(dir);
    // A directory whose name is what the bad one decodes to, with a lock:
    // listed once, not once per name that decodes so.
    const twin = join(dir, "bad\uFFFD");
    const live = await holder(join(twin, "z.lock"));
    try {
      const skipped: Skipped[] = [];
      const found = await scan(dir, {
        recursive: true,
        onSkip: (s) => skipped.push(s),
      });
      assert.deepEqual(found.map((i) => i.path), [join(twin, "z.lock")]);
      assert.deepEqual(skipped, [{ path: twin, reason: "not UTF-8" }]);
      const r = cli("ls", "--recursive", dir);
      assert.equal(r.code, 0);
      assert.equal(r.stdout.trim().split("\n").length, 1);
      assert.match(r.stderr, /skipped .*bad.*: its name is not UTF-8/);
    } finally {
      await live.kill();
      await child.kill();
      cleanup();
    }
  });
});
