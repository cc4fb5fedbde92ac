// The runlock CLI's mistakes and failures, as a person meets them: each
// message says what is wrong in runlock's words, names what it is about,
// and fits 80 columns. Real processes: under Deno src/cli.ts, under Node
// and Bun the installed package's bin, or the `bun build --compile`
// binary (RUNLOCK_CLI), through tests/_cli.ts.
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { atTerminal, cli, cliIn, type Result, start } from "../_cli.ts";
import { tempDir } from "../_helpers.ts";

/** Every command, as `runlock --help` lists them. */
const COMMANDS = ["status", "run", "wait", "ls", "db-setup"];

/** Runs the CLI with its stderr on a terminal, at its default 80 columns. */
function cli80(...args: string[]): Promise<Result> {
  return atTerminal({ COLUMNS: "" }, ...args);
}

/** `text` with the lines a break made joined back to the line they continue. */
function joined(text: string): string {
  return text.replace(/\n {2}(?=\S)/g, " ");
}

/** Asserts that every line `r` printed, out or err, fits 80 columns. */
function fits80(r: Result, what: string): void {
  for (const line of `${r.stdout}\n${r.stderr}`.split("\n")) {
    assert.ok(
      [...line].length <= 80,
      `${what}: a line of ${[...line].length} columns: ${line}`,
    );
  }
}

describe("runlock ls: a directory that is not there, or empty", () => {
  test("ls of a directory that does not exist exits 2 with one line naming it, with or without --json", () => {
    const { dir, cleanup } = tempDir();
    try {
      const missing = join(dir, "nope");
      for (const args of [["ls", missing], ["ls", "--json", missing]]) {
        const r = cli(...args);
        assert.equal(r.code, 2, args.join(" "));
        assert.equal(r.stdout, "", args.join(" "));
        assert.equal(
          r.stderr,
          `runlock: ls: ${missing} does not exist\n`,
          args.join(" "),
        );
      }
    } finally {
      cleanup();
    }
  });

  test("ls of a file whose name has a tab quotes the name alone, not runlock's words", () => {
    const { dir, cleanup } = tempDir();
    try {
      const file = join(dir, "a\tb");
      writeFileSync(file, "");
      const r = cli("ls", file);
      assert.equal(r.code, 2);
      assert.equal(
        r.stderr,
        `runlock: ls: $'${dir}/a\\tb' is not a directory\n`,
      );
      // Below a file: said in runlock's words, the path alone quoted.
      const below = join(file, "sub");
      const n = cli("ls", below);
      assert.equal(n.code, 2);
      assert.equal(
        n.stderr,
        `runlock: ls: $'${dir}/a\\tb/sub': a parent of the path is not a directory\n`,
      );
    } finally {
      cleanup();
    }
  });

  test("ls of an empty directory says 'no locks in DIR' on stderr, prints nothing on stdout, exit 0; --json prints []", () => {
    const { dir, cleanup } = tempDir();
    try {
      assert.deepEqual(cli("ls", dir), {
        code: 0,
        stdout: "",
        stderr: `runlock: ls: no locks in ${dir}\n`,
      });
      assert.deepEqual(cli("ls", "--recursive", dir), {
        code: 0,
        stdout: "",
        stderr: `runlock: ls: no locks in ${dir} or below\n`,
      });
      assert.deepEqual(cli("ls", "--json", dir), {
        code: 0,
        stdout: "[]\n",
        stderr: "",
      });
    } finally {
      cleanup();
    }
  });
});

describe("runlock: usage errors", () => {
  test("a mistyped command suggests the nearest command, exit 2; a word near none gets no guess", async () => {
    const cases: [string, string][] = [
      ["stauts", "status"],
      ["rn", "run"],
      ["wiat", "wait"],
      ["lss", "ls"],
      ["dbsetup", "db-setup"],
    ];
    for (const [typed, meant] of cases) {
      const r = cli(typed, "x");
      assert.equal(r.code, 2, typed);
      assert.equal(r.stdout, "", typed);
      assert.equal(
        r.stderr.split("\n")[0],
        `runlock: unknown command '${typed}'; did you mean '${meant}'?`,
      );
      fits80(await cli80(typed, "x"), typed);
    }
    const far = cli("frobnicate", "x");
    assert.equal(far.code, 2);
    assert.equal(
      far.stderr.split("\n")[0],
      "runlock: unknown command 'frobnicate'",
    );
    const help = cli("help", "stauts");
    assert.equal(help.code, 2);
    assert.match(help.stderr, /did you mean 'status'\?/);
  });

  test("a usage error in a command prints that command's usage, not every command's", async () => {
    const cases: [string[], string][] = [
      [["run", "--wait=x", "L", "--", "true"], "run"],
      [["status", "--jsn", "x"], "status"],
      [["wait", "--timeout=-1", "x"], "wait"],
      [["ls", "-r", "."], "ls"],
    ];
    for (const [args, name] of cases) {
      const what = args.join(" ");
      const r = cli(...args);
      assert.equal(r.code, 2, what);
      assert.equal(r.stdout, "", what);
      const usage = r.stderr.slice(r.stderr.indexOf("\nusage:\n") + 1);
      assert.match(usage, new RegExp(`^usage:\\n  runlock ${name} `), what);
      const commands = new Set(
        [...usage.matchAll(/^ {2}runlock ([a-z-]+)/gm)].map((m) => m[1]),
      );
      assert.deepEqual([...commands], [name], `${what}: ${r.stderr}`);
      assert.match(usage, new RegExp(`runlock ${name} --help`), what);
      fits80(await cli80(...args), what);
    }
  });

  test("run -- CMD, without a path, says the path is missing, exit 2", async () => {
    for (
      const args of [
        ["run", "--", "true"],
        ["run", "--", "./sync.sh", "--full"],
        ["run", "--wait=1", "--", "true"],
      ]
    ) {
      const what = args.join(" ");
      const r = cli(...args);
      assert.equal(r.code, 2, what);
      assert.equal(r.stdout, "", what);
      assert.match(
        r.stderr,
        /^runlock: run: missing <path> before '--': runlock run <path> -- /,
        what,
      );
      fits80(await cli80(...args), what);
    }
  });

  test("--db that is not a postgres:// URL is explained for a person, without the API's words or the password", async () => {
    for (
      const db of [
        "notaurl",
        "mysql://app:hunter2-secret@db/x",
        "app:hunter2-secret@db/app",
      ]
    ) {
      for (
        const args of [
          ["status", `--db=${db}`, "k"],
          ["run", `--db=${db}`, "k", "--", "true"],
          ["wait", `--db=${db}`, "k"],
          ["ls", `--db=${db}`],
        ]
      ) {
        const what = args.join(" ");
        const r = cli(...args);
        assert.equal(r.code, 2, what);
        assert.equal(r.stdout, "", what);
        assert.equal(
          r.stderr.split("\n")[0],
          "runlock: --db must be a postgres:// URL, e.g. postgres://user@host/db",
          what,
        );
        assert.doesNotMatch(r.stderr, /pgLocks|'url'/, what);
        assert.doesNotMatch(r.stderr, /hunter2/, `${what}: the password`);
        fits80(await cli80(...args), what);
      }
    }
  });

  test("--db that starts as a postgres:// URL but does not parse (a port that is no number, an unclosed IPv6 bracket) says what to check, not that it must be a postgres:// URL, and never the password", async () => {
    for (
      const db of [
        "postgres://app:hunter2-secret@db:notaport/app",
        "postgres://app:hunter2-secret@db:99999/app",
        "postgres://app:hunter2-secret@[::1/app",
      ]
    ) {
      const r = cli("status", `--db=${db}`, "k");
      assert.equal(r.code, 2, db);
      assert.equal(r.stdout, "", db);
      assert.equal(
        r.stderr.split("\n")[0],
        "runlock: --db is not a URL: check host, port; percent-encode @:/?# in passwords",
        db,
      );
      assert.doesNotMatch(r.stderr, /hunter2/, `${db}: the password`);
      fits80(await cli80("status", `--db=${db}`, "k"), db);
    }
  });
});

describe("runlock run: a command that cannot be started", () => {
  test("a command not found: 'cannot run ...: command not found', exit 127, in runlock's words on every runtime", () => {
    const { dir, cleanup } = tempDir();
    try {
      const r = cli("run", join(dir, "run.lock"), "--", "nosuchcmd-runlock");
      assert.equal(r.code, 127);
      assert.equal(r.stdout, "");
      assert.equal(
        r.stderr,
        "runlock: cannot run 'nosuchcmd-runlock': command not found\n",
      );
      const path = join(dir, "no", "such-file");
      const p = cli("run", join(dir, "run.lock"), "--", path);
      assert.equal(p.code, 127);
      assert.equal(
        p.stderr,
        `runlock: cannot run '${path}': no such file or directory\n`,
      );
    } finally {
      cleanup();
    }
  });

  test("a file that is not executable, or a directory: 'cannot run ...: permission denied', exit 126", () => {
    const { dir, cleanup } = tempDir();
    try {
      const script = join(dir, "script.sh");
      writeFileSync(script, "#!/bin/sh\nexit 0\n");
      chmodSync(script, 0o644);
      const sub = join(dir, "sub");
      mkdirSync(sub);
      for (const target of [script, sub]) {
        const r = cli("run", join(dir, "run.lock"), "--", target);
        assert.equal(r.code, 126, r.stderr);
        assert.equal(r.stdout, "");
        assert.equal(
          r.stderr,
          `runlock: cannot run '${target}': permission denied\n`,
        );
      }
    } finally {
      cleanup();
    }
  });

  test("an executable script without #! is run by sh, as a shell (and execvp) runs it, on every runtime: its output and exit code come through", () => {
    const { dir, cleanup } = tempDir();
    try {
      const script = join(dir, "noshebang.sh");
      writeFileSync(script, "echo ran by sh\nexit 7\n");
      chmodSync(script, 0o755);
      const r = cli("run", join(dir, "run.lock"), "--", script);
      assert.deepEqual(r, { code: 7, stdout: "ran by sh\n", stderr: "" });
      // By a name found in PATH, as a shell finds it.
      const bin = join(dir, "bin");
      mkdirSync(bin);
      writeFileSync(join(bin, "noshebang-runlock"), "echo found in PATH\n");
      chmodSync(join(bin, "noshebang-runlock"), 0o755);
      const named = cliIn(
        { PATH: `${bin}:${process.env.PATH}` },
        "run",
        join(dir, "run.lock"),
        "--",
        "noshebang-runlock",
      );
      assert.deepEqual(named, {
        code: 0,
        stdout: "found in PATH\n",
        stderr: "",
      });
    } finally {
      cleanup();
    }
  });
});

describe("runlock --help: 80 columns", () => {
  test("--help and each command's --help print no line longer than 80 columns", () => {
    for (const args of [["--help"], ...COMMANDS.map((c) => [c, "--help"])]) {
      const r = cli(...args);
      assert.equal(r.code, 0, args.join(" "));
      assert.ok(r.stdout.length > 0, args.join(" "));
      fits80(cli(...args), args.join(" "));
    }
  });

  test("a usage error's message and the usage it prints fit 80 columns", async () => {
    for (const args of [["nosuch"], ...COMMANDS.map((c) => [c, "--nosuch"])]) {
      const r = cli(...args);
      assert.equal(r.code, 2, args.join(" "));
      assert.match(r.stderr, /\nusage:\n/, args.join(" "));
      fits80(await cli80(...args), args.join(" "));
    }
  });
});

describe("runlock: a message wider than the terminal", () => {
  test("is broken at spaces into lines of at most 80 columns, each break indented two, and read joined it is the one-line message: wait's time-out, a refused run, a misplaced --db, a refused connection", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "a-state-directory-with-a-long-name", "run.lock");
    const holder = start(
      "run",
      path,
      "--",
      "sh",
      "-c",
      "echo ready; exec sleep 120",
      "sync-worker",
    );
    try {
      await holder.line(/^ready$/);
      const cases = [
        ["wait", "--timeout=0", path],
        ["run", path, "--", "true"],
        ["status", "--db=postgres://app:hunter2@127.0.0.1:1/app", "k"],
        ["--db=postgres://app:hunter2@127.0.0.1:1/app", "status", "k"],
      ];
      for (const args of cases) {
        const what = args.join(" ");
        const wide = cli(...args);
        const message = wide.stderr.split("\nusage:\n")[0];
        assert.ok(
          message.split("\n").some((l) => [...l].length > 80),
          `${what}: a message wider than 80 columns to break: ${message}`,
        );
        const narrow = await cli80(...args);
        assert.equal(narrow.code, wide.code, what);
        fits80(narrow, what);
        // The two runs may be a second apart: "(0s ago)", "(1s ago)".
        const ago = (text: string) => text.replace(/\(\d+s ago\)/g, "(ago)");
        assert.equal(
          ago(joined(narrow.stderr.split("\nusage:\n")[0])),
          ago(message),
          what,
        );
      }
      const forty = await atTerminal(
        { COLUMNS: "40" },
        "run",
        path,
        "--",
        "true",
      );
      const lines = forty.stderr.trimEnd().split("\n");
      assert.ok(lines.length > 2, `COLUMNS=40 breaks more: ${forty.stderr}`);
      assert.ok(
        lines.every((l) => [...l].length <= 40 || !l.trim().includes(" ")),
        `COLUMNS=40: no line over 40 columns but a single word: ${forty.stderr}`,
      );
      assert.equal(
        joined(forty.stderr),
        joined((await cli80("run", path, "--", "true")).stderr),
      );
    } finally {
      // runlock forwards SIGTERM to the command's group.
      holder.signal("SIGTERM");
      await holder.exited;
      cleanup();
    }
  });

  test("never breaks inside a quoted command name, and a word wider than the line goes whole on a line of its own", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const tool = `no such tool ${"x".repeat(30)} with spaces`;
      const r = await cli80("run", join(dir, "run.lock"), "--", tool);
      assert.equal(r.code, 127);
      fits80(r, tool);
      assert.ok(
        r.stderr.split("\n").some((l) => l.includes(`'${tool}':`)),
        `the quoted name on one line: ${r.stderr}`,
      );
      assert.equal(
        joined(r.stderr),
        `runlock: cannot run '${tool}': command not found\n`,
      );
      // A path that needs bash's $'…' quoting, an escaped quote and a space
      // in it: quoted alone (runlock's words stay plain), and whole.
      writeFileSync(join(dir, "f"), "");
      const odd = join(dir, "f", "the users' dir\nwith newline", "run.lock");
      const q = await atTerminal({ COLUMNS: "40" }, "run", odd, "--", "true");
      assert.equal(q.code, 2);
      const span = `$'${odd.replace("'", "\\'").replace("\n", "\\n")}'`;
      assert.ok(
        q.stderr.split("\n").some((l) => l.trim() === `${span}:`),
        `the quoted path on a line of its own: ${q.stderr}`,
      );
      assert.match(
        joined(q.stderr),
        /: cannot open the lock's directory: a parent of the path is not a directory\n$/,
      );
      const long = `/${"y".repeat(90)}`;
      const w = await cli80("run", join(dir, "run.lock"), "--", long);
      assert.equal(w.code, 127);
      assert.deepEqual(w.stderr.split("\n"), [
        "runlock: cannot run",
        `  '${long}':`,
        "  no such file or directory",
        "",
      ]);
    } finally {
      cleanup();
    }
  });
});
