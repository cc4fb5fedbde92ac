// Limits that should not be there: every name the filesystem accepts can be
// locked, the file's mode does not depend on the umask, and a process that
// locks a new name per job does not grow without end.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  existsSync,
  mkdirSync,
  readdirSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { acquire, acquireSync, held, RunlockError } from "../../mod.ts";
import { Child, fixtureCommand, runtime, tempDir } from "../_helpers.ts";

const bytes = (s: string) => new TextEncoder().encode(s).length;

describe("long lock names", () => {
  test("every name from 230 to 255 bytes can be locked, released, and leaves no litter", async () => {
    const { dir, cleanup } = tempDir();
    try {
      for (let n = 230; n <= 255; n++) {
        const path = join(dir, "x".repeat(n));
        const lock = await acquire(path);
        assert.equal(await held(path), true);
        await lock.release();
        acquireSync(path).releaseSync();
      }
      // Multi-byte names near the limit: cut at a character boundary.
      for (const name of ["é".repeat(127), "€".repeat(85), "😀".repeat(63)]) {
        assert.ok(bytes(name) <= 255 && bytes(name) >= 252, name);
        const lock = await acquire(join(dir, name));
        await lock.release();
      }
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("a name over 255 bytes gets a clear RunlockError saying the name is too long", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "x".repeat(256));
      await assert.rejects(acquire(path), (err) => {
        assert.ok(err instanceof RunlockError, String(err));
        assert.match(err.message, /longer than the filesystem allows/);
        return true;
      });
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("a dead run's temp file of a long name is swept; files that only look like temp files are left alone", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const name = "y".repeat(250);
      const stem = name.slice(0, 233); // 255 - 22 bytes of ".", ".<16 hex>.tmp"
      const dead = `.${stem}.0123456789abcdef.tmp`;
      writeFileSync(join(dir, dead), "4242\nrunlock 1\n");
      const lookalikes = [
        `.${stem}.0123456789ABCDEF.tmp`, // not our hex
        `.${stem}.0123456789abcde.tmp`, // 15 digits
        `.${stem}.fedcba9876543210.tmp`, // ours by name, not by content
      ];
      for (const f of lookalikes) writeFileSync(join(dir, f), "hello\n");
      const lock = await acquire(join(dir, name));
      assert.equal(
        existsSync(join(dir, dead)),
        false,
        "the dead temp is swept",
      );
      for (const f of lookalikes) {
        assert.equal(existsSync(join(dir, f)), true, `${f} is left alone`);
      }
      await lock.release();
    } finally {
      cleanup();
    }
  });
});

describe("the lock file's mode", () => {
  test("is 0644 under umask 077, so other users' probes can read it", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const [cmd, args] = fixtureCommand("child.ts", ["hold", path]);
    const child = new Child("", [], undefined, [
      "sh",
      "-c",
      'umask 077 && exec "$@"',
      "sh",
      cmd,
      ...args,
    ]);
    try {
      await child.expect("acquired");
      assert.equal(statSync(path).mode & 0o777, 0o644);
    } finally {
      await child.kill();
      cleanup();
    }
  });

  test("under umask 077 in a directory others may write to: 0644 where the mode is set on the descriptor (Node, Bun, Deno with every permission), the umask's 0600 on Deno with scoped permissions (chmod by path could be turned against another file); 0644 in a sticky directory everywhere", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const open = join(dir, "open");
      const sticky = join(dir, "sticky");
      mkdirSync(open);
      mkdirSync(sticky);
      chmodSync(open, 0o777);
      chmodSync(sticky, 0o1777);
      const scoped = [
        `--allow-read=${dir}`,
        `--allow-write=${dir}`,
        "--no-prompt",
      ];
      const cases: [string, number, string[]?][] = [
        [open, 0o644],
        [sticky, 0o644],
      ];
      if (runtime === "deno") {
        cases.push([open, 0o600, scoped], [sticky, 0o644, scoped]);
      }
      for (const [where, expected, flags] of cases) {
        const path = join(where, "run.lock");
        const [cmd, args] = fixtureCommand("child.ts", ["hold", path], flags);
        const child = new Child("", [], undefined, [
          "sh",
          "-c",
          'umask 077 && exec "$@"',
          "sh",
          cmd,
          ...args,
        ]);
        try {
          await child.expect("acquired");
          assert.equal(
            (statSync(path).mode & 0o777).toString(8),
            expected.toString(8),
            `${where} ${flags?.join(" ") ?? ""}`,
          );
        } finally {
          await child.kill();
        }
      }
    } finally {
      cleanup();
    }
  });

  test("is what the mode option says (0600 for a private lock), and a mode the owner cannot read is a RangeError", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const lock = await acquire(path, { mode: 0o600 });
      assert.equal(statSync(path).mode & 0o777, 0o600);
      await lock.release();
      for (const mode of [0o200, -1, 0o1000, 1.5, Number.NaN]) {
        await assert.rejects(acquire(path, { mode }), RangeError);
        assert.throws(() => acquireSync(path, { mode }), RangeError);
      }
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("a lock file this user cannot read gets a LockPermissionError saying the file is unreadable, with its mode and owner", async (t) => {
    const uid = process.getuid?.();
    const setpriv = spawnSync("setpriv", ["--version"]).status === 0;
    if (uid !== 0 || !setpriv) return t.skip("needs root and setpriv");
    const { dir, cleanup } = tempDir();
    try {
      chmodSync(dir, 0o755);
      const path = join(dir, "run.lock");
      const lock = await acquire(path, { mode: 0o600 });
      const [cmd, args] = fixtureCommand("child.ts", ["probe", path]);
      const result = spawnSync("setpriv", [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        cmd,
        ...args,
      ], { encoding: "utf8", cwd: "/" });
      await lock.release();
      const line = result.stdout.trim().split("\n").pop() ?? "";
      if (!line.startsWith("{")) {
        return t.skip(
          `the runtime cannot start as uid 65534: ${result.stderr}`,
        );
      }
      const event = JSON.parse(line);
      assert.equal(event.name, "LockPermissionError", line);
      assert.match(
        event.message,
        /the file is not readable by this user \(mode 0600, owner uid 0\)/,
      );
      assert.doesNotMatch(event.message, /access to .*\/runlock-test/);
    } finally {
      cleanup();
    }
  });
});

describe("memory", () => {
  test("taking and releasing 12,000 locks of distinct names does not grow the heap", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const flags = runtime === "deno"
        ? ["--allow-all", "--v8-flags=--expose-gc"]
        : undefined;
      const child = new Child("memory.ts", [dir, "2000", "14000"], flags);
      const done = await child.expect("done");
      const perName = (Number(done.after) - Number(done.before)) /
        Number(done.names);
      console.log(
        `memory: ${
          Math.round(Number(done.before) / 1024)
        } KiB after 2,000 names, ` +
          `${Math.round(Number(done.after) / 1024)} KiB after 14,000 (${
            perName.toFixed(1)
          } bytes per name)`,
      );
      // Unbounded per-path caches cost about 500 bytes per name.
      assert.ok(perName < 100, `${perName.toFixed(1)} bytes per name`);
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });
});
