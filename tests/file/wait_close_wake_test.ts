// A waiter wakes on its holder's close (on Linux, inotify's
// IN_CLOSE_WRITE): the close of a SIGKILLed holder's descriptor. On Node
// and Bun, whose fs.watch does not report it, through the close watch of
// src/platform/_close_node.ts; on Deno, through its own watch of the lock
// file, whose mask has IN_CLOSE_WRITE. Shown under strace, as a property
// of the waiter's system calls, not a time: the waiter reads the close
// event from its inotify descriptor, and its winning attempt comes after
// that read. Without it, the waiter finds a dead holder only by its
// fallback looks (5 s apart on all three once the close is watched), and
// reads no close event at all. And a waiter follows the lock file from
// holder to holder, also when the next holder's file has the old one's
// inode number: the old watch went with the old inode.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  statSync,
  unlinkSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  Child,
  runtime,
  tempDir,
  tracedFixture,
  waitFor,
} from "../_helpers.ts";

const here = new URL(".", import.meta.url).pathname;

function skip(): string | false {
  if (process.platform !== "linux") return "inotify is Linux only";
  if (spawnSync("python3", ["-c", ""]).status !== 0) return "no python3";
  const r = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"]);
  const why = r.error || r.status !== 0 ? "strace cannot trace here" : false;
  if (why && process.env.CI === "true") throw new Error(why);
  return why;
}

/** A python3 holder of `path` (a runlock record, flocked); once it holds. */
async function pyHolder(path: string): Promise<Child> {
  const child = new Child("", [path], undefined, [
    "python3",
    join(here, "..", "fixtures", "record_holder.py"),
  ]);
  const e = await child.next();
  assert.equal(e.text, "held", JSON.stringify(e));
  return child;
}

/** fixtures/close_waiter.ts under strace, its trace written to `trace`. */
function tracedWaiter(trace: string, args: string[]): Child {
  return tracedFixture(
    "close_waiter.ts",
    args,
    trace,
    "inotify_add_watch,inotify_rm_watch,poll,epoll_ctl,read,openat,linkat,fcntl,dup,dup2,dup3,statx,newfstatat,lstat,stat",
  );
}

interface CloseWatch {
  /**
   * The inotify descriptor and watch descriptor of each close watch, and
   * the index of its line.
   */
  adds: { fd: string; wd: string; at: number }[];
  lines: string[];
}

/**
 * The waiter's watches of `name` that report IN_CLOSE_WRITE (Node and Bun:
 * the close watch, IN_CLOSE_WRITE alone; Deno: its watch of the file),
 * from its trace's text.
 */
function closeWatches(text: string, name: string): CloseWatch {
  // strace -f splits a call that another thread's call interrupts
  // ("<unfinished ...>", then "<... linkat resumed>"): join them, where
  // the call began.
  const lines: string[] = [];
  const open = new Map<string, number>();
  for (const line of text.split("\n")) {
    const [, pid, body] = line.match(/^(\d+)\s+(.*)$/) ?? [, "", line];
    if (body.endsWith("<unfinished ...>")) {
      open.set(pid, lines.length);
      lines.push(line.slice(0, -"<unfinished ...>".length));
      continue;
    }
    const resumed = body.match(/^<\.\.\. \w+ resumed>(.*)$/);
    const at = open.get(pid);
    if (resumed && at !== undefined) {
      lines[at] = lines[at].trimEnd() + resumed[1].replace(/^\)\s+=/, ") =");
      open.delete(pid);
    } else lines.push(line);
  }
  const adds = [];
  for (const [at, line] of lines.entries()) {
    const m = line.match(
      /inotify_add_watch\((\d+), "[^"]*\/([^"/]+)", [A-Z_|]*\bIN_CLOSE_WRITE\b[A-Z_|]*\) = (\d+)/,
    );
    if (m && m[2] === name) adds.push({ fd: m[1], wd: m[3], at });
  }
  return { adds, lines };
}

/**
 * The inotify descriptor `fd` and its duplicates in the trace (Bun reads a
 * stream of a descriptor through a duplicate of it).
 */
function sameFd(lines: string[], fd: string): Set<string> {
  const fds = new Set([fd]);
  for (const line of lines) {
    const m = line.match(
      /(?:fcntl\((\d+), F_DUPFD(?:_CLOEXEC)?, \d+\)|dup[23]?\((\d+)(?:, \d+)*(?:, \w+)?\))\s+=\s+(\d+)/,
    );
    if (m && fds.has(m[1] ?? m[2])) fds.add(m[3]);
  }
  return fds;
}

/**
 * Whether the waiter's trace shows its `nth` close watch of `name` (1: the
 * first) waiting (a poll of the inotify descriptor on Node; on Bun, the
 * descriptor added to the event loop's epoll) and its looks at `name`
 * since grown apart: five of them (growing from 1 ms, the next is then
 * 250 ms or more away), or one seen 400 ms ago (a waiter that sleeps
 * straight to its longest sleep after the first look). `seen` keeps when
 * the first look was seen.
 */
function sleeping(
  trace: string,
  name: string,
  seen: { at?: number } = {},
  nth = 1,
  isLook: (line: string, name: string) => boolean = opensName,
): boolean {
  let text;
  try {
    text = readFileSync(trace, "utf8");
  } catch {
    return false;
  }
  const { adds, lines } = closeWatches(text, name);
  if (adds.length < nth) return false;
  const after = lines.slice(adds[nth - 1].at);
  const fds = sameFd(lines, adds[0].fd);
  // Deno adds its inotify descriptor to its watch thread's epoll before
  // the watch itself.
  const polled = lines.some((l) => {
    const m = l.match(/(?:poll\(\[\{fd=|EPOLL_CTL_ADD, )(\d+),/);
    return m !== null && fds.has(m[1]);
  });
  const looks = after.filter((l) => isLook(l, name)).length;
  if (!polled || looks === 0) return false;
  seen.at ??= performance.now();
  return looks >= 5 || performance.now() - seen.at >= 400;
}

/**
 * Whether a trace line opens `name` read-only: through the pinned
 * directory (Node, Bun) or by its path (Deno).
 */
function opensName(line: string, name: string): boolean {
  return line.includes(`"${name}", O_RDONLY`) ||
    line.includes(`/${name}", O_RDONLY`);
}

/**
 * Whether a trace line is a look at `name`: its open (see `opensName`), or
 * the `lstat` of a quick look (a runlock holder of this host that lives:
 * no open).
 */
function looksAt(line: string, name: string): boolean {
  return opensName(line, name) ||
    /^(\d+\s+)?(newfstatat|statx|lstat)\(/.test(line) &&
      (line.includes(`"${name}"`) || line.includes(`/${name}"`));
}

const IN_ATTRIB = 0x4;
const IN_CLOSE_WRITE = 0x8;
const IN_MOVE_SELF = 0x800;

/** The four bytes of `n`, little-endian. */
function le32(n: number): number[] {
  return [n & 255, (n >> 8) & 255, (n >> 16) & 255, (n >>> 24) & 255];
}

/** A byte as strace prints it in a string. */
function esc(b: number): string {
  const named: Record<number, string> = {
    9: "\\t",
    10: "\\n",
    11: "\\v",
    12: "\\f",
    13: "\\r",
    34: '\\"',
    92: "\\\\",
  };
  if (named[b]) return named[b];
  if (b >= 32 && b < 127) return String.fromCharCode(b);
  return "\\" + b.toString(8);
}

/**
 * Whether the waiter's trace shows its winning attempt on `name` made at
 * once after it read an event of its `nth` close watch of `name` (1: the
 * first) with `mask` (the close, unless told): the first call on the lock's
 * name after the read is its temp file's creation, not a look at the name
 * (which is what finds a dead holder when no event tells: a look, 5 s after
 * the last). Says why not.
 */
function wokeBy(
  trace: string,
  name: string,
  nth: number,
  round: number,
  mask = IN_CLOSE_WRITE,
): boolean {
  const { adds, lines } = closeWatches(readFileSync(trace, "utf8"), name);
  assert.ok(
    adds.length >= nth,
    `the waiter watched the lock file for IN_CLOSE_WRITE ${nth} times`,
  );
  const { fd, wd } = adds[nth - 1];
  const body = (l: string) => l.replace(/^\d+\s+/, "");
  const won = lines.findIndex((l) =>
    /linkat\(.*[/"]run\d\.lock", 0\s*\)\s*= 0$/.test(body(l))
  );
  assert.ok(won > 0, "the waiter linked its record into place");
  // struct inotify_event: int wd, uint32 mask.
  const bytes = [...le32(Number(wd)), ...le32(mask)].map(esc).join("");
  const fds = sameFd(lines, fd);
  const event = lines.findIndex((l) => {
    const m = body(l).match(/^read\((\d+), "/);
    return m !== null && fds.has(m[1]) && body(l).includes(bytes);
  });
  const main = lines[won]?.match(/^(\d+)\s/)?.[1];
  const next =
    lines.slice(event + 1).find((l) =>
      l.match(/^(\d+)\s/)?.[1] === main && /run\d\.lock/.test(l)
    ) ?? "";
  const shown = event >= 0 && event < won &&
    /\.run\d\.lock\.[0-9a-f]+\.tmp", O_RDWR\|O_CREAT\|O_EXCL/.test(next);
  if (!shown) console.log(`round ${round}: after the event: ${next}`);
  return shown;
}

/**
 * A waiter on a python3 holder's lock, under strace, once it sleeps on its
 * close watch; `end` ends the holder's file (or the holder). Whether the
 * waiter took the lock at once after reading an event with `mask` (see
 * `wokeBy`), and then exited on its own. A fallback look may, rarely, land
 * between the end and the read of its event and win first: a round then
 * shows nothing, and another is run (three in all).
 */
async function takesAtOnce(
  end: (path: string, holder: Child) => unknown,
  mask: number,
): Promise<boolean> {
  const { dir, cleanup } = tempDir();
  try {
    for (let round = 0; round < 3; round++) {
      const name = `run${round}.lock`;
      const path = join(dir, name);
      const trace = join(dir, `waiter${round}.trace`);
      const holder = await pyHolder(path);
      const waiter = tracedWaiter(trace, [path, "120000", "1"]);
      try {
        await waiter.expect("waiting");
        // Once the close watch waits (its poll is issued) and the waiter's
        // looks have grown apart (see `sleeping`), so that a look finding
        // the end is the exception the rounds allow for, not the rule.
        const seen = {};
        await waitFor(
          () => sleeping(trace, name, seen, 1, looksAt),
          "the waiter waits on its close watch",
        );
        await end(path, holder);
        await waiter.expect("acquired");
        await waiter.expect("done");
        // Nothing keeps it alive: it ends without process.exit.
        const { code } = await waiter.exited;
        assert.equal(code, 0, waiter.stderr.join(""));
      } finally {
        await holder.kill();
        await waiter.kill();
      }
      if (wokeBy(trace, name, 1, round, mask)) return true;
    }
    return false;
  } finally {
    cleanup();
  }
}

describe("waiters wake on their holder's close", { skip: skip() }, () => {
  test("a waiter takes the lock of a SIGKILLed holder on its close event (read before its winning attempt), and then exits on its own", async () => {
    // Without the close watch no round shows the event.
    assert.ok(
      await takesAtOnce((_, holder) => holder.kill("SIGKILL"), IN_CLOSE_WRITE),
      "the waiter's winning attempt followed its read of the close event, and came at once",
    );
  });

  test("a waiter that saw its holder's file replaced (a release and retake) takes the lock at the new holder's SIGKILL on the close event of its watch of the new file", async () => {
    const { dir, cleanup } = tempDir();
    try {
      let shown = false;
      for (let round = 0; round < 3 && !shown; round++) {
        const name = `run${round}.lock`;
        const path = join(dir, name);
        const trace = join(dir, `waiter${round}.trace`);
        const holder = new Child("flip_holder.ts", [path]);
        await holder.expect("held");
        const waiter = tracedWaiter(trace, [path, "120000", "1"]);
        try {
          await waiter.expect("waiting");
          const first = {};
          await waitFor(
            () => sleeping(trace, name, first, 1, looksAt),
            "the waiter waits on its close watch",
          );
          // Stopped, the waiter cannot take the lock between the release
          // and the retake; its watch's events wait for it.
          waiter.signal("SIGSTOP");
          holder.send("flip");
          await holder.expect("reheld");
          waiter.signal("SIGCONT");
          // A second close watch of the name: the new holder's file's;
          // then past the looks that follow an event (1 ms, growing
          // fourfold), the holder's death is told by its close, or by a
          // look seconds later.
          const seen = {};
          await waitFor(
            () => sleeping(trace, name, seen, 2, looksAt),
            "the waiter waits on its watch of the new holder's file",
          );
          await holder.kill("SIGKILL");
          await waiter.expect("acquired");
          await waiter.expect("done");
        } finally {
          await holder.kill();
          await waiter.kill();
        }
        shown = wokeBy(trace, name, 2, round);
      }
      assert.ok(
        shown,
        "the waiter's winning attempt followed its read of the new file's close event, and came at once",
      );
    } finally {
      cleanup();
    }
  });

  for (
    const [what, end, mask] of [
      ["removed", (path: string) => unlinkSync(path), IN_ATTRIB],
      [
        "renamed away",
        (path: string) => renameSync(path, `${path}.moved`),
        IN_MOVE_SELF,
      ],
    ] as const
  ) {
    test(`a Node or Bun waiter's close watch also wakes it when the file is ${what} by hand while its holder lives: it takes the lock at once, after reading the event`, async (t) => {
      if (runtime === "deno") {
        t.skip("Node and Bun: Deno watches the file with its own watcher");
        return;
      }
      assert.ok(
        await takesAtOnce(end, mask),
        "the waiter's winning attempt followed its read of the event, and came at once",
      );
    });
  }

  test("a waiter whose attempt saw a live runlock holder of this host opens nothing to look: a 1.5 s wait opens the lock file twice, for its first attempt and its last (on Deno every open is an event for every other waiter's watch)", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const trace = join(dir, "waiter.trace");
      const holder = await pyHolder(path);
      try {
        const waiter = tracedWaiter(trace, [path, "1500", "1"]);
        await waiter.expect("waiting");
        await waiter.expect("held");
        await waiter.expect("done");
        assert.equal((await waiter.exited).code, 0, waiter.stderr.join(""));
      } finally {
        await holder.kill();
      }
      const opens = readFileSync(trace, "utf8").split("\n").filter((l) =>
        opensName(l, "run.lock")
      );
      assert.equal(opens.length, 2, opens.join("\n"));
    } finally {
      cleanup();
    }
  });

  test("20 waiters of one process share one close watch (one inotify descriptor, one watch), and all get the lock in turn", async (t) => {
    if (runtime === "deno") {
      t.skip("Node and Bun: Deno makes no close watch");
      return;
    }
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const trace = join(dir, "waiters.trace");
      const holder = await pyHolder(path);
      const waiter = tracedWaiter(trace, [path, "120000", "20"]);
      try {
        await waiter.expect("waiting");
        await holder.kill("SIGKILL");
        for (let i = 0; i < 20; i++) await waiter.expect("acquired");
        await waiter.expect("done");
        assert.equal((await waiter.exited).code, 0, waiter.stderr.join(""));
      } finally {
        await holder.kill();
        await waiter.kill();
      }
      const { adds } = closeWatches(
        readFileSync(trace, "utf8"),
        "run.lock",
      );
      assert.ok(adds.length >= 20, `${adds.length} close watches asked for`);
      const first = adds.slice(0, 20);
      assert.deepEqual(
        new Set(first.map((a) => `${a.fd}:${a.wd}`)).size,
        1,
        JSON.stringify(first),
      );
    } finally {
      cleanup();
    }
  });

  test("a Node waiter's close watch waits in one poll while nothing happens (none re-issued each second: each is a wake-up of the waiting process)", async (t) => {
    if (runtime !== "node") {
      t.skip("Node only: Bun's event loop waits for the descriptor itself");
      return;
    }
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const holder = await pyHolder(path);
      try {
        const trace = join(dir, "trace");
        // 3.5 s of waiting, with nothing happening to the lock file.
        const waiter = tracedWaiter(trace, [path, "3500", "1"]);
        await waiter.expect("waiting");
        await waiter.expect("held");
        await waiter.expect("done");
        assert.equal((await waiter.exited).code, 0, waiter.stderr.join(""));
        const { adds, lines } = closeWatches(
          readFileSync(trace, "utf8"),
          "run.lock",
        );
        assert.equal(adds.length, 1, "one close watch");
        const polls = lines.filter((l) =>
          l.includes(`poll([{fd=${adds[0].fd}, events=POLLIN}`)
        );
        assert.equal(polls.length, 1, polls.join("\n"));
      } finally {
        await holder.kill();
      }
    } finally {
      cleanup();
    }
  });

  test("a waiter's timeout and abort still end its wait, and the process then ends on its own", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const holder = await pyHolder(path);
      try {
        const timed = new Child("close_waiter.ts", [path, "200", "2"]);
        await timed.expect("waiting");
        await timed.expect("held");
        await timed.expect("held");
        await timed.expect("done");
        assert.equal((await timed.exited).code, 0, timed.stderr.join(""));
        const aborted = new Child("close_waiter.ts", [
          path,
          "120000",
          "2",
          "abort",
        ]);
        await aborted.expect("waiting");
        aborted.send("abort");
        await aborted.expect("aborted");
        await aborted.expect("aborted");
        await aborted.expect("done");
        assert.equal((await aborted.exited).code, 0, aborted.stderr.join(""));
      } finally {
        await holder.kill();
      }
    } finally {
      cleanup();
    }
  });
});

/** The inodes (hex, as fdinfo prints them) that process `pid` watches. */
function watchedInos(pid: number): Set<string> {
  const inos = new Set<string>();
  let fds: string[] = [];
  try {
    fds = readdirSync(`/proc/${pid}/fd`);
  } catch {
    return inos;
  }
  for (const fd of fds) {
    try {
      if (
        !readlinkSync(`/proc/${pid}/fd/${fd}`).endsWith("anon_inode:inotify")
      ) {
        continue;
      }
      const info = readFileSync(`/proc/${pid}/fdinfo/${fd}`, "utf8");
      for (const m of info.matchAll(/^inotify wd:\S+ ino:([0-9a-f]+)/gm)) {
        inos.add(m[1]);
      }
    } catch {
      // Closed meanwhile.
    }
  }
  return inos;
}

describe("waiters follow the lock file from holder to holder", {
  skip: process.platform !== "linux" && "inotify's /proc view is Linux only",
}, () => {
  test("a waiter watches the new holder's file after a release and retake, also when the new file reuses the old one's inode number (ext4 does at once; the kernel dropped the old watch with the old inode)", async (t) => {
    const { dir, cleanup } = tempDir();
    try {
      let reused = false;
      for (let round = 0; round < 5 && !reused; round++) {
        const path = join(dir, `run${round}.lock`);
        const holder = new Child("flip_holder.ts", [path]);
        const first = await holder.expect("held");
        const waiter = new Child("close_waiter.ts", [path, "120000", "1"]);
        try {
          const ino = (n: unknown) => Number(n).toString(16);
          const pid = Number((await waiter.expect("waiting")).pid);
          await waitFor(
            () => watchedInos(pid).has(ino(first.ino)),
            "the waiter watches the first holder's file",
          );
          // Stopped, the waiter cannot take the lock in the moment between
          // the release and the retake; its watch's events wait for it.
          waiter.signal("SIGSTOP");
          holder.send("flip");
          const again = await holder.expect("reheld");
          waiter.signal("SIGCONT");
          // Another inode: no proof either way; try again.
          if (again.ino !== first.ino) continue;
          reused = true;
          // The old inode was freed (its number is the new file's), and
          // with it the old watch: only a new watch can report the release.
          await waitFor(
            () => watchedInos(pid).has(ino(again.ino)),
            "the waiter watches the new holder's file",
          );
          holder.send("release");
          await waiter.expect("acquired");
          await waiter.expect("done");
        } finally {
          await holder.kill();
          await waiter.kill();
        }
      }
      if (!reused) t.skip("this filesystem did not reuse the inode number");
    } finally {
      cleanup();
    }
  });
});

describe("a holder's flock is the first thing its death lets go of", {
  skip: process.platform !== "linux"
    ? "Linux only (/proc/PID/fd, inotify)"
    : runtime === "deno"
    ? "a Deno holder makes no inotify instance (its watch would keep the process alive)"
    : false,
}, () => {
  test("a holder's lock descriptor is numbered above its watch's inotify descriptor (the kernel closes a dying process's files from the highest down; an inotify close waits an RCU grace period, up to 20 ms)", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const holder = new Child("child.ts", ["hold", path]);
    try {
      await holder.expect("acquired");
      const fds = `/proc/${holder.pid}/fd`;
      const lock = statSync(path).ino;
      /** The holder's descriptors: the lock file's, and inotify's. */
      const numbers = () => {
        const got = { lock: [] as number[], inotify: [] as number[] };
        for (const fd of readdirSync(fds)) {
          try {
            if (readlinkSync(`${fds}/${fd}`) === "anon_inode:inotify") {
              got.inotify.push(Number(fd));
            } else if (statSync(`${fds}/${fd}`).ino === lock) {
              got.lock.push(Number(fd));
            }
          } catch {
            // Closed meanwhile.
          }
        }
        return got;
      };
      // The holder's watch begins once its event loop turns.
      await waitFor(() => numbers().inotify.length > 0, "the holder's watch");
      const { lock: ours, inotify } = numbers();
      assert.equal(ours.length, 1, JSON.stringify({ ours, inotify }));
      for (const fd of inotify) {
        assert.ok(fd < ours[0], JSON.stringify({ ours, inotify }));
      }
    } finally {
      await holder.kill();
      cleanup();
    }
  });
});
