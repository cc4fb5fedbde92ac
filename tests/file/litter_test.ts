// Litter: a process killed between creating its temp file and linking it
// (or between the link and the temp name's unlink) leaves the temp file; it
// is swept only once no live process holds it, and never by a listing of a
// larger directory on the acquire (PROTOCOL.md, "Litter").
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { basename, dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { acquire, acquireSync } from "../../mod.ts";
import { createInterface } from "node:readline";
import {
  deadPid,
  fixture,
  fixtureCommand,
  holder,
  tempDir,
  waitFor,
} from "../_helpers.ts";

/**
 * The state a process leaves if it is killed between protocol steps 1 and 2:
 * a `.run.lock.<random>.tmp` holding a record, flocked by a live process.
 * fixtures/litter_holder.py plays that process: it takes the flock itself
 * and says so, so the same fixture serves every runtime under test. (Not
 * flock(1): its forked command shares the locked descriptor until it
 * closes it, so killing flock(1) does not always drop the lock at once, and
 * the next acquire rightly keeps a temp file that is still locked.)
 */
async function litter(
  path: string,
): Promise<{ temp: string; kill(): Promise<void> }> {
  const hex = randomBytes(8).toString("hex");
  const temp = join(dirname(path), `.${basename(path)}.${hex}.tmp`);
  writeFileSync(temp, `99999\nrunlock 1\n`, { flag: "wx" });
  const holder = spawn("python3", [fixture("litter_holder.py"), temp], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise<void>((resolve) =>
    holder.on("exit", () => resolve())
  );
  const lines = createInterface({ input: holder.stdout! });
  await new Promise<void>((resolve, reject) => {
    lines.on("line", (line) => line === "held" && resolve());
    exited.then(() => reject(new Error(`litter_holder.py exited early`)));
  });
  return {
    temp,
    async kill() {
      holder.kill("SIGKILL");
      await exited; // its descriptor, and so its flock, is gone now
    },
  };
}

/** Gives `dir` `n` more names (of one empty file): more than one block. */
function fill(dir: string, n: number): void {
  // One python3 process making hard links: ten times faster than as many
  // new files (no inode each), and the directory is just as large.
  const made = spawnSync("python3", [
    "-c",
    "import os, sys\nd = sys.argv[1]\nopen(f'{d}/f', 'w').close()\n" +
    "for i in range(int(sys.argv[2]) - 1): os.link(f'{d}/f', f'{d}/f{i}')",
    dir,
    String(n),
  ]);
  assert.equal(made.status, 0, String(made.stderr));
  // More than one ext4 block (tmpfs, btrfs: more names than one holds):
  // the acquire does not list it (src/file/_sweep.ts, SMALL_DIR_BYTES).
  assert.ok(statSync(dir).size > 4096, `${dir} is still small`);
}

/** Whether strace can trace here, else why the strace tests skip. */
function straceSkip(): string | false {
  const r = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"]);
  if (!r.error && r.status === 0) return false;
  const why = r.error
    ? "strace is not installed (apt-get install strace; .ci/run does)"
    : `strace cannot trace here: ${r.stderr}`;
  if (process.env.CI === "true") throw new Error(why);
  console.warn(`\n*** file/litter_test's strace tests SKIPPED: ${why} ***\n`);
  return why;
}
const noStrace = straceSkip();

/**
 * Runs fixture `name` under `strace -f -qq -y` with `straceArgs`; returns
 * its stdout and the trace's lines.
 */
function traced(
  name: string,
  args: string[],
  straceArgs: string[],
  env: Record<string, string> = {},
): { stdout: string; stderr: string; lines: string[] } {
  const { dir, cleanup } = tempDir();
  try {
    const out = join(dir, "trace");
    const [cmd, argv] = fixtureCommand(name, args);
    const r = spawnSync(
      "strace",
      ["-f", "-qq", "-y", ...straceArgs, "-o", out, cmd, ...argv],
      { encoding: "utf8", env: { ...process.env, ...env } },
    );
    const lines = existsSync(out) ? readFileSync(out, "utf8").split("\n") : [];
    return { stdout: r.stdout, stderr: r.stderr, lines };
  } finally {
    cleanup();
  }
}

describe("litter", () => {
  test("a temp file whose creator is alive is never swept", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const creator = await litter(path);
    try {
      const [temp] = readdirSync(dir);
      assert.match(temp, /^\.run\.lock\.[0-9a-f]{16}\.tmp$/);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), [temp]);
    } finally {
      await creator.kill();
      cleanup();
    }
  });

  test("a temp file left by a process SIGKILLed before its link is swept by the next acquire", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      const creator = await litter(path);
      await creator.kill();
      assert.equal(readdirSync(dir).length, 1);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), []);
    } finally {
      cleanup();
    }
  });

  test("after any number of kills, one clean acquire and release leaves the directory as it was", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      writeFileSync(join(dir, "unrelated.txt"), "keep me");
      writeFileSync(join(dir, ".run.lock.notours.tmp"), "keep me too");
      const creators = await Promise.all(
        [1, 2, 3, 4, 5].map(() => litter(path)),
      );
      const first = await holder(path);
      await Promise.all([...creators, first].map((c) => c.kill()));
      assert.equal(readdirSync(dir).length, 8);
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir).sort(), [
        ".run.lock.notours.tmp",
        "unrelated.txt",
      ]);
    } finally {
      cleanup();
    }
  });

  test("a stale takeover sweeps again, even in a process that swept this path before", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      await (await acquire(path)).release(); // this process's one-time sweep
      const creator = await litter(path);
      await creator.kill();
      writeFileSync(path, `${deadPid()}\nrunlock 1\n`); // and a crashed holder
      const lock = await acquire(path);
      await lock.release();
      assert.deepEqual(readdirSync(dir), []);
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });

  test(
    "a new name in a directory of 20,000 files is acquired without reading the directory",
    { skip: noStrace },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const small = join(dir, "small");
        const big = join(dir, "big");
        mkdirSync(small);
        mkdirSync(big);
        fill(big, 20_000);
        // getdents64 calls on the lock's directory (strace -y names it),
        // during one acquireSync and releaseSync by a fresh process.
        const reads = (d: string) => {
          const r = traced("litter_child.ts", [join(d, "run.lock")], [
            "-e",
            "trace=getdents64,getdents",
          ]);
          assert.equal(r.stdout, "done\n", r.stderr);
          const real = realpathSync(d);
          return r.lines.filter((l) => l.includes(`<${real}>`)).length;
        };
        // The count sees listings: a small directory is listed on the
        // acquire (its litter goes at once)...
        assert.ok(reads(small) > 0, "the trace saw no listing at all");
        // ...a larger one never is: its cost does not grow with its size.
        assert.equal(reads(big), 0, "the acquire listed 20,000 names");
        assert.equal(readdirSync(big).length, 20_000);
      } finally {
        cleanup();
      }
    },
  );

  test("in a larger directory, a dead acquirer's temp file is removed after the acquire, by a pass of the process that lives on; a live one's and look-alikes stay", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const live = await litter(path);
    try {
      fill(dir, 400);
      const dead = await litter(path);
      await dead.kill();
      const lookAlikes = [
        ".run.lock.fedcba9876543210.tmp", // ours by name, not by content
        ".other.lock.0123456789abcdef.tmp", // another lock's litter
        ".run.lock.notours.tmp",
      ];
      for (const name of lookAlikes) {
        writeFileSync(
          join(dir, name),
          name.includes("fedcba") ? "hello\n" : `${deadPid()}\nrunlock 1\n`,
        );
      }
      const before = readdirSync(dir).sort();
      // Synchronously: no event-loop turn between the acquire and the look.
      acquireSync(path).releaseSync();
      assert.deepEqual(readdirSync(dir).sort(), before, "swept on the acquire");
      await waitFor(
        () => !existsSync(dead.temp),
        "the pass removes the dead acquirer's temp file",
      );
      // The pass checks this lock's few temp files in one turn: done now.
      assert.deepEqual(
        readdirSync(dir).sort(),
        before.filter((n) => n !== basename(dead.temp)),
      );
      assert.ok(existsSync(live.temp));
    } finally {
      await live.kill();
      cleanup();
    }
  });

  test(
    "in a larger directory, the second name left by a holder SIGKILLed between its link and the temp name's unlink is removed after the takeover",
    { skip: noStrace },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      try {
        fill(dir, 400);
        // The fixture's temp names are .run.lock.<TAG><counter>.tmp; strace
        // kills it at its first unlink: the temp name's, after the link.
        const tag = randomBytes(4).toString("hex");
        const temp = join(dir, `.run.lock.${tag}00000001.tmp`);
        const r = traced("inject_fixture.ts", ["acquire", path], [
          "-e",
          "trace=unlink,unlinkat",
          "-e",
          "inject=unlink,unlinkat:signal=KILL:when=1",
        ], { RUNLOCK_INJECT_TAG: tag });
        assert.equal(r.stdout, "", `the fixture was not killed: ${r.stdout}`);
        const unlinks = r.lines.filter((l) => /\bunlink(at)?\(/.test(l));
        assert.ok(
          unlinks.length === 1 && unlinks[0].includes(basename(temp)) &&
            r.lines.some((l) => l.includes("killed by SIGKILL")),
          `not killed at the temp name's unlink:\n${r.lines.join("\n")}`,
        );
        assert.equal(statSync(temp).ino, statSync(path).ino);
        acquireSync(path).releaseSync(); // takes over the crashed holder's lock
        assert.equal(existsSync(path), false);
        assert.ok(existsSync(temp), "listed on the acquire");
        await waitFor(
          () => !existsSync(temp),
          "the pass after the takeover removes the second name",
        );
        assert.equal(
          readdirSync(dir).filter((n) => n.endsWith(".tmp")).length,
          0,
        );
      } finally {
        cleanup();
      }
    },
  );
});
