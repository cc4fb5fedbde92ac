// A hostile-input corpus: what can sit at a lock path or in its directory,
// one row each, every row stating what acquire and inspect must do, and a
// snapshot of the whole directory (names, inodes, modes, sizes, contents,
// link targets) proving that nothing outside the row's expected change was
// touched. Runs on every runtime.
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import {
  existsSync,
  linkSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  acquire,
  HeldError,
  inspect,
  InvalidLockFileError,
  RunlockError,
} from "../../mod.ts";
import { deadPid, tempDir } from "../_helpers.ts";

type State = "free" | "stale" | "held" | "invalid";

/** What acquire must do. */
type Acquire =
  | { takes: true } // acquires; release leaves `removed` gone, all else equal
  | { invalid: RegExp } // InvalidLockFileError with this reason
  | { held: number | "live" } // HeldError naming this pid
  | { type: RegExp } // TypeError, before touching the disk
  | { error: RegExp }; // another RunlockError with this message

interface Row {
  name: string;
  /** Builds the row in `dir`; returns the lock path and what to clean up. */
  setup(dir: string): Setup | Promise<Setup>;
  acquire: Acquire;
  /** inspect()'s state, or the error class it throws. */
  inspect: State | "TypeError" | "RunlockError";
  /** Entries (relative to dir) that a successful acquire+release removes. */
  removed?: string[];
}

interface Setup {
  path: string;
  /** A live process the row needs (a foreign pidfile's holder), or a server. */
  live?: number;
  done?: () => void | Promise<void>;
  /** Checked while the lock is held (for rows that take it). */
  whileHeld?: () => void;
}

const enc = (s: string) => new TextEncoder().encode(s);

/** A file at the lock path holding `content`. */
const file = (content: string | Uint8Array) => (dir: string): Setup => {
  const path = join(dir, "run.lock");
  writeFileSync(path, typeof content === "string" ? enc(content) : content);
  return { path };
};

const dead = deadPid();
const NOT_PID = /is not a PID from 1 to 2147483647/;
const SYMLINK = /is a symbolic link/;
const NOT_REGULAR = /is not a regular file/;

/** Ends a flock(1) holder whose command reads stdin; resolves on its exit. */
function ended(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve();
  }
  const closed = new Promise<void>((r) => child.on("close", () => r()));
  child.stdin!.end();
  return closed;
}

function sleeper(): { pid: number; done: () => void } {
  const child = spawn("sleep", ["60"], { stdio: "ignore" });
  return { pid: child.pid!, done: () => void child.kill("SIGKILL") };
}

const ROWS: Row[] = [
  // Records.
  {
    name: "an empty file (a run that died before writing)",
    setup: file(""),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "whitespace only",
    setup: file("  \n\t\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "a dead run's record with CRLF line ends",
    setup: file(`${dead}\r\nrunlock 1\r\nhost=gone\r\n`),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "a PID with leading zeros",
    setup: file(`00${dead}\nrunlock 1\n`),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "a PID with a sign (+5)",
    setup: file("+5\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "a hex PID (0x10)",
    setup: file("0x10\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "PID -1 (kill(-1, 0) would probe every process)",
    setup: file("-1\nrunlock 1\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "PID 0 (kill(0, 0) would probe our own group)",
    setup: file("0\nrunlock 1\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "PID 2147483648 (2^31)",
    setup: file("2147483648\nrunlock 1\n"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "10 MB of digits",
    setup: file("1".repeat(10 * 1024 * 1024)),
    acquire: { invalid: /larger than 4096 bytes/ },
    inspect: "invalid",
  },
  {
    name: "a record of 4097 bytes (marker and a long host)",
    setup: file(`${dead}\nrunlock 1\nhost=${"h".repeat(4080)}\n`),
    acquire: { invalid: /larger than 4096 bytes/ },
    inspect: "invalid",
  },
  {
    name: "NUL bytes after the PID",
    setup: file(`${dead}\0\nrunlock 1\n`),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "invalid UTF-8",
    setup: file(new Uint8Array([0x34, 0x32, 0x0a, 0xff, 0xfe, 0x0a])),
    acquire: { invalid: /not UTF-8 text/ },
    inspect: "invalid",
  },
  {
    name: "a dead PID followed by garbage lines (a foreign pidfile)",
    setup: file(`${dead}\nhello\nworld\n`),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "a live PID followed by garbage lines (a foreign pidfile)",
    setup: (dir) => {
      const { pid, done } = sleeper();
      writeFileSync(join(dir, "run.lock"), `${pid}\nhello\n`);
      return { path: join(dir, "run.lock"), live: pid, done };
    },
    acquire: { held: "live" },
    inspect: "held",
  },
  {
    name:
      "a future format's marker (runlock 2) over a dead PID: the flock rules",
    setup: file(`${dead}\nrunlock 2\nnew=field\n`),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "a record truncated mid-marker",
    setup: file(`${dead}\nrunl`),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "a record truncated inside the PID line",
    setup: file(`${dead}`),
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  {
    name: "a record truncated after the sign of a PID",
    setup: file("-"),
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name: "garbage under flock(1): held, by no pid",
    setup: (dir) => {
      const path = join(dir, "run.lock");
      writeFileSync(path, "not a pid\n");
      // flock(1)'s command holds the lock with it, until our end of its
      // stdin closes (then both exit: no orphan left holding it).
      const child = spawn(
        "flock",
        ["--exclusive", path, "sh", "-c", "read _"],
        {
          stdio: ["pipe", "ignore", "ignore"],
        },
      );
      // Wait until flock(1) holds it.
      while (
        spawnSync("flock", ["--nonblock", "--shared", path, "true"])
          .status === 0
      ) {
        spawnSync("sleep", ["0.01"]);
      }
      return { path, done: () => ended(child) };
    },
    acquire: { held: 0 },
    inspect: "held",
  },
  // Not regular files.
  {
    name: "a directory",
    setup: (dir) => {
      mkdirSync(join(dir, "run.lock"));
      writeFileSync(join(dir, "run.lock", "inside"), "x");
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: /is a directory/ },
    inspect: "invalid",
  },
  {
    name: "a FIFO (never opened for a blocking read)",
    setup: (dir) => {
      const path = join(dir, "run.lock");
      assert.equal(spawnSync("mkfifo", [path]).status, 0);
      return { path };
    },
    acquire: { invalid: NOT_REGULAR },
    inspect: "invalid",
  },
  {
    name: "a UNIX socket",
    setup: async (dir) => {
      const path = join(dir, "run.lock");
      const server: Server = createServer();
      await new Promise<void>((resolve) => server.listen(path, resolve));
      return {
        path,
        done: () => new Promise<void>((r) => server.close(() => r())),
      };
    },
    acquire: { invalid: NOT_REGULAR },
    inspect: "invalid",
  },
  {
    name: "a character device (mknod c 1 3, a /dev/null)",
    setup: (dir) => {
      const path = join(dir, "run.lock");
      const made = spawnSync("mknod", [path, "c", "1", "3"]);
      if (made.status !== 0) writeFileSync(path, "0\n"); // not root: still invalid
      return { path };
    },
    acquire: { invalid: /not a regular file|not a PID/ },
    inspect: "invalid",
  },
  // Symlinks.
  {
    name: "a symlink to a dead run's record (never followed)",
    setup: (dir) => {
      writeFileSync(join(dir, "target"), `${dead}\nrunlock 1\n`);
      symlinkSync(join(dir, "target"), join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: SYMLINK },
    inspect: "invalid",
  },
  {
    name: "a symlink to a directory",
    setup: (dir) => {
      mkdirSync(join(dir, "elsewhere"));
      symlinkSync(join(dir, "elsewhere"), join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: SYMLINK },
    inspect: "invalid",
  },
  {
    name: "a dangling symlink (nothing is created at its target)",
    setup: (dir) => {
      symlinkSync(join(dir, "nowhere"), join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: SYMLINK },
    inspect: "invalid",
  },
  {
    name: "a symlink loop",
    setup: (dir) => {
      symlinkSync("run.lock", join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: SYMLINK },
    inspect: "invalid",
  },
  // Hard links.
  {
    name: "a hard link of someone's text file",
    setup: (dir) => {
      writeFileSync(join(dir, "notes.txt"), "my notes\n");
      linkSync(join(dir, "notes.txt"), join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { invalid: NOT_PID },
    inspect: "invalid",
  },
  {
    name:
      "a hard link of another file holding a dead run's record: only the lock's name goes",
    setup: (dir) => {
      writeFileSync(join(dir, "other"), `${dead}\nrunlock 1\n`);
      linkSync(join(dir, "other"), join(dir, "run.lock"));
      return { path: join(dir, "run.lock") };
    },
    acquire: { takes: true },
    inspect: "stale",
    removed: ["run.lock"],
  },
  // Paths.
  {
    name:
      "a path through a symlinked directory: the lock lands in the real one",
    setup: (dir) => {
      mkdirSync(join(dir, "real"));
      symlinkSync(join(dir, "real"), join(dir, "link"));
      return {
        path: join(dir, "link", "run.lock"),
        whileHeld: () =>
          assert.ok(existsSync(join(dir, "real", "run.lock")), "in real/"),
      };
    },
    acquire: { takes: true },
    inspect: "free",
  },
  {
    name: "a name of 255 bytes (NAME_MAX)",
    setup: (dir) => ({ path: join(dir, "n".repeat(255)) }),
    acquire: { takes: true },
    inspect: "free",
  },
  {
    name: "a name of 256 bytes (over NAME_MAX)",
    setup: (dir) => ({ path: join(dir, "n".repeat(256)) }),
    acquire: { error: /longer than the filesystem allows/ },
    inspect: "RunlockError",
  },
  {
    name: "a path over PATH_MAX (4096 bytes)",
    setup: (dir) => ({ path: join(dir, "d/".repeat(2100), "run.lock") }),
    acquire: { error: /longer than the filesystem allows/ },
    inspect: "RunlockError",
  },
  {
    name: "a parent that is a regular file",
    setup: (dir) => {
      writeFileSync(join(dir, "file.txt"), "x");
      return { path: join(dir, "file.txt", "run.lock") };
    },
    acquire: { error: /not a directory/ },
    inspect: "RunlockError",
  },
  {
    name: "a name with a newline and non-ASCII (é😀)",
    setup: (dir) => ({ path: join(dir, "run\né😀.lock") }),
    acquire: { takes: true },
    inspect: "free",
  },
  ...[".", "..", "/", "state/", "state/.", "state/.."].map((tail): Row => ({
    name: `a path ending in ${JSON.stringify(tail)}`,
    // Not path.join, which would normalize the tail away.
    setup: (dir) => ({ path: tail === "/" ? `${dir}/` : `${dir}/${tail}` }),
    acquire: { type: /'path' must name a file/ },
    inspect: "TypeError",
  })),
  // Litter.
  {
    name: "files that only look like our temp files are left alone",
    setup: (dir) => {
      for (
        const name of [
          ".run.lock.0123456789ABCDEF.tmp", // not our hex
          ".run.lock.0123456789abcde.tmp", // 15 digits
          ".run.lock.0123456789abcdef0.tmp", // 17 digits
          ".run.lock.fedcba9876543210.tmp", // ours by name, not by content
          ".run.lock.0123456789abcdef.tmp.bak",
          "run.lock.0123456789abcdef.tmp", // no leading dot
          ".other.lock.0123456789abcdef.tmp", // another lock's litter
        ]
      ) {
        writeFileSync(
          join(dir, name),
          name.includes("fedcba") ? "hello\n" : `${dead}\nrunlock 1\n`,
        );
      }
      mkdirSync(join(dir, ".run.lock.1111111111111111.tmp")); // a directory
      return { path: join(dir, "run.lock") };
    },
    acquire: { takes: true },
    inspect: "free",
  },
  {
    name: "a dead run's temp file (ours by name and record) is swept",
    setup: (dir) => {
      writeFileSync(
        join(dir, ".run.lock.0123456789abcdef.tmp"),
        `${dead}\nrunlock 1\n`,
      );
      writeFileSync(join(dir, ".run.lock.89abcdef01234567.tmp"), "");
      return { path: join(dir, "run.lock") };
    },
    acquire: { takes: true },
    inspect: "free",
    removed: [
      ".run.lock.0123456789abcdef.tmp",
      ".run.lock.89abcdef01234567.tmp",
    ],
  },
  {
    name: "a live temp file (its creator holds its flock) is not swept",
    setup: (dir) => {
      const temp = join(dir, ".run.lock.0123456789abcdef.tmp");
      writeFileSync(temp, `${process.pid}\nrunlock 1\n`);
      const child = spawn(
        "flock",
        ["--exclusive", temp, "sh", "-c", "read _"],
        {
          stdio: ["pipe", "ignore", "ignore"],
        },
      );
      while (
        spawnSync("flock", ["--nonblock", "--shared", temp, "true"])
          .status === 0
      ) {
        spawnSync("sleep", ["0.01"]);
      }
      return {
        path: join(dir, "run.lock"),
        done: () => ended(child),
      };
    },
    acquire: { takes: true },
    inspect: "free",
  },
];

/** Every entry under `dir`: kind, inode, mode, size, mtime, content. */
function snapshot(dir: string): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (rel: string) => {
    const abs = rel ? join(dir, rel) : dir;
    for (const name of readdirSync(abs)) {
      const r = rel ? join(rel, name) : name;
      const p = join(dir, r);
      const s = lstatSync(p);
      let what = "";
      if (s.isSymbolicLink()) what = `-> ${readlinkSync(p)}`;
      else if (s.isFile()) {
        what = createHash("sha256").update(readFileSync(p)).digest("hex");
      }
      // A directory's own mtime moves whenever an entry comes and goes (the
      // lock's, its temp file's): its entries are what is compared.
      const mtime = s.isDirectory() ? 0 : s.mtimeMs;
      out.set(r, JSON.stringify([s.ino, s.mode, s.size, mtime, what]));
      if (s.isDirectory()) walk(r);
    }
  };
  walk("");
  return out;
}

async function outcome<T>(f: () => Promise<T>): Promise<T | Error> {
  try {
    return await f();
  } catch (err) {
    return err as Error;
  }
}

describe("hostile-input corpus", () => {
  test(`the corpus has at least 30 rows (${ROWS.length})`, () => {
    assert.ok(ROWS.length >= 30);
  });

  for (const row of ROWS) {
    const what = "takes" in row.acquire
      ? "acquire takes it"
      : "invalid" in row.acquire
      ? "InvalidLockFileError naming the file"
      : "held" in row.acquire
      ? "HeldError"
      : "type" in row.acquire
      ? "TypeError"
      : "RunlockError";
    test(`${row.name}: ${what}; inspect says ${row.inspect}; nothing else touched`, async () => {
      const { dir, cleanup } = tempDir();
      let setup: Setup | undefined;
      try {
        setup = await row.setup(dir);
        const { path } = setup;
        const before = snapshot(dir);
        const seen = await outcome(() => inspect(path));
        const got = await outcome(() => acquire(path));
        const expect = row.acquire;
        if ("takes" in expect) {
          assert.ok(!(got instanceof Error), String(got));
          setup.whileHeld?.();
          assert.equal((await inspect(path)).state, "held");
          await got.release();
        } else if ("invalid" in expect) {
          assert.ok(got instanceof InvalidLockFileError, String(got));
          assert.equal(got.path, path);
          assert.ok(got.message.startsWith(`${path}: `), got.message);
          assert.match(got.reason, expect.invalid);
        } else if ("held" in expect) {
          assert.ok(got instanceof HeldError, String(got));
          assert.equal(got.byThisProcess, false);
          assert.equal(
            got.pid,
            expect.held === "live" ? setup.live : expect.held,
          );
        } else if ("type" in expect) {
          assert.ok(got instanceof TypeError, String(got));
          assert.match(got.message, expect.type);
        } else {
          assert.ok(got instanceof RunlockError, String(got));
          assert.equal(got.constructor, RunlockError, got.name);
          assert.ok(got.message.startsWith(`${path}: `), got.message);
          assert.match(got.message, expect.error);
        }
        // inspect(), taken before the acquire.
        if (row.inspect === "TypeError" || row.inspect === "RunlockError") {
          assert.ok(seen instanceof Error, JSON.stringify(seen));
          assert.equal(seen.name, row.inspect, String(seen));
        } else {
          assert.ok(!(seen instanceof Error), String(seen));
          assert.equal(seen.state, row.inspect);
        }
        // Nothing touched but what the row expects.
        const after = snapshot(dir);
        const expected = new Map(before);
        for (const r of row.removed ?? []) {
          assert.ok(expected.delete(r), `${r} was there before`);
        }
        assert.deepEqual(after, expected);
      } finally {
        await setup?.done?.();
        cleanup();
      }
    });
  }
});
