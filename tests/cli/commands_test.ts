// The runlock CLI: every command and exit code, with real processes and
// real signals. Under Deno it runs src/cli.ts; under Node and Bun the `bin`
// of the installed package.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { constants, hostname } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  Background,
  cli,
  cliCommand,
  cliRuntime,
  fixture,
  processState,
  Reads,
  start,
  startWithInput,
} from "../_cli.ts";
import {
  deadPid,
  HANG_MS,
  holder,
  runtime,
  tempDir,
  waitFor,
} from "../_helpers.ts";

const [cmd, ...pre] = cliCommand();

/** The clone: src/cli.ts and deno.json, for the Deno-only tests. */
const CLONE = join(new URL(".", import.meta.url).pathname, "..", "..");
/** src/cli.ts, for the tests that run it under Deno with chosen flags. */
const CLI_SOURCE = join(CLONE, "src", "cli.ts");

/**
 * The `runlock` command for Deno users, as the docs give it (from the
 * clone): `deno install -g --name runlock` with these flags and
 * src/cli.ts; `--allow-net` added for --db.
 */
const INSTALL_FLAGS = [
  "--allow-read",
  "--allow-write",
  "--allow-sys=hostname",
  "--allow-run",
  "--allow-env",
];

/**
 * A command that counts the signals it gets (tests/fixtures/tty_child.py),
 * under `startWithInput`: it reads lines from the test ("report", "die")
 * and exits when the test closes its input.
 */
const counter = ["python3", fixture("tty_child.py")];

/**
 * The signals `run` forwards (README, "Signals"), as far as this platform
 * has them. Under Bun, SIGSTKFLT cannot be caught and SIGPWR belongs to the
 * runtime: the README lists both as exceptions.
 */
const FORWARDED = ([
  "SIGHUP",
  "SIGINT",
  "SIGQUIT",
  "SIGTRAP",
  "SIGABRT",
  "SIGUSR1",
  "SIGUSR2",
  "SIGALRM",
  "SIGTERM",
  "SIGSTKFLT",
  "SIGCONT",
  "SIGURG",
  "SIGXCPU",
  "SIGXFSZ",
  "SIGVTALRM",
  "SIGPROF",
  "SIGWINCH",
  "SIGIO",
  "SIGPWR",
  "SIGSYS",
  "SIGINFO",
  "SIGEMT",
] as NodeJS.Signals[]).filter((s) =>
  s in constants.signals &&
  !(cliRuntime === "bun" && (s === "SIGSTKFLT" || s === "SIGPWR"))
);

async function readyPid(command: Background): Promise<number> {
  return Number((await command.line(/^ready pid=\d+/)).match(/\d+/)![0]);
}

/** The CLI run in `cwd`. */
function cliIn(cwd: string, ...args: string[]) {
  const r = spawnSync(cmd, [...pre, ...args], { cwd, encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** The shell loop of a command that runs until the file "$1" exists. */
const UNTIL_DONE =
  'echo ready; while [ ! -e "$1" ]; do sleep 0.05; done; exit "${2:-0}"';

/**
 * `runlock run [options] <path> -- sh -c UNTIL_DONE sh <done> [args...]`,
 * once the command runs. Its recorded command line is `recorded(...)`.
 */
async function running(
  path: string,
  done: string,
  options: string[] = [],
  args: string[] = [],
): Promise<Background> {
  const wrapper = start(
    "run",
    ...options,
    path,
    "--",
    "sh",
    "-c",
    UNTIL_DONE,
    "sh",
    done,
    ...args,
  );
  await wrapper.line(/^ready$/);
  return wrapper;
}

/** The words of a command line, as bash reads them back (eval). */
function bashWords(line: string): string[] {
  const r = spawnSync(
    "bash",
    ["-c", 'eval "set -- $1"; printf "%s\\0" "$@"', "bash", line],
    // (UTF-8, so that $'\u2028' reads as that character.)
    { encoding: "utf8", env: { ...process.env, LC_ALL: "C.UTF-8" } },
  );
  assert.equal(r.status, 0, r.stderr);
  return r.stdout.split("\0").slice(0, -1);
}

/** A runlock record written by hand (a run that is gone). */
function record(
  path: string,
  pid: number,
  fields: Record<string, string>,
): void {
  const lines = Object.entries(fields).map(([k, v]) => `${k}=${v}\n`);
  writeFileSync(path, `${pid}\nrunlock 1\n${lines.join("")}`);
}

/** Whether this process may make a PID namespace (root, with unshare(1)). */
const canUnshare = process.getuid?.() === 0 &&
  spawnSync("unshare", ["--pid", "--fork", "--kill-child", "true"]).status ===
    0;

describe("runlock status", () => {
  test("free: prints 'free', exit 1", () => {
    const { dir, cleanup } = tempDir();
    try {
      const r = cli("status", join(dir, "run.lock"));
      assert.equal(r.code, 1);
      assert.equal(r.stdout, "free\n");
      assert.equal(r.stderr, "");
    } finally {
      cleanup();
    }
  });

  test("held: prints the holder's pid, host and start time, exit 0; --json is one parseable object with the record's runtime", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      const r = cli("status", path);
      assert.equal(r.code, 0, r.stderr);
      assert.match(
        r.stdout,
        new RegExp(
          `^held by pid ${first.pid} on ${hostname()} since \\d\\d:\\d\\d:\\d\\d \\(\\d+s ago\\)\\n$`,
        ),
      );
      const j = cli("status", "--json", path);
      assert.equal(j.code, 0);
      assert.equal(j.stdout.trim().split("\n").length, 1);
      const info = JSON.parse(j.stdout);
      assert.equal(info.state, "held");
      assert.equal(info.pid, first.pid);
      assert.equal(info.host, hostname());
      assert.equal(info.path, path);
      assert.equal(info.foreign, false);
      assert.equal(info.reason, null);
      assert.equal(info.runtime, runtime, "the holder's runtime= line");
      assert.ok(Math.abs(Date.parse(info.started) - Date.now()) < 60_000);
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("stale after the holder is SIGKILLed: names the dead pid, exit 1", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      await first.kill("SIGKILL");
      const r = cli("status", path);
      assert.equal(r.code, 1);
      assert.equal(r.stdout, `stale: last holder pid ${first.pid} is gone\n`);
      assert.equal(
        JSON.parse(cli("status", "--json", path).stdout).state,
        "stale",
      );
    } finally {
      cleanup();
    }
  });

  test("invalid file: message on stderr, nothing on stdout, exit 2; --json says invalid, exit 2", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      writeFileSync(path, "garbage\n");
      const r = cli("status", path);
      assert.equal(r.code, 2);
      assert.equal(r.stdout, "");
      assert.match(
        r.stderr,
        /^runlock: invalid: .*run\.lock: first line "garbage" is not a PID/,
      );
      const j = cli("status", "--json", path);
      assert.equal(j.code, 2);
      assert.equal(JSON.parse(j.stdout).state, "invalid");
      assert.equal(readFileSync(path, "utf8"), "garbage\n");
    } finally {
      cleanup();
    }
  });

  test("a name or record holding control characters is shown quoted as bash's $'...': status's invalid-file message (ESC, a newline in the name), a stale record's command and meta; run's and wait's messages about a held lock so named; --json exact", async () => {
    const { dir, cleanup } = tempDir();
    const bad = join(dir, "x\x1b[2J\ny.lock");
    const named = join(dir, "t\x1b]0;PWNED\x07\nu.lock");
    // deno-lint-ignore no-control-regex -- control characters are the point
    const controls = /[\x00-\x1f\x7f]/;
    let first: Awaited<ReturnType<typeof holder>> | undefined;
    try {
      writeFileSync(bad, "garbage\n");
      const r = cli("status", bad);
      assert.equal(r.code, 2);
      assert.equal(r.stdout, "");
      assert.ok(
        r.stderr.startsWith(
          `runlock: invalid: $'${join(dir, "x\\x1b[2J\\ny.lock")}': first line`,
        ),
        r.stderr,
      );
      assert.doesNotMatch(r.stderr.slice(0, -1), controls);
      assert.equal(JSON.parse(cli("status", "--json", bad).stdout).path, bad);

      const stale = join(dir, "stale.lock");
      const gone = deadPid();
      record(stale, gone, {
        "meta.cmd": "c\x1b]0;T\x07d",
        "meta.k": "v\x1bz",
      });
      const s = cli("status", stale);
      assert.equal(s.code, 1);
      assert.equal(
        s.stdout,
        `stale: last holder pid ${gone} is gone: $'c\\x1b]0;T\\x07d'\n  k=$'v\\x1bz'\n`,
      );

      first = await holder(named);
      const shown = join(dir, "t\\x1b]0;PWNED\\x07\\nu.lock");
      // The library's message names the path: the message is quoted whole.
      const held = cli("run", named, "--", "true");
      assert.equal(held.code, 75, held.stderr);
      assert.ok(held.stderr.startsWith("runlock: $'"), held.stderr);
      assert.ok(held.stderr.includes(shown), held.stderr);
      assert.doesNotMatch(held.stderr.slice(0, -1), controls);
      const waited = cli("wait", "--timeout=0", named);
      assert.equal(waited.code, 1, waited.stderr);
      assert.ok(
        waited.stderr.startsWith(
          `runlock: timed out after 0s: $'${shown}' is still held by pid ${first.pid}`,
        ),
        waited.stderr,
      );
      assert.doesNotMatch(waited.stderr.slice(0, -1), controls);
    } finally {
      await first?.kill();
      cleanup();
    }
  });

  test(
    "a plain pidfile under Deno without --allow-run: status says that it could not check whether the pid is alive, and that --allow-run lets it",
    { skip: cliRuntime !== "deno" && "Deno's permissions only" },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const path = join(dir, "app.pid");
        // This test's own pid: alive, so only a missing grant can make
        // kill(pid, 0) unanswerable.
        writeFileSync(path, `${process.pid}\n`);
        const status = (...flags: string[]) =>
          spawnSync(
            process.execPath,
            ["run", "--quiet", ...flags, CLI_SOURCE, "status", path],
            { encoding: "utf8" },
          );
        const without = status(`--allow-read=${dir}`);
        assert.equal(without.status, 0, without.stderr);
        assert.match(
          without.stdout,
          new RegExp(
            `^held by pid ${process.pid} \\(a plain pidfile: runlock could not check that pid ${process.pid} is alive, as Deno needs --allow-run for kill\\(pid, 0\\); counted as held\\)\n$`,
          ),
        );
        const granted = status(`--allow-read=${dir}`, "--allow-run");
        assert.equal(granted.status, 0, granted.stderr);
        assert.equal(
          granted.stdout,
          `held by pid ${process.pid} (a plain pidfile: liveness from kill(pid, 0))\n`,
        );
      } finally {
        cleanup();
      }
    },
  );
});

describe("runlock run", () => {
  test("runs the command with inherited stdio while holding the lock, releases it, and exits with its code", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const script = `echo out; echo err >&2; "$@" status "${path}"; exit 3`;
      const r = cli("run", path, "--", "sh", "-c", script, "sh", cmd, ...pre);
      assert.equal(r.code, 3, r.stderr);
      const [first, second] = r.stdout.split("\n");
      assert.equal(first, "out");
      assert.match(
        second,
        /^held by pid \d+ /,
        "the command sees the lock held",
      );
      assert.equal(r.stderr, "err\n");
      assert.equal(existsSync(path), false, "released");
    } finally {
      cleanup();
    }
  });

  test("refuses when another run holds the lock: exit 75, the holder's pid on stderr, the command never runs", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const marker = join(dir, "ran");
    const first = await holder(path);
    try {
      const r = cli("run", path, "--", "touch", marker);
      assert.equal(r.code, 75);
      assert.equal(r.stdout, "");
      assert.match(
        r.stderr,
        new RegExp(`another run is active as pid ${first.pid}`),
      );
      assert.equal(existsSync(marker), false);
      assert.equal(
        cli("run", "--conflict-exit-code=9", path, "--", "touch", marker).code,
        9,
      );
      const timed = cli("run", "--wait=0.3", path, "--", "touch", marker);
      assert.equal(timed.code, 75);
      assert.equal(existsSync(marker), false);
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("--wait hands the lock over when the holder releases it", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const marker = join(dir, "ran");
    const first = await holder(path);
    const reads = await Reads.watch(path, join(dir, "mark"));
    try {
      const waiter = start("run", "--wait", path, "--", "touch", marker);
      await reads.reads(1); // it looked, and found the lock held
      assert.equal(existsSync(marker), false, "still waiting");
      first.send("release");
      await first.expect("released");
      const { code } = await waiter.exited;
      assert.equal(code, 0, waiter.stderr());
      assert.ok(existsSync(marker));
      assert.equal(
        waiter.stderr(),
        "",
        "no waiting line when stderr is not a terminal",
      );
    } finally {
      await reads.stop();
      await first.kill();
      cleanup();
    }
  });

  test("forwards SIGTERM to the command, which can trap it; exits with its code and releases", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const script =
        'trap "echo got TERM; exit 7" TERM; echo ready; while :; do sleep 0.05; done';
      const wrapper = start("run", path, "--", "sh", "-c", script);
      await wrapper.line(/^ready$/);
      wrapper.signal("SIGTERM");
      const { code } = await wrapper.exited;
      assert.equal(code, 7, wrapper.stderr());
      assert.ok(wrapper.lines.includes("got TERM"));
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });

  test("forwards every catchable signal to the command's process group once, and keeps the lock through all of them", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const wrapper = startWithInput("run", path, "--", ...counter);
    try {
      await readyPid(wrapper);
      for (const s of FORWARDED) {
        wrapper.signal(s);
        await wrapper.line(new RegExp(`^got ${s} 1$`));
      }
      // A second copy would have been sent by the time runlock forwards
      // the next signal: SIGHUP once more, then the command's own count
      // (the report comes after every handler it has run).
      wrapper.signal("SIGHUP");
      await wrapper.line(/^got SIGHUP 2$/);
      wrapper.send("report");
      const counts = (s: NodeJS.Signals) => s === "SIGHUP" ? 2 : 1;
      assert.equal(
        await wrapper.line(/^report /),
        `report ${
          [...FORWARDED].sort().map((s) => `${s.slice(3)}=${counts(s)}`)
            .join(" ")
        } size=none`,
      );
      const status = cli("status", path);
      assert.equal(status.code, 0, status.stdout);
      assert.match(status.stdout, new RegExp(`^held by pid ${wrapper.pid} `));
      if (cliRuntime === "node") {
        // Node opens its inspector on SIGUSR1 unless a listener takes it.
        // (Deno >= 2.9.2 opens its own on SIGUSR1 whatever the program
        // does; the README says so.)
        assert.doesNotMatch(wrapper.stderr(), /Debugger listening/);
      }
      wrapper.send("die"); // the command SIGKILLs itself
      assert.equal((await wrapper.exited).code, 137);
      assert.equal(existsSync(path), false, "released");
      for (const s of FORWARDED) {
        assert.equal(wrapper.count(new RegExp(`^got ${s} `)), counts(s), s);
      }
    } finally {
      await wrapper.kill(); // (closes its input: the command exits)
      cleanup();
    }
  });

  test("lives until the command exits: a command that ignores SIGTERM keeps running under the lock, and its exit code comes through", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const script =
      `trap "" TERM; trap "echo got HUP" HUP; echo ready; while [ ! -e "$1" ]; do sleep 0.05; done; exit 6`;
    const wrapper = start("run", path, "--", "sh", "-c", script, "sh", done);
    try {
      await wrapper.line(/^ready$/);
      wrapper.signal("SIGTERM");
      // Had SIGTERM ended runlock, it could not forward a signal sent after.
      wrapper.signal("SIGHUP");
      await wrapper.line(/^got HUP$/);
      assert.ok(wrapper.running, "runlock is still running");
      assert.equal(cli("status", path).code, 0, "and still holds the lock");
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 6, wrapper.stderr());
      assert.equal(existsSync(path), false, "released");
    } finally {
      writeFileSync(done, ""); // the command ends (run's SIGKILL would not end it)
      await wrapper.kill();
      cleanup();
    }
  });

  test("SIGTSTP to runlock stops the command, then runlock, with the lock held; SIGCONT continues both", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const wrapper = startWithInput("run", path, "--", ...counter);
    let pid = 0;
    try {
      pid = await readyPid(wrapper);
      wrapper.signal("SIGTSTP");
      await waitFor(
        () => /^T/.test(processState(wrapper.pid)),
        "runlock stopped",
        HANG_MS,
      );
      // runlock stops the command's group first, then itself; a stop takes
      // effect when the stopped process next runs, which on a loaded
      // machine can be after runlock's own.
      await waitFor(
        () => /^T/.test(processState(pid)),
        "the command stopped",
        HANG_MS,
      );
      assert.equal(cli("status", path).code, 0, "the lock is held");
      wrapper.signal("SIGCONT");
      await wrapper.line(/^got SIGCONT 1$/);
      assert.doesNotMatch(processState(pid), /^T/);
      assert.doesNotMatch(processState(wrapper.pid), /^T/);
    } finally {
      // A command left stopped would never read the end of its input: it
      // is runlock's child, and printed its own pid.
      if (pid) wrapper.signalChild(pid, "SIGKILL");
      await wrapper.kill();
      cleanup();
    }
  });

  test("while waiting for the lock, SIGWINCH, SIGCONT and SIGURG do not end the wait; SIGUSR2 ends it, runs nothing, exit 140", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const marker = join(dir, "ran");
    // Held by a plain pidfile of a live process (this one): no event can
    // tell of its end, so every look of the wait reads the file (a runlock
    // holder's are quick looks, which open nothing, between whole probes
    // 10 s apart).
    writeFileSync(path, `${process.pid}\n`);
    const reads = await Reads.watch(path, join(dir, "mark"));
    const waiter = start("run", "--wait", path, "--", "touch", marker);
    try {
      // Listening (run sets its signal listeners before it looks at the
      // lock), and waiting: it looked and found the lock held.
      await reads.reads(1);
      for (const s of ["SIGWINCH", "SIGCONT", "SIGURG"] as const) {
        waiter.signal(s);
      }
      // Each probe of the wait is a turn of runlock's event loop, which
      // dispatches the signals it got before: two probes that began after
      // the signals were sent mean that its listeners have seen them.
      await reads.reads(2, await reads.mark());
      assert.ok(waiter.running, "still waiting");
      waiter.signal("SIGUSR2");
      assert.deepEqual(await waiter.exited, { code: 140, signal: null });
      assert.equal(existsSync(marker), false, "the command never ran");
      assert.equal(cli("status", path).code, 0, "the holder is undisturbed");
    } finally {
      await reads.stop();
      await waiter.kill();
      cleanup();
    }
  });

  test("'--' also ends the options before the path, so a path may start with '-'", () => {
    const { dir, cleanup } = tempDir();
    try {
      const name = "-odd.lock";
      const free = cliIn(dir, "status", "--", name);
      assert.equal(free.code, 1, free.stderr);
      assert.equal(free.stdout, "free\n");
      const ran = cliIn(
        dir,
        "run",
        "--",
        name,
        "--",
        "sh",
        "-c",
        `head -n 1 ./${name}`,
      );
      assert.equal(ran.code, 0, ran.stderr);
      assert.match(ran.stdout, /^\d+\n$/, "the lock was at ./-odd.lock");
      assert.equal(cliIn(dir, "wait", "--", name).code, 0);
      assert.equal(cli("status", "--json", "--", join(dir, name)).code, 1);
      assert.deepEqual(readdirSync(dir), [], "released, nothing left");
    } finally {
      cleanup();
    }
  });

  test("a directory at the lock path: says it is a directory and to choose another path, never to remove it, and leaves it", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "state");
      mkdirSync(path);
      writeFileSync(join(path, "keep"), "data");
      const marker = join(dir, "ran");
      for (
        const args of [
          ["run", path, "--", "touch", marker],
          ["status", path],
          ["wait", path],
        ]
      ) {
        const r = cli(...args);
        assert.equal(r.code, 2, `${args[0]}: ${r.stderr}`);
        assert.match(r.stderr, /directory/, args[0]);
        assert.doesNotMatch(r.stderr, /remove|delete/i, args[0]);
      }
      assert.match(
        cli("run", path, "--", "true").stderr,
        /choose another path/i,
      );
      assert.equal(existsSync(marker), false);
      assert.equal(readFileSync(join(path, "keep"), "utf8"), "data");
    } finally {
      cleanup();
    }
  });

  test("a directory at the lock path gets one message, the same from status, run and wait, with or without a trailing '/', and with --json", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "state");
      mkdirSync(path);
      const marker = join(dir, "ran");
      const said = new Set<string>();
      for (
        const args of [
          ["status", path],
          ["status", `${path}/`],
          ["status", "--json", `${path}/`],
          ["run", path, "--", "touch", marker],
          ["run", `${path}/`, "--", "touch", marker],
          ["wait", `${path}/`],
        ]
      ) {
        const r = cli(...args);
        assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
        assert.equal(r.stdout, "", args.join(" "));
        said.add(r.stderr);
      }
      assert.deepEqual([...said], [
        `runlock: ${path}: is a directory, not a lock file; runlock leaves it as it is. Choose another path for the lock, such as ${path}/run.lock\n`,
      ]);
      assert.equal(existsSync(marker), false, "the command never ran");
      assert.deepEqual(readdirSync(path), [], "nothing made in it");
    } finally {
      cleanup();
    }
  });

  test("a lock path under /proc, or through a symlink into it (/dev/fd), is refused at once by run, status and wait: Node's recursive mkdir would loop there forever", () => {
    const { dir, cleanup } = tempDir();
    try {
      const marker = join(dir, "ran");
      for (
        const path of [
          `/proc/runlock-test-${process.pid}/run.lock`,
          `/dev/fd/runlock-test-${process.pid}/run.lock`,
          "/proc/self/run.lock",
        ]
      ) {
        for (
          const args of [
            ["run", path, "--", "touch", marker],
            ["status", path],
            ["wait", "--timeout=0", path],
          ]
        ) {
          // (A run that spins at 100% CPU, deaf to SIGTERM, would never
          // end: a SIGKILL through the handle ends it.)
          const r = spawnSync(cmd, [...pre, ...args], {
            encoding: "utf8",
            timeout: 20_000,
            killSignal: "SIGKILL",
          });
          const what = args.join(" ");
          assert.equal(r.signal, null, `${what}: still running after 20 s`);
          assert.equal(r.status, 2, `${what}: ${r.stdout}${r.stderr}`);
          assert.equal(r.stdout, "", what);
          assert.match(
            r.stderr,
            new RegExp(
              `^runlock: ${
                path.replace(/[.]/g, "\\.")
              }: is on /proc(, as /proc/[^ ]+)?, a virtual filesystem that holds no lock files: choose a lock path on a real filesystem\n$`,
            ),
            what,
          );
        }
      }
      assert.equal(existsSync(marker), false, "the command never ran");
    } finally {
      cleanup();
    }
  });

  test("a path that starts with '-' is refused before '--', as --help says: 'run -x.lock -- cmd' runs nothing and makes no lock", () => {
    const { dir, cleanup } = tempDir();
    try {
      for (
        const args of [
          ["run", "-x.lock", "--", "touch", "ran"],
          ["run", "--wait=1", "-x.lock", "--", "touch", "ran"],
          ["wait", "-x.lock"],
        ]
      ) {
        const r = cliIn(dir, ...args);
        assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
        assert.equal(r.stdout, "");
        assert.match(
          r.stderr,
          new RegExp(
            `^runlock: unknown option '-x\\.lock' \\(a path that starts with "-" goes after "--": runlock ${
              args[0]
            } -- -x\\.lock \\.\\.\\.\\)\n`,
          ),
        );
      }
      assert.deepEqual(readdirSync(dir), [], "no lock, and touch never ran");
    } finally {
      cleanup();
    }
  });

  test("messages read well when the record has no host: 'pid N since ...', 'as pid N; wait for it or stop it'", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = new Background([
      "python3",
      fixture("record_holder.py"),
      path,
    ]);
    try {
      await first.line(/^held$/);
      const status = cli("status", path);
      assert.equal(status.code, 0, status.stderr);
      assert.match(
        status.stdout,
        new RegExp(
          `^held by pid ${first.pid} since \\d\\d:\\d\\d:\\d\\d \\(\\d+s ago\\)\n$`,
        ),
      );
      assert.equal(JSON.parse(cli("status", "--json", path).stdout).host, "");
      const refused = cli("run", path, "--", "true");
      assert.equal(refused.code, 75);
      assert.match(
        refused.stderr,
        new RegExp(
          `another run is active as pid ${first.pid}; wait for it or stop it\n$`,
        ),
      );
      const waited = cli("wait", "--timeout=0.2", path);
      assert.equal(waited.code, 1);
      assert.match(
        waited.stderr,
        new RegExp(`is still held by pid ${first.pid} since `),
      );
      for (const text of [status.stdout, refused.stderr, waited.stderr]) {
        assert.doesNotMatch(text, / on [;(]| on $| on \n/m);
      }
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("a command killed by a signal makes runlock exit 128+signal; a missing command exits 127", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      assert.equal(
        cli("run", path, "--", "sh", "-c", "kill -KILL $$").code,
        137,
      );
      assert.equal(existsSync(path), false);
      const missing = cli("run", path, "--", join(dir, "no-such-command"));
      assert.equal(missing.code, 127);
      assert.match(missing.stderr, /cannot run/);
      assert.equal(existsSync(path), false);
    } finally {
      cleanup();
    }
  });
});

describe("runlock run: what the record says, and status shows", () => {
  test("records the command line as meta.cmd, quoted so that a shell reads back the same words, plus --meta fields; status prints them after the holder, --json has meta and where the pid lives", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    // (Short enough for the 200 characters, after sh -c and the loop.)
    const odd = [
      "it's $HOME",
      "a\nb",
      "t\tx",
      "q' b\\s \x01",
      "\u2028\x85",
      "",
      "*",
      "ï ✓",
    ];
    const wrapper = await running(path, done, [
      "--meta",
      "job.id=42",
      "--meta=note=nightly full sync",
    ], ["0", ...odd]);
    try {
      const info = JSON.parse(cli("status", "--json", path).stdout);
      const cmd: string = info.meta.cmd;
      assert.deepEqual(
        bashWords(cmd),
        ["sh", "-c", UNTIL_DONE, "sh", done, "0", ...odd],
        `a shell reads ${cmd} back as the command's words`,
      );
      assert.doesNotMatch(cmd, /\n/, "one line");
      assert.deepEqual(info.meta, {
        cmd,
        "job.id": "42",
        note: "nightly full sync",
      });
      assert.equal(info.pid, wrapper.pid);
      assert.match(info.bootId, /^[0-9a-f-]{36}$/, "Linux boot id");
      assert.match(info.pidNamespace, /^\d+$/);
      assert.equal(info.pidValidHere, true);
      assert.equal(info.pidElsewhere, null);

      const r = cli("status", path);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stderr, "", "no warning for a pid that means us");
      const since = "since \\d\\d:\\d\\d:\\d\\d \\(\\d+s ago\\)";
      assert.match(
        r.stdout,
        new RegExp(
          `^held by pid ${wrapper.pid} on ${hostname()} ${since}: sh -c `,
        ),
      );
      assert.equal(
        r.stdout.slice(r.stdout.indexOf(": sh -c ") + 2),
        `${cmd}\n  job.id=42\n  note=nightly full sync\n`,
      );
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 0, wrapper.stderr());
    } finally {
      writeFileSync(done, ""); // the command ends (run's SIGKILL would not end it)
      await wrapper.kill();
      cleanup();
    }
  });

  test("a long command line is cut to 200 characters, ending in '…'; status shows it cut", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const wrapper = await running(path, done, [], ["0", "x".repeat(300)]);
    try {
      const { meta } = JSON.parse(cli("status", "--json", path).stdout);
      assert.equal([...meta.cmd].length, 200);
      assert.ok(meta.cmd.endsWith("xxx…"), meta.cmd);
      assert.ok(meta.cmd.startsWith("sh -c 'echo ready;"), meta.cmd);
      assert.ok(cli("status", path).stdout.endsWith("xxx…\n"));
    } finally {
      writeFileSync(done, "");
      await wrapper.kill();
      cleanup();
    }
  });

  test("--no-cmd keeps the command line (and a secret in its arguments) out of the lock file; --meta cmd=... records a text of your own instead", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const secret = "--token=s3cr3t-never-in-the-record";
    for (
      const [options, meta] of [
        [["--no-cmd", "--meta", "job=7"], { job: "7" }],
        [["--meta", "cmd=./deploy.sh (token elided)"], {
          cmd: "./deploy.sh (token elided)",
        }],
      ] as [string[], Record<string, string>][]
    ) {
      const wrapper = await running(path, done, options, ["0", secret]);
      try {
        const file = readFileSync(path, "utf8");
        assert.doesNotMatch(file, /s3cr3t/, file);
        assert.doesNotMatch(file, /while \[/, "no part of the command line");
        assert.deepEqual(
          JSON.parse(cli("status", "--json", path).stdout).meta,
          meta,
        );
        const line = cli("status", path).stdout.split("\n")[0];
        if (meta.cmd) assert.ok(line.endsWith(`: ${meta.cmd}`), line);
        else assert.match(line, /ago\)$/, "nothing after the holder");
        writeFileSync(done, "");
        assert.equal((await wrapper.exited).code, 0, wrapper.stderr());
        unlinkSync(done);
      } finally {
        if (!existsSync(done)) writeFileSync(done, "");
        await wrapper.kill();
        unlinkSync(done);
      }
    }
    cleanup();
  });

  test("a bad --meta is a usage error naming the key, before anything touches the disk: no directory, no lock file, the command never runs", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "sub", "run.lock");
      const marker = join(dir, "ran");
      for (
        const [meta, message] of [
          ["Job=1", /the key 'Job' must be 1 to 64 of a-z 0-9 _ \. -/],
          [`${"k".repeat(65)}=1`, /the key 'k{65}' must be/],
          ["job", /'--meta' takes KEY=VALUE: current value is 'job'/],
          ["=1", /the key '' must be/],
          ["note=two\nlines", /the value of 'note' must be one line/],
          ["note=a\u2028b", /the value of 'note' must be one line/],
          ["note=bell\x07", /without control characters/],
          ["__proto__=x", /the key '__proto__' is reserved/],
        ] as [string, RegExp][]
      ) {
        const r = cli("run", "--meta", meta, path, "--", "touch", marker);
        assert.equal(r.code, 2, meta);
        assert.match(r.stderr, message);
        assert.match(r.stderr, /usage:/);
        assert.equal(r.stdout, "");
      }
      // The 4 KiB is the whole record's, runlock's own lines (pid, host,
      // start, the command's pid, the command line) with the meta: the
      // message says so, and by how many bytes to shorten.
      const big = cli(
        "run",
        `--meta=k=${"v".repeat(4060)}`,
        path,
        "--",
        "touch",
        marker,
      );
      assert.equal(big.code, 2, big.stderr);
      const over = big.stderr.match(
        /over 4096 \(runlock's own lines take (\d+)\): shorten meta\.k by (\d+) bytes\n/,
      );
      assert.ok(over, big.stderr);
      assert.ok(Number(over[1]) > 50, `runlock's lines: ${over[1]}`);
      const fits = cli(
        "run",
        `--meta=k=${"v".repeat(4060 - Number(over[2]))}`,
        path,
        "--",
        "touch",
        marker,
      );
      assert.equal(fits.code, 0, `shortened as said: ${fits.stderr}`);
      // Counted in bytes: 1,400 CJK characters are 4,200 bytes of UTF-8,
      // more than 1,500 ASCII ones.
      const wide = cli(
        "run",
        `--meta=a=${"x".repeat(1500)}`,
        `--meta=b=${"日".repeat(1400)}`,
        path,
        "--",
        "touch",
        marker,
      );
      assert.match(wide.stderr, /: shorten meta\.b by \d+ bytes\n/);
      const spread = cli(
        "run",
        ...Array.from(
          { length: 40 },
          (_, k) => `--meta=k${k}=${"x".repeat(110)}`,
        ),
        path,
        "--",
        "touch",
        marker,
      );
      assert.match(
        spread.stderr,
        /: shorten the meta by \d+ bytes \(meta\.k\d+ is the longest\)\n/,
      );
      rmSync(join(dir, "sub"), { recursive: true });
      rmSync(marker);
      const twice = cli("run", "--meta=a=1", "--meta=a=2", path, "--", "true");
      assert.equal(twice.code, 2);
      assert.match(twice.stderr, /the key 'a' is given twice/);
      assert.deepEqual(readdirSync(dir), [], "nothing created");
    } finally {
      cleanup();
    }
  });
});

describe("runlock status: where the pid lives", () => {
  test(
    "a holder in another PID namespace: status and ls warn on stderr that `kill 1` here would hit another process; --json says pidValidHere false, namespace",
    {
      skip: canUnshare ? false : "needs root and unshare(1) --pid",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const done = join(dir, "done");
      // The holder is runlock run itself, as PID 1 of a new PID namespace
      // (a container's view), sharing the lock directory with us.
      const wrapper = new Background([
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        ...cliCommand(),
        "run",
        path,
        "--",
        "sh",
        "-c",
        UNTIL_DONE,
        "sh",
        done,
      ]);
      try {
        await wrapper.line(/^ready$/);
        const warning =
          "runlock: pid 1 belongs to another PID namespace (a container): `kill 1` here would hit another process\n";
        const r = cli("status", path);
        assert.equal(r.code, 0, r.stderr);
        assert.match(r.stdout, /^held by pid 1 on .*: sh -c 'echo ready;/);
        assert.equal(r.stderr, warning);
        const info = JSON.parse(cli("status", "--json", path).stdout);
        assert.equal(info.pid, 1);
        assert.equal(info.pidValidHere, false);
        assert.equal(info.pidElsewhere, "namespace");
        const listed = cli("ls", dir);
        assert.equal(listed.code, 0);
        assert.match(listed.stdout, /^held {2}1 {2}/);
        assert.equal(listed.stderr, `runlock: ${path}: ${warning.slice(9)}`);
        writeFileSync(done, "");
        assert.equal((await wrapper.exited).code, 0, wrapper.stderr());
        assert.equal(existsSync(path), false, "released from inside");
      } finally {
        await wrapper.kill();
        cleanup();
      }
    },
  );

  test("a live holder under another kernel boot, or on another host: status warns that `kill N` here would hit another process; the same boot and namespace get no warning, nor does a stale record", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const here = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
    const ns = String(statSync("/proc/self/ns/pid").ino); // ours
    const started = `started=${new Date().toISOString()}`;
    /** status, status --json, and what ls says, with a forged live holder. */
    const withHolder = async (...fields: string[]) => {
      const forged = new Background([
        "python3",
        fixture("forged_holder.py"),
        path,
        ...fields,
      ]);
      try {
        await forged.line(/^held$/);
        const text = cli("status", path);
        assert.equal(text.code, 0, text.stderr);
        const json = JSON.parse(cli("status", "--json", path).stdout);
        const listed = cli("ls", dir);
        return { pid: forged.pid, text, json, listed };
      } finally {
        await forged.kill();
        unlinkSync(path); // its file, stale now, would block the next one
      }
    };
    try {
      const boot = await withHolder(
        `host=${hostname()}`,
        started,
        "boot=00000000-0000-4000-8000-000000000000",
        `pidns=${ns}`,
        "meta.cmd=./sync.sh",
      );
      assert.match(boot.text.stdout, /: \.\/sync\.sh\n$/);
      const bootWarning =
        `pid ${boot.pid} was recorded under another boot of a kernel (another machine sharing this file, or an earlier boot of this one): \`kill ${boot.pid}\` here would hit another process`;
      assert.equal(boot.text.stderr, `runlock: ${bootWarning}\n`);
      assert.equal(boot.json.pidValidHere, false);
      assert.equal(boot.json.pidElsewhere, "boot");
      assert.equal(boot.listed.stderr, `runlock: ${path}: ${bootWarning}\n`);

      // A record without boot id or namespace (a Deno holder without
      // --allow-all): the host name decides.
      const host = await withHolder("host=build-elsewhere-7", started);
      assert.equal(
        host.text.stderr,
        `runlock: pid ${host.pid} is a process on build-elsewhere-7, not on this host (another machine, or a container with a host name of its own): \`kill ${host.pid}\` here would hit another process\n`,
      );
      assert.equal(host.json.pidElsewhere, "host");

      const same = await withHolder(
        `host=${hostname()}`,
        started,
        `boot=${here}`,
        `pidns=${ns}`,
      );
      assert.equal(same.text.stderr, "", "same boot and namespace");
      assert.equal(same.json.pidValidHere, true);
      assert.equal(same.listed.stderr, "");

      // Only a live holder's number means anything: a stale record gets no
      // verdict (its namespace may be gone, its inode number reused).
      record(path, deadPid(), {
        host: "build-elsewhere-7",
        boot: "00000000-0000-4000-8000-000000000000",
      });
      const stale = cli("status", path);
      assert.equal(stale.code, 1);
      assert.equal(stale.stderr, "");
      assert.equal(
        JSON.parse(cli("status", "--json", path).stdout).pidValidHere,
        null,
      );
    } finally {
      cleanup();
    }
  });
});

describe("runlock ls", () => {
  test("one line per lock, sorted by path: state, pid, host, age, command, path; plain files and pidfiles are not locks; --recursive walks the tree; exit 0", async () => {
    const { dir, cleanup } = tempDir();
    const done = join(dir, "done-flag");
    const sync = join(dir, "sync.lock");
    const wrapper = await running(sync, done, ["--meta", "job=1"]);
    try {
      const gone = deadPid();
      record(join(dir, "gc.lock"), gone, {
        host: "build-7",
        started: new Date(Date.now() - 3 * 3600_000).toISOString(),
        "meta.cmd": "./gc.sh --all",
      });
      writeFileSync(join(dir, "notes.txt"), "not a lock\n");
      writeFileSync(join(dir, "plain.pid"), `${gone}\n`);
      mkdirSync(join(dir, "sub"));
      record(join(dir, "sub", "deep.lock"), gone, {});

      const r = cli("ls", dir);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stderr, "", "a stale record's pid gets no verdict");
      const lines = r.stdout.split("\n").slice(0, -1);
      assert.equal(lines.length, 2, r.stdout);
      const cols = lines.map((l) => l.split(/ {2,}/));
      assert.deepEqual(cols[0], [
        "stale",
        String(gone),
        "build-7",
        "3h ago",
        "./gc.sh --all",
        join(dir, "gc.lock"),
      ]);
      assert.equal(cols[1][0], "held");
      assert.equal(cols[1][1], String(wrapper.pid));
      assert.equal(cols[1][2], hostname());
      assert.match(cols[1][3], /^\d+s ago$/);
      assert.match(cols[1][4], /^sh -c 'echo ready;/);
      assert.equal(cols[1][5], sync);
      assert.equal(
        lines[0].indexOf(join(dir, "gc.lock")),
        lines[1].indexOf(sync),
        "the path column is aligned",
      );

      const deep = cli("ls", "--recursive", dir).stdout.split("\n");
      assert.equal(deep.length, 4);
      assert.deepEqual(deep[1].split(/ {2,}/), [
        "stale",
        String(gone),
        "-",
        "-",
        "-",
        join(dir, "sub", "deep.lock"),
      ], "a record without host, start or command");

      const j = cli("ls", "--json", "--recursive", dir);
      assert.equal(j.code, 0);
      const all = JSON.parse(j.stdout);
      assert.deepEqual(
        all.map((i: { path: string; state: string }) => [i.path, i.state]),
        [
          [join(dir, "gc.lock"), "stale"],
          [join(dir, "sub", "deep.lock"), "stale"],
          [sync, "held"],
        ],
      );
      assert.equal(all[2].meta.job, "1");
      assert.match(all[0].started, /^\d{4}-\d\d-\d\dT.*Z$/);
      assert.equal(all[2].pidValidHere, true);
    } finally {
      writeFileSync(done, "");
      await wrapper.kill();
      cleanup();
    }
  });

  test("a name, host or command holding control characters (ESC, BEL, a newline, a tab, NEL, U+202E) is shown quoted as bash's $'...' (\\x1b, \\n, \\t, \\u0085, a backslash \\\\): one line per lock, no escape sequence reaches the terminal, the columns as wide as they show, a path that bash reads back as the file's; --json keeps them exact", async () => {
    const { dir, cleanup } = tempDir();
    const name = "a\x1b]0;PWNED\x07b\nc.lock";
    const first = await holder(join(dir, name));
    try {
      const gone = deadPid();
      record(join(dir, "gc.lock"), gone, {
        host: "h\x1b[2Jx",
        "meta.cmd": "c\x1b[Hd\te",
      });
      // A backslash and an x, a C1 control (NEL), a right-to-left override.
      record(join(dir, "z\\x1b\u0085\u202e.lock"), gone, {});
      const r = cli("ls", dir);
      assert.equal(r.code, 0, r.stderr);
      const lines = r.stdout.split("\n").slice(0, -1);
      assert.equal(lines.length, 3, r.stdout);
      for (const line of lines) {
        // deno-lint-ignore no-control-regex -- control characters are the point
        assert.doesNotMatch(line, /[\x00-\x1f\x7f]/);
      }
      const cols = lines.map((l) => l.split(/ {2,}/));
      assert.equal(cols[0][0], "held");
      assert.equal(cols[0][1], String(first.pid));
      assert.equal(
        cols[0][5],
        `$'${join(dir, "a\\x1b]0;PWNED\\x07b\\nc.lock")}'`,
      );
      assert.deepEqual(bashWords(cols[0][5]), [join(dir, name)]);
      assert.deepEqual(cols[1], [
        "stale",
        String(gone),
        "$'h\\x1b[2Jx'",
        "-",
        "$'c\\x1b[Hd\\te'",
        join(dir, "gc.lock"),
      ]);
      assert.equal(
        cols[2][5],
        `$'${join(dir, "z\\\\x1b\\u0085\\u202e.lock")}'`,
      );
      assert.deepEqual(bashWords(cols[2][5]), [
        join(dir, "z\\x1b\u0085\u202e.lock"),
      ]);
      for (const column of [3, 5]) {
        assert.equal(
          lines[0].indexOf(cols[0][column]),
          lines[1].indexOf(cols[1][column]),
          `column ${column} is aligned`,
        );
      }
      const all = JSON.parse(cli("ls", "--json", dir).stdout);
      assert.deepEqual(
        all.map((i: { path: string; host: string }) => [i.path, i.host]),
        [
          [join(dir, name), hostname()],
          [join(dir, "gc.lock"), "h\x1b[2Jx"],
          [join(dir, "z\\x1b\u0085\u202e.lock"), ""],
        ],
      );
      assert.equal(all[1].meta.cmd, "c\x1b[Hd\te");
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test("an empty directory lists nothing, saying so on stderr; a missing one is an error, exit 2; a file is an error, exit 2", () => {
    const { dir, cleanup } = tempDir();
    try {
      assert.deepEqual(cli("ls", dir), {
        code: 0,
        stdout: "",
        stderr: `runlock: ls: no locks in ${dir}\n`,
      });
      const missing = join(dir, "nope");
      assert.equal(cli("ls", missing).code, 2);
      assert.equal(cli("ls", "--json", missing).code, 2);
      const file = join(dir, "file");
      writeFileSync(file, "");
      const f = cli("ls", file);
      assert.equal(f.code, 2);
      assert.equal(f.stderr, `runlock: ls: ${file} is not a directory\n`);
    } finally {
      cleanup();
    }
  });
});

describe("runlock run: a lock lost while the command runs", () => {
  test("the lock file deleted by hand: run says so on stderr at once (the delay is measured), the command keeps running, and its exit code comes through", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const wrapper = await running(path, done, [], ["4"]);
    try {
      const before = performance.now();
      unlinkSync(path);
      await wrapper.stderrMatch(/lost the lock/);
      const ms = performance.now() - before;
      console.log(
        `run (${cliRuntime}) said the lock was lost ${
          ms.toFixed(1)
        } ms after the lock file was deleted`,
      );
      assert.match(
        wrapper.stderr(),
        new RegExp(
          `^runlock: lost the lock while the command runs: ${path}: the lock file was deleted while pid ${wrapper.pid} held it; .*The command keeps running, without the lock \\(--on-lost=term would stop it\\)\n$`,
        ),
      );
      assert.equal(cli("status", path).stdout, "free\n");
      // The command ends only now, when told to: its code coming through
      // means that run went on after the loss, and did not stop it.
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 4, "the command's code");
      assert.equal(
        wrapper.stderr().match(/lost the lock/g)?.length,
        1,
        "said once, not again at release",
      );
      assert.equal(existsSync(path), false, "nothing recreated");
    } finally {
      writeFileSync(done, "");
      await wrapper.kill();
      cleanup();
    }
  });

  test("--on-lost=term: the lock file replaced by another run's sends SIGTERM to the command's group, naming the new holder; release leaves the successor's file alone", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const script =
      'trap "echo got TERM; exit 9" TERM; echo ready; while :; do sleep 0.05; done';
    const wrapper = start(
      "run",
      "--on-lost=term",
      path,
      "--",
      "sh",
      "-c",
      script,
    );
    // Another run's lock, moved over ours in one rename (a replacement).
    const other = join(dir, "other.lock");
    const successor = await holder(other);
    try {
      await wrapper.line(/^ready$/);
      const before = performance.now();
      renameSync(other, path);
      await wrapper.line(/^got TERM$/);
      const ms = performance.now() - before;
      console.log(
        `run --on-lost=term (${cliRuntime}) signalled the command ${
          ms.toFixed(1)
        } ms after the lock file was replaced`,
      );
      assert.equal((await wrapper.exited).code, 9, wrapper.stderr());
      // Who holds it now: the CLI runs with every permission under Deno,
      // whose open of the new file then cannot block either (libc's, with
      // O_NONBLOCK).
      const now = ` \\(now held by pid ${successor.pid}[^)]*\\)`;
      assert.match(
        wrapper.stderr().split("\n")[0],
        new RegExp(
          `^runlock: lost the lock while the command runs: ${path}: the lock file was replaced by another file${now} while pid ${wrapper.pid} held it; .*Sending SIGTERM to the command \\(--on-lost=term\\)$`,
        ),
      );
      assert.equal(
        readFileSync(path, "utf8").split("\n")[0],
        String(successor.pid),
        "the successor's file is still there",
      );
      assert.equal(cli("status", path).code, 0);
    } finally {
      await wrapper.kill();
      await successor.kill();
      cleanup();
    }
  });
});

const hasStrace = spawnSync("sh", ["-c", "command -v strace"]).status === 0;

describe("runlock run: a replacement that lands while run looks at its lock", () => {
  test(
    "--on-lost=term: the lock file replaced while run's read of the lock's path waits (strace holds it) is reported as replaced, never as its directory moved away",
    { skip: hasStrace ? false : "needs strace(1)" },
    async () => {
      // A descriptor-pinned lock (Node, Bun) reads its file twice when it
      // checks: through the pinned directory and by the path as named. A rename
      // landing between the two reads must not read as "moved away from its
      // path" (it can happen under load). strace delays each read of the path
      // as named (-P: that path only, whatever its position among the calls)
      // until the test has renamed: the order of the two reads decides the
      // message. (Deno pins by the canonical path, this same path: its one read
      // is the one held.)
      const { dir, cleanup } = tempDir();
      const real = realpathSync(dir);
      const path = join(real, "run.lock");
      const done = join(real, "done");
      const log = join(real, "strace.log");
      const other = join(real, "other.lock");
      const successor = await holder(other);
      const script =
        'trap "echo got TERM; exit 9" TERM; echo ready; while [ ! -e "$1" ]; do sleep 0.05; done';
      const stats = "statx,newfstatat,lstat,stat";
      const wrapper = new Background([
        "strace",
        "-f",
        "-qq",
        "-o",
        log,
        "-P",
        path,
        "-e",
        `trace=${stats}`,
        "-e",
        `inject=${stats}:delay_enter=3000000`,
        ...cliCommand(),
        "run",
        "--on-lost=term",
        path,
        "--",
        "sh",
        "-c",
        script,
        "sh",
        done,
      ]);
      try {
        await wrapper.line(/^ready$/);
        // strace writes a call's start when it enters it: the last line,
        // unfinished, is the read of the path held now.
        // How soon run's check comes depends on the machine's load, not on
        // runlock: the limit only detects a hang.
        await waitFor(
          () => {
            const last = readFileSync(log, "utf8").split("\n").filter(Boolean)
              .at(-1) ?? "";
            return last.includes(`"${path}"`) && !last.includes(" = ");
          },
          "a read of the lock's path held by strace",
          HANG_MS,
        );
        renameSync(other, path);
        await wrapper.line(/^got TERM$/);
        assert.equal((await wrapper.exited).code, 9, wrapper.stderr());
        assert.match(
          wrapper.stderr().split("\n")[0],
          new RegExp(
            `^runlock: lost the lock while the command runs: ${path}: the lock file was replaced by another file[ (]`,
          ),
        );
      } finally {
        writeFileSync(done, "");
        await wrapper.kill();
        await successor.kill();
        cleanup();
      }
    },
  );
});

describe("runlock wait", () => {
  test("returns 0 at once when free, 1 on timeout while held (saying on stderr who holds it), 0 once the holder releases", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      assert.equal(cli("wait", path).code, 0);
      const first = await holder(path);
      const timedOut = cli("wait", "--timeout=0.3", path);
      assert.equal(timedOut.code, 1);
      assert.equal(timedOut.stdout, "");
      assert.match(
        timedOut.stderr,
        new RegExp(
          `^runlock: timed out after 0\\.3s: .*run\\.lock is still held by pid ${first.pid} on ${hostname()} since `,
        ),
      );
      assert.equal(
        timedOut.stderr.split("\n").length,
        2,
        "one line, and no waiting line: stderr is not a terminal",
      );
      for (const text of ["\r", "\x1b", "waiting"]) {
        assert.ok(!timedOut.stderr.includes(text), JSON.stringify(text));
      }
      const reads = await Reads.watch(path, join(dir, "mark"));
      const waiter = start("wait", "--timeout=30", path);
      // Two looks, each finding it held: a waiting line, were there one,
      // would be drawn after the first.
      await reads.reads(2);
      first.send("release");
      await first.expect("released");
      assert.equal((await waiter.exited).code, 0);
      assert.equal(waiter.stderr(), "", "nothing while waiting");
      await reads.stop();
      await first.kill();
    } finally {
      cleanup();
    }
  });

  test("a crashed holder's lock counts as not held", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      const first = await holder(path);
      await first.kill("SIGKILL");
      assert.equal(cli("wait", "--timeout=5", path).code, 0);
    } finally {
      cleanup();
    }
  });
});

describe("runlock installed for Deno", () => {
  test(
    "'deno install -g --name runlock' of src/cli.ts, with the permissions the docs give, makes a runlock command: status answers, run records the host; with --allow-net, --db finds its client",
    { skip: cliRuntime !== "deno" && "deno install: Deno only" },
    () => {
      const { dir, cleanup } = tempDir();
      try {
        const root = join(dir, "root");
        const install = (...extra: string[]) => {
          const r = spawnSync(process.execPath, [
            "install",
            "-g",
            "-f",
            "--root",
            root,
            "--name",
            "runlock",
            ...INSTALL_FLAGS,
            ...extra,
            CLI_SOURCE,
          ], { encoding: "utf8" });
          assert.equal(r.status, 0, r.stderr);
        };
        // The installed script runs `deno` from PATH: this test's.
        const env = {
          ...process.env,
          PATH: `${dirname(process.execPath)}:${process.env.PATH}`,
        };
        const runlock = (...args: string[]) =>
          spawnSync(join(root, "bin", "runlock"), args, {
            encoding: "utf8",
            env,
            cwd: dir,
          });
        install();
        const free = runlock("status", "run.lock");
        assert.equal(free.status, 1, free.stderr);
        assert.equal(free.stdout, "free\n");
        const ran = runlock("run", "run.lock", "--", "cat", "run.lock");
        assert.equal(ran.status, 0, ran.stderr);
        assert.match(ran.stdout, /^\d+\nrunlock 1\n/);
        assert.match(ran.stdout, new RegExp(`^host=${hostname()}$`, "m"));
        assert.equal(runlock("status", "run.lock").stdout, "free\n");
        // With --db: no server needed to see that the client loads (port 1
        // refuses at once).
        install("--allow-net=127.0.0.1:1");
        const db = runlock("status", "--db=postgres://u@127.0.0.1:1/db", "x");
        assert.equal(db.status, 2);
        assert.match(db.stderr, /cannot connect to PostgreSQL .*refused/);
      } finally {
        cleanup();
      }
    },
  );
});

describe("usage", () => {
  test("--help and --version print to stdout and exit 0", () => {
    const help = cli("--help");
    assert.equal(help.code, 0);
    assert.match(
      help.stdout,
      /runlock status \[--json\] \[--db=URL \[--schema=NAME\]\] \[--\] <path\|name>/,
    );
    const version = cli("--version");
    assert.equal(version.code, 0);
    assert.match(version.stdout, /^runlock \d+\.\d+\.\d+\n$/);
  });

  test("the version is the package's", () => {
    const { dir, cleanup } = tempDir();
    try {
      // deno.json under Deno; the installed package.json under Node and Bun.
      const candidates = [
        new URL("../../deno.json", import.meta.url),
        new URL("../../node_modules/runlock/package.json", import.meta.url),
      ];
      const file = candidates.find((u) => existsSync(u));
      assert.ok(file, "a manifest to compare with");
      const { version } = JSON.parse(readFileSync(file, "utf8"));
      assert.equal(cli("--version").stdout, `runlock ${version}\n`);
      mkdirSync(join(dir, "x"));
    } finally {
      cleanup();
    }
  });

  const bad: [string, string[], RegExp][] = [
    ["no command", [], /missing command/],
    ["an unknown command", ["stat", "x"], /unknown command 'stat'/],
    [
      "an option before the command",
      ["--db=postgres://u:pw@h/d", "status", "k"],
      /'--db' is an option: write it after the command, as in 'runlock status --db=\.\.\. \.\.\.'\n/,
    ],
    [
      "an unknown option and no command",
      ["--jsn"],
      /'--jsn' is an option: write it after the command\n/,
    ],
    ["an unknown option", ["status", "--jsn", "x"], /unknown option '--jsn'/],
    ["a missing path", ["status"], /status: missing <path>/],
    ["an extra argument", ["status", "a", "b"], /unexpected argument 'b'/],
    ["run without --", ["run", "x", "true"], /missing '--'/],
    [
      "--wait with its seconds after a space",
      ["run", "--wait", "5", "x", "--", "true"],
      /'--wait 5' waits without a time limit .* write --wait=5/,
    ],
    [
      "--timeout with its seconds after a space",
      ["wait", "--timeout", "2", "x"],
      /write --timeout=2/,
    ],
    [
      "run with '--' and no path",
      ["run", "--", "--", "true"],
      /missing <path>/,
    ],
    ["run without a command", ["run", "x", "--"], /missing <command>/],
    [
      "a bad --wait",
      ["run", "--wait=soon", "x", "--", "true"],
      /'--wait' must be a non-negative number/,
    ],
    ["a bad --conflict-exit-code", [
      "run",
      "--conflict-exit-code=300",
      "x",
      "--",
      "true",
    ], /from 0 to 255/],
    [
      "a bad --timeout",
      ["wait", "--timeout=-1", "x"],
      /'--timeout' must be a non-negative number/,
    ],
    ["--timeout without a value", ["wait", "--timeout", "x"], /needs a value/],
    [
      "a bad --on-lost",
      ["run", "--on-lost=kill", "x", "--", "true"],
      /'--on-lost' must be 'warn' or 'term': current value is 'kill'/,
    ],
    ["--meta without KEY=VALUE", ["run", "--meta"], /needs KEY=VALUE/],
    ["an empty --db", ["status", "--db=", "x"], /'--db' needs a URL/],
    [
      "--db with a URL that is not postgres://",
      ["status", "--db=mysql://u:pw@db/x", "x"],
      /--db must be a postgres:\/\/ URL, e\.g\. postgres:\/\/user@host\/db\n/,
    ],
    [
      "a single-dash unknown option, which is no lock path",
      ["status", "-j"],
      /unknown option '-j'/,
    ],
    [
      "a single-dash unknown option before the path",
      ["status", "-j", "x.lock"],
      /unknown option '-j'/,
    ],
    ["a single-dash option of ls", ["ls", "-r", "."], /unknown option '-r'/],
    ["ls without a directory", ["ls"], /ls: missing <dir>/],
  ];
  for (const [name, args, message] of bad) {
    test(`${name}: a short message and the usage on stderr, nothing on stdout, exit 2`, () => {
      const r = cli(...args);
      assert.equal(r.code, 2);
      assert.equal(r.stdout, "");
      assert.match(r.stderr, message);
      assert.match(r.stderr, /usage:/);
      assert.doesNotMatch(r.stderr, /pw@/, "a password is never printed");
    });
  }

  test("'COMMAND --help' (or -h, or 'help COMMAND') prints that command's usage and help on stdout, exit 0; after run's '--' it is the command's", () => {
    const says: Record<string, RegExp> = {
      status: /Print who holds the lock/,
      run: /Take the lock, run the command/,
      wait: /Wait until no live run holds the lock/,
      ls: /One line per lock file in <dir>/,
      "db-setup": /Print the SQL that creates/,
    };
    for (
      const args of [
        ["status", "--help"],
        ["run", "--help"],
        ["wait", "--help"],
        ["ls", "--help"],
        ["db-setup", "--help"],
        ["status", "-h"],
        ["status", "--json", "--help"],
        ["help", "run"],
      ]
    ) {
      const name = args[0] === "help" ? args[1] : args[0];
      const r = cli(...args);
      const what = args.join(" ");
      assert.equal(r.code, 0, `${what}: ${r.stderr}`);
      assert.equal(r.stderr, "", what);
      assert.match(r.stdout, new RegExp(`^usage:\\n  runlock ${name} `), what);
      assert.match(r.stdout, says[name], what);
      assert.doesNotMatch(
        r.stdout,
        /^commands:/m,
        `${what}: not all of --help`,
      );
    }
    const { dir, cleanup } = tempDir();
    try {
      const r = cli(
        "run",
        join(dir, "run.lock"),
        "--",
        "sh",
        "-c",
        'printf "%s\\n" "$1"',
        "sh",
        "--help",
      );
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stdout, "--help\n", "the command got --help");
    } finally {
      cleanup();
    }
  });

  test("'help' of an unknown command is the usage error 'runlock nosuch' gives, exit 2, not the general help", () => {
    const r = cli("help", "nosuch");
    assert.equal(r.code, 2, r.stdout + r.stderr);
    assert.equal(r.stdout, "");
    assert.match(r.stderr, /unknown command 'nosuch'/);
  });

  test("--help describes every command and option, the PostgreSQL form and the exit codes", () => {
    // (Lines wrapped anywhere: compare with the spaces collapsed.)
    const help = cli("--help").stdout.replace(/\s+/g, " ");
    for (
      const text of [
        "runlock ls [--json] [--recursive] [--] <dir>",
        "--meta KEY=VALUE",
        "--no-cmd",
        "--on-lost=warn|term",
        "--db=URL",
        "RUNLOCK_DATABASE_URL",
        "another PID namespace",
        "world-readable",
        "75 held by",
        "(\\x1b is ESC)",
      ]
    ) {
      assert.ok(help.includes(text), text);
    }
  });
});
