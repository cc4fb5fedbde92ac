// watch(): the current state first (as scan() lists it), then each run's
// start, end, crash, takeover and loss as it happens, from real holders in
// other processes, decided by probes (never a change a probe contradicts).
import assert from "node:assert/strict";
import {
  lstatSync,
  mkdirSync,
  renameSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  acquire,
  type Change,
  type ChangeKind,
  RunlockError,
  scan,
  watch,
  type WatchOptions,
} from "../../mod.ts";
import {
  Child,
  deadPid,
  delay,
  fixture,
  fixtureCommand,
  holder,
  runtime,
  tempDir,
} from "../_helpers.ts";

/** How long a wait for a change may take before the test calls it hung. */
const HANG_MS = 120_000;

/** A watch being iterated, with every change it reported so far. */
class Watching {
  readonly changes: Change[] = [];
  readonly batches: Change[][] = [];
  readonly #it: AsyncIterator<Change[]>;
  #ended = false;

  constructor(dir: string, options?: WatchOptions) {
    this.#it = watch(dir, options)[Symbol.asyncIterator]();
  }

  /** The next batch, or `undefined` once the iteration ended. */
  async batch(): Promise<Change[] | undefined> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const hang = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () =>
          reject(
            new Error(
              `no batch in ${HANG_MS / 1000} s; so far: ${
                JSON.stringify(this.changes.map((c) => [c.path, c.kind]))
              }`,
            ),
          ),
        HANG_MS,
      );
    });
    try {
      const r = await Promise.race([this.#it.next(), hang]);
      if (r.done) {
        this.#ended = true;
        return undefined;
      }
      this.batches.push(r.value);
      this.changes.push(...r.value);
      return r.value;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Reads batches until `done(changes)` holds. */
  async until(done: (changes: Change[]) => boolean): Promise<Change[]> {
    while (!done(this.changes)) {
      if (this.#ended || (await this.batch()) === undefined) {
        throw new Error(
          `the watch ended first: ${
            JSON.stringify(this.changes.map((c) => [c.path, c.kind]))
          }`,
        );
      }
    }
    return this.changes;
  }

  /** The kinds reported for `path`, in order. */
  kinds(path: string): ChangeKind[] {
    return this.changes.filter((c) => c.path === path).map((c) => c.kind);
  }

  get ended(): boolean {
    return this.#ended;
  }

  async close(): Promise<void> {
    await this.#it.return?.();
  }
}

/**
 * Runs fixtures/short_runs.ts: `runs` runs of `ms` ms in `dirs`
 * directories `d<k>` of `dir`, `atOnce` at a time; resolves once all ended.
 */
async function shortRuns(
  dir: string,
  dirs: number,
  runs: number,
  atOnce: number,
  ms: number,
): Promise<void> {
  const child = new Child(
    "short_runs.ts",
    [dir, dirs, runs, atOnce, ms].map(String),
  );
  try {
    assert.equal((await child.expect("done")).runs, runs);
  } finally {
    await child.kill();
  }
}

/**
 * How many runs `kinds` (one path's changes) shows, asserting that each is
 * a start followed by its release.
 */
function startedThenReleased(kinds: ChangeKind[]): number {
  kinds.forEach((kind, i) =>
    assert.equal(kind, i % 2 === 0 ? "started" : "released", `${kinds}`)
  );
  assert.equal(kinds.length % 2, 0, `${kinds}`);
  return kinds.length / 2;
}

const has = (path: string, kind: ChangeKind) => (changes: Change[]) =>
  changes.some((c) => c.path === path && c.kind === kind);

describe("watch()", () => {
  test("the first batch is what scan() lists (held and stale runs, not pidfiles, other files or temp files), flat and recursive", async () => {
    const { dir, cleanup } = tempDir();
    const live = await holder(join(dir, "b-live.lock"));
    const flat = new Watching(dir);
    const deep = new Watching(dir, { recursive: true });
    try {
      const dead = deadPid();
      writeFileSync(join(dir, "a-crashed"), `${dead}\nrunlock 1\nhost=x\n`);
      writeFileSync(join(dir, "plain.pid"), `${dead}\n`);
      writeFileSync(join(dir, "notes.txt"), "hello\n");
      writeFileSync(
        join(dir, ".b-live.lock.0123456789abcdef.tmp"),
        `${dead}\nrunlock 1\n`,
      );
      symlinkSync(join(dir, "a-crashed"), join(dir, "link.lock"));
      mkdirSync(join(dir, "sub"));
      writeFileSync(join(dir, "sub", "deep.lock"), `${dead}\nrunlock 1\n`);
      for (const [w, recursive] of [[flat, false], [deep, true]] as const) {
        const first = await w.batch();
        const listed = await scan(dir, { recursive });
        assert.deepEqual(
          first,
          listed.map((inspection) => ({
            path: inspection.path,
            kind: "present",
            inspection,
          })),
        );
      }
      assert.equal(flat.changes.length, 2);
      assert.equal(deep.changes.length, 3);
    } finally {
      await flat.close();
      await deep.close();
      await live.kill();
      cleanup();
    }
  });

  test("a run that starts and releases: started (held, its pid and meta), then released (free); files that are not locks bring no change", async () => {
    const { dir, cleanup } = tempDir();
    const w = new Watching(dir);
    const path = join(dir, "sync.lock");
    let child: Child | undefined;
    try {
      assert.deepEqual(await w.batch(), []);
      writeFileSync(join(dir, "notes.txt"), "hello\n");
      writeFileSync(join(dir, "plain.pid"), `${deadPid()}\n`);
      child = new Child("child.ts", ["hold", path, "0", '{"cmd":"sync"}']);
      await child.expect("acquired");
      await w.until(has(path, "started"));
      const started = w.changes.find((c) => c.path === path)!;
      assert.equal(started.inspection.state, "held");
      assert.equal(started.inspection.pid, child.pid);
      assert.equal(started.inspection.meta.cmd, "sync");
      child.send("release");
      await child.expect("released");
      await w.until(has(path, "released"));
      assert.deepEqual(w.kinds(path), ["started", "released"]);
      assert.equal(w.changes.at(-1)!.inspection.state, "free");
      assert.deepEqual(
        w.changes.map((c) => c.path),
        [path, path],
        "the other files brought no change",
      );
    } finally {
      await w.close();
      await child?.kill();
      cleanup();
    }
  });

  test("a SIGKILLed holder is crashed: its record stays, stale, with its pid", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "job.lock");
    const child = await holder(path);
    const w = new Watching(dir);
    try {
      const [first] = (await w.batch())!;
      assert.equal(first.kind, "present");
      assert.equal(first.inspection.state, "held");
      await child.kill("SIGKILL");
      await w.until(has(path, "crashed"));
      assert.deepEqual(w.kinds(path), ["present", "crashed"]);
      const crashed = w.changes.at(-1)!;
      assert.equal(crashed.inspection.state, "stale");
      assert.equal(crashed.inspection.pid, child.pid);
    } finally {
      await w.close();
      await child.kill();
      cleanup();
    }
  });

  test("a holder killed between its link and its temp name's unlink is crashed, found by its close: before a run started after the kill", async () => {
    // Deno's directory watch reports a holder's close under the name its
    // descriptor was opened by, here a temp name that still exists.
    const { dir, cleanup } = tempDir();
    const path = join(dir, "job.lock");
    const later = join(dir, "later.lock");
    const forged = new Child("", [path, "--keep-temp"], undefined, [
      "python3",
      fixture("forged_holder.py"),
    ]);
    let w: Watching | undefined;
    try {
      assert.equal((await forged.next()).text, "held");
      w = new Watching(dir);
      await w.until(has(path, "present"));
      await forged.kill("SIGKILL");
      // Its flock went with its exit: a look now finds it crashed.
      const run = await acquire(later);
      await w.until(has(later, "started"));
      await run.release();
      const order = w.changes.map((c) => `${c.kind} ${c.path}`);
      assert.ok(
        order.indexOf(`crashed ${path}`) >= 0 &&
          order.indexOf(`crashed ${path}`) < order.indexOf(`started ${later}`),
        order.join("\n"),
      );
    } finally {
      await w?.close();
      await forged.kill();
      cleanup();
    }
  });

  test(
    "after events were lost (the inotify queue overflowed while the watcher was stopped), a subdirectory renamed away and made again meanwhile is watched again: a run started in it then is reported",
    {
      skip: runtime !== "deno" &&
        "Node's and Bun's fs.watch do not report lost events (PROTOCOL.md, Watching)",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const sub = join(dir, "sub");
      mkdirSync(sub);
      const watcher = new Child("watcher.ts", ["follow-recursive", dir]);
      let run: Child | undefined;
      try {
        await watcher.expect("first");
        assert.ok(watcher.signal("SIGSTOP"));
        // More events than the queue holds (16,384 by default).
        // Two files in turn: the kernel merges an event equal to the last.
        const flood = spawnSync("python3", [
          "-c",
          "import sys\nfrom os import utime\na, b = sys.argv[1:]\n" +
          "open(a, 'w').close(); open(b, 'w').close()\n" +
          "for i in range(10000): utime(a); utime(b)",
          join(dir, "flood-a"),
          join(dir, "flood-b"),
        ]);
        assert.equal(flood.status, 0, String(flood.stderr));
        renameSync(sub, `${sub}.old`);
        mkdirSync(sub);
        assert.ok(watcher.signal("SIGCONT"));
        run = await holder(join(sub, "run.lock"));
        for (;;) {
          const e = await watcher.expect("change");
          if (e.kind === "started" && e.path === join(sub, "run.lock")) break;
        }
      } finally {
        await run?.kill();
        await watcher.kill();
        cleanup();
      }
    },
  );

  test("a watched directory replaced by a file with its inode number (ext4 gives it at once) ends the watch: an identity is a directory's only if a directory is there", async (t) => {
    const { dir, cleanup } = tempDir();
    try {
      let reused = false;
      for (let round = 0; round < 20 && !reused; round++) {
        const top = join(dir, `top${round}`);
        mkdirSync(top);
        const ino = lstatSync(top).ino;
        const w = new Watching(top);
        try {
          await w.batch();
          rmSync(top, { recursive: true });
          writeFileSync(top, "");
          // Another inode: no proof either way; try again.
          if (lstatSync(top).ino !== ino) continue;
          reused = true;
          assert.equal(await w.batch(), undefined);
        } finally {
          await w.close();
        }
      }
      if (!reused) t.skip("no inode number was given again here");
    } finally {
      cleanup();
    }
  });

  test("a holder's file deleted under it is lost (not released) while the holder lives on", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "job.lock");
    const child = await holder(path);
    const w = new Watching(dir);
    try {
      await w.batch();
      unlinkSync(path);
      await w.until(has(path, "lost"));
      assert.deepEqual(w.kinds(path), ["present", "lost"]);
      assert.equal(w.changes.at(-1)!.inspection.state, "free");
      assert.ok(child.running, "the holder still runs");
      child.send("owned");
      assert.equal((await child.expect("owned")).owned, false);
    } finally {
      await w.close();
      await child.kill();
      cleanup();
    }
  });

  test("a stale file that a new holder acquires is taken over, with the new holder's pid", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "job.lock");
    const dead = deadPid();
    writeFileSync(path, `${dead}\nrunlock 1\nhost=x\n`);
    const w = new Watching(dir);
    let child: Child | undefined;
    try {
      const [first] = (await w.batch())!;
      assert.equal(first.inspection.state, "stale");
      assert.equal(first.inspection.pid, dead);
      child = await holder(path);
      await w.until(has(path, "taken over"));
      assert.deepEqual(w.kinds(path), ["present", "taken over"]);
      const taken = w.changes.at(-1)!;
      assert.equal(taken.inspection.state, "held");
      assert.equal(taken.inspection.pid, child.pid);
    } finally {
      await w.close();
      await child?.kill();
      cleanup();
    }
  });

  test("1,000 runs started and ended in a burst: every path exactly started, then released; nothing lost, nothing invented", async () => {
    const { dir, cleanup } = tempDir();
    const n = 1000;
    const w = new Watching(dir);
    const child = new Child("watch_many.ts", ["hold", dir, String(n), "0"]);
    const paths = Array.from({ length: n }, (_, i) => join(dir, `lock-${i}`));
    try {
      assert.deepEqual(await w.batch(), []);
      await child.expect("held");
      const count = (kind: ChangeKind) => (changes: Change[]) =>
        changes.filter((c) => c.kind === kind).length >= n;
      await w.until(count("started"));
      for (let i = 0; i < n; i++) child.send(`release ${i}`);
      await w.until(count("released"));
      // A run after them all: once it is reported, nothing of the burst
      // can still be on its way.
      await using sentinel = await acquire(join(dir, "sentinel"));
      await w.until(has(sentinel.path, "started"));
      for (const path of paths) {
        assert.deepEqual(w.kinds(path), ["started", "released"], path);
      }
      assert.equal(w.changes.length, 2 * n + 1);
      for (const c of w.changes) {
        assert.equal(
          c.inspection.state,
          c.kind === "started" ? "held" : "free",
          `${c.path} ${c.kind}`,
        );
      }
    } finally {
      await w.close();
      await child.kill();
      cleanup();
    }
  });

  test("300 runs of 30 ms, 8 at a time, in 73 directories watched recursively: most reported, each one started, then released", async () => {
    const { dir, cleanup } = tempDir();
    const dirs = 73;
    const runs = 300;
    for (let k = 0; k < dirs; k++) mkdirSync(join(dir, `d${k}`));
    const w = new Watching(dir, { recursive: true });
    try {
      assert.deepEqual(await w.batch(), []);
      await shortRuns(dir, dirs, runs, 8, 30);
      // A run after them all: once it is reported, nothing of theirs can
      // still be on its way.
      await using sentinel = await acquire(join(dir, "sentinel"));
      await w.until(has(sentinel.path, "started"));
      // A run can end before a busy machine lets the watch look at it:
      // each run seen is seen started, then released; and most are seen
      // (one watcher per directory on Deno saw 24 of 300).
      let seen = 0;
      for (let k = 0; k < dirs; k++) {
        const kinds = w.kinds(join(dir, `d${k}`, "run.lock"));
        const most = Math.floor(runs / dirs) + (k < runs % dirs ? 1 : 0);
        assert.ok(kinds.length <= 2 * most, `d${k}: ${kinds}`);
        seen += startedThenReleased(kinds);
      }
      assert.ok(seen >= runs / 2, `${seen} of ${runs} runs seen`);
    } finally {
      await w.close();
      cleanup();
    }
  });

  test("a watcher short of descriptors (ulimit -n 64) reports each of 100 runs started, then crashed, and lives on: a look that finds no descriptor is looked at again, and the kept ones leave the runtime some", async () => {
    const { dir, cleanup } = tempDir();
    const n = 100;
    const [cmd, argv] = fixtureCommand("watcher.ts", ["follow", dir]);
    const w = new Child("watcher.ts", argv, undefined, [
      "sh",
      "-c",
      'ulimit -n 64 && exec "$@"',
      "sh",
      cmd,
    ]);
    let child: Child | undefined;
    try {
      assert.equal((await w.expect("first")).n, 0);
      child = new Child("watch_many.ts", ["hold", dir, String(n), "0"]);
      await child.expect("held");
      const kinds = new Map<string, string[]>();
      const count = (kind: string) =>
        [...kinds.values()].filter((k) => k.at(-1) === kind).length;
      const read = async (kind: string) => {
        while (count(kind) < n) {
          const e = await w.next();
          assert.equal(e.event, "change", JSON.stringify([e, w.stderr]));
          kinds.set(e.path as string, [
            ...kinds.get(e.path as string) ?? [],
            e.kind as string,
          ]);
        }
      };
      await read("started");
      await child.kill("SIGKILL");
      await read("crashed");
      assert.equal(kinds.size, n);
      for (const [path, k] of kinds) {
        assert.deepEqual(k, ["started", "crashed"], path);
      }
    } finally {
      await w.kill();
      await child?.kill();
      cleanup();
    }
  });

  test("a watched directory that is removed: its runs end (a live holder's as lost, a stale file as released), then the iteration ends", async () => {
    const { dir, cleanup } = tempDir();
    const sub = join(dir, "state");
    mkdirSync(sub);
    const stale = join(sub, "old.lock");
    writeFileSync(stale, `${deadPid()}\nrunlock 1\n`);
    const live = join(sub, "job.lock");
    const child = await holder(live);
    const w = new Watching(sub);
    try {
      assert.equal((await w.batch())!.length, 2);
      rmSync(sub, { recursive: true, force: true });
      while ((await w.batch()) !== undefined);
      assert.deepEqual(w.kinds(stale), ["present", "released"]);
      assert.deepEqual(w.kinds(live), ["present", "lost"]);
      assert.ok(w.ended);
    } finally {
      await w.close();
      await child.kill();
      cleanup();
    }
  });

  test("recursive: runs in subdirectories made after the watch began are seen, never through a symlink; a flat watch sees none of them", async () => {
    const { dir, cleanup } = tempDir();
    const deep = new Watching(dir, { recursive: true });
    const flat = new Watching(dir);
    let child: Child | undefined;
    try {
      await deep.batch();
      await flat.batch();
      mkdirSync(join(dir, "a", "b"), { recursive: true });
      symlinkSync(join(dir, "a"), join(dir, "link"));
      const path = join(dir, "a", "b", "x.lock");
      child = await holder(path);
      await deep.until(has(path, "started"));
      child.send("release");
      await child.expect("released");
      await deep.until(has(path, "released"));
      rmSync(join(dir, "a"), { recursive: true });
      await using top = await acquire(join(dir, "top.lock"));
      await deep.until(has(top.path, "started"));
      await flat.until(has(top.path, "started"));
      assert.deepEqual(deep.changes.map((c) => [c.path, c.kind]), [
        [path, "started"],
        [path, "released"],
        [top.path, "started"],
      ]);
      assert.deepEqual(flat.changes.map((c) => [c.path, c.kind]), [
        [top.path, "started"],
      ]);
    } finally {
      await deep.close();
      await flat.close();
      await child?.kill();
      cleanup();
    }
  });

  test("two watches of one directory, one of them through a symlink: ending one leaves the other seeing a run start and crash", async () => {
    const { dir, cleanup } = tempDir();
    const link = `${dir}.link`;
    symlinkSync(dir, link);
    const kept = new Watching(dir);
    const ended = new Watching(link);
    let child: Child | undefined;
    try {
      await kept.batch();
      await ended.batch();
      await ended.close();
      const path = join(dir, "x.lock");
      child = await holder(path);
      await kept.until(has(path, "started"));
      await child.kill();
      await kept.until(has(path, "crashed"));
      assert.deepEqual(kept.kinds(path), ["started", "crashed"]);
    } finally {
      await kept.close();
      await child?.kill();
      unlinkSync(link);
      cleanup();
    }
  });

  for (const inProcess of [false, true]) {
    test(
      `recursive: a subdirectory removed and made again at its path (its runs held in ${
        inProcess ? "the watching process" : "another process"
      }) is watched again: 8 or more of 10 runs of 150 ms there are seen, each started, then released`,
      {
        // Bun's fs.watch of a path serves a new watch with the watch of the
        // directory that was there, while any watch of it is open: here the
        // lock's own watch of its directory (PROTOCOL.md, "Where it does
        // not hold").
        skip: inProcess && runtime === "bun",
      },
      async () => {
        const { dir, cleanup } = tempDir();
        const sub = join(dir, "d0");
        mkdirSync(sub);
        mkdirSync(join(dir, "other"));
        const w = new Watching(dir, { recursive: true });
        /** A run of `path` that the watch is seen to start and end. */
        const seenRun = async (path: string) => {
          if (inProcess) {
            const lock = await acquire(path);
            await w.until(has(path, "started"));
            await lock.release();
            await w.until(has(path, "released"));
          } else {
            const h = await holder(path);
            await w.until(has(path, "started"));
            await h.kill("SIGKILL");
            await w.until(has(path, "crashed"));
          }
        };
        try {
          assert.deepEqual(await w.batch(), []);
          // The watch knows the old directory.
          await seenRun(join(sub, "first.lock"));
          rmSync(sub, { recursive: true });
          // At once: the new directory gets the old one's inode number.
          mkdirSync(sub);
          // Seen once the watch found the new directory (by a look, if not
          // by its watch).
          await seenRun(join(sub, "again.lock"));
          const runs = 10;
          if (!inProcess) await shortRuns(dir, 1, runs, 1, 150);
          else {
            for (let i = 0; i < runs; i++) {
              const lock = await acquire(join(sub, "run.lock"));
              await delay(150);
              await lock.release();
            }
          }
          await using sentinel = await acquire(join(dir, "other", "sentinel"));
          await w.until(has(sentinel.path, "started"));
          const seen = startedThenReleased(w.kinds(join(sub, "run.lock")));
          // Without a watch of the new directory, its looks come after
          // other events, or once a second: 4 of these 150 ms runs were
          // seen so. A busy machine may make a watch miss one or two.
          assert.ok(seen >= runs - 2, `${seen} of ${runs} seen`);
        } finally {
          await w.close();
          cleanup();
        }
      },
    );
  }

  test("recursive: a subdirectory renamed away and straight back is still watched, and the one inside it: a run started there later is seen, and its crash", async () => {
    const { dir, cleanup } = tempDir();
    const sub = join(dir, "sub");
    mkdirSync(join(sub, "inner"), { recursive: true });
    const deep = new Watching(dir, { recursive: true });
    let child: Child | undefined;
    try {
      await deep.batch();
      renameSync(sub, `${sub}2`);
      renameSync(`${sub}2`, sub);
      // Past the re-scans that follow the renames' events (250 ms, then a
      // second later), so that only the watch can report the run. Under
      // load they may still be running: the test then passes either way,
      // never fails for it.
      await delay(2000);
      const path = join(sub, "inner", "x.lock");
      child = await holder(path);
      await deep.until(has(path, "started"));
      await child.kill();
      await deep.until(has(path, "crashed"));
      assert.deepEqual(deep.kinds(path), ["started", "crashed"]);
    } finally {
      await deep.close();
      await child?.kill();
      cleanup();
    }
  });

  test("an onSkip that ends the watch in the middle of its first listing leaves no watch behind: the process exits by itself", async () => {
    const { dir, cleanup } = tempDir();
    // A temp-named file that is not empty is left out unread (onSkip);
    // directories around it, and below, are what the listing would watch.
    writeFileSync(join(dir, ".job.lock.0123456789abcdef.tmp"), "x");
    for (let i = 0; i < 30; i++) {
      mkdirSync(join(dir, `d${i}`, "sub"), { recursive: true });
    }
    try {
      const child = new Child("watcher.ts", ["skip-return", dir]);
      assert.equal((await child.expect("ended")).batches, 0);
      // Exits by itself; the bound only tells a hang from a slow machine.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const exited = await Promise.race([
        child.exited,
        new Promise((resolve) => timer = setTimeout(resolve, 60_000, "hung")),
      ]);
      clearTimeout(timer);
      if (exited === "hung") await child.kill();
      assert.deepEqual(exited, { code: 0, signal: null });
    } finally {
      cleanup();
    }
  });

  test("its signal, and a break out of the loop, end it and free everything: a process that watches and stops exits by itself", async () => {
    const { dir, cleanup } = tempDir();
    // A held run, so that the watch holds a descriptor and a close watch.
    const live = await holder(join(dir, "job.lock"));
    try {
      for (const mode of ["abort", "break"]) {
        const child = new Child("watcher.ts", [mode, dir]);
        assert.equal((await child.expect("first")).n, 1);
        await child.expect("ended");
        // Exits by itself; the bound only tells a hang from a slow machine.
        let timer: ReturnType<typeof setTimeout> | undefined;
        const exited = await Promise.race([
          child.exited,
          new Promise((resolve) => timer = setTimeout(resolve, 60_000, "hung")),
        ]);
        clearTimeout(timer);
        if (exited === "hung") await child.kill();
        assert.deepEqual(exited, { code: 0, signal: null }, mode);
      }
      const controller = new AbortController();
      controller.abort();
      const w = new Watching(dir, { signal: controller.signal });
      assert.equal(await w.batch(), undefined, "an aborted signal: no batch");
    } finally {
      await live.kill();
      cleanup();
    }
  });

  test(
    "under Deno with --allow-read for the watched directory only, it keeps watching after a release (it does not take the directory for gone because its parent may not be read)",
    {
      skip: typeof Deno === "undefined",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const state = join(dir, "state");
      mkdirSync(state);
      const first = await holder(join(state, "a.lock"));
      let second: Child | undefined;
      const w = new Child("watcher.ts", ["follow", state], [
        `--allow-read=${state}`,
      ]);
      try {
        assert.equal((await w.expect("first")).n, 1);
        first.send("release");
        await first.expect("released");
        const released = await w.next();
        assert.deepEqual([released.event, released.kind], [
          "change",
          "released",
        ]);
        second = await holder(join(state, "b.lock"));
        const started = await w.next();
        assert.deepEqual(
          [started.event, started.kind, started.path],
          ["change", "started", join(state, "b.lock")],
          "still watching",
        );
      } finally {
        await w.kill();
        await first.kill();
        await second?.kill();
        cleanup();
      }
    },
  );

  test(
    "under Deno with --allow-read for a symlink to the watched directory only, the LockPermissionError names the grant it needs: the symlink's and the real directory's",
    {
      skip: typeof Deno === "undefined",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const real = join(dir, "state");
      const link = join(dir, "link");
      mkdirSync(real);
      symlinkSync(real, link);
      const w = new Child("watcher.ts", ["follow", link], [
        `--allow-read=${link}`,
      ]);
      try {
        const { code } = await w.exited;
        const stderr = w.stderr.join("");
        assert.notEqual(code, 0, stderr);
        assert.match(stderr, /LockPermissionError/);
        assert.ok(
          stderr.includes(`run Deno with --allow-read=${link},${real} `),
          stderr,
        );
      } finally {
        await w.kill();
        cleanup();
      }
    },
  );

  test("bad input is a TypeError before anything touches the disk; a file or a missing directory is a RunlockError", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const missing = join(dir, "nowhere", "deeper");
      for (
        const [arg, options] of [
          ["", undefined],
          [`${missing}\0x`, undefined],
          [42, undefined],
          [missing, { recursive: "yes" }],
          [missing, { signal: "stop" }],
        ] as [unknown, unknown][]
      ) {
        assert.throws(
          () => watch(arg as string, options as WatchOptions),
          TypeError,
          JSON.stringify(arg),
        );
      }
      const file = join(dir, "file");
      writeFileSync(file, "x");
      for (const path of [file, missing]) {
        const it = watch(path)[Symbol.asyncIterator]();
        await assert.rejects(it.next(), (err) => {
          assert.ok(err instanceof RunlockError, String(err));
          assert.match(err.message, /cannot watch/);
          return true;
        });
        assert.deepEqual(await it.next(), { value: undefined, done: true });
      }
    } finally {
      cleanup();
    }
  });
});
