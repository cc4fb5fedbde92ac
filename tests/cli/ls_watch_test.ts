// `runlock ls --watch`: the live table at a real pseudo-terminal
// (tests/fixtures/pty_run.py), the JSON lines and plain lines through a
// pipe, a reader that goes away (| head -n 2), and --db against a real
// server. The holders are real processes (tests/fixtures/child.ts), killed
// with SIGKILL through their handles; every step waits for what the watch
// printed about the one before.
import assert from "node:assert/strict";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  Background,
  cli,
  cliCommand,
  cliPgTestable,
  type Result,
  start,
  startWithInput,
  Terminal,
} from "../_cli.ts";
import { Child, deadPid, delay, tempDir } from "../_helpers.ts";
import { commandLines, docBlock } from "../_readme.ts";
import { type Cluster, startCluster } from "../fixtures/pg_cluster.ts";

const runlock = cliCommand();

/** A holder of `path` whose record says `cmd`; resolves once it holds it. */
async function holding(path: string, cmd: string): Promise<Child> {
  const child = new Child("child.ts", [
    "hold",
    path,
    "0",
    JSON.stringify({ cmd }),
  ]);
  await child.expect("acquired");
  return child;
}

/** Releases `child`'s lock, and waits until it says so. */
async function release(child: Child): Promise<void> {
  child.send("release");
  await child.expect("released");
}

/** What redraws a frame: the cursor home, then the lines. */
const HOME = "\x1b[H";
/** What the table leaves on exit: wrap on, cursor shown, main screen. */
const RESTORE = "\x1b[?7h\x1b[?25h\x1b[?1049l";

/**
 * Each frame the table drew, as its lines without escapes (a frame ends at
 * its erase-below; the terminal turns each "\n" into "\r\n").
 */
function frames(output: string): string[][] {
  return output.split(HOME).slice(1).map((f) =>
    f.split("\x1b[J")[0].replaceAll("\x1b[2K", "").replaceAll("\x1b[K", "")
      .split(/\r*\n/)
  );
}

/** A frame's lock rows, as cells: state, pid, host, since, command, path. */
function rows(frame: string[]): string[][] {
  return frame.slice(2).filter((l) => /^(held|stale|invalid) /.test(l))
    .map((l) => l.split(/ {2,}/));
}

/**
 * Waits (up to 20 s) until the last frame the terminal shows satisfies
 * `ok`, looking again as output comes; returns it. `after`: only frames
 * drawn after that much output count.
 */
async function frame(
  term: Terminal,
  ok: (frame: string[]) => boolean,
  what: string,
  after = 0,
): Promise<string[]> {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const last = frames(term.output.slice(after)).at(-1);
    if (last && ok(last)) return last;
    if (Date.now() > deadline) {
      throw new Error(
        `the table never showed ${what}:\n${last?.join("\n")}\n${
          JSON.stringify(term.output.slice(-2000))
        }`,
      );
    }
    // The output is a stream the terminal appends to: look again soon.
    await delay(20);
  }
}

/** The row of `path` in `frame`, or undefined. */
function row(frame: string[], path: string): string[] | undefined {
  return rows(frame).find((r) => r[5] === path);
}

/** The JSON ls prints for the lock `path` now (ls --json's element). */
function lsJson(dir: string, path: string): Record<string, unknown> {
  const r: Result = cli("ls", "--json", dir);
  assert.equal(r.code, 0, r.stderr);
  const found = JSON.parse(r.stdout).find((i: { path: string }) =>
    i.path === path
  );
  assert.ok(found, `${path} in ls --json: ${r.stdout}`);
  return found;
}

/** The kinds of change ls --watch prints. */
const KINDS = [
  "present",
  "started",
  "released",
  "crashed",
  "taken over",
  "lost",
];

/**
 * A plain ls --watch line's cells (kind, state, pid, host, since, command,
 * path), checking its columns: the kind padded to 'taken over', the state
 * to 'invalid', then ls's columns two spaces apart.
 */
function plainCells(line: string): string[] {
  const kind = line.slice(0, 12).trimEnd();
  const state = line.slice(12, 21).trimEnd();
  assert.ok(KINDS.includes(kind), `a kind: '${line}'`);
  assert.match(state, /^(held|stale|free|invalid)$/, line);
  assert.notEqual(line[21], " ", `the pid at column 21: '${line}'`);
  const rest = line.slice(21).split(/ {2,}/);
  assert.equal(rest.length, 5, line);
  assert.match(rest[0], /^\d+$/, line);
  assert.match(rest[2], /^\d+s ago$/, line);
  return [kind, state, ...rest];
}

describe("runlock ls --watch", () => {
  test("at a terminal, a live table (state, pid, host, since, command, path) shows a new run held, a SIGKILLed one stale, drops a released one, ages its 'since' column, cuts its lines to a narrow terminal, and Ctrl-C gives the terminal back (exit 130)", async () => {
    const { dir, cleanup } = tempDir();
    const [a, b, c] = ["a", "b", "c"].map((n) => join(dir, `${n}.lock`));
    const holders: Child[] = [];
    let term: Terminal | undefined;
    try {
      const ha = await holding(a, "job-a");
      const hb = await holding(b, "job-b");
      holders.push(ha, hb);
      // Wide, so that the rows are whole until the test narrows it.
      term = new Terminal([
        "sh",
        "-c",
        'stty cols 200; exec "$@"',
        "sh",
        ...runlock,
        "ls",
        "--watch",
        dir,
      ]);
      const first = await frame(
        term,
        (f) => rows(f).length === 2,
        "the two locks",
      );
      assert.match(first[0], /^runlock ls --watch .* {2}· {2}2 locks$/);
      assert.deepEqual(first[1].split(/ +/), [
        "STATE",
        "PID",
        "HOST",
        "SINCE",
        "COMMAND",
        "PATH",
      ]);
      // docs/cli.md's picture: this title and header, rows of this shape.
      const picture = docBlock("cli.md", "cli-watch-table").text.trimEnd()
        .split("\n");
      assert.equal(picture[0], "$ runlock ls --watch .state");
      assert.equal(
        picture[1].replace(/ \d+ locks/, " N locks"),
        first[0].replace(dir, ".state").replace(/ \d+ locks/, " N locks") +
          "  ·  last: started sync.lock at 01:12:37",
      );
      assert.deepEqual(picture[2].split(/ +/), first[1].split(/ +/));
      /** Where each column starts. */
      const starts = (line: string) =>
        [...line.matchAll(/(?:^| {2})(\S)/g)].map((m) =>
          m.index! + m[0].length - 1
        );
      for (const line of picture.slice(3)) {
        assert.deepEqual(starts(line), starts(picture[2]), line);
        const cells = line.split(/ {2,}/);
        assert.equal(cells.length, 6, line);
        assert.match(cells[0], /^(held|stale)$/, line);
        assert.match(cells[1], /^\d+$/, line);
        assert.match(cells[3], /^\d+s ago$/, line);
      }
      const [state, pid, host, since, cmd] = row(first, a)!;
      assert.deepEqual([state, pid, host, cmd], [
        "held",
        String(ha.pid),
        hostname(),
        "job-a",
      ]);
      assert.match(since, /^\d+s ago$/);
      assert.equal(row(first, b)![4], "job-b");

      // Nothing changes, and the age still moves on.
      await frame(
        term,
        (f) => row(f, a)?.[3] !== since,
        `a's age past '${since}'`,
      );

      const hc = await holding(c, "job-c");
      holders.push(hc);
      const started = await frame(
        term,
        (f) => row(f, c)?.[0] === "held",
        "c held",
      );
      assert.equal(row(started, c)![1], String(hc.pid));
      assert.match(started[0], / {2}3 locks {2}· {2}last: started c\.lock at /);

      await ha.kill("SIGKILL");
      const crashed = await frame(
        term,
        (f) => row(f, a)?.[0] === "stale",
        "a stale",
      );
      assert.deepEqual(row(crashed, a)!.slice(0, 2), ["stale", String(ha.pid)]);
      assert.equal(row(crashed, a)![4], "job-a", "the dead run's command");
      assert.match(crashed[0], /last: crashed a\.lock at /);

      await release(hb);
      const released = await frame(
        term,
        (f) => /last: released b\.lock at /.test(f[0]),
        "b released",
      );
      assert.equal(row(released, b), undefined, "b's row is gone");
      assert.deepEqual(rows(released).map((r) => r[5]), [a, c]);

      // A narrow terminal: every line cut to its width, none wrapped.
      const mark = term.output.length;
      term.resize(24, 40);
      const narrow = await frame(term, (f) => f.length > 3, "a frame", mark);
      for (const line of narrow) {
        assert.ok([...line].length <= 40, `fits 40 columns: '${line}'`);
      }
      assert.ok(narrow[0].endsWith("…"), narrow[0]);
      assert.match(narrow[2], /^stale {2}/, "a row, cut");

      term.type("\x03");
      assert.equal(await term.exit(), "exit 130", term.output);
      assert.ok(term.output.includes("\x1b[?1049h"), "took the screen");
      assert.ok(
        term.output.endsWith(RESTORE),
        JSON.stringify(term.output.slice(-80)),
      );
    } finally {
      await term?.close();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });

  test("--json prints one line per change: present, started, released, crashed, each with the fields ls --json gives, in order; the plain form prints the kind and ls's columns; SIGTERM and SIGHUP end them (143, 129)", async () => {
    const { dir, cleanup } = tempDir();
    const [p, s, k] = ["present", "short", "killed"].map((n) =>
      join(dir, `${n}.lock`)
    );
    const holders: Child[] = [];
    let json: Background | undefined;
    let plain: Background | undefined;
    try {
      const hp = await holding(p, "job-p");
      holders.push(hp);
      json = start("ls", "--watch", "--json", dir);
      plain = start("ls", "--watch", dir);
      const expected: Record<string, unknown>[] = [];
      /** Waits until both have printed `n` lines. */
      const both = async (n: number) => {
        await json!.until(() => json!.lines.length >= n, `${n} JSON lines`);
        await plain!.until(() => plain!.lines.length >= n, `${n} lines`);
      };

      expected.push({ kind: "present", ...lsJson(dir, p) });
      await both(1);

      const hs = await holding(s, "job-s");
      holders.push(hs);
      await both(2);
      expected.push({ kind: "started", ...lsJson(dir, s) });

      await release(hs);
      await both(3);
      const free = cli("status", "--json", s);
      expected.push({ kind: "released", ...JSON.parse(free.stdout) });

      const hk = await holding(k, "job-k");
      holders.push(hk);
      await both(4);
      expected.push({ kind: "started", ...lsJson(dir, k) });

      await hk.kill("SIGKILL");
      await both(5);
      expected.push({ kind: "crashed", ...lsJson(dir, k) });

      json.signal("SIGTERM");
      plain.signal("SIGHUP");
      assert.equal((await json.exited).code, 143, json.stderr());
      assert.equal((await plain.exited).code, 129, plain.stderr());
      assert.deepEqual(json.lines.map((l) => JSON.parse(l)), expected);
      assert.equal(JSON.parse(json.lines[3]).state, "held");
      assert.equal(JSON.parse(json.lines[4]).state, "stale");

      const words = plain.lines.map((l) => l.split(/ {2,}/));
      const host = hostname();
      assert.deepEqual(
        words.map(([kind, state, pid, h, _since, cmd, path]) => [
          kind,
          state,
          pid,
          h,
          cmd,
          path,
        ]),
        [
          ["present", "held", String(hp.pid), host, "job-p", p],
          ["started", "held", String(hs.pid), host, "job-s", s],
          // The run that ended: who it was, as last seen.
          ["released", "free", String(hs.pid), host, "job-s", s],
          ["started", "held", String(hk.pid), host, "job-k", k],
          ["crashed", "stale", String(hk.pid), host, "job-k", k],
        ],
      );
      assert.ok(words.every((w) => /^\d+s ago$/.test(w[4])), plain.lines[0]);
      for (const line of plain.lines) plainCells(line);

      // docs/cli.md's pictures: lines of these very shapes.
      const shown = docBlock("cli.md", "cli-watch-json").text.trimEnd()
        .split("\n");
      assert.equal(shown[0], "$ runlock ls --watch --json .state");
      const keys = Object.keys(JSON.parse(json.lines[0]));
      const told = shown.slice(1).map((l) => JSON.parse(l));
      for (const line of told) {
        assert.deepEqual(Object.keys(line), keys, JSON.stringify(line));
        assert.ok(KINDS.includes(line.kind), line.kind);
      }
      assert.deepEqual(told.map((l) => [l.kind, l.state]), [
        ["present", "held"],
        ["started", "held"],
        ["started", "held"],
        ["crashed", "stale"],
        ["released", "free"],
      ]);
      // A release's line is the free inspection, as printed here.
      assert.deepEqual(
        { ...told[4], path: s },
        JSON.parse(json.lines[2]),
      );
      const logged = docBlock("cli.md", "cli-watch-plain").text.trimEnd()
        .split("\n");
      assert.equal(
        logged[0],
        "$ runlock ls --watch .state >> watch.log; cat watch.log",
      );
      assert.deepEqual(logged.slice(1).map((l) => plainCells(l)[0]), [
        "present",
        "started",
        "started",
        "crashed",
        "released",
      ]);
    } finally {
      await json?.kill();
      await plain?.kill();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });

  test("names and records holding control characters (ESC, BEL, a newline) are shown quoted as bash's $'...' (\\x1b, \\n) in the plain lines and the live table: one line per change, no escape sequence from a name reaches the terminal, the columns as wide as they show; --json exact", async () => {
    const { dir, cleanup } = tempDir();
    const first = join(dir, "e\x1b]0;PWNED\x07\nf.lock");
    const second = join(dir, "g\x1b[2J\x1b[Hh.lock");
    const stale = join(dir, "s.lock");
    const escaped = (path: string) =>
      `$'${
        path.replaceAll("\x1b", "\\x1b").replaceAll("\x07", "\\x07")
          .replaceAll("\n", "\\n")
      }'`;
    // deno-lint-ignore no-control-regex -- control characters are the point
    const controls = /[\x00-\x1f\x7f]/;
    const holders: Child[] = [];
    let plain: Background | undefined;
    let json: Background | undefined;
    let term: Terminal | undefined;
    try {
      holders.push(await holding(first, "job-e"));
      writeFileSync(
        stale,
        `${deadPid()}\nrunlock 1\nhost=h\x1b[2Jx\nstarted=${
          new Date().toISOString()
        }\nmeta.cmd=c\x1b]0;T\x07d\n`,
      );
      plain = start("ls", "--watch", dir);
      json = start("ls", "--watch", "--json", dir);
      term = new Terminal([
        "sh",
        "-c",
        'stty cols 200; exec "$@"',
        "sh",
        ...runlock,
        "ls",
        "--watch",
        dir,
      ]);
      await plain.until(() => plain!.lines.length >= 2, "2 lines");
      await json.until(() => json!.lines.length >= 2, "2 JSON lines");
      const table = await frame(term, (f) => rows(f).length === 2, "2 rows");
      holders.push(await holding(second, "job-g"));
      await plain.until(() => plain!.lines.length >= 3, "3 lines");
      await json.until(() => json!.lines.length >= 3, "3 JSON lines");
      const started = await frame(
        term,
        (f) => rows(f).length === 3,
        "3 rows",
      );

      const cells = plain.lines.map((line) => {
        assert.doesNotMatch(line, controls);
        return plainCells(line);
      });
      assert.deepEqual(
        cells.map(([kind, state, , host, , cmd, path]) => [
          kind,
          state,
          host,
          cmd,
          path,
        ]),
        [
          ["present", "held", hostname(), "job-e", escaped(first)],
          ["present", "stale", "$'h\\x1b[2Jx'", "$'c\\x1b]0;T\\x07d'", stale],
          ["started", "held", hostname(), "job-g", escaped(second)],
        ],
      );
      assert.deepEqual(
        json.lines.map((l) => JSON.parse(l)).map((j) => [j.path, j.host]),
        [[first, hostname()], [stale, "h\x1b[2Jx"], [second, hostname()]],
      );

      for (const f of [table, started]) {
        for (const line of f) assert.doesNotMatch(line, controls);
      }
      assert.deepEqual(rows(started).map((r) => r[5]), [
        escaped(first),
        escaped(second),
        stale,
      ]);
      const [, , host, since, cmd] = row(started, stale)!;
      assert.deepEqual([host, cmd], ["$'h\\x1b[2Jx'", "$'c\\x1b]0;T\\x07d'"]);
      assert.match(since, /^\d+s ago$/);
      /** Where each column starts. */
      const starts = (line: string) =>
        [...line.matchAll(/(?:^| {2})(\S)/g)].map((m) =>
          m.index! + m[0].length - 1
        );
      for (const line of started.slice(2)) {
        assert.deepEqual(starts(line), starts(started[1]), line);
      }
      assert.ok(
        started[0].includes("last: started $'g\\x1b[2J\\x1b[Hh.lock' at "),
        started[0],
      );
      assert.ok(!term.output.includes("PWNED\x07"), "no title was set");
    } finally {
      await term?.close();
      await plain?.kill();
      await json?.kill();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });

  test("--json | head -n 2: ls --watch exits 0, quietly, at its next line once head has gone (EPIPE)", async () => {
    const { dir, cleanup } = tempDir();
    const holders: Child[] = [];
    // head closes its end of the pipe when it exits; the group closes its
    // copy (exec <&-), so that nothing reads the pipe any more.
    const script = '"$@" | { head -n 2; exec <&-; echo head-done >&2; }; ' +
      'echo "ls-exit ${PIPESTATUS[0]}" >&2';
    let pipeline: Background | undefined;
    try {
      for (const n of ["a", "b", "c"]) {
        holders.push(await holding(join(dir, `${n}.lock`), `job-${n}`));
      }
      pipeline = new Background([
        "bash",
        "-c",
        script,
        "bash",
        ...runlock,
        "ls",
        "--watch",
        "--json",
        dir,
      ]);
      await pipeline.stderrMatch(/head-done/);
      assert.deepEqual(
        pipeline.lines.map((l) => JSON.parse(l).kind),
        ["present", "present"],
      );
      // The third line may have gone into the pipe before head left; the
      // next change's line cannot.
      holders.push(await holding(join(dir, "d.lock"), "job-d"));
      await pipeline.stderrMatch(/ls-exit \d+/);
      assert.equal((await pipeline.exited).code, 0);
      assert.equal(
        pipeline.stderr(),
        "head-done\nls-exit 0\n",
        "no error, no stack trace",
      );
    } finally {
      await pipeline?.kill();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });

  test("ls --watch ends when its directory is removed (exit 1, said on stderr); one that does not exist is an error (exit 2)", async () => {
    const { dir, cleanup } = tempDir();
    const state = join(dir, "state");
    mkdirSync(state);
    let w: Background | undefined;
    const holders: Child[] = [];
    try {
      const h = await holding(join(state, "a.lock"), "job-a");
      holders.push(h);
      w = start("ls", "--watch", state);
      await w.line(/^present /);
      await release(h);
      await w.line(/^released /);
      rmSync(state, { recursive: true });
      assert.equal((await w.exited).code, 1, w.stderr());
      assert.equal(
        w.stderr(),
        `runlock: ls: ${state} is gone (removed or moved): nothing left to watch\n`,
      );
      const missing = cli("ls", "--watch", state);
      assert.equal(missing.code, 2);
      assert.equal(
        missing.stderr,
        `runlock: ls: ${state} does not exist: nothing to watch\n`,
      );
    } finally {
      await w?.kill();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });

  test("usage errors exit 2 before anything is watched: --interval without --db or --watch, a bad --interval, --recursive with --db; --help describes --watch", () => {
    const db = "--db=postgres://nobody@127.0.0.1:1/none";
    const cases: [string[], RegExp][] = [
      [
        ["--watch", "--interval=100", "."],
        /option '--interval' is for --db \(PostgreSQL, polled\)/,
      ],
      [["--interval=100", db], /'--interval' .* it needs --watch/],
      [
        ["--watch", "--interval=5", db],
        /'--interval' must be a whole number of milliseconds from 10 to 3600000: current value is '5'/,
      ],
      [["--watch", "--interval=1s", db], /current value is '1s'/],
      [["--watch", "--recursive", db], /'--recursive' is for directories/],
    ];
    for (const [args, message] of cases) {
      const r = cli("ls", ...args);
      assert.equal(r.code, 2, `${args.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, message);
      assert.match(r.stderr, /usage:/);
      assert.equal(r.stdout, "");
    }
    const help = cli("ls", "--help");
    assert.equal(help.code, 0);
    assert.ok(
      help.stdout.includes(
        "runlock ls --watch [--json] [--recursive] [--] <dir>\n" +
          "  runlock ls --db=URL [--schema=NAME] [--json] [--watch [--interval=MS]]\n" +
          "            [--] [<prefix>]",
      ),
      help.stdout,
    );
    assert.match(help.stdout, /--watch: keep watching/);
    assert.match(
      help.stdout,
      /from the runlock_locks table and pg_locks; --watch\npolls them every --interval=MS/,
    );
    assert.match(help.stdout, /pg_locks/);
  });
});

// --db: as tests/cli/db_test.ts does, against the server of
// RUNLOCK_TEST_PG_URL or a throwaway cluster; skipped loudly without
// PostgreSQL binaries (failed under CI=true), and under Node and Bun until
// the npm package ships runlock/postgres.
const testable = cliPgTestable("ls --watch --db");

/** The shell loop of a command that runs until the file "$1" exists. */
const UNTIL_DONE = 'echo ready; while [ ! -e "$1" ]; do sleep 0.05; done';

describe("runlock ls --watch --db (PostgreSQL)", {
  skip: !testable,
}, () => {
  let cluster: Cluster;
  let db: string;
  before(async () => {
    cluster = await startCluster();
    db = `--db=${cluster.url}`;
  });
  after(() => cluster?.stop());

  /** `runlock run --db NAME -- sh (until done)`, once its command runs. */
  async function running(name: string, done: string): Promise<Background> {
    const run = start(
      "run",
      db,
      name,
      "--",
      "sh",
      "-c",
      UNTIL_DONE,
      "sh",
      done,
    );
    await run.line(/^ready$/);
    return run;
  }

  /** status --json --db of `name`, as an object. */
  function statusJson(name: string): Record<string, unknown> {
    const r = cli("status", "--json", db, name);
    assert.ok(r.code === 0 || r.code === 1, r.stderr);
    return JSON.parse(r.stdout);
  }

  test("a lock name holding control characters (ESC, BEL, a newline) is shown quoted as bash's $'...' (\\x1b, \\n) by ls --db and ls --watch --db's plain lines, one line each; --json exact", async () => {
    const { dir, cleanup } = tempDir();
    const prefix = `cli-esc/${process.pid}-${Date.now().toString(36)}/`;
    const name = `${prefix}\x1b]0;PWNED\x07t\nu`;
    const shown = `$'${prefix}\\x1b]0;PWNED\\x07t\\nu'`;
    const done = join(dir, "done");
    let run: Background | undefined;
    let plain: Background | undefined;
    try {
      run = await running(name, done);
      const once = cli("ls", db, prefix);
      assert.equal(once.code, 0, once.stderr);
      const lines = once.stdout.split("\n").slice(0, -1);
      assert.equal(lines.length, 1, once.stdout);
      assert.deepEqual(
        lines.map((l) => l.split(/ {2,}/)).map((r) => [r[0], r[1], r[5]]),
        [["held", String(run.pid), shown]],
      );
      const json = JSON.parse(cli("ls", "--json", db, prefix).stdout);
      assert.deepEqual(json.map((i: { path: string }) => i.path), [name]);
      plain = start("ls", "--watch", "--interval=50", db, prefix);
      await plain.until(() => plain!.lines.length >= 1, "a line");
      const [line] = plain.lines;
      assert.deepEqual(
        [plainCells(line)[0], plainCells(line)[6]],
        ["present", shown],
      );
    } finally {
      writeFileSync(done, "");
      await plain?.kill();
      await run?.kill();
      cleanup();
    }
  });

  test("--json --interval: one line per change of the names under the prefix (present, started, released, crashed: its runlock SIGKILLed), each with status --json's fields; ls --db lists them once; Ctrl-C (SIGINT) ends it (130)", async () => {
    const { dir, cleanup } = tempDir();
    const prefix = `cli-watch/${process.pid}-${Date.now().toString(36)}/`;
    const [p, s, k] = ["present", "short", "killed"].map((n) => prefix + n);
    const done = join(dir, "done");
    const runs: Background[] = [];
    let json: Background | undefined;
    try {
      const rp = await running(p, done);
      runs.push(rp);
      // Another prefix's lock is not listed.
      runs.push(await running(`other-${prefix}x`, done));
      // docs/cli.md's line, on this server and prefix.
      const [documented] = commandLines(docBlock("cli.md", "cli-watch-db"));
      const words = documented.split(" ");
      assert.deepEqual(words.slice(0, 4), [
        "runlock",
        "ls",
        "--watch",
        "--json",
      ]);
      assert.match(words[4], /^--db=postgres:\/\//);
      assert.match(words[5], /^--interval=\d+$/);
      json = start("ls", "--watch", "--json", words[5], db, prefix);
      const lines = async (n: number) => {
        await json!.until(() => json!.lines.length >= n, `${n} JSON lines`);
      };
      const expected: Record<string, unknown>[] = [];
      await lines(1);
      expected.push({ kind: "present", ...statusJson(p) });

      const rs = startWithInput(
        "run",
        db,
        s,
        "--",
        "sh",
        "-c",
        "echo ready; read x || true",
      );
      runs.push(rs);
      await rs.line(/^ready$/);
      await lines(2);
      expected.push({ kind: "started", ...statusJson(s) });
      // ls --db (without --watch): the same names, once.
      const once = cli("ls", db, prefix);
      assert.equal(once.code, 0, once.stderr);
      const listed = once.stdout.trimEnd().split("\n").map((l) =>
        l.split(/ {2,}/)
      );
      assert.deepEqual(listed.map((r) => [r[0], r[1], r[4], r[5]]), [
        ["held", String(rp.pid), `sh -c '${UNTIL_DONE}' sh ${done}`, p],
        ["held", String(rs.pid), "sh -c 'echo ready; read x || true'", s],
      ]);
      const onceJson = JSON.parse(cli("ls", "--json", db, prefix).stdout);
      assert.deepEqual(onceJson, [statusJson(p), statusJson(s)]);

      rs.endInput(); // its command reads EOF and exits: a release
      assert.equal((await rs.exited).code, 0, rs.stderr());
      await lines(3);
      expected.push({ kind: "released", ...statusJson(s) });

      const rk = await running(k, done);
      runs.push(rk);
      await lines(4);
      expected.push({ kind: "started", ...statusJson(k) });
      // runlock dies; its session with it; the record stays: stale.
      rk.child.kill("SIGKILL");
      await lines(5);
      expected.push({ kind: "crashed", ...statusJson(k) });

      json.signal("SIGINT");
      assert.equal((await json.exited).code, 130, json.stderr());
      assert.deepEqual(json.lines.map((l) => JSON.parse(l)), expected);
      assert.deepEqual(expected.map((e) => e.state), [
        "held",
        "held",
        "free",
        "held",
        "stale",
      ]);
    } finally {
      writeFileSync(done, "");
      await json?.kill();
      for (const r of runs) await r.kill();
      cleanup();
    }
  });
});
