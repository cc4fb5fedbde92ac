// Injected errors: every system call of the protocol made to fail, once,
// with an errno the OS really returns there, under strace's fault injection
// (`strace -e inject=SYSCALL:error=ERRNO:when=N`), against a real program
// (fixtures/inject_fixture.ts) of the runtime running the tests.
//
// How a case hits exactly the call it names, by what the call touches:
// strace runs with `-P` for every name of the case's lock directory's files
// (the directory, run.lock, a dead run's temp file, the program's own temp
// files, each by its path and through /proc/self/fd/K/, as the Node and Bun
// platforms' node:fs fallback names files of the pinned directory). strace
// then traces, and counts for `when=`, only the calls that name one of
// these files by a path or by a descriptor (-P resolves a descriptor, a
// directory's included, through /proc/PID/fd). An *at() call (the Node and
// Bun platforms on Linux x86-64 and arm64: openat, linkat, unlinkat,
// fstatat on the pinned directory's descriptor) is selected by that
// descriptor, -P matching neither its relative name nor the joined path;
// the matcher reads the name after the descriptor (parseLine), so a case
// still finds its call by the file it touches, and the calls the
// descriptor selects are the fixture's own, made in the same order on
// every run (checkInterval 0: no timer, no watch). Whatever else the
// runtime does (start-up,
// a file it reads lazily or from another moment on another run) is neither
// counted nor hit. The program's temp file names are known before the run
// because the fixture fixes the random tag in them (RUNLOCK_INJECT_TAG,
// checked against the trace). A census run of the same scenario under the
// same -P (strace -y, no injection) lists those calls with the file each
// descriptor names; the case's matcher (which file, by path or by
// descriptor, and its flags) finds its call there, and its ordinal among
// the listed calls of that system call gives `when=N`. strace traces only
// the main thread (no -f), where every runtime makes every synchronous file
// system call. The injected run's own trace must show exactly one
// "(INJECTED)" line, and it must be the call the matcher finds in that very
// trace.
//
// For every case: the documented typed error naming the path and the failed
// action (or success, where the protocol retries or the call is best
// effort); no temp file left (except the one whose own unlink failed, which
// the next acquire sweeps); no half record; a lock already held is still
// held; and the very next acquire in a fresh process succeeds at once
// (timeout 0) and leaves the directory empty.
//
// strace missing: skipped with a message (.ci/run installs it). strace
// present but not allowed to trace (no ptrace in this container): skipped
// with a message, except under CI=true, where that fails.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { after, describe, test } from "node:test";
import { acquireSync, inspect, type Lock } from "../../mod.ts";
import { deadPid, fixtureCommand, runtime, tempDir } from "../_helpers.ts";

type Scenario =
  | "fresh" // an empty directory: acquire, then release
  | "private" // the same with mode 0600, so that the mode is set (fchmod)
  | "stale" // a dead run's record at the path: takeover
  | "litter" // a dead run's temp file in the directory: the sweep
  | "held" // this test process holds the lock; the program probes it
  | "contend" // this test process holds the lock; the program acquires
  | "self"; // the program holds the lock and probes it itself

interface Outcome {
  /** The step that fails, or undefined when every step succeeds. */
  step?: "acquire" | "release" | "probe";
  /** The error class of that step. */
  error?: string;
  /** What the message says was being done. */
  action?: RegExp;
  /** A temp file stays until the next acquire sweeps it. */
  litter?: boolean;
  /** The lock file stays (stale, flock free) until the next acquire. */
  lockLeft?: boolean;
  /** What the probe answers when it succeeds. */
  state?: string;
}

interface Case {
  scenario: Scenario;
  /** The call, as the table names it. */
  call: string;
  /** System calls that can carry it (they differ between runtimes). */
  syscalls: string[];
  /** Which file the call touches, and how (see `Target`). */
  match: Target;
  /** The call is the first match after the first call matching this. */
  after?: Target;
  errno: string;
  /** Per runtime, where they differ. */
  expect: Outcome | Partial<Record<Runtime, Outcome>>;
  /** Runtimes on which the call exists (default: all). */
  only?: Runtime[];
}

// The files of a case's lock directory, as a traced call names them.
type Kind = "dir" | "lock" | "temp" | "litter" | "other";

// The fixed tag of the program's temp file names (RUNLOCK_INJECT_TAG of
// fixtures/inject_fixture.ts): they are .run.lock.<TAG><8 hex digits>.tmp.
// A dead run's temp file has the fixed random part 0123456789abcdef.
const TAG = "feedc0de";
const LITTER_NAME = ".run.lock.0123456789abcdef.tmp";
const OURS = new RegExp(String.raw`^\.run\.lock\.${TAG}[0-9a-f]{8}\.tmp$`);
/** The program's temp names strace selects: its first few acquires'. */
const TEMP_NAMES = Array.from(
  { length: 8 },
  (_, i) => `.run.lock.${TAG}${(i + 1).toString(16).padStart(8, "0")}.tmp`,
);
/** Descriptors K of /proc/self/fd/K/<name> paths strace selects. */
const PROC_FDS = 256;

function kindOf(name: string): Kind {
  if (name === "" || name === ".") return "dir";
  if (name === "run.lock") return "lock";
  if (name === LITTER_NAME) return "litter";
  if (OURS.test(name)) return "temp";
  return "other";
}

/**
 * What a case's call touches. All given fields must hold.
 * - `fd`: its first argument is a descriptor of this file;
 * - `path`: it names this file (each of these files) by a path, absolute,
 *   through /proc/self/fd/K/, or relative to the directory's descriptor;
 * - `on`: it touches this file either way;
 * - `text`: its strace -y line (before " = ") matches, e.g. its flags.
 */
interface Target {
  fd?: Kind;
  path?: Kind | Kind[];
  on?: Kind;
  text?: RegExp;
}

const M = {
  pin: { path: "dir", text: /O_PATH|^readlink/ },
  tempOpen: { path: "temp", text: /O_CREAT\|O_EXCL/ },
  tempFlock: { fd: "temp", text: /LOCK_EX/ },
  tempFd: { fd: "temp" },
  tempAny: { on: "temp" },
  tempPath: { path: "temp" },
  link: { path: ["temp", "lock"] },
  sweepList: { fd: "dir" },
  lockPathStat: { path: "lock" },
  lockUnlink: { path: "lock" },
  lockClose: { fd: "temp", text: /\(deleted\)/ },
  fileOpen: { path: "lock", text: /O_RDONLY/ },
  fileFlockEx: { fd: "lock", text: /LOCK_EX/ },
  fileFlockSh: { fd: "lock", text: /LOCK_SH/ },
  fileFd: { fd: "lock" },
  fileClose: { fd: "lock" },
  litterOpen: { path: "litter", text: /O_RDONLY/ },
  litterFlock: { fd: "litter", text: /LOCK_EX/ },
  litterFd: { fd: "litter" },
  litterUnlink: { path: "litter" },
} satisfies Record<string, Target>;

const OPEN = ["openat", "open"];
const STAT_FD = ["statx", "newfstatat", "fstat", "fstatat64"];
const STAT_PATH = ["statx", "newfstatat", "lstat", "fstatat64"];
const READ = ["read", "pread64", "readv", "preadv", "preadv2"];
const WRITE = ["write", "pwrite64", "writev", "pwritev", "pwritev2"];
const LINK = ["link", "linkat"];
const UNLINK = ["unlink", "unlinkat"];
const CHMOD = ["fchmod", "fchmodat", "chmod", "fchmodat2"];

const ok = (extra: Outcome = {}): Outcome => extra;
const fails = (
  step: Outcome["step"],
  error: string,
  action: RegExp,
  extra: Outcome = {},
): Outcome => ({ step, error, action, ...extra });

/**
 * ENOLCK (no flock here: NFS without a lock manager) is the documented
 * UnsupportedFilesystemError on every runtime. (Deno gives ENOLCK no error
 * code; its platform reads the errno from "(os error 37)".)
 */
function noLocks(step: Outcome["step"], _action: RegExp): Outcome {
  const typed = fails(
    step,
    "UnsupportedFilesystemError",
    /does not support flock/,
  );
  return typed;
}

const CREATE = /: cannot create the lock: /;
const WRITE_LOCK = /: cannot write the lock: /;
const PIN = /: cannot open the lock's directory: /;
const REMOVE = /: cannot remove the lock file: /;
const READ_FILE = /: cannot read the lock file: /;
const STALE = /: cannot remove the stale lock: /;
const DENIED = /permission denied/;

const CASES: Case[] = [
  // Pinning the directory: an O_PATH open where the runtime names the
  // directory by descriptor, the readlink calls of realpath(3) otherwise.
  ...["EACCES", "EIO", "ENOMEM"].map((errno): Case => ({
    scenario: "fresh",
    call: "open O_PATH (or realpath) of the lock's directory (pin)",
    syscalls: [...OPEN, "readlink", "readlinkat"],
    match: M.pin,
    errno,
    expect: errno === "EACCES"
      ? fails("acquire", "LockPermissionError", PIN)
      : fails("acquire", "RunlockError", PIN),
  })),
  // Step 1: the temp file.
  ...[
    ["EACCES", fails("acquire", "LockPermissionError", CREATE)],
    ["EPERM", fails("acquire", "LockPermissionError", CREATE)],
    ["EROFS", fails("acquire", "LockPermissionError", /read-only file/)],
    ["EMFILE", fails("acquire", "RunlockError", CREATE)],
    ["ENFILE", fails("acquire", "RunlockError", CREATE)],
    ["ENOSPC", fails("acquire", "RunlockError", CREATE)],
    ["EDQUOT", fails("acquire", "RunlockError", CREATE)],
    ["EIO", fails("acquire", "RunlockError", CREATE)],
    ["EINTR", ok()],
  ].map(([errno, expect]): Case => ({
    scenario: "fresh",
    call: "open of the temp file (O_CREAT|O_EXCL)",
    syscalls: OPEN,
    match: M.tempOpen,
    errno: errno as string,
    expect: expect as Outcome,
  })),
  {
    scenario: "fresh",
    call: "flock LOCK_EX of the temp file",
    syscalls: ["flock"],
    match: M.tempFlock,
    errno: "ENOLCK",
    expect: noLocks("acquire", WRITE_LOCK),
  },
  {
    // A non-blocking flock never sleeps, so the kernel never returns EINTR
    // there; the libc platforms retry it all the same, and that is tested.
    scenario: "fresh",
    call: "flock LOCK_EX of the temp file",
    syscalls: ["flock"],
    match: M.tempFlock,
    errno: "EINTR",
    expect: ok(),
    only: ["deno", "node", "bun"],
  },
  {
    scenario: "fresh",
    call: "fstat of the temp file",
    syscalls: STAT_FD,
    match: M.tempFd,
    errno: "EIO",
    expect: fails("acquire", "RunlockError", WRITE_LOCK),
  },
  ...[
    ["EPERM", fails("acquire", "LockPermissionError", WRITE_LOCK)],
    ["EROFS", fails("acquire", "LockPermissionError", /read-only file/)],
    ["EIO", fails("acquire", "RunlockError", WRITE_LOCK)],
  ].map(([errno, expect]): Case => ({
    scenario: "private",
    call: "fchmod of the temp file to 0600",
    syscalls: CHMOD,
    match: M.tempAny,
    errno: errno as string,
    expect: expect as Outcome,
  })),
  ...["ENOSPC", "EDQUOT", "EIO", "EFBIG"].map((errno): Case => ({
    scenario: "fresh",
    call: "write of the record into the temp file",
    syscalls: WRITE,
    match: M.tempFd,
    errno,
    expect: fails("acquire", "RunlockError", WRITE_LOCK),
  })),
  // Step 2: link.
  ...[
    ["EACCES", fails("acquire", "LockPermissionError", CREATE)],
    ["EPERM", fails("acquire", "UnsupportedFilesystemError", /hard links/)],
    ["EROFS", fails("acquire", "LockPermissionError", /read-only file/)],
    ["ENOSPC", fails("acquire", "RunlockError", CREATE)],
    ["EDQUOT", fails("acquire", "RunlockError", CREATE)],
    ["EMLINK", fails("acquire", "RunlockError", CREATE)],
    ["EIO", fails("acquire", "RunlockError", CREATE)],
  ].map(([errno, expect]): Case => ({
    scenario: "fresh",
    call: "link of the temp file to the lock path",
    syscalls: LINK,
    match: M.link,
    errno: errno as string,
    expect: expect as Outcome,
  })),
  ...["EIO", "EACCES"].map((errno): Case => ({
    scenario: "fresh",
    call: "unlink of the temp file after link",
    syscalls: UNLINK,
    match: M.tempPath,
    errno,
    // Left behind, it is a second name of our locked inode: harmless, and
    // the next acquire's sweep removes it.
    expect: ok({ litter: true }),
  })),
  {
    scenario: "fresh",
    call: "getdents of the directory (litter sweep)",
    syscalls: ["getdents64", "getdents"],
    match: M.sweepList,
    errno: "EIO",
    expect: ok(),
  },
  // Release.
  ...["EIO", "EACCES"].map((errno): Case => ({
    scenario: "fresh",
    call: "lstat of the lock file (release)",
    syscalls: STAT_PATH,
    match: M.lockPathStat,
    errno,
    expect: fails(
      "release",
      errno === "EACCES" ? "LockPermissionError" : "RunlockError",
      REMOVE,
      { lockLeft: true },
    ),
  })),
  ...[
    ["EACCES", "LockPermissionError"],
    ["EPERM", "LockPermissionError"],
    ["EROFS", "LockPermissionError"],
    ["EIO", "RunlockError"],
    ["EBUSY", "RunlockError"],
  ].map(([errno, error]): Case => ({
    scenario: "fresh",
    call: "unlink of the lock file (release)",
    syscalls: UNLINK,
    match: M.lockUnlink,
    errno,
    expect: fails("release", error, REMOVE, { lockLeft: true }),
  })),
  ...["EIO", "EINTR"].map((errno): Case => ({
    scenario: "fresh",
    call: "close of the lock's descriptor (release)",
    syscalls: ["close"],
    match: M.lockClose,
    errno,
    // Linux frees the descriptor (and the flock) whatever close returns.
    expect: ok(),
  })),
  // Step 3: takeover of a dead run's file.
  ...[
    ["EACCES", fails("acquire", "LockPermissionError", READ_FILE)],
    ["EMFILE", fails("acquire", "RunlockError", READ_FILE)],
    ["EIO", fails("acquire", "RunlockError", READ_FILE)],
    ["EINTR", ok()],
  ].map(([errno, expect]): Case => ({
    scenario: "stale",
    call: "open of the stale lock file",
    syscalls: OPEN,
    match: M.fileOpen,
    errno: errno as string,
    expect: expect as Outcome,
  })),
  {
    scenario: "stale",
    call: "fstat of the stale lock file",
    syscalls: STAT_FD,
    match: M.fileFd,
    errno: "EIO",
    expect: fails("acquire", "RunlockError", READ_FILE),
  },
  {
    scenario: "stale",
    call: "flock LOCK_EX of the stale lock file",
    syscalls: ["flock"],
    match: M.fileFlockEx,
    errno: "ENOLCK",
    expect: noLocks("acquire", READ_FILE),
  },
  {
    scenario: "stale",
    call: "read of the stale record",
    syscalls: READ,
    match: M.fileFd,
    errno: "EIO",
    expect: fails("acquire", "RunlockError", READ_FILE),
  },
  {
    // Deno's open has no O_NOFOLLOW, so with scoped permissions (Deno's
    // ops, not libc) its platform lstats the path before opening it;
    // elsewhere the first lstat is the one before the unlink.
    scenario: "stale",
    call: "first lstat of the stale lock file",
    syscalls: STAT_PATH,
    match: M.lockPathStat,
    errno: "EIO",
    expect: {
      "deno-scoped": fails("acquire", "RunlockError", READ_FILE),
      deno: fails("acquire", "RunlockError", STALE),
      node: fails("acquire", "RunlockError", STALE),
      bun: fails("acquire", "RunlockError", STALE),
    },
  },
  {
    scenario: "stale",
    call: "lstat of the stale lock file before unlinking it",
    syscalls: STAT_PATH,
    match: M.lockPathStat,
    after: M.fileFlockEx,
    errno: "EIO",
    expect: fails("acquire", "RunlockError", STALE),
  },
  ...[
    ["EACCES", "LockPermissionError"],
    ["EPERM", "LockPermissionError"],
    ["EIO", "RunlockError"],
  ].map(([errno, error]): Case => ({
    scenario: "stale",
    call: "unlink of the stale lock file",
    syscalls: UNLINK,
    match: M.lockUnlink,
    errno,
    expect: fails("acquire", error, STALE),
  })),
  // The sweep is best effort: a failure leaves the litter to the next one.
  ...[
    [
      "getdents of the directory (sweep)",
      ["getdents64", "getdents"],
      M.sweepList,
      "EIO",
    ],
    ["open of a dead run's temp file (sweep)", OPEN, M.litterOpen, "EMFILE"],
    [
      "flock of a dead run's temp file (sweep)",
      ["flock"],
      M.litterFlock,
      "ENOLCK",
    ],
    ["read of a dead run's temp file (sweep)", READ, M.litterFd, "EIO"],
    [
      "unlink of a dead run's temp file (sweep)",
      UNLINK,
      M.litterUnlink,
      "EACCES",
    ],
  ].map(([call, syscalls, match, errno]): Case => ({
    scenario: "litter",
    call: call as string,
    syscalls: syscalls as string[],
    match: match as Target,
    errno: errno as string,
    expect: ok({ litter: true }),
  })),
  // Probes of a lock another process holds: never release it.
  ...[
    [
      "open of the lock file",
      OPEN,
      M.fileOpen,
      "EACCES",
      "LockPermissionError",
    ],
    ["open of the lock file", OPEN, M.fileOpen, "EMFILE", "RunlockError"],
    ["fstat of the lock file", STAT_FD, M.fileFd, "EIO", "RunlockError"],
    [
      "flock LOCK_SH of the lock file",
      ["flock"],
      M.fileFlockSh,
      "ENOLCK",
      "UnsupportedFilesystemError",
    ],
    ["read of the record", READ, M.fileFd, "EIO", "RunlockError"],
    ["close of the probe's descriptor", ["close"], M.fileClose, "EIO", ""],
  ].map(([call, syscalls, match, errno, error]): Case => ({
    scenario: "held",
    call: `${call} (probe)`,
    syscalls: syscalls as string[],
    match: match as Target,
    errno: errno as string,
    expect: error === "UnsupportedFilesystemError"
      ? noLocks("probe", READ_FILE)
      : error
      ? fails("probe", error as string, READ_FILE)
      : ok({ state: "held" }),
  })),
  // An acquire that meets a held lock: the holder keeps it.
  ...[
    [
      "flock LOCK_EX of the held lock file",
      M.fileFlockEx,
      ["flock"],
      "ENOLCK",
      "UnsupportedFilesystemError",
      READ_FILE,
    ],
    [
      "read of the holder's record",
      M.fileFd,
      READ,
      "EIO",
      "RunlockError",
      READ_FILE,
    ],
  ].map(([call, match, syscalls, errno, error, action]): Case => ({
    scenario: "contend",
    call: call as string,
    syscalls: syscalls as string[],
    match: match as Target,
    errno: errno as string,
    expect: error === "UnsupportedFilesystemError"
      ? noLocks("acquire", action as RegExp)
      : fails("acquire", error as string, action as RegExp),
  })),
  // A process probing its own lock: a failed probe (and the close of the
  // probe's descriptor) never drops the flock it holds through another
  // descriptor (flock locks belong to the open file, not the process, as
  // fcntl locks would).
  ...[
    [
      "open of its own lock file",
      OPEN,
      M.fileOpen,
      "EACCES",
      "LockPermissionError",
    ],
    [
      "flock LOCK_SH of its own lock file",
      ["flock"],
      M.fileFlockSh,
      "ENOLCK",
      "UnsupportedFilesystemError",
    ],
    ["read of its own record", READ, M.fileFd, "EIO", "RunlockError"],
    ["close of the probe's descriptor", ["close"], M.fileClose, "EIO", ""],
  ].map(([call, syscalls, match, errno, error]): Case => ({
    scenario: "self",
    call: `${call} (probe by the holder)`,
    syscalls: syscalls as string[],
    match: match as Target,
    after: M.link,
    errno: errno as string,
    expect: error === "UnsupportedFilesystemError"
      ? noLocks("probe", READ_FILE)
      : error
      ? fails("probe", error as string, READ_FILE)
      : ok({ state: "held" }),
  })),
];

// ---------------------------------------------------------------------------

/**
 * Where the calls differ: Deno with every permission calls libc as Node
 * and Bun do; with scoped permissions ("deno-scoped"), Deno's own ops.
 */
type Runtime = "deno" | "deno-scoped" | "node" | "bun";

/** One run of every case: a runtime, and on Deno its permission flags. */
interface Variant {
  rt: Runtime;
  cases: Case[];
  /** The Deno flags for a run under `root` (default: --allow-all). */
  flags?: (root: string) => string[];
}

const variant = (rt: Runtime, flags?: Variant["flags"]): Variant => ({
  rt,
  cases: CASES.filter((c) => !c.only || c.only.includes(rt)),
  flags,
});
const variants: Variant[] = runtime === "deno"
  ? [
    variant("deno"),
    variant("deno-scoped", (root) => [
      `--allow-read=${root}`,
      `--allow-write=${root}`,
      "--allow-env=RUNLOCK_INJECT_TAG",
      "--allow-run",
      "--no-prompt",
    ]),
  ]
  : [variant(runtime as Runtime)];

function outcomeOf(c: Case, rt: Runtime): Outcome {
  const e = c.expect as Record<string, Outcome>;
  const keyed = "deno" in e || "deno-scoped" in e || "node" in e || "bun" in e;
  if (keyed) return e[rt] ?? (rt === "deno-scoped" ? e.deno : undefined) ?? {};
  return c.expect as Outcome;
}

function label(c: Case, rt: Runtime): string {
  const o = outcomeOf(c, rt);
  const what = o.step
    ? `${o.error} from ${o.step}`
    : `succeeds${o.litter ? " (litter swept by the next acquire)" : ""}`;
  return `${c.scenario}: ${c.call} fails with ${c.errno} -> ${what}`;
}

/** Whether strace can trace here: "ok", "missing" or why not. */
function straceState(): string {
  const r = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"], {
    encoding: "utf8",
  });
  if (r.error) return "missing";
  if (r.status !== 0) return `cannot trace: ${r.stderr.trim()}`;
  return "ok";
}

const state = straceState();
const inCi = process.env.CI === "true";
let skip: string | false = false;
if (state === "missing") {
  skip = "strace is not installed (apt-get install strace; .ci/run does)";
} else if (state !== "ok") {
  if (inCi) {
    throw new Error(`strace is installed but could not run under CI: ${state}`);
  }
  skip = `strace is installed but may not trace here (${state})`;
}
// The CommonJS copy of the compiled suite runs the very same platform code
// as the ES module copy: inject once per runtime.
const cjsCopy = import.meta.url.includes("/tests-cjs/");
if (!skip && cjsCopy) skip = "injected once per runtime, in the ESM copy";
if (skip) {
  console.warn(
    `\n*** file/injected_errors_test SKIPPED on ${runtime}: ${skip} ***\n`,
  );
}

/** One traced call, with the files of the lock directory it touches. */
interface Line {
  name: string;
  /** The strace -y line. */
  text: string;
  /** The kind of file its first argument is a descriptor of. */
  fd?: Kind;
  /** The kinds of file it names by a path. */
  paths: Kind[];
  /** The kinds of file it names by a descriptor. */
  fds: Kind[];
}

// A quoted string (strace escapes the quotes inside it), or a descriptor
// as -y prints it (`21</dir/file>`, and the directory of AT_FDCWD).
const TOKEN = /"(?:[^"\\]|\\.)*"(?:\.\.\.)?|(AT_FDCWD|\d+)<([^>]*)>/g;

/** Parses a strace -y line of a call, for the files of `dir`. */
function parseLine(text: string, dir: string): Line | undefined {
  const m = /^([a-z_0-9]+)\(/.exec(text);
  if (!m) return undefined;
  const args = text.slice(m[0].length).replace(/\) += [^=]*$/, "");
  const inDir = (path: string): Kind => {
    if (path === dir) return "dir";
    const name = path.startsWith(`${dir}/`) ? path.slice(dir.length + 1) : "/";
    return name.includes("/") ? "other" : kindOf(name);
  };
  const line: Line = { name: m[1], text, paths: [], fds: [] };
  // Where the argument after a descriptor of `dir` starts: a name there is
  // relative to the directory (openat(dirfd, name), ...).
  let relative = -1;
  for (const t of args.matchAll(TOKEN)) {
    if (t[2] !== undefined) {
      // A descriptor (AT_FDCWD's paths are absolute: no file of `dir`).
      if (t[1] !== "AT_FDCWD") {
        const kind = inDir(t[2]);
        line.fds.push(kind);
        if (t.index === 0) line.fd = kind;
        if (kind === "dir") relative = t.index + t[0].length + 2;
      }
      continue;
    }
    let value: string;
    try {
      value = JSON.parse(t[0].replace(/\.\.\.$/, ""));
    } catch {
      continue; // data with escapes JSON does not read: not a path
    }
    const proc = /^\/proc\/self\/fd\/\d+\/([^/]+)$/.exec(value);
    if (proc) line.paths.push(kindOf(proc[1]));
    else if (value.startsWith("/")) line.paths.push(inDir(value));
    else if (t.index === relative && value !== "") {
      line.paths.push(kindOf(value));
    }
  }
  return line;
}

function parseTrace(file: string, dir: string): Line[] {
  return readFileSync(file, "utf8").split("\n")
    .map((text) => parseLine(text, dir))
    .filter((l): l is Line => l !== undefined);
}

function matches(t: Target, l: Line): boolean {
  if (t.fd && l.fd !== t.fd) return false;
  const paths = t.path === undefined ? [] : [t.path].flat();
  if (!paths.every((k) => l.paths.includes(k))) return false;
  if (t.on && !l.paths.includes(t.on) && !l.fds.includes(t.on)) return false;
  if (t.text && !t.text.test(l.text.replace(/\) += [^=]*$/, ")"))) {
    return false;
  }
  return true;
}

const show = (t: Target) =>
  JSON.stringify(t, (_k, v) => v instanceof RegExp ? String(v) : v);

/**
 * Finds the case's call in a trace: its index, its system call and its
 * `when=` (its ordinal among the traced calls of that system call, which
 * are the ones strace counts).
 */
function locate(
  c: Case,
  lines: Line[],
): { index: number; name: string; when: number } {
  let from = 0;
  if (c.after) {
    from = lines.findIndex((l) => matches(c.after!, l)) + 1;
    if (from === 0) throw new Error(`no ${show(c.after)} in the trace`);
  }
  for (let i = from; i < lines.length; i++) {
    const l = lines[i];
    if (c.syscalls.includes(l.name) && matches(c.match, l)) {
      const when = lines.slice(0, i + 1).filter((x) => x.name === l.name)
        .length;
      return { index: i, name: l.name, when };
    }
  }
  throw new Error(
    `the trace of ${c.scenario} has no ${c.syscalls.join("/")} matching ${
      show(c.match)
    }`,
  );
}

/**
 * strace's -P arguments for a lock directory: every name of its files the
 * runtimes use. (strace matches a path argument by its text, and a
 * descriptor by the path /proc/PID/fd/N links to.) The bare directory
 * through /proc/self/fd/K is left out: a runtime's own start-up names its
 * descriptors so too.
 */
function selected(dir: string): string[] {
  const names = ["run.lock", LITTER_NAME, ...TEMP_NAMES];
  const paths = [dir, ...names.map((n) => `${dir}/${n}`)];
  for (let k = 0; k < PROC_FDS; k++) {
    for (const n of names) paths.push(`/proc/self/fd/${k}/${n}`);
  }
  return paths.flatMap((path) => ["-P", path]);
}

const TRACED = [
  ...OPEN,
  ...STAT_FD,
  ...STAT_PATH,
  ...READ,
  ...WRITE,
  ...LINK,
  ...UNLINK,
  ...CHMOD,
  "flock",
  "close",
  "getdents64",
  "getdents",
  "readlink",
  "readlinkat",
];
const TRACE_SET = [...new Set(TRACED)].map((s) => `?${s}`).join(",");

function fixtureArgs(scenario: Scenario, path: string): string[] {
  switch (scenario) {
    case "private":
      return ["acquire", path, "600"];
    case "held":
      return ["probe", path];
    case "self":
      return ["hold-probe", path];
    default:
      return ["acquire", path];
  }
}

/** Sets up a scenario's directory; returns the lock this process holds. */
function prepare(scenario: Scenario, dir: string): Lock | undefined {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "run.lock");
  if (scenario === "stale") {
    writeFileSync(path, `${deadPid()}\nrunlock 1\nhost=gone\n`);
  } else if (scenario === "litter") {
    writeFileSync(
      join(dir, ".run.lock.0123456789abcdef.tmp"),
      `${deadPid()}\nrunlock 1\n`,
    );
  } else if (scenario === "held" || scenario === "contend") {
    return acquireSync(path);
  }
  return undefined;
}

/** Whether some process holds an exclusive flock on `path` (flock(1)). */
function flockHeld(path: string): boolean {
  return spawnSync("flock", ["--nonblock", "--shared", path, "true"]).status ===
    1;
}

interface Step {
  step: string;
  ok: boolean;
  name?: string;
  message?: string;
  path?: string;
  state?: string;
  owned?: boolean;
  holder?: number;
  ms?: number;
}

interface Run {
  steps: Step[];
  trace: Line[];
  stderr: string;
  /** For "self": whether the flock was still held while the program held it. */
  heldDuring?: boolean;
}

/**
 * Runs the fixture on `dir`/run.lock under strace, tracing only the calls
 * that touch the files of `dir` (a real path); `inject` is
 * "syscall:error=E:when=N", N counted among those calls of that syscall.
 */
function traced(
  scenario: Scenario,
  dir: string,
  traceFile: string,
  flags: string[] | undefined,
  inject?: { name: string; errno: string; when: number },
): Promise<Run> {
  const path = join(dir, "run.lock");
  const [cmd, args] = fixtureCommand(
    "inject_fixture.ts",
    fixtureArgs(scenario, path),
    flags,
  );
  const straceArgs = [
    // -qq, and no "Requested path resolved into" notes for the -P paths.
    "-e",
    "quiet=attach,personality,exit,path-resolution",
    "-y",
    "-o",
    traceFile,
    "-e",
    `trace=${TRACE_SET}`,
    ...selected(dir),
  ];
  if (inject) {
    straceArgs.push(
      "-e",
      `inject=${inject.name}:error=${inject.errno}:when=${inject.when}`,
    );
  }
  const child = spawn("strace", [...straceArgs, "--", cmd, ...args], {
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, RUNLOCK_INJECT_TAG: TAG },
  });
  const steps: Step[] = [];
  let stderr = "";
  let heldDuring: boolean | undefined;
  child.stderr!.on("data", (d) => stderr += d);
  createInterface({ input: child.stdout! }).on("line", (line) => {
    let step: Step;
    try {
      step = JSON.parse(line);
    } catch {
      stderr += line;
      return;
    }
    steps.push(step);
    if (step.step === "owned") {
      heldDuring = step.owned === true && flockHeld(path);
      child.stdin!.write("release\n");
    }
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`no exit in 30 s: ${stderr}`));
    }, 30_000);
    child.on("close", () => {
      clearTimeout(timer);
      child.stdin!.destroy();
      resolve({
        steps,
        trace: parseTrace(traceFile, dir),
        stderr,
        heldDuring,
      });
    });
  });
}

interface Result {
  c: Case;
  path: string;
  hit?: string;
  run?: Run;
  /** Directory entries right after the injected run. */
  after?: string[];
  /** inspect() of the path right after the injected run. */
  afterState?: string;
  /** For held/contend: whether this process still held its lock after. */
  stillHeld?: boolean;
  stillOwned?: boolean;
  clean?: Step;
  /** Directory entries after the clean acquire. */
  final?: string[];
  error?: unknown;
}

async function runAll(v: Variant): Promise<Map<Case, Result>> {
  const { dir: tmp, cleanup } = tempDir();
  after(cleanup);
  // A real path: strace matches descriptors by the path they link to.
  const root = realpathSync(tmp);
  const flags = v.flags?.(root);
  const cases = v.cases;
  const results = new Map<Case, Result>();
  const censuses = new Map<Scenario, Promise<Line[]>>();
  const census = (scenario: Scenario): Promise<Line[]> => {
    if (censuses.has(scenario)) return censuses.get(scenario)!;
    const promise = (async () => {
      const dir = join(root, `L-census-${scenario}`);
      const lock = prepare(scenario, dir);
      try {
        const run = await traced(
          scenario,
          dir,
          join(root, `census-${scenario}.trace`),
          flags,
        );
        // Every scenario but "held" makes a temp file: it must carry the
        // fixed tag, or strace could not select the calls on it.
        if (
          scenario !== "held" && !run.trace.some((l) => l.fd === "temp")
        ) {
          throw new Error(
            `no traced call of the ${scenario} census touched a temp file ` +
              `named .run.lock.${TAG}<counter>.tmp: RUNLOCK_INJECT_TAG did ` +
              `not fix runlock's temp names (fixtures/inject_fixture.ts)\n` +
              `${
                readFileSync(join(root, `census-${scenario}.trace`), "utf8")
              }` +
              run.stderr,
          );
        }
        return run.trace;
      } finally {
        lock?.releaseSync();
      }
    })();
    censuses.set(scenario, promise);
    return promise;
  };

  const one = async (c: Case, index: number): Promise<void> => {
    const dir = join(root, `L-${index}`);
    const path = join(dir, "run.lock");
    const result: Result = { c, path };
    results.set(c, result);
    try {
      const target = locate(c, await census(c.scenario));
      const lock = prepare(c.scenario, dir);
      let run: Run;
      try {
        run = await traced(
          c.scenario,
          dir,
          join(root, `case${index}.trace`),
          flags,
          { name: target.name, when: target.when, errno: c.errno },
        );
        result.after = readdirSync(dir).sort();
        result.afterState = (await inspect(path)).state;
        if (lock) {
          result.stillOwned = lock.isOwned();
          result.stillHeld = flockHeld(path);
        }
      } finally {
        lock?.releaseSync();
      }
      result.run = run;
      // Exactly one call failed, and it is the call the case names, found
      // in this run's own trace.
      const injected = run.trace.filter((l) => l.text.endsWith("(INJECTED)"));
      result.hit = injected.map((l) => l.text).join("\n");
      const named = locate(c, run.trace);
      assert.ok(
        injected.length === 1 && run.trace[named.index] === injected[0],
        `the injection did not hit ${c.call}: ${result.hit || "no call"}` +
          ` (the call: ${run.trace[named.index].text})`,
      );
    } catch (err) {
      result.error = err;
    }
  };

  // A few at a time: each is a short strace'd process.
  const queue = cases.map((c, i) => [c, i] as const);
  const workers = Array.from({ length: 3 }, async () => {
    for (let next = queue.shift(); next; next = queue.shift()) {
      await one(...next);
    }
  });
  await Promise.all(workers);

  // The very next acquire, in one fresh process that never saw these locks:
  // each path at once (timeout 0), then release.
  const paths = cases.map((c) => results.get(c)!.path);
  const [cmd, args] = fixtureCommand(
    "inject_fixture.ts",
    ["clean", ...paths],
    flags,
  );
  const clean = spawnSync(cmd, args, { encoding: "utf8" });
  if (clean.status !== 0) {
    throw new Error(
      `the clean acquire exited ${clean.status}: ${clean.stderr}`,
    );
  }
  const cleanSteps: Step[] = clean.stdout.trim().split("\n").filter(Boolean)
    .map((l) => JSON.parse(l));
  for (const [i, c] of cases.entries()) {
    const r = results.get(c)!;
    r.clean = cleanSteps[i];
    r.final = existsSync(join(root, `L-${i}`))
      ? readdirSync(join(root, `L-${i}`))
      : [];
  }
  return results;
}

const all = new Map<Variant, Promise<Map<Case, Result>>>();
const results = (v: Variant) => {
  if (!all.has(v)) all.set(v, runAll(v));
  return all.get(v)!;
};

function check(r: Result, rt: Runtime): void {
  if (r.error) throw r.error;
  const c = r.c;
  const o = outcomeOf(c, rt);
  const run = r.run!;
  const why = `${label(c, rt)}\nhit: ${r.hit}\nsteps: ${
    JSON.stringify(run.steps)
  }\n${run.stderr}`;
  // The step that was to fail failed with the documented class, naming the
  // path and the action; every other step succeeded.
  const expected: string[] = {
    fresh: ["acquire", "release"],
    private: ["acquire", "release"],
    stale: ["acquire", "release"],
    litter: ["acquire", "release"],
    contend: ["acquire"],
    held: ["probe"],
    self: ["acquire", "probe", "owned", "release"],
  }[c.scenario];
  const failedAt = expected.indexOf(o.step ?? "");
  const shown = run.steps.map((s) => s.step);
  if (c.scenario === "contend" && !o.step) {
    assert.deepEqual(shown, ["acquire"], why);
  } else if (o.step === "acquire" && c.scenario !== "self") {
    assert.deepEqual(shown, ["acquire"], why);
  } else {
    assert.deepEqual(shown, expected, why);
  }
  for (const [i, s] of run.steps.entries()) {
    if (i === failedAt) {
      assert.equal(s.ok, false, why);
      assert.equal(s.name, o.error, why);
      assert.equal(s.path, r.path, why);
      assert.ok(s.message!.startsWith(`${r.path}: `), why);
      assert.match(s.message!, o.action!, why);
      if (o.error === "LockPermissionError") {
        assert.match(s.message!, DENIED, why);
      }
    } else {
      assert.equal(s.ok, true, why);
    }
    if (s.step === "probe" && s.ok) {
      assert.equal(s.state, o.state ?? "held", why);
    }
  }
  // Nothing left behind but what the case allows.
  const temps = r.after!.filter((n) => n.endsWith(".tmp"));
  if (!o.litter) assert.deepEqual(temps, [], `temp files left: ${why}`);
  const held = c.scenario === "held" || c.scenario === "contend";
  if (held) {
    // The lock this process held was never released by the failed call.
    assert.equal(r.stillOwned, true, why);
    assert.equal(r.stillHeld, true, why);
    assert.equal(r.afterState, "held", why);
  } else if (c.scenario === "self") {
    assert.equal(run.heldDuring, true, `the flock was dropped: ${why}`);
    assert.equal(run.steps.find((s) => s.step === "owned")?.owned, true, why);
  }
  if (r.after!.includes("run.lock") && !held) {
    // Never a half record, never a file a later acquire cannot take over.
    assert.equal(r.afterState, "stale", why);
    const allowed = o.lockLeft || o.step === "acquire" &&
        c.scenario === "stale" ||
      c.scenario === "self" && o.lockLeft;
    assert.ok(allowed, `a lock file was left: ${why}`);
  }
  // The very next acquire in a fresh process succeeds at once, and leaves
  // the directory empty (stale files taken over, litter swept).
  // (At once: the fixture's clean acquire has timeout 0.)
  assert.equal(r.clean?.ok, true, `clean acquire: ${JSON.stringify(r.clean)}`);
  assert.deepEqual(r.final, [], `left after the clean acquire: ${why}`);
}

for (const v of variants) {
  const { rt, cases } = v;
  describe(`injected errors (${rt})`, { skip }, () => {
    for (const c of cases) {
      test(label(c, rt), async () => {
        check((await results(v)).get(c)!, rt);
      });
    }

    test("summary: every case hit its call, and the table is printed", async () => {
      const all = await results(v);
      const rows = [...all.values()].map((r) => {
        const o = outcomeOf(r.c, rt);
        const got = r.run?.steps.find((s) => !s.ok);
        return [
          r.c.scenario,
          r.c.call,
          r.c.errno,
          (r.hit ?? "").replace(/\(.*/, ""),
          got ? `${got.name} (${got.step})` : "ok",
          o.step ? `${o.error} (${o.step})` : "ok",
        ];
      });
      const typed = rows.filter((r) => r[5] !== "ok").length;
      console.log(
        `\ninjected errors on ${rt}: ${rows.length} cases, ${typed} typed errors, ` +
          `${
            rows.length - typed
          } succeeded (retried or best effort); every one ` +
          `followed by a clean acquire in a fresh process\n` +
          rows.map((r) => `  ${r.join(" | ")}`).join("\n"),
      );
      assert.equal(rows.length, cases.length);
      assert.ok(
        [...all.values()].every((r) => r.hit?.endsWith("(INJECTED)")),
        "every case hit its call",
      );
    });
  });
}
