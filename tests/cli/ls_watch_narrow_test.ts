// `runlock ls --watch` on a narrow or short terminal:
// a real pseudo-terminal (tests/fixtures/pty_run.py) of a given size, set
// by stty before runlock starts and then by TIOCSWINSZ (Terminal.resize),
// as a window resize does. Lines fit the width in terminal columns (a CJK
// character takes two), cut with "…", never wrapped and never inside a
// character; the path is the last column to go, cut from its start; the
// PostgreSQL table's last column is NAME; the "… N more" line counts the
// locks not shown. The holders are real processes (tests/fixtures/
// child.ts).
import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  type Background,
  cliCommand,
  cliPgTestable,
  start,
  Terminal,
} from "../_cli.ts";
import { Child, delay, tempDir } from "../_helpers.ts";
import { type Cluster, startCluster } from "../fixtures/pg_cluster.ts";

const runlock = cliCommand();

/** The full header of the file table, in order. */
const HEADER = ["STATE", "PID", "HOST", "SINCE", "COMMAND", "PATH"];

/**
 * How many columns `text` takes on a terminal, for the characters these
 * tests use (this file's own count, not runlock's): CJK ideographs, in
 * the BMP and beyond it, two; a combining mark none; others one.
 */
function columns(text: string): number {
  let n = 0;
  for (const char of text) {
    const code = char.codePointAt(0)!;
    if (/^\p{M}$/u.test(char)) continue;
    n += (code >= 0x3000 && code <= 0x9fff) ||
        (code >= 0x20000 && code <= 0x3fffd)
      ? 2
      : 1;
  }
  return n;
}

/** What draws a frame: the cursor home, the lines, an erase-below. */
const HOME = "\x1b[H";
const END = "\x1b[J";

/**
 * The frames the table drew whole, as their lines without escapes (the
 * terminal turns each "\n" into "\r\n").
 */
function frames(output: string): string[][] {
  return output.split(HOME).slice(1).filter((f) => f.includes(END)).map((f) =>
    f.split(END)[0].replaceAll("\x1b[2K", "").replaceAll("\x1b[K", "").split(
      /\r*\n/,
    )
  );
}

/**
 * Waits (up to 20 s) until the last whole frame drawn after `after`
 * characters of output satisfies `ok`; returns it.
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
        `the table never showed ${what}; its last frame:\n${
          last?.join("\n")
        }\n${JSON.stringify(term.output.slice(-1500))}`,
      );
    }
    await delay(20);
  }
}

/** Whether every line of `f` fits `width` columns. */
function fits(f: string[], width: number): boolean {
  return f.every((line) => columns(line) <= width);
}

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

/**
 * `runlock ls --watch ARGS` in a terminal of `rows` x `cols`, run in
 * `cwd` (so that a relative directory names the paths shown).
 */
function watching(
  cwd: string,
  rows: number,
  cols: number,
  args: string[],
): Terminal {
  return new Terminal([
    "sh",
    "-c",
    `cd "$1" && stty rows ${rows} cols ${cols} && shift && exec "$@"`,
    "sh",
    cwd,
    ...runlock,
    "ls",
    "--watch",
    ...args,
  ]);
}

/**
 * Holders of `locks` (path under `dir`, command), in the table's order,
 * and `runlock ls --watch --recursive var/state` in `dir` at a terminal of
 * 24 x `cols`; `body` gets them, and everything is ended after it.
 */
async function table(
  locks: [string, string][],
  cols: number,
  body: (term: Terminal, dir: string) => Promise<void>,
): Promise<void> {
  const { dir, cleanup } = tempDir();
  const holders: Child[] = [];
  let term: Terminal | undefined;
  try {
    for (const [path, cmd] of locks) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      holders.push(await holding(join(dir, path), cmd));
    }
    term = watching(dir, 24, cols, ["--recursive", "var/state"]);
    await body(term, dir);
  } finally {
    await term?.close();
    for (const h of holders) await h.kill();
    cleanup();
  }
}

/** The title of table()'s watch, with `n` locks and no change yet. */
const TITLE = (n: number) =>
  `runlock ls --watch --recursive var/state  ·  ${n} locks`;

/**
 * The frame of `rows` lock rows fitting `width` columns (after a resize
 * to it, unless it is the first width), as its header's cells and each
 * row's cells; `at` names it in messages.
 */
async function at(
  term: Terminal,
  width: number,
  rows: number,
  resize: boolean,
): Promise<{ f: string[]; header: string[]; cells: string[][]; at: string }> {
  const mark = term.output.length;
  if (resize) term.resize(24, width);
  const f = await frame(
    term,
    (f) => f.length === 2 + rows && fits(f, width),
    `${rows} rows in ${width} columns`,
    resize ? mark : 0,
  );
  return {
    f,
    header: f[1].split(/ {2,}/),
    cells: f.slice(2).map((l) => l.split(/ {2,}/)),
    at: `at ${width} columns:\n${f.join("\n")}`,
  };
}

/**
 * The lines of the frames drawn whole, with their escapes: each line as
 * sent, between the frame's start and its erase-below.
 */
function rawLines(output: string): string[] {
  return output.split(HOME).slice(1).filter((f) => f.includes(END)).flatMap(
    (f) => f.split(END)[0].split(/\r*\n/),
  );
}

describe("runlock ls --watch on a narrow terminal", () => {
  test("a line that fills the width keeps its last column: no erase to the line's end follows it (with wrapping off, the cursor stays on that column and the erase would take its character)", async () => {
    const path = "var/state/nightly/deploy-the-widths.lock";
    await table([[path, "./deploy.sh"]], 30, async (term) => {
      const f = await frame(
        term,
        (f) => f.length === 3 && f[2].endsWith("widths.lock"),
        "the row ending with its path's end",
      );
      assert.ok(fits(f, 30), f.join("\n"));
      const full = rawLines(term.output).filter((l) =>
        // deno-lint-ignore no-control-regex -- the escapes are the point
        columns(l.replace(/\x1b\[[0-9;?]*[A-Za-z]/g, "")) === 30
      );
      assert.ok(full.length > 0, "no line filled the width");
      for (const line of full) {
        assert.ok(!line.endsWith("\x1b[K"), JSON.stringify(line));
      }
    });
  });

  test("every line fits the width in terminal columns (a CJK character two, a combining accent none), from 60 columns down to 16: cut with '…', not wrapped, and never inside a surrogate pair (𠮷) or a combining sequence (é)", async () => {
    // In the table's order; the widest is 38 columns, 36 code points.
    const paths = [
      "var/state/build.lock",
      "var/state/cafe\u0301s/deploy.lock",
      "var/state/nightly/日本語𠮷-report.lock",
    ];
    const title = TITLE(3);
    await table(
      [
        [paths[0], "make build --jobs=4"],
        [paths[1], "./deploy.sh"],
        [paths[2], "./report.sh --since=monday"],
      ],
      60,
      async (term) => {
        // 21 and 22: the cut falls by '𠮷' and by 'é'.
        for (const width of [60, 45, 40, 33, 28, 24, 22, 21, 20, 16]) {
          const t = await at(term, width, 3, width !== 60);
          // The title whole, or cut with "…" at the edge.
          if (columns(title) <= width) assert.equal(t.f[0], title, t.at);
          else assert.equal(t.f[0], title.slice(0, width - 1) + "…", t.at);
          for (const [i, cells] of t.cells.entries()) {
            assert.equal(cells.length, t.header.length, t.at);
            assert.equal(cells[0], "held", t.at);
            const shown = cells.at(-1)!;
            if (shown === paths[i]) continue;
            // "…" and an end of the path, from a character's start: a
            // surrogate cut in two would show as U+FFFD, a mark cut from its
            // letter would start the end.
            assert.ok(shown.startsWith("…"), `cut with '…' ${t.at}`);
            const kept = shown.slice(1);
            assert.ok(paths[i].endsWith(kept), `'${kept}' ends it ${t.at}`);
            assert.ok(!/^\p{M}/u.test(kept), `not inside 'é' ${t.at}`);
            assert.ok(!kept.includes("\ufffd"), `not inside '𠮷' ${t.at}`);
            // As much as the line has room for (a wide character that
            // would straddle the edge goes whole).
            assert.ok(columns(t.f[2 + i]) >= width - 1, `fills it ${t.at}`);
          }
          if (width === 24) {
            assert.deepEqual(t.cells.map((cells) => cells.at(-1)), [
              "…state/build.lock",
              "…afe\u0301s/deploy.lock",
              "…語𠮷-report.lock",
            ], t.at);
          }
        }
        assert.ok(!term.output.includes("\ufffd"), "no character cut in two");
      },
    );
  });

  test("at 100, 60, 40 and 23 columns the path is the last column to go: the command is cut first, then host, command, since and pid are dropped in that order while the whole path does not fit; then the path is cut from its start, keeping its end ('…/state/run.lock')", async () => {
    // In the table's order: 28 and 41 columns.
    const paths = [
      "var/state/app/state/run.lock",
      "var/state/deployments/production/run.lock",
    ];
    await table(
      [
        [paths[0], "./nightly.sh"],
        [paths[1], "./deploy.sh --env=production --all --verbose --notify=ops"],
      ],
      100,
      async (term) => {
        for (const width of [100, 60, 40, 24]) {
          const t = await at(term, width, 2, width !== 100);
          assert.equal(t.header[0], "STATE", t.at);
          assert.equal(t.header.at(-1), "PATH", t.at);
          // The columns gone: the first of host, command, since, pid.
          const gone = HEADER.filter((h) => !t.header.includes(h));
          assert.deepEqual(
            new Set(gone),
            new Set(["HOST", "COMMAND", "SINCE", "PID"].slice(0, gone.length)),
            `columns dropped in order ${t.at}`,
          );
          const shown = t.cells.map((cells) => cells.at(-1));
          if (width === 100) {
            // The command cut from its end, the paths whole.
            assert.deepEqual(shown, paths, t.at);
            const command = t.header.indexOf("COMMAND");
            assert.ok(command > 0, t.at);
            assert.match(t.cells[1][command], /^\.\/deploy\.sh .*…$/, t.at);
          } else if (width === 60) {
            // STATE, PID (at most 7 digits), PATH and their gaps: 57 at most.
            assert.deepEqual(shown, paths, `the paths whole ${t.at}`);
            assert.ok(t.header.includes("PID"), t.at);
          } else {
            // Cut from the start only once nothing else is left.
            assert.deepEqual(t.header, ["STATE", "PATH"], t.at);
            const room = width - "STATE  ".length;
            assert.deepEqual(
              shown,
              paths.map((p) => p.length <= room ? p : "…" + p.slice(1 - room)),
              t.at,
            );
          }
        }
        const last = await at(term, 23, 2, true);
        assert.deepEqual(last.cells, [
          ["held", "…/state/run.lock"],
          ["held", "…uction/run.lock"],
        ], last.at);
      },
    );
  });

  test("a short terminal: the last line counts the locks not shown ('… 5 more' with 5 locks and no row shown), not the lines; one line shows the title, which counts them all", async () => {
    const { dir, cleanup } = tempDir();
    const holders: Child[] = [];
    let term: Terminal | undefined;
    try {
      mkdirSync(join(dir, "locks"));
      for (const n of [1, 2, 3, 4, 5]) {
        holders.push(
          await holding(join(dir, "locks", `job${n}.lock`), `job ${n}`),
        );
      }
      term = watching(dir, 2, 100, ["locks"]);
      const two = await frame(
        term,
        (f) => / {2}5 locks$/.test(f[0]),
        "the five locks",
      );
      assert.deepEqual(two.slice(1), ["… 5 more"], two.join("\n"));
      // [rows, the frame's lines after the title]
      const cases: [number, string[]][] = [
        [3, ["… 5 more"]],
        [4, ["<header>", "locks/job1.lock", "… 4 more"]],
        [6, [
          "<header>",
          "locks/job1.lock",
          "locks/job2.lock",
          "locks/job3.lock",
          "… 2 more",
        ]],
        [7, ["<header>", ...[1, 2, 3, 4, 5].map((n) => `locks/job${n}.lock`)]],
        [1, []],
      ];
      for (const [rows, expected] of cases) {
        const mark = term.output.length;
        term.resize(rows, 100);
        const f = await frame(
          term,
          (f) => f.length === 1 + expected.length,
          `${rows} lines`,
          mark,
        );
        assert.equal(f[0], "runlock ls --watch locks  ·  5 locks");
        const seen = f.slice(1).map((l) =>
          l.startsWith("STATE")
            ? "<header>"
            : l.startsWith("held ")
            ? l.split(/ {2,}/).at(-1)!
            : l
        );
        assert.deepEqual(seen, expected, `${rows} rows:\n${f.join("\n")}`);
      }
    } finally {
      await term?.close();
      for (const h of holders) await h.kill();
      cleanup();
    }
  });
});

// --db: against the server of RUNLOCK_TEST_PG_URL or a throwaway cluster,
// as tests/cli/ls_watch_test.ts does (skipped loudly without PostgreSQL).
const testable = cliPgTestable("ls --watch --db on a narrow terminal");

describe("runlock ls --watch --db on a narrow terminal", {
  skip: !testable,
}, () => {
  let cluster: Cluster;
  before(async () => {
    cluster = await startCluster();
  });
  after(() => cluster?.stop());

  test("the PostgreSQL table heads its last column NAME, not PATH, and a long name is cut from its start, keeping its end", async () => {
    const { dir, cleanup } = tempDir();
    const prefix = `narrow/${process.pid}-${Date.now().toString(36)}/`;
    const name = `${prefix}sync/eu-west/nightly-report`;
    const done = join(dir, "done");
    let run: Background | undefined;
    let term: Terminal | undefined;
    try {
      run = start(
        "run",
        `--db=${cluster.url}`,
        name,
        "--",
        "sh",
        "-c",
        'echo ready; while [ ! -e "$1" ]; do sleep 0.05; done',
        "sh",
        done,
      );
      await run.line(/^ready$/);
      term = watching(dir, 24, 120, [
        "--interval=50",
        `--db=${cluster.url}`,
        prefix,
      ]);
      const wide = await frame(
        term,
        (f) => f.length === 3 && f[2].startsWith("held "),
        "the lock",
      );
      assert.deepEqual(wide[1].split(/ {2,}/), [...HEADER.slice(0, 5), "NAME"]);
      assert.equal(wide[2].split(/ {2,}/).at(-1), name);
      const mark = term.output.length;
      term.resize(24, 31);
      const narrow = await frame(
        term,
        (f) => f.length === 3 && fits(f, 31),
        "the lock in 31 columns",
        mark,
      );
      assert.deepEqual(narrow[1].split(/ {2,}/), ["STATE", "NAME"]);
      const shown = narrow[2].split(/ {2,}/).at(-1)!;
      assert.ok(shown.startsWith("…"), narrow.join("\n"));
      assert.ok(shown.endsWith("/eu-west/nightly-report"), narrow.join("\n"));
    } finally {
      writeFileSync(done, "");
      await term?.close();
      await run?.kill();
      cleanup();
    }
  });
});
