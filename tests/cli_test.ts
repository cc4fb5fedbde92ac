// The runlock CLI: every command and exit code, with real processes and
// real signals. Under Deno it runs src/cli.ts; under Node and Bun the `bin`
// of the installed package.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { describe, test } from "node:test";
import {
  cliCommand,
  delay,
  holder,
  processExists,
  tempDir,
} from "./_helpers.ts";

const [cmd, ...pre] = cliCommand();

function cli(
  ...args: string[]
): { code: number | null; stdout: string; stderr: string } {
  const r = spawnSync(cmd, [...pre, ...args], {
    encoding: "utf8",
    env: { ...process.env, NO_COLOR: "1" },
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Starts the CLI in the background; lines of stdout arrive in `lines`. */
function start(...args: string[]) {
  const child = spawn(cmd, [...pre, ...args], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  const lines: string[] = [];
  let stderr = "";
  const waiters: (() => void)[] = [];
  createInterface({ input: child.stdout! }).on("line", (l) => {
    lines.push(l);
    waiters.splice(0).forEach((w) => w());
  });
  child.stderr!.on("data", (d) => (stderr += d));
  const exited = new Promise<{ code: number | null; signal: string | null }>((
    resolve,
  ) => child.on("close", (code, signal) => resolve({ code, signal })));
  const line = async (pattern: RegExp): Promise<string> => {
    for (let i = 0; i < 400; i++) {
      const found = lines.find((l) => pattern.test(l));
      if (found) return found;
      await Promise.race([
        new Promise<void>((r) => waiters.push(r)),
        delay(50),
      ]);
    }
    throw new Error(
      `no line matching ${pattern}: ${lines.join("|")} ${stderr}`,
    );
  };
  // process.kill, not child.kill: under Deno, child.kill makes the exit
  // look like death by that signal even when the process trapped it.
  const signal = (name: NodeJS.Signals) => process.kill(child.pid!, name);
  // "exit", not "close": for when a grandchild keeps the pipes open.
  const died = new Promise((resolve) => child.on("exit", resolve));
  return { child, lines, line, exited, died, signal, stderr: () => stderr };
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

  test("held: prints the holder's pid, host and start time, exit 0; --json is one parseable object", async () => {
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

  test("forwards SIGINT and SIGHUP too", async () => {
    const { dir, cleanup } = tempDir();
    try {
      for (const [signal, number] of [["SIGINT", 2], ["SIGHUP", 1]] as const) {
        const path = join(dir, `${signal}.lock`);
        const name = signal.slice(3);
        const script =
          `trap "echo got ${name}; exit ${number}" ${name}; echo ready; while :; do sleep 0.05; done`;
        const wrapper = start("run", path, "--", "sh", "-c", script);
        await wrapper.line(/^ready$/);
        wrapper.signal(signal);
        const { code } = await wrapper.exited;
        assert.equal(code, number, wrapper.stderr());
        assert.ok(wrapper.lines.includes(`got ${name}`));
      }
    } finally {
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
  test("returns 0 at once when free, 1 on timeout while held, 0 once the holder releases", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      assert.equal(cli("wait", path).code, 0);
      const first = await holder(path);
      assert.equal(cli("wait", "--timeout=0.3", path).code, 1);
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
    assert.match(help.stdout, /runlock status \[--json\] <path>/);
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
