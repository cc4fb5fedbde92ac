// Injected errors: every system call of the protocol made to fail, once,
// with an errno the OS really returns there, under strace's fault injection
// (`strace -e inject=SYSCALL:error=ERRNO:when=N`), against a real program
// (fixtures/inject_fixture.ts) of the runtime running the tests.
//
// How a case hits exactly the call it names: a census run of the same
// scenario (strace -y, no injection) lists the program's system calls with
// the files their descriptors name; the case's matcher finds its call there
// (the temp file's openat, the flock of the lock file, ...), and its ordinal
// among the calls of that system call gives `when=N`. strace traces only
// the main thread (no -f), where both runtimes make every synchronous file
// system call, so no other thread's call is ever counted or hit. The
// injected run's own trace must show exactly one "(INJECTED)" line, on the
// call the case names; if the program's start-up drifted between the two
// runs, the census is taken again.
//
// For every case: the documented typed error naming the path and the failed
// action (or success, where the protocol retries or the call is best
// effort); no temp file left (except the one whose own unlink failed, which
// the next acquire sweeps); no half record; a lock already held is still
// held; and the very next acquire in a fresh process succeeds at once and
// leaves the directory empty.
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
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { after, describe, test } from "node:test";
import { acquireSync, inspect, type Lock } from "../mod.ts";
import { deadPid, fixtureCommand, runtime, tempDir } from "./_helpers.ts";

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
  /** Matches the census line of the call (strace -y, before " = "). */
  match: RegExp;
  /** The call is the first match after the first line matching this. */
  after?: RegExp;
  errno: string;
  /** Per runtime, where they differ. */
  expect: Outcome | Partial<Record<"deno" | "node" | "bun", Outcome>>;
  /** Runtimes on which the call exists (default: all). */
  only?: ("deno" | "node" | "bun")[];
}

// Matchers. Lock directories are named L-<case>, the lock file run.lock;
// a dead run's temp file has the fixed random part 0123456789abcdef.
const OURS_TMP = String.raw`\.run\.lock\.(?!0123456789abcdef)[0-9a-f]{16}\.tmp`;
const LITTER = String.raw`\.run\.lock\.0123456789abcdef\.tmp`;
const FD = (file: string) => new RegExp(String.raw`^\w+\(\d+<[^>]*/${file}>`);
const PATH = (file: string) => new RegExp(String.raw`"[^"]*/${file}"`);
const LOCK = String.raw`run\.lock`;

const M = {
  pin: /\/L-[^/"]*", O_[A-Z_|]*O_PATH|^readlink(at)?\([^"]*"[^"]*\/L-[^/"]*"/,
  tempOpen: new RegExp(String.raw`/${OURS_TMP}", O_RDWR\|O_CREAT\|O_EXCL`),
  tempFlock: new RegExp(String.raw`^flock\(\d+<[^>]*/${OURS_TMP}>, LOCK_EX`),
  tempFd: FD(OURS_TMP),
  tempPath: PATH(OURS_TMP),
  link: new RegExp(String.raw`${OURS_TMP}", .*"[^"]*/run\.lock"`),
  sweepList: /^getdents(64)?\(\d+<[^>]*\/L-[^/>]*>/,
  lockPathStat: new RegExp(
    String
      .raw`^(statx|newfstatat|lstat|fstatat64)\((AT_FDCWD[^,]*, )?"[^"]*/run\.lock"`,
  ),
  lockUnlink: PATH(LOCK),
  lockClose: new RegExp(
    String.raw`^close\(\d+<[^>]*/${OURS_TMP}>\(deleted\)\)`,
  ),
  fileOpen: new RegExp(String.raw`/run\.lock", O_RDONLY`),
  fileFlockEx: /^flock\(\d+<[^>]*\/run\.lock>, LOCK_EX/,
  fileFlockSh: /^flock\(\d+<[^>]*\/run\.lock>, LOCK_SH/,
  fileFd: FD(LOCK),
  fileClose: /^close\(\d+<[^>]*\/run\.lock>\)/,
  litterOpen: new RegExp(String.raw`/${LITTER}", O_RDONLY`),
  litterFlock: new RegExp(String.raw`^flock\(\d+<[^>]*/${LITTER}>, LOCK_EX`),
  litterFd: FD(LITTER),
  litterUnlink: PATH(LITTER),
};

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
    // there; the Node platform retries it all the same, and that is tested.
    scenario: "fresh",
    call: "flock LOCK_EX of the temp file",
    syscalls: ["flock"],
    match: M.tempFlock,
    errno: "EINTR",
    expect: ok(),
    only: ["node", "bun"],
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
    match: /tmp/,
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
    // Deno's open has no O_NOFOLLOW, so its platform lstats the path before
    // opening it; elsewhere the first lstat is the one before the unlink.
    scenario: "stale",
    call: "first lstat of the stale lock file",
    syscalls: STAT_PATH,
    match: M.lockPathStat,
    errno: "EIO",
    expect: {
      deno: fails("acquire", "RunlockError", READ_FILE),
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
    match: match as RegExp,
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
    match: match as RegExp,
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
    match: match as RegExp,
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
    match: match as RegExp,
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

type Runtime = "deno" | "node" | "bun";
const rt = runtime as Runtime;
const cases = CASES.filter((c) => !c.only || c.only.includes(rt));

function outcomeOf(c: Case): Outcome {
  const e = c.expect as Record<string, Outcome>;
  if ("deno" in e || "node" in e || "bun" in e) return e[rt] ?? {};
  return c.expect as Outcome;
}

function label(c: Case): string {
  const o = outcomeOf(c);
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
  console.warn(`\n*** inject_test SKIPPED on ${rt}: ${skip} ***\n`);
}

interface Line {
  name: string;
  text: string;
}

function parseTrace(file: string): Line[] {
  const lines: Line[] = [];
  for (const text of readFileSync(file, "utf8").split("\n")) {
    const m = /^([a-z_0-9]+)\(/.exec(text);
    if (m) lines.push({ name: m[1], text });
  }
  return lines;
}

const beforeResult = (text: string) => text.replace(/\) += [^=]*$/, ")");

/** Finds the case's call in a census: its system call and its `when=`. */
function locate(c: Case, lines: Line[]): { name: string; when: number } {
  let from = 0;
  if (c.after) {
    from = lines.findIndex((l) => c.after!.test(beforeResult(l.text))) + 1;
    if (from === 0) throw new Error(`no ${c.after} in the census`);
  }
  for (let i = from; i < lines.length; i++) {
    const l = lines[i];
    if (c.syscalls.includes(l.name) && c.match.test(beforeResult(l.text))) {
      const when = lines.slice(0, i + 1).filter((x) => x.name === l.name)
        .length;
      return { name: l.name, when };
    }
  }
  throw new Error(
    `the census of ${c.scenario} has no ${
      c.syscalls.join("/")
    } matching ${c.match}`,
  );
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

/** Runs the fixture under strace; `inject` is "syscall:error=E:when=N". */
function traced(
  scenario: Scenario,
  path: string,
  traceFile: string,
  inject?: { name: string; errno: string; when: number },
): Promise<Run> {
  const [cmd, args] = fixtureCommand(
    "inject_fixture.ts",
    fixtureArgs(scenario, path),
  );
  const straceArgs = ["-qq", "-y", "-o", traceFile];
  if (inject) {
    straceArgs.push(
      "-e",
      `trace=${inject.name}`,
      "-e",
      `inject=${inject.name}:error=${inject.errno}:when=${inject.when}`,
    );
  } else {
    straceArgs.push("-e", `trace=${TRACE_SET}`);
  }
  const child = spawn("strace", [...straceArgs, "--", cmd, ...args], {
    stdio: ["pipe", "pipe", "pipe"],
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
      resolve({ steps, trace: parseTrace(traceFile), stderr, heldDuring });
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

async function runAll(): Promise<Map<Case, Result>> {
  const { dir: root, cleanup } = tempDir();
  after(cleanup);
  const results = new Map<Case, Result>();
  const censuses = new Map<Scenario, Promise<Line[]>>();
  let counter = 0;
  const census = (scenario: Scenario, fresh = false): Promise<Line[]> => {
    if (!fresh && censuses.has(scenario)) return censuses.get(scenario)!;
    const promise = (async () => {
      const dir = join(root, `L-census${counter++}`);
      const lock = prepare(scenario, dir);
      try {
        const run = await traced(
          scenario,
          join(dir, "run.lock"),
          join(root, `census${counter++}.trace`),
        );
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
      for (let attempt = 1;; attempt++) {
        const target = locate(c, await census(c.scenario, attempt > 1));
        const lock = prepare(c.scenario, dir);
        const traceFile = join(root, `case${index}-${attempt}.trace`);
        let run: Run;
        try {
          run = await traced(c.scenario, path, traceFile, {
            ...target,
            errno: c.errno,
          });
          result.after = readdirSync(dir).sort();
          result.afterState = (await inspect(path)).state;
          if (lock) {
            result.stillOwned = lock.isOwned();
            result.stillHeld = flockHeld(path);
          }
        } finally {
          lock?.releaseSync();
        }
        const injected = run.trace.filter((l) => l.text.endsWith("(INJECTED)"));
        const hit = injected.length === 1 &&
          c.match.test(beforeResult(injected[0].text));
        if (hit || attempt === 3) {
          result.run = run;
          result.hit = injected.map((l) => l.text).join("\n");
          assert.ok(
            hit,
            `the injection did not hit ${c.call}: ${result.hit || "no call"}`,
          );
          return;
        }
        // Start-up drifted since the census: clean up and count again.
        for (const name of readdirSync(dir)) {
          spawnSync("rm", ["-rf", join(dir, name)]);
        }
      }
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
  const [cmd, args] = fixtureCommand("inject_fixture.ts", ["clean", ...paths]);
  const clean = spawnSync(cmd, args, { encoding: "utf8" });
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

let all: Promise<Map<Case, Result>> | undefined;
const results = () => all ??= runAll();

function check(r: Result): void {
  if (r.error) throw r.error;
  const c = r.c;
  const o = outcomeOf(c);
  const run = r.run!;
  const why = `${label(c)}\nhit: ${r.hit}\nsteps: ${
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
  assert.equal(r.clean?.ok, true, `clean acquire: ${JSON.stringify(r.clean)}`);
  assert.ok(r.clean!.ms! < 2000, `the clean acquire took ${r.clean!.ms} ms`);
  assert.deepEqual(r.final, [], `left after the clean acquire: ${why}`);
}

describe(`injected errors (${rt})`, { skip }, () => {
  for (const c of cases) {
    test(label(c), async () => {
      check((await results()).get(c)!);
    });
  }

  test("summary: every case hit its call, and the table is printed", async () => {
    const all = await results();
    const rows = [...all.values()].map((r) => {
      const o = outcomeOf(r.c);
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
