// The FFI of the platforms (src/platform/_libc_node.ts, _libc_deno.ts).
//
// Node: when koffi (the FFI module runlock calls flock through) cannot be
// loaded, the error says so and why, instead of blaming the filesystem.
//
// Node, Bun, and Deno with every permission, on Linux x86-64 and arm64:
// every call of a lock goes through libc's *at() calls on the pinned
// directory's descriptor, never through a /proc/self/fd/N/<name> path, and
// the answers the protocol expects come back as values. Shown on the system calls themselves, under strace (-y
// names each descriptor's file), of a real program
// (fixtures/inject_fixture.ts) that goes through the public API. strace
// missing or not allowed to trace: skipped with a message, except under
// CI=true, where that fails (as in file/injected_errors_test.ts).
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  cpSync,
  readFileSync,
  realpathSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { held, inspect } from "../../mod.ts";
import { fixtureCommand, holder, runtime, tempDir } from "../_helpers.ts";

describe("the FFI module", {
  skip: runtime !== "node" &&
    "Node only: Deno has flock built in, Bun uses bun:ffi",
}, () => {
  test("a missing koffi gives a RunlockError that names koffi and the reason, not UnsupportedFilesystemError", () => {
    const { dir, cleanup } = tempDir();
    try {
      // The installed package, copied where no koffi can be found.
      const pkg = dirname(
        createRequire(import.meta.url).resolve("runlock/package.json"),
      );
      cpSync(pkg, join(dir, "node_modules", "runlock"), { recursive: true });
      const script = join(dir, "try.mjs");
      writeFileSync(
        script,
        `import { acquire } from "runlock";
try {
  await acquire(${JSON.stringify(join(dir, "run.lock"))});
  console.log(JSON.stringify({ ok: true }));
} catch (err) {
  console.log(JSON.stringify({ name: err.name, message: err.message }));
}
`,
      );
      const result = spawnSync(process.execPath, [script], {
        cwd: dir,
        encoding: "utf8",
      });
      const event = JSON.parse(result.stdout.trim());
      assert.equal(event.name, "RunlockError", result.stdout);
      assert.match(
        event.message,
        /cannot load koffi, which runlock uses to call flock\(2\)/,
      );
      assert.match(event.message, /Cannot find module 'koffi'/);
      assert.doesNotMatch(event.message, /filesystem/);
    } finally {
      cleanup();
    }
  });
});

/** Why the strace tests cannot run here, or false. */
function straceSkip(on: "node" | "deno" | "any" = "node"): string | false {
  if (on === "node" && runtime === "deno") {
    return "Node and Bun only: Deno makes its own system calls";
  }
  if (on === "deno" && runtime !== "deno") {
    return "Deno only: Node and Bun have their own tests above";
  }
  if (
    process.platform !== "linux" ||
    (process.arch !== "x64" && process.arch !== "arm64")
  ) {
    return `libc is called on Linux x86-64 and arm64 only, not ${process.platform} ${process.arch}`;
  }
  const r = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"]);
  const why = r.error
    ? "strace is not installed (apt-get install strace; .ci/run does)"
    : r.status !== 0
    ? `strace may not trace here (${String(r.stderr).trim()})`
    : false;
  if (why && process.env.CI === "true") {
    throw new Error(`${why}: under CI the FFI's system calls must be shown`);
  }
  if (why) {
    console.warn(
      `\n*** platform/ffi_test's strace tests SKIPPED: ${why} ***\n`,
    );
  }
  return why;
}

interface Traced {
  /** The fixture's JSON lines. */
  steps: {
    step: string;
    ok: boolean;
    name?: string;
    state?: string;
    held?: boolean;
  }[];
  /** strace -y lines of the file system calls. */
  calls: string[];
  /** Every line strace wrote. */
  lines: string[];
}

const FILE_CALLS = [
  "open",
  "openat",
  "link",
  "linkat",
  "unlink",
  "unlinkat",
  "stat",
  "lstat",
  "fstat",
  "newfstatat",
  "statx",
  "flock",
  "read",
  "pread64",
  "write",
  "close",
];

/**
 * Runs fixtures/inject_fixture.ts `mode path` under strace (on Deno with
 * `denoFlags`), tracing `trace` (by default the file system calls that
 * may fail).
 */
function traced(
  dir: string,
  mode: string,
  path: string,
  denoFlags?: string[],
  trace = FILE_CALLS.map((c) => `?${c}`).join(","),
): Traced {
  const out = join(dir, `${mode}.trace`);
  const [cmd, args] = fixtureCommand(
    "inject_fixture.ts",
    [mode, path],
    denoFlags,
  );
  const r = spawnSync("strace", [
    "-qq",
    "-y",
    "-o",
    out,
    "-e",
    `trace=${trace}`,
    "--",
    cmd,
    ...args,
    // A hang detector, not a timing claim: a FIFO must not block the open.
  ], { encoding: "utf8", timeout: 60_000 });
  assert.equal(r.status, 0, `${r.signal ?? ""} ${r.stderr}`);
  const lines = readFileSync(out, "utf8").split("\n");
  return {
    steps: r.stdout.trim().split("\n").map((l) => JSON.parse(l)),
    calls: lines.filter((l) => l.includes(dir)),
    lines,
  };
}

/** `s` matched literally in a regular expression. */
const escapeRe = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

const show = (t: Traced) => `${JSON.stringify(t.steps)}\n${t.calls.join("\n")}`;

describe("the *at() calls on the pinned directory", {
  // On Deno the fixture runs with --allow-all: libc's calls.
  skip: straceSkip("any"),
}, () => {
  test("acquireSync and releaseSync name every file of the lock relative to the directory's descriptor, never through /proc/self/fd/N/", () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const t = traced(dir, "acquire", join(dir, "run.lock"));
      assert.deepEqual(t.steps.map((s) => [s.step, s.ok]), [
        ["acquire", true],
        ["release", true],
      ]);
      const walks = t.calls.filter((l) => /"\/proc\/self\/fd\/\d+\//.test(l));
      assert.deepEqual(walks, [], show(t));
      // D<dir>: the pinned directory's descriptor, as strace -y shows it.
      const d = `\\d+<${escapeRe(dir)}>`;
      const temp = String.raw`"\.run\.lock\.[0-9a-f]{16}\.tmp"`;
      for (
        const call of [
          `openat\\(${d}, ${temp}, O_RDWR\\|O_CREAT\\|O_EXCL\\|O_CLOEXEC, 0644\\) = \\d+`,
          `linkat\\(${d}, ${temp}, ${d}, "run\\.lock", 0\\) = 0`,
          `unlinkat\\(${d}, ${temp}, 0\\) = 0`,
          `(newfstatat|fstatat64)\\(${d}, "run\\.lock", .*AT_SYMLINK_NOFOLLOW\\) = 0`,
          `unlinkat\\(${d}, "run\\.lock", 0\\) = 0`,
        ]
      ) {
        assert.ok(
          t.calls.some((l) => new RegExp(`^${call}`).test(l)),
          `no ${call} in\n${show(t)}`,
        );
      }
    } finally {
      cleanup();
    }
  });

  test("held() and inspect() of a free lock: one open of the path, O_NOFOLLOW|O_NONBLOCK, whose ENOENT is the answer 'free'", async () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const path = join(dir, "run.lock");
      // In this process too: ENOENT is an answer, not an error.
      assert.equal(await held(path), false);
      assert.equal((await inspect(path)).state, "free");
      const t = traced(dir, "probe", path);
      assert.deepEqual(t.steps.map((s) => [s.step, s.ok, s.state]), [
        ["probe", true, "free"],
      ]);
      // One call: the open, refusing a symlink and a FIFO's wait, closed
      // on exec; its ENOENT is the answer (strace -y shows AT_FDCWD with
      // the directory it stands for).
      assert.equal(t.calls.length, 1, show(t));
      const m =
        /^openat\(AT_FDCWD(?:<[^>]*>)?, "([^"]*)", ([A-Z_|]+)\) = -1 ENOENT /
          .exec(t.calls[0]);
      assert.equal(m?.[1], path, show(t));
      const flags = m![2].split("|");
      for (
        const flag of [
          "O_RDONLY",
          "O_NOFOLLOW",
          "O_NONBLOCK",
          "O_NOCTTY",
          "O_CLOEXEC",
        ]
      ) {
        assert.ok(flags.includes(flag), `${flag}: ${show(t)}`);
      }
    } finally {
      cleanup();
    }
  });

  test("a symlink at the lock path is refused (ELOOP) without being followed: its target, a FIFO, is never opened", () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const path = join(dir, "run.lock");
      const fifo = join(dir, "fifo");
      assert.equal(spawnSync("mkfifo", [fifo]).status, 0);
      symlinkSync(fifo, path);
      for (const mode of ["probe", "acquire"]) {
        const t = traced(dir, mode, path);
        const step = t.steps[0];
        if (mode === "probe") assert.equal(step.state, "invalid", show(t));
        else assert.equal(step.name, "InvalidLockFileError", show(t));
        assert.ok(
          t.calls.some((l) =>
            // The path itself (probe), or its name in the pinned directory.
            /^openat\(/.test(l) &&
            (l.includes(`"${path}"`) || l.includes(`${dir}>, "run.lock"`)) &&
            l.includes("O_NOFOLLOW") &&
            l.endsWith("= -1 ELOOP (Too many levels of symbolic links)")
          ),
          show(t),
        );
        assert.deepEqual(t.calls.filter((l) => l.includes(fifo)), [], show(t));
      }
    } finally {
      cleanup();
    }
  });

  test("a FIFO at the lock path is opened without blocking, found not a regular file, closed and never read", () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const path = join(dir, "run.lock");
      assert.equal(spawnSync("mkfifo", [path]).status, 0);
      const t = traced(dir, "probe", path);
      assert.equal(t.steps[0].state, "invalid", show(t));
      const opened = t.calls.find((l) =>
        /^openat\(AT_FDCWD[<,]/.test(l) && l.includes(`"${path}"`)
      );
      assert.match(opened ?? "", /O_NONBLOCK.* = \d+</, show(t));
      const fd = /= (\d+)</.exec(opened!)![1];
      const onIt = t.calls.filter((l) => l.includes(`(${fd}<${path}>`));
      assert.ok(onIt.some((l) => l.startsWith("close(")), show(t));
      assert.deepEqual(
        onIt.filter((l) => /^(read|pread64)\(/.test(l)),
        [],
        show(t),
      );
    } finally {
      cleanup();
    }
  });
});

describe("held() of a lock a live process holds", {
  skip: straceSkip("any"),
}, () => {
  test("six system calls on the file, from its open to its close: open, fstat, flock (refused: held), pread of the record's first line, kill(pid, 0) of that pid, close; no getpid", async () => {
    const { dir: tmp, cleanup } = tempDir();
    const dir = realpathSync(tmp);
    const path = join(dir, "run.lock");
    const h = await holder(path);
    try {
      const t = traced(
        dir,
        "held",
        path,
        undefined,
        "openat,newfstatat,fstat,statx,flock,pread64,read,getpid,kill,close",
      );
      assert.deepEqual(t.steps.map((step) => step.held), [true]);
      const lines = t.lines;
      const open = lines.findIndex((l) =>
        /^openat\(/.test(l) && l.includes(`"${path}"`)
      );
      assert.ok(open >= 0, lines.join("\n"));
      const fd = /= (\d+)</.exec(lines[open])![1];
      const close = lines.findIndex((l, i) =>
        i > open && new RegExp(`^close\\(${fd}<`).test(l)
      );
      const calls = lines.slice(open, close + 1).map((l) =>
        l.slice(0, l.indexOf("("))
      );
      assert.deepEqual(
        calls.map((c) => c === "fstat" || c === "statx" ? "newfstatat" : c),
        ["openat", "newfstatat", "flock", "pread64", "kill", "close"],
        lines.slice(open, close + 1).join("\n"),
      );
    } finally {
      await h.kill();
      cleanup();
    }
  });
});

describe("Deno's lstat through libc", { skip: straceSkip("deno") }, () => {
  test("held() and inspect() of a free lock with --allow-ffi and unscoped reading, short of every permission: one fstatat of the path, not following a symlink, whose ENOENT is the answer 'free' (no exception in Deno)", () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const path = join(dir, "run.lock");
      const t = traced(dir, "probe", path, [
        "--allow-ffi",
        "--allow-read",
        "--allow-write",
        "--allow-env",
      ]);
      assert.deepEqual(t.steps.map((s) => [s.step, s.ok, s.state]), [
        ["probe", true, "free"],
      ]);
      assert.equal(t.calls.length, 1, show(t));
      assert.match(
        t.calls[0],
        new RegExp(
          `^newfstatat\\(AT_FDCWD(?:<[^>]*>)?, "${
            escapeRe(path)
          }", 0x[0-9a-f]+, AT_SYMLINK_NOFOLLOW\\) = -1 ENOENT `,
        ),
        show(t),
      );
    } finally {
      cleanup();
    }
  });

  test("without --allow-ffi, or with reading scoped, the probe asks Deno's own lstat (statx), and answers the same", () => {
    const { dir: tmp, cleanup } = tempDir();
    try {
      const dir = realpathSync(tmp);
      const path = join(dir, "run.lock");
      for (
        const flags of [
          ["--allow-read", "--allow-write", "--allow-env", "--allow-run"],
          [
            `--allow-read=${dir}`,
            "--allow-write",
            "--allow-env",
            "--allow-ffi",
          ],
        ]
      ) {
        const t = traced(dir, "probe", path, flags);
        assert.deepEqual(t.steps.map((s) => [s.step, s.ok, s.state]), [
          ["probe", true, "free"],
        ], show(t));
        const onPath = t.calls.filter((l) => l.includes(`"${path}"`));
        assert.ok(onPath.length > 0, show(t));
        assert.ok(onPath.every((l) => l.startsWith("statx(")), show(t));
      }
    } finally {
      cleanup();
    }
  });
});
