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
  writeFileSync,
} from "node:fs";
import { constants, hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import {
  Background,
  cli,
  cliCommand,
  cliRuntime,
  fixture,
  killQuietly,
  processState,
  start,
} from "./_cli.ts";
import { delay, holder, processExists, runtime, tempDir } from "./_helpers.ts";

const [cmd, ...pre] = cliCommand();

/** A command that counts the signals it gets (tests/fixtures/tty_child.py). */
const counter = ["python3", fixture("tty_child.py")];

/** How long to wait for a second copy of a signal that must not come. */
const SETTLE = 500;

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

async function until(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !condition(); i++) await delay(25);
  assert.ok(condition(), "timed out");
}

/** The CLI run in `cwd`. */
function cliIn(cwd: string, ...args: string[]) {
  const r = spawnSync(cmd, [...pre, ...args], { cwd, encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

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
    try {
      const waiter = start("run", "--wait", path, "--", "touch", marker);
      await delay(400);
      assert.equal(existsSync(marker), false, "still waiting");
      first.send("release");
      await first.expect("released");
      const { code } = await waiter.exited;
      assert.equal(code, 0, waiter.stderr());
      assert.ok(existsSync(marker));
    } finally {
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
    const wrapper = start("run", path, "--", ...counter);
    let pid = 0;
    try {
      pid = await readyPid(wrapper);
      for (const s of FORWARDED) {
        wrapper.signal(s);
        await wrapper.line(new RegExp(`^got ${s} 1$`));
      }
      await delay(SETTLE);
      for (const s of FORWARDED) {
        assert.equal(wrapper.count(new RegExp(`^got ${s} `)), 1, s);
      }
      const status = cli("status", path);
      assert.equal(status.code, 0, status.stdout);
      assert.match(status.stdout, new RegExp(`^held by pid ${wrapper.pid} `));
      if (cliRuntime === "node") {
        // Node opens its inspector on SIGUSR1 unless a listener takes it.
        // (Deno >= 2.9.2 opens its own on SIGUSR1 whatever the program
        // does; the README says so.)
        assert.doesNotMatch(wrapper.stderr(), /Debugger listening/);
      }
      process.kill(pid, "SIGKILL");
      assert.equal((await wrapper.exited).code, 137);
      assert.equal(existsSync(path), false, "released");
    } finally {
      if (pid) killQuietly(pid);
      await wrapper.kill();
      cleanup();
    }
  });

  test("lives until the command exits: a command that ignores SIGTERM keeps running under the lock, and its exit code comes through", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const done = join(dir, "done");
    const script =
      `trap "" TERM; echo ready; while [ ! -e "$1" ]; do sleep 0.05; done; exit 6`;
    const wrapper = start("run", path, "--", "sh", "-c", script, "sh", done);
    try {
      await wrapper.line(/^ready$/);
      wrapper.signal("SIGTERM");
      await delay(SETTLE);
      assert.ok(processExists(wrapper.pid), "runlock is still running");
      assert.equal(cli("status", path).code, 0, "and still holds the lock");
      writeFileSync(done, "");
      assert.equal((await wrapper.exited).code, 6, wrapper.stderr());
      assert.equal(existsSync(path), false, "released");
    } finally {
      await wrapper.kill();
      cleanup();
    }
  });

  test("SIGTSTP to runlock stops the command, then runlock, with the lock held; SIGCONT continues both", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const wrapper = start("run", path, "--", ...counter);
    let pid = 0;
    try {
      pid = await readyPid(wrapper);
      wrapper.signal("SIGTSTP");
      await until(() => /^T/.test(processState(wrapper.pid)));
      assert.match(processState(pid), /^T/, "the command is stopped");
      assert.equal(cli("status", path).code, 0, "the lock is held");
      wrapper.signal("SIGCONT");
      await wrapper.line(/^got SIGCONT 1$/);
      assert.doesNotMatch(processState(pid), /^T/);
      assert.doesNotMatch(processState(wrapper.pid), /^T/);
    } finally {
      if (pid) killQuietly(pid);
      await wrapper.kill();
      cleanup();
    }
  });

  test("while waiting for the lock, SIGWINCH, SIGCONT and SIGURG do not end the wait; SIGUSR2 ends it, runs nothing, exit 140", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const marker = join(dir, "ran");
    const first = await holder(path);
    const waiter = start("run", "--wait", path, "--", "touch", marker);
    try {
      await delay(SETTLE); // started, listening, and waiting
      for (const s of ["SIGWINCH", "SIGCONT", "SIGURG"] as const) {
        waiter.signal(s);
      }
      await delay(SETTLE);
      assert.ok(processExists(waiter.pid), "still waiting");
      waiter.signal("SIGUSR2");
      assert.deepEqual(await waiter.exited, { code: 140, signal: null });
      assert.equal(existsSync(marker), false, "the command never ran");
      assert.equal(cli("status", path).code, 0, "the holder is undisturbed");
    } finally {
      await waiter.kill();
      await first.kill();
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

  test("as documented: if runlock itself is SIGKILLed, the lock drops at once, the command runs on, status says stale with runlock's pid", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    let commandPid = 0;
    try {
      const wrapper = start(
        "run",
        path,
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 30",
      );
      commandPid = Number(await wrapper.line(/^\d+$/));
      wrapper.signal("SIGKILL");
      await wrapper.died;
      assert.ok(processExists(commandPid), "the command goes on");
      const r = cli("status", path);
      assert.equal(r.code, 1);
      assert.equal(
        r.stdout,
        `stale: last holder pid ${wrapper.child.pid} is gone\n`,
      );
    } finally {
      if (commandPid) process.kill(commandPid, "SIGKILL");
      cleanup();
    }
  });
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
      const waiter = start("wait", "--timeout=30", path);
      await delay(300);
      first.send("release");
      await first.expect("released");
      assert.equal((await waiter.exited).code, 0);
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

describe("usage", () => {
  test("--help and --version print to stdout and exit 0", () => {
    const help = cli("--help");
    assert.equal(help.code, 0);
    assert.match(help.stdout, /runlock status \[--json\] \[--\] <path>/);
    const version = cli("--version");
    assert.equal(version.code, 0);
    assert.match(version.stdout, /^runlock \d+\.\d+\.\d+\n$/);
  });

  test("the version is the package's", () => {
    const { dir, cleanup } = tempDir();
    try {
      // deno.json under Deno; the installed package.json under Node and Bun.
      const candidates = [
        new URL("../deno.json", import.meta.url),
        new URL("../node_modules/runlock/package.json", import.meta.url),
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
  ];
  for (const [name, args, message] of bad) {
    test(`${name}: a short message and the usage on stderr, nothing on stdout, exit 2`, () => {
      const r = cli(...args);
      assert.equal(r.code, 2);
      assert.equal(r.stdout, "");
      assert.match(r.stderr, message);
      assert.match(r.stderr, /usage:/);
    });
  }
});
