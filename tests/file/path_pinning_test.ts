// The lock means the file it took: its directory is resolved once, at
// acquire, and every later call goes through it, whatever happens to the
// path (a symlinked parent re-pointed, `..`, a chdir after a relative path).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { acquire, acquireSync, held, HeldError, inspect } from "../../mod.ts";
import {
  Child,
  fixtureCommand,
  holder,
  runtime,
  tempDir,
  waitFor,
} from "../_helpers.ts";

/** Points `link` at `to` atomically, as a deploy does. */
function repoint(link: string, to: string): void {
  symlinkSync(to, `${link}.next`);
  renameSync(`${link}.next`, link);
}

/** A temp name (PROTOCOL.md): `.<stem>.<16 hex digits>.tmp`. */
const TEMP_NAME = /^\..+\.[0-9a-f]{16}\.tmp$/;

/** The names in a directory, sorted. */
function names(dir: string): string[] {
  return readdirSync(dir).sort();
}

const seconds = Number(process.env.RUNLOCK_PIN_RACE_SECONDS ?? 3);

/**
 * Runs flip_worker fixtures while `mover` moves the directories, for
 * `seconds` and until the mover said it is moving and every worker took
 * the lock at least once; then stops them all (the file `stop`) and
 * returns the lines the workers logged.
 */
async function raceWorkers(
  path: string,
  dirs: string[],
  log: string,
  stop: string,
  count: number,
  mover: Child,
): Promise<string[]> {
  const began = Date.now();
  const workers = Array.from(
    { length: count },
    () => new Child("flip_worker.ts", [path, log, stop, dirs.join(",")]),
  );
  try {
    await mover.expect("moving");
    const entered = () => {
      const text = existsSync(log) ? readFileSync(log, "utf8") : "";
      return workers.every((w) => text.includes(` ${w.pid}\n`));
    };
    await waitFor(
      () => Date.now() - began >= seconds * 1000 && entered(),
      "every worker took the lock",
      (60 + 4 * seconds) * 1000,
    );
  } finally {
    writeFileSync(stop, "");
  }
  for (const w of workers) {
    const done = await w.expect("done");
    assert.ok(
      Number(done.rounds) > 0,
      `every worker took the lock: ${JSON.stringify(done)} ${
        w.stderr.join("")
      }`,
    );
  }
  return existsSync(log)
    ? readFileSync(log, "utf8").split("\n").filter(Boolean)
    : [];
}

/** Overlaps per directory, from an append-only log of enter/exit lines. */
function overlaps(lines: string[]): string[] {
  const inside = new Map<string, string>();
  const found: string[] = [];
  for (const line of lines) {
    const [event, dir, pid] = line.split(" ");
    if (event === "enter") {
      if (inside.has(dir)) {
        found.push(`${pid} entered ${dir} while ${inside.get(dir)} was inside`);
      }
      inside.set(dir, pid);
    } else if (event === "exit" && inside.get(dir) === pid) {
      inside.delete(dir);
    }
  }
  return found;
}

describe("a symlinked parent directory re-pointed while the lock is held", () => {
  test("release() removes the file in the directory the lock was taken in, and leaves the other directory's live lock alone", async () => {
    const { dir, cleanup } = tempDir();
    const a = join(dir, "releases", "1");
    const b = join(dir, "releases", "2");
    mkdirSync(a, { recursive: true });
    mkdirSync(b, { recursive: true });
    const current = join(dir, "current");
    symlinkSync(a, current);
    const path = join(current, "run.lock");
    const lock = await acquire(path);
    assert.ok(existsSync(join(a, "run.lock")));
    repoint(current, b);
    // Another run takes the lock through the same path, now in releases/2.
    const other = new Child("child.ts", ["hold", path]);
    try {
      await other.expect("acquired");
      assert.equal(lock.isOwned(), true, "our file is still ours");
      await lock.release(); // no LockLostError: nothing was lost
      assert.deepEqual(names(a), [], "our file is gone, no litter");
      // The other run, alive, may be making its watch's marker (a temp
      // name it creates and removes as the watch begins): not litter yet.
      assert.deepEqual(
        names(b).filter((n) => !TEMP_NAME.test(n)),
        ["run.lock"],
        "the other run's file is intact",
      );
      assert.equal(await held(path), true, "the other run still holds it");
      const third = new Child("child.ts", ["try", path]);
      const refused = await third.expect("held");
      assert.equal(refused.holder, other.pid);
      other.send("release");
      await other.expect("released");
      assert.deepEqual(names(b), [], "its release leaves no litter either");
    } finally {
      await other.kill();
      cleanup();
    }
  });

  test("the same, synchronously", () => {
    const { dir, cleanup } = tempDir();
    try {
      const a = join(dir, "a");
      const b = join(dir, "b");
      mkdirSync(a);
      mkdirSync(b);
      const current = join(dir, "current");
      symlinkSync(a, current);
      const lock = acquireSync(join(current, "run.lock"));
      repoint(current, b);
      writeFileSync(join(b, "run.lock"), "1\n"); // someone else's file
      lock.releaseSync();
      assert.deepEqual(names(a), []);
      assert.deepEqual(names(b), ["run.lock"]);
      assert.equal(readFileSync(join(b, "run.lock"), "utf8"), "1\n");
    } finally {
      cleanup();
    }
  });

  test(`a symlink re-pointed over and over while workers take and release the lock through it never lets two runs into one directory (${seconds} s at least)`, async () => {
    const { dir, cleanup } = tempDir();
    const a = join(dir, "a");
    const b = join(dir, "b");
    mkdirSync(a);
    mkdirSync(b);
    const current = join(dir, "current");
    symlinkSync(a, current);
    const log = join(dir, "log");
    const stop = join(dir, "stop");
    const flipper = new Child("flipper.ts", [current, a, b, stop]);
    try {
      const lines = await raceWorkers(
        join(current, "run.lock"),
        [a, b],
        log,
        stop,
        4,
        flipper,
      );
      const flips = await flipper.expect("done");
      const enters = lines.filter((l) => l.startsWith("enter")).length;
      console.log(
        `pinning race: ${enters} critical sections, ${flips.flips} flips`,
      );
      assert.ok(
        Number(flips.flips) > 100,
        `the symlink really moved: ${flips.flips}`,
      );
      assert.deepEqual(overlaps(lines), [], "no two runs in one directory");
      assert.deepEqual(
        lines.filter((l) => !/^(enter|exit) /.test(l)),
        [],
        "no lost lock, no error",
      );
      assert.ok(
        lines.every((l) => !l.includes(" ? ")),
        "every record was found where it was taken",
      );
    } finally {
      await flipper.kill();
      cleanup();
    }
  });
});

describe("real directories exchanged under a held lock", () => {
  // renameat2(RENAME_EXCHANGE) swaps two directories behind their names in
  // one step. A lock pinned by a directory descriptor never notices; one
  // that names its path again would unlink the other directory's live lock.
  const python = spawnSync("python3", ["-c", "import ctypes"]).status === 0;
  // Deno pins by canonical path (PROTOCOL.md): only re-pointed symlinks are
  // covered there, and this test would fail, as documented.
  const skip = runtime === "deno"
    ? "Deno pins the directory by its canonical path, not a descriptor"
    : !python && "python3 is not installed";
  test(
    `directories swapped over and over while workers take and release the lock: no error, and a holder whose directory was swapped away is told it moved away from its path (${seconds} s at least)`,
    { skip },
    async () => {
      const { dir, cleanup } = tempDir();
      const x = join(dir, "x");
      const y = join(dir, "y");
      mkdirSync(x);
      mkdirSync(y);
      const log = join(dir, "log");
      const stop = join(dir, "stop");
      const script = `
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b, stop = sys.argv[1].encode(), sys.argv[2].encode(), sys.argv[3]
n = 0
while not os.path.exists(stop):
    if n == 200:
        print(json.dumps({"event": "moving"}), flush=True)
    for _ in range(100):
        if libc.renameat2(-100, a, -100, b, 2) != 0:
            print(json.dumps({"event": "error", "errno": ctypes.get_errno()}), flush=True)
            sys.exit(1)
        n += 1
print(json.dumps({"event": "done", "exchanges": n}), flush=True)
`;
      const exchanger = new Child("", [x, y, stop], undefined, [
        "python3",
        "-c",
        script,
      ]);
      try {
        const lines = await raceWorkers(
          join(x, "run.lock"),
          [x, y],
          log,
          stop,
          4,
          exchanger,
        );
        const done = await exchanger.expect("done");
        console.log(
          `exchange race: ${
            lines.filter((l) => l.startsWith("enter")).length
          } critical sections, ${done.exchanges} exchanges`,
        );
        assert.ok(
          Number(done.exchanges) > 100,
          `the directories really moved: ${done.exchanges}`,
        );
        // A holder whose directory was exchanged away while it held is told
        // (the path then named the other directory, where another worker
        // could take the lock); nothing else is reported.
        assert.deepEqual(
          lines.filter((l) =>
            !/^(enter|exit) /.test(l) &&
            !/^lost \d+ .*: the lock file was moved away from its path /.test(l)
          ),
          [],
          "no error, no other loss",
        );
      } finally {
        await exchanger.kill();
        cleanup();
      }
    },
  );
});

describe("paths with ..", () => {
  test("a path through a symlinked directory and .. locks the file the kernel resolves, with its temp file beside it", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const real = join(dir, "real");
      mkdirSync(join(real, "sub"), { recursive: true });
      mkdirSync(join(dir, "here"));
      symlinkSync(join(real, "sub"), join(dir, "here", "current"));
      // The kernel resolves here/current/.. to real/, not to here/.
      // (A string, not join(): join() would fold the .. away lexically.)
      const path = `${dir}/here/current/../run.lock`;
      const lock = await acquire(path);
      assert.deepEqual(names(real), ["run.lock", "sub"]);
      assert.deepEqual(names(join(dir, "here")), ["current"]);
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(process.pid),
        "cat sees our record through the same path",
      );
      assert.equal(await held(join(real, "run.lock")), true);
      assert.equal((await inspect(path)).state, "held");
      const other = new Child("child.ts", ["try", join(real, "run.lock")]);
      assert.equal((await other.expect("held")).holder, process.pid);
      await lock.release();
      assert.deepEqual(names(real), ["sub"]);
    } finally {
      cleanup();
    }
  });

  test("a path whose .. leads to another filesystem (tmpfs) locks there, not across filesystems", async (t) => {
    const shm = "/dev/shm";
    if (!existsSync(shm)) return t.skip("no /dev/shm");
    const { dir, cleanup } = tempDir();
    const target = join(shm, `runlock-test-${process.pid}-${Date.now()}`);
    try {
      mkdirSync(join(target, "sub"), { recursive: true });
      symlinkSync(join(target, "sub"), join(dir, "current"));
      const path = `${dir}/current/../run.lock`;
      const lock = await acquire(path, { timeout: 2000 });
      assert.deepEqual(names(target), ["run.lock", "sub"]);
      assert.deepEqual(
        names(dir),
        ["current"],
        "no temp file left on the other filesystem",
      );
      await lock.release();
      assert.deepEqual(names(target), ["sub"]);
    } finally {
      rmSync(target, { recursive: true, force: true });
      cleanup();
    }
  });

  test("a plain state/../run.lock is the file next to state/", async () => {
    const { dir, cleanup } = tempDir();
    try {
      mkdirSync(join(dir, "state"));
      const lock = await acquire(`${dir}/state/../run.lock`);
      assert.deepEqual(names(dir), ["run.lock", "state"]);
      assert.deepEqual(names(join(dir, "state")), []);
      await lock.release();
      assert.deepEqual(names(dir), ["state"]);
    } finally {
      cleanup();
    }
  });
});

describe("a relative path and a later chdir", () => {
  test("a directory whose name ends in ')' or ' (deleted)', reached through a symlink re-pointed or a relative path and a chdir before the lock's first look, is still owned: no false LockLostError", async () => {
    const { dir, cleanup } = tempDir();
    const cwd = process.cwd();
    try {
      for (const tail of [" (rc)", " (deleted)"]) {
        const v1 = join(dir, `v1${tail}`);
        const v2 = join(dir, `v2${tail}`);
        mkdirSync(v1);
        mkdirSync(v2);
        const current = join(dir, "current");
        symlinkSync(v1, current);
        // No periodic check: isOwned() is the lock's first look, made
        // after the symlink moved on.
        const a = await acquire(join(current, "run.lock"), {
          checkInterval: 0,
        });
        unlinkSync(current);
        symlinkSync(v2, current);
        assert.equal(a.isOwned(), true, tail);
        await a.release();
        assert.deepEqual(readdirSync(v1), [], tail);

        process.chdir(v1);
        const b = await acquire("run.lock", { checkInterval: 0 });
        process.chdir(v2);
        assert.equal(b.isOwned(), true, tail);
        await b.release();
        assert.deepEqual(readdirSync(v1), [], tail);
        process.chdir(cwd);
        unlinkSync(current);
      }
    } finally {
      process.chdir(cwd);
      cleanup();
    }
  });

  test("release() removes the file it took, in the first directory, without a false LockLostError", async () => {
    const { dir, cleanup } = tempDir();
    const cwd = process.cwd();
    try {
      const one = join(dir, "one");
      const two = join(dir, "two");
      mkdirSync(one);
      mkdirSync(two);
      process.chdir(one);
      const lock = await acquire("run.lock");
      process.chdir(two);
      assert.equal(lock.isOwned(), true);
      // A lock of the same relative name in the new directory is another lock.
      const second = await acquire("run.lock");
      assert.deepEqual(names(two), ["run.lock"]);
      await lock.release();
      assert.deepEqual(names(one), [], "the first file is gone");
      assert.deepEqual(names(two), ["run.lock"], "the second is untouched");
      second.releaseSync();
      assert.deepEqual(names(two), []);
    } finally {
      process.chdir(cwd);
      cleanup();
    }
  });

  test(
    "Deno with permissions scoped to the first directory: an acquire after chdir gets LockPermissionError, never a prompt",
    {
      skip: runtime !== "deno" && "Deno permissions only",
    },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const one = join(dir, "one");
        const two = join(dir, "two");
        mkdirSync(one);
        mkdirSync(two);
        // Under a pseudo-terminal (script), Deno would prompt, and hang, if
        // runlock ever called an op it has no grant for.
        const [cmd, args] = fixtureCommand("chdir.ts", [one, two], [
          `--allow-read=${one},${two}`,
          `--allow-write=${one}`,
        ]);
        const line = [cmd, ...args].map((a) => `'${a}'`).join(" ");
        const result = spawnSync("script", ["-qec", line, "/dev/null"], {
          encoding: "utf8",
          timeout: 20_000,
          input: "",
        });
        assert.equal(
          result.error,
          undefined,
          "the child did not hang on a prompt",
        );
        assert.doesNotMatch(result.stdout, /Deno requests/);
        const events = result.stdout.trim().split(/\r?\n/).map((l) =>
          JSON.parse(l)
        );
        assert.deepEqual(events.map((e) => e.event), [
          "first",
          "second",
          "released",
        ]);
        assert.equal(
          events[1].name,
          "LockPermissionError",
          JSON.stringify(events[1]),
        );
        assert.equal(events[2].ok, true, JSON.stringify(events[2]));
        assert.deepEqual(names(one), []);
        assert.deepEqual(names(two), []);
      } finally {
        cleanup();
      }
    },
  );
});

describe("a held lock whose directory is moved away", () => {
  for (const sync of [false, true]) {
    test(`${sync ? "releaseSync" : "release"}() before any check (checkInterval 0) removes its file in the moved directory and reports LockLostError: the lock was not at its path, where another run took it`, async () => {
      const { dir, cleanup } = tempDir();
      try {
        const state = join(dir, "state");
        const path = join(state, "run.lock");
        const lock = sync
          ? acquireSync(path, { checkInterval: 0 })
          : await acquire(path, { checkInterval: 0 });
        renameSync(state, join(dir, "state.old"));
        mkdirSync(state);
        const other = await acquire(path, { timeout: 0 });
        const check = (err: unknown) => {
          assert.equal((err as Error).name, "LockLostError", String(err));
          assert.match((err as Error).message, /moved away from its path/);
          return true;
        };
        if (sync) assert.throws(() => lock.releaseSync(), check);
        else await assert.rejects(lock.release(), check);
        assert.equal(lock.signal.aborted, true);
        assert.deepEqual(names(join(dir, "state.old")), []);
        assert.equal(await held(path), true, "the other run's lock is left");
        await other.release();
      } finally {
        cleanup();
      }
    });
  }
});

describe("which directory is pinned", () => {
  test("a lock taken through a symlink to a directory in tmpdir is in the real directory", async () => {
    const { dir, cleanup } = tempDir();
    try {
      mkdirSync(join(dir, "real"));
      symlinkSync(join(dir, "real"), join(dir, "link"));
      await using lock = await acquire(join(dir, "link", "run.lock"));
      assert.equal(lock.path, join(dir, "link", "run.lock"), "path as given");
      assert.deepEqual(names(join(dir, "real")), ["run.lock"]);
      await assert.rejects(
        acquire(join(dir, "real", "run.lock")),
        (err) => err instanceof HeldError && err.byThisProcess,
      );
    } finally {
      cleanup();
    }
  });
});

describe("a lock's directory moved away and replaced while a run waits for it", () => {
  // The waiter pinned d at its start; d is renamed and a new d made, where
  // X takes the lock; then the old holder releases. The waiter must not
  // hold d.old/run.lock as if it were d/run.lock (beside X): it waits for X.
  for (const how of ["renamed", "mounted over"] as const) {
    test(
      `directory ${how}: the waiter takes the lock only at the path it was given, after the run there`,
      {
        skip: how === "mounted over" &&
          (process.platform !== "linux" || process.getuid?.() !== 0),
      },
      async () => {
        const { dir, cleanup } = tempDir();
        const d = join(dir, "d");
        mkdirSync(d);
        const path = join(d, "run.lock");
        const children: Child[] = [];
        let mounted = false;
        try {
          const h = await holder(path);
          children.push(h);
          const w = new Child("child.ts", ["wait", path, "60000"]);
          children.push(w);
          await w.expect("waiting");
          if (how === "renamed") {
            renameSync(d, join(dir, "d.old"));
            mkdirSync(d);
          } else {
            const r = spawnSync("mount", ["-t", "tmpfs", "none", d]);
            assert.equal(r.status, 0, String(r.stderr));
            mounted = true;
          }
          const x = await holder(path);
          children.push(x);
          h.send("release");
          // The old holder may find, as it releases, that its directory was
          // moved away or mounted over (a loss it reports; its lock is
          // removed all the same): either way it lets go.
          const letGo = await h.next();
          assert.ok(
            letGo.event === "released" ||
              (letGo.event === "release-error" &&
                letGo.name === "LockLostError"),
            JSON.stringify(letGo),
          );
          // Whatever the waiter did on that release, the lock at the path is
          // X's until X lets go; then the waiter's.
          x.send("release");
          await x.expect("released");
          const got = await w.expect("acquired");
          const info = await inspect(path);
          assert.equal(info.state, "held");
          assert.equal(
            info.pid,
            got.pid,
            "the waiter holds the lock at its path",
          );
          const old = how === "renamed"
            ? await inspect(join(dir, "d.old", "run.lock"))
            : undefined;
          assert.notEqual(
            old?.state,
            "held",
            "nothing held in the old directory",
          );
          w.send("release");
          await w.expect("released");
        } finally {
          for (const c of children) c.send("exit");
          await Promise.all(children.map((c) => c.exited));
          if (mounted) spawnSync("umount", [d]);
          cleanup();
        }
      },
    );
  }
});
