// The README and docs/*.md, exactly as written: their command lines and
// programs, taken from the documents themselves (tests/_readme.ts) and run
// as a reader would, with Deno from npm on the PATH only as the README's
// "Install" line puts it there. (The README's npm lines and its Node
// example are run by scripts/test_npm.ts; the demo line by
// tests/docs/first_run_test.ts; the Node forms of the docs below, on each Node
// version, by the npm build's run of this file.)
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { hostname, tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  blocks,
  commandLines,
  docBlock,
  documents,
  readmeBlock,
  root,
} from "../_readme.ts";
import { holder, runtime, waitFor } from "../_helpers.ts";
import { Reads } from "../_cli.ts";
import { pgLocks, pgSetupSql } from "../../src/postgres/mod.ts";
import {
  type Cluster,
  psql,
  psqlPath,
  startCluster,
} from "../fixtures/pg_cluster.ts";
import { pgServerAvailable } from "../fixtures/pg_available.ts";

const hasPg = pgServerAvailable;

/** PATH without any directory that holds a `deno`: a machine without Deno. */
function pathWithoutDeno(): string {
  return (process.env.PATH ?? "").split(delimiter).filter((d) =>
    d !== "" && !existsSync(join(d, "deno"))
  ).join(delimiter);
}

/** The environment of a shell that ran the README's "Install" PATH line. */
let readerEnv: Record<string, string> = {};

function sh(line: string, cwd: string, env = readerEnv) {
  const r = spawnSync("sh", ["-c", line], { cwd, env, encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A line started in the background, with its output collected. */
function background(
  line: string,
  cwd: string,
  env = readerEnv,
  { group = false } = {},
) {
  // exec, so that the handle is the command's; through env(1) when the
  // line starts with an assignment (VAR=value cmd), which exec refuses.
  // With `group`, in a process group of its own, as a terminal runs a
  // command: `interrupt()` is then its Ctrl-C, which reaches every process
  // of the group (npx and what it started), not the first one alone.
  const command = /^\w+=/.test(line) ? `exec env ${line}` : `exec ${line}`;
  const child: ChildProcess = spawn("sh", ["-c", command], {
    cwd,
    env,
    stdio: ["ignore", "pipe", "pipe"],
    detached: group,
  });
  const out = { stdout: "", stderr: "" };
  child.stdout!.on("data", (d) => (out.stdout += d));
  child.stderr!.on("data", (d) => (out.stderr += d));
  const exited = new Promise<number | null>((resolve) =>
    child.on("close", (code) => resolve(code))
  );
  const interrupt = () => {
    assert.ok(group, "interrupt() is for a command run with { group: true }");
    process.kill(-child.pid!, "SIGINT");
  };
  return { child, out, exited, interrupt };
}

/** A clone next to a project (`../runlock`), as the README lays them out. */
function project(): { work: string; dir: string; cleanup: () => void } {
  const work = mkdtempSync(join(tmpdir(), "runlock-docs-"));
  symlinkSync(root, join(work, "runlock"));
  const dir = join(work, "project");
  mkdirSync(dir);
  const config = readmeBlock("deno-json");
  assert.equal(config.lang, "json");
  writeFileSync(join(dir, "deno.json"), config.text);
  return {
    work,
    dir,
    cleanup: () => rmSync(work, { recursive: true, force: true }),
  };
}

/** npm's global prefix of the reader's shell, where the README puts `deno`. */
let npmPrefix = "";

/**
 * A new terminal: a login shell with nothing of this one's environment, HOME
 * a fresh directory whose ~/.profile puts npm's global bin `bin` on the PATH
 * (as a reader's setup does for npm's bin: /etc/profile resets PATH to the
 * system's directories, where a system Node's npm puts it).
 */
function newShell(line: string, bin: string, home: string) {
  mkdirSync(home, { recursive: true });
  writeFileSync(join(home, ".profile"), `PATH="${bin}:$PATH"\n`);
  const r = spawnSync("env", [
    "-i",
    `HOME=${home}`,
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "bash",
    "-lc",
    line,
  ], { encoding: "utf8" });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * Runs a `deno install -g --root "$(npm prefix -g)" --name runlock …` line
 * of the docs with npm's global prefix in `work` (never the reader's), which
 * holds a link to the reader's `deno` as npm's global bin would, and returns
 * an environment whose PATH has that bin, and the bin.
 */
function install(line: string, cwd: string, work: string) {
  assert.match(
    line,
    /^deno install -g (-f )?--root "\$\(npm prefix -g\)" --name runlock .*src\/cli\.ts$/,
  );
  const prefix = join(work, "npm-global");
  const bin = join(prefix, "bin");
  mkdirSync(bin, { recursive: true });
  symlinkSync(join(npmPrefix, "bin", "deno"), join(bin, "deno"));
  const env = {
    ...readerEnv,
    NPM_CONFIG_PREFIX: prefix,
    PATH: `${bin}${delimiter}${readerEnv.PATH}`,
  };
  const r = sh(line, cwd, env);
  assert.equal(r.code, 0, r.stderr);
  assert.ok(existsSync(join(bin, "runlock")), r.stderr);
  return { env, bin };
}

/**
 * The README's "CLI in brief" lines (run, status, ls, wait), in `dir` with
 * `env`: run holds the lock while ./sync.sh waits for a file named done,
 * status and ls show it, wait waits, and both end once done appears.
 */
async function cliBrief(
  [run, status, ls, wait]: string[],
  dir: string,
  env: Record<string, string>,
): Promise<void> {
  const host = hostname();
  const guarded = background(run, dir, env);
  await waitFor(() => guarded.out.stdout.includes("syncing"), "run");
  const held = sh(status, dir, env);
  assert.equal(held.code, 0, held.stderr);
  assert.match(
    held.stdout,
    new RegExp(`^held by pid \\d+ on ${host} since .*: \\./sync\\.sh\\n$`),
  );
  const listed = sh(ls, dir, env);
  assert.equal(listed.code, 0, listed.stderr);
  assert.match(
    listed.stdout,
    new RegExp(
      `^held +\\d+ +${host} +.* \\./sync\\.sh +\\.state/run\\.lock$`,
      "m",
    ),
  );
  // `wait` has begun waiting once it has read the held lock file.
  const reads = await Reads.watch(
    join(dir, ".state", "run.lock"),
    join(dir, "mark"),
  );
  const waiting = background(wait, dir, env);
  try {
    await reads.reads(1);
  } finally {
    await reads.stop();
  }
  assert.equal(waiting.child.exitCode, null, "wait returned while held");
  writeFileSync(join(dir, "done"), "");
  assert.equal(await guarded.exited, 0, guarded.out.stderr);
  assert.equal(await waiting.exited, 0, waiting.out.stderr);
}

const SYNC_SH =
  "#!/bin/sh\necho syncing\nwhile [ ! -e done ]; do sleep 0.05; done\n";

describe("the documents", { skip: runtime !== "deno" }, () => {
  test("every code block of the README and docs/*.md is marked, and each marker is run by a test", () => {
    const sources = [
      ...["tests", "scripts"].flatMap((d) =>
        spawnSync("git", ["ls-files", "-co", "--exclude-standard", d], {
          cwd: root,
          encoding: "utf8",
        }).stdout.split("\n").filter((f) => f.endsWith(".ts"))
      ),
    ].filter((f) => f !== "tests/_readme.ts")
      .map((f) => readFileSync(join(root, f), "utf8")).join("\n");
    const docs = documents();
    assert.ok(docs.length > 1, "docs/ holds the guides");
    const unmarked: string[] = [];
    const untested: string[] = [];
    for (const file of docs) {
      for (const b of blocks(file)) {
        if (b.marker === undefined) unmarked.push(`${file}:${b.line}`);
        else if (!sources.includes(`"${b.marker}"`)) {
          untested.push(`${file}:${b.line} (${b.marker})`);
        }
      }
    }
    assert.deepEqual(unmarked, [], "blocks without a test marker");
    assert.deepEqual(untested, [], "markers no test names");
  });

  test("the README is a front door: under 250 lines, saying first what runlock is and for whom, linking each guide", () => {
    const readme = readFileSync(join(root, "README.md"), "utf8");
    const lines = readme.split("\n");
    assert.ok(lines.length <= 250, `${lines.length} lines`);
    const top = lines.slice(0, 6).join(" ");
    assert.match(top, /lock library/);
    assert.match(top, /`runlock` command/);
    assert.match(top, /Deno, Node\.js and Bun/);
    for (const file of documents().slice(1)) {
      assert.ok(readme.includes(`](${file})`), `README links ${file}`);
    }
    assert.match(readme, /\[PROTOCOL\.md\]\(PROTOCOL\.md\) is the reference/);
  });

  test("the documents speak to users: no notes to ourselves, no goals as PASS/MISS", () => {
    const phrases = [
      /PASS\/MISS/,
      /\bmeasured here\b/i,
      /\bhere, median\b/,
      /this VM/i,
      /while other test suites were running/i,
      /the machines this was built/i,
      /what the gap is made of/i,
      /amendments this implementation/i,
      /\bissue \d+\b/i,
      /src\/_attempt\.ts/,
      /\bGoals met\b/,
      /\bMissed\b/,
    ];
    const found: string[] = [];
    for (const file of [...documents(), "PROTOCOL.md"]) {
      const text = readFileSync(join(root, file), "utf8");
      if (file === "PROTOCOL.md") {
        if (/closing note/i.test(text)) found.push(`${file}: closing note`);
        continue;
      }
      for (const p of phrases) if (p.test(text)) found.push(`${file}: ${p}`);
    }
    assert.deepEqual(found, []);
  });
});

describe("the documents and the first release", {
  skip: runtime !== "deno",
}, () => {
  test("no document speaks of releases before the first (0.1.0 is unreleased)", () => {
    const changelog = readFileSync(join(root, "CHANGELOG.md"), "utf8");
    assert.match(changelog, /^## 0\.1\.0 \(unreleased\)$/m);
    assert.equal(changelog.match(/^## /gm)?.length, 1, "one version so far");
    const phrases = [
      /\bolder (runlock|releases?|versions?)\b/i,
      /\bearlier (releases?|versions?)\b/i,
      /\bprevious (releases?|versions?)\b/i,
      /\bolder and newer holders\b/i,
    ];
    const found: string[] = [];
    for (const file of [...documents(), "PROTOCOL.md"]) {
      const text = readFileSync(join(root, file), "utf8");
      for (const p of phrases) if (p.test(text)) found.push(`${file}: ${p}`);
    }
    assert.deepEqual(found, []);
  });
});

/**
 * The reader's npm prefix and home (see the README's "Install" block),
 * which the later describes' lines run with (readerEnv): removed once
 * the file's tests are done, not when the describe that made it is.
 */
let scratch = "";
after(() => {
  if (scratch) rmSync(scratch, { recursive: true, force: true });
});

describe("the README and docs, run as written (Deno)", {
  skip: runtime !== "deno",
}, () => {
  before(() => {
    // The README's "Install" line, in a shell whose PATH has no deno, with
    // npm's global prefix in a directory of the test's own, on that PATH as
    // npm's global bin is on a reader's.
    scratch = mkdtempSync(join(tmpdir(), "runlock-reader-"));
    npmPrefix = join(scratch, "npm-global");
    const base = {
      ...process.env as Record<string, string>,
      NPM_CONFIG_PREFIX: npmPrefix,
      PATH: `${join(npmPrefix, "bin")}${delimiter}${pathWithoutDeno()}`,
      NO_COLOR: "1",
    };
    assert.notEqual(
      spawnSync("sh", ["-c", "command -v deno"], { env: base }).status,
      0,
      "the test starts from a PATH without deno",
    );
    for (const line of commandLines(readmeBlock("deno-path"))) {
      const r = spawnSync("sh", ["-c", line], { env: base, encoding: "utf8" });
      assert.equal(r.status, 0, r.stderr);
    }
    readerEnv = base;
    const deno = spawnSync("sh", ["-c", "deno --version"], {
      env: readerEnv,
      encoding: "utf8",
    });
    assert.match(
      deno.stdout,
      /^deno 2\.9\.6 /,
      "the line puts Deno 2.9.6 on PATH",
    );
    // `deno` is Deno itself, not npm's Node launcher (whose pid a signal
    // would reach instead of Deno's).
    const self = spawnSync(
      "sh",
      ["-c", `echo $$; exec deno eval "console.log(Deno.pid)"`],
      { env: readerEnv, encoding: "utf8" },
    );
    const [shell, denoPid] = self.stdout.trim().split("\n");
    assert.equal(denoPid, shell, "deno runs as the process that ran it");
    // ... and a new terminal finds it.
    const home = join(scratch, "home");
    const again = newShell("deno --version", join(npmPrefix, "bin"), home);
    assert.equal(again.code, 0, `a new shell: ${again.stderr}`);
    assert.match(again.stdout, /^deno 2\.9\.6 /);
  });

  test("Quick start: two processes with the README's deno.json, program and deno run line; the second is refused with the first one's pid and exits 75", async () => {
    const { dir, cleanup } = project();
    try {
      writeFileSync(join(dir, "main.ts"), readmeBlock("quick-start").text);
      const [line] = commandLines(readmeBlock("deno-run"));
      assert.match(line, /^deno run .* main\.ts$/);
      // docs/permissions.md gives the same line for a holder.
      assert.deepEqual(
        commandLines(docBlock("permissions.md", "perm-holder")),
        [line],
      );
      const first = background(line, dir);
      try {
        await waitFor(
          () => /working as pid \d+/.test(first.out.stdout),
          `the first run: ${first.out.stderr}`,
        );
        const pid = first.out.stdout.match(/working as pid (\d+)/)![1];
        const second = sh(line, dir);
        assert.equal(second.code, 75, second.stderr);
        assert.match(
          second.stderr,
          new RegExp(
            `^\\.state/run\\.lock: another run is active as pid ${pid} on ${hostname()}; wait for it or stop it\\n$`,
          ),
        );
        // The record is as docs/api.md shows it, line by line.
        const record = readFileSync(join(dir, ".state", "run.lock"), "utf8")
          .split("\n");
        const shown = docBlock("api.md", "record-format").text.trimEnd()
          .split("\n");
        assert.equal(shown[0], "4242");
        assert.equal(record[0], pid);
        for (const [i, l] of shown.entries()) {
          const key = l.split("=")[0];
          if (i === 0) continue;
          if (!l.includes("=")) assert.equal(record[i], l);
          else assert.ok(record[i].startsWith(`${key}=`), `${record[i]}`);
        }
        assert.equal(record[2], `host=${hostname()}`);
        assert.equal(record[4], "runtime=deno");
      } finally {
        first.child.kill("SIGTERM");
        await first.exited;
      }
    } finally {
      cleanup();
    }
  });

  test("docs/api.md: each program runs as written, with type checking, in a project mapped to the clone", () => {
    const { dir, cleanup } = project();
    try {
      for (
        const name of [
          "api-wait",
          "api-probes",
          "api-signal",
          "api-meta",
          "api-scan",
          "api-watch",
        ]
      ) {
        const block = docBlock("api.md", name);
        assert.equal(block.lang, "ts", name);
        writeFileSync(join(dir, `${name}.ts`), block.text);
        // Type-checked by `deno check --doc-only docs/*.md` (deno task check).
        const r = sh(`deno run --quiet -A ${name}.ts`, dir);
        assert.equal(r.code, 0, `${name}: ${r.stderr}`);
        assert.equal(r.stderr, "", name);
      }
      // The status program of docs/permissions.md, with its line.
      writeFileSync(
        join(dir, "status.ts"),
        docBlock("api.md", "api-probes").text,
      );
      const [line] = commandLines(docBlock("permissions.md", "perm-probe"));
      assert.match(line, /^deno run .* status\.ts$/);
      const r = sh(line, dir);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /^no run is active\n/);
    } finally {
      cleanup();
    }
  });

  test("the runlock command: the README's deno install line, then the README's and docs/cli.md's command lines (run, status, --json, a refused run, ls, wait)", async () => {
    const { work, dir, cleanup } = project();
    try {
      const [installLine] = commandLines(readmeBlock("deno-install-cli"));
      assert.deepEqual(
        commandLines(docBlock("permissions.md", "perm-cli")),
        [installLine],
      );
      const { env, bin } = install(installLine, dir, work);
      // A new terminal finds the command, and the command finds Deno.
      const home = join(work, "home");
      const version = newShell("runlock --version", bin, home);
      assert.equal(version.code, 0, `a new shell: ${version.stderr}`);
      assert.match(version.stdout, /\b\d+\.\d+\.\d+\b/);
      writeFileSync(join(dir, "sync.sh"), SYNC_SH, { mode: 0o755 });
      const [run, status, ls, wait] = commandLines(readmeBlock("cli-brief"));
      assert.match(run, /^runlock run \.state\/run\.lock -- \.\/sync\.sh /);
      const host = hostname();

      await cliBrief([run, status, ls, wait], dir, env);
      rmSync(join(dir, "done"));

      // docs/cli.md's session.
      const session = commandLines(docBlock("cli.md", "cli-session"));
      assert.equal(session.length, 6);
      const holderLine = session[0].replace(/\s*&$/, "");
      const first = background(holderLine, dir, env);
      await waitFor(() => first.out.stdout.includes("syncing"), "run --meta");
      const s = sh(session[1], dir, env);
      assert.equal(s.code, 0, s.stderr);
      assert.match(
        s.stdout,
        new RegExp(
          `^held by pid (\\d+) on ${host} since .*: \\./sync\\.sh --full\\n  job=42\\n$`,
        ),
      );
      const json = JSON.parse(sh(session[2], dir, env).stdout);
      assert.equal(json.state, "held");
      assert.deepEqual(json.meta, { cmd: "./sync.sh --full", job: "42" });
      const refused = sh(session[3], dir, env);
      assert.equal(refused.code, 75);
      assert.equal(
        refused.stderr,
        `runlock: .state/run.lock: another run is active as pid ${json.pid} on ${host}; wait for it or stop it\n`,
      );
      assert.match(
        sh(session[4], dir, env).stdout,
        /^held .*\.state\/run\.lock$/m,
      );
      const waited = background(session[5], dir, env);
      writeFileSync(join(dir, "done"), "");
      assert.equal(await first.exited, 0, first.out.stderr);
      assert.equal(await waited.exited, 0, waited.out.stderr);
      assert.equal(existsSync(join(dir, ".state", "run.lock")), false);
    } finally {
      cleanup();
    }
  });

  test("docs/signals.md: without a handler SIGTERM leaves a stale file; the documented pattern releases, so status reads free", async () => {
    const { dir, cleanup } = project();
    const path = join(dir, ".state", "run.lock");
    const status = `deno run --allow-read ${
      join(root, "src", "cli.ts")
    } status ${path}`;
    try {
      const plain = await holder(path);
      await plain.kill("SIGTERM");
      assert.equal(existsSync(path), true, "the file stays");
      assert.match(
        sh(status, dir).stdout,
        /^stale: last holder pid \d+ is gone/,
      );
      rmSync(path);

      const block = docBlock("signals.md", "release-on-signals");
      assert.equal(block.lang, "ts");
      // The program, unchanged, imported by a main module that says when
      // its top level (acquire, then the listeners) has run.
      writeFileSync(join(dir, "doc.ts"), block.text);
      writeFileSync(
        join(dir, "main.ts"),
        'import "./doc.ts";\nconsole.log("listening");\n',
      );
      for (
        const [signal, code] of [["SIGTERM", 143], ["SIGINT", 130]] as const
      ) {
        const program = background(
          "deno run --quiet --allow-read=.state --allow-write=.state main.ts",
          dir,
        );
        await waitFor(() => program.out.stdout.includes("listening\n"), signal);
        assert.equal(existsSync(path), true, "it holds the lock");
        // process.kill of our own child's PID (it runs: it just said so):
        // Deno's ChildProcess.kill reports an exit by the signal at once.
        process.kill(program.child.pid!, signal);
        assert.equal(await program.exited, code, signal);
        assert.equal(existsSync(path), false, `released on ${signal}`);
        assert.equal(sh(status, dir).stdout, "free\n");
      }
    } finally {
      cleanup();
    }
  });

  test("docs/cli.md: lslocks shows a holder's lock as the temp file's name, deleted, with the lock file's inode", async () => {
    const { dir, cleanup } = project();
    const path = join(dir, ".state", "run.lock");
    try {
      const shown = docBlock("cli.md", "lslocks").text.trimEnd().split("\n");
      assert.match(shown[0], /^\$ lslocks /);
      assert.match(
        shown[2],
        /^deno +4242 FLOCK WRITE \S*\/\.state\/\.run\.lock\.[0-9a-f]+\.tmp \(deleted\)$/,
      );
      const child = await holder(path);
      try {
        const pid = child.proc.pid!;
        const ino = statSync(path).ino;
        const locks = readFileSync("/proc/locks", "utf8").split("\n")
          .filter((l) =>
            / FLOCK +ADVISORY +WRITE /.test(l) && l.includes(` ${pid} `)
          );
        assert.equal(locks.length, 1, locks.join("\n"));
        assert.equal(Number(locks[0].split(/\s+/)[5].split(":")[2]), ino);
        const lslocks = sh(shown[0].slice(2), dir);
        if (lslocks.code === 127) return; // not installed: /proc/locks said it
        assert.equal(lslocks.code, 0, lslocks.stderr);
        const words = (l: string) => l.trim().split(/\s+/);
        assert.deepEqual(words(lslocks.stdout.split("\n")[0]), words(shown[1]));
        const row = lslocks.stdout.split("\n").find((l) =>
          new RegExp(`^\\S+ +${pid} +FLOCK `).test(l)
        );
        assert.ok(row, lslocks.stdout);
        assert.match(
          row,
          new RegExp(
            `FLOCK WRITE ${
              dirname(path).replaceAll(".", "\\.")
            }/\\.run\\.lock\\.[0-9a-f]+\\.tmp \\(deleted\\)$`,
          ),
        );
      } finally {
        await child.kill();
      }
    } finally {
      cleanup();
    }
  });
});

/** A database and a role of this test's own on the test server. */
function pgTarget(cluster: Cluster) {
  const tag = `docs_${process.pid}_${Date.now().toString(36)}`;
  psql(cluster.url, `CREATE DATABASE ${tag}`);
  psql(cluster.url, `CREATE ROLE ${tag} LOGIN`);
  const at = (user: string, db: string) => {
    const u = new URL(cluster.url);
    u.username = user;
    u.pathname = `/${db}`;
    return u.toString();
  };
  return {
    tag,
    owner: at(new URL(cluster.url).username || "postgres", tag),
    app: at(tag, tag),
    hostPort: `${cluster.host}:${cluster.port}`,
  };
}

/** The docs' placeholders, for this server and role. */
function placeholders(text: string, t: ReturnType<typeof pgTarget>): string {
  return text
    .replaceAll("postgres://app@db-host/app", t.app)
    .replaceAll("postgres://owner@db-host/app", t.owner)
    .replaceAll("db-host:5432", t.hostPort);
}

describe("docs/postgres.md and its permissions, run as written (Deno)", {
  skip: runtime !== "deno" || !hasPg,
}, () => {
  let cluster: Cluster;
  let t: ReturnType<typeof pgTarget>;
  before(async () => {
    cluster = await startCluster();
    t = pgTarget(cluster);
  });
  after(() => cluster?.stop());

  test("the DBA's SQL is what runlock db-setup prints; run once as the owner, it lets a role that may create nothing take, inspect and release locks", async () => {
    const sql = docBlock("postgres.md", "pg-setup-sql").text;
    const statements = (text: string) =>
      text.split("\n").filter((l) => !l.startsWith("--")).join("\n")
        .replace(/\s+/g, " ").trim();
    assert.equal(statements(sql), statements(pgSetupSql({ role: "app" })));
    // Without it, the role cannot create the table (PostgreSQL 15+).
    const before = pgLocks(t.app);
    await assert.rejects(before.acquire("sync/main"), /GRANT CREATE ON SCHEMA/);
    await before.end();
    psql(t.owner, sql.replaceAll('"app"', `"${t.tag}"`));
    const locks = pgLocks(t.app);
    const lock = await locks.acquire("sync/main");
    assert.equal((await locks.inspect("sync/main")).state, "held");
    await lock.release();
    await locks.end();
  });

  test("the Deno example and its deno run line: the fence printed, the lock released, no prompt, no warning", () => {
    const { dir, cleanup } = project();
    try {
      writeFileSync(
        join(dir, "pg.ts"),
        placeholders(docBlock("postgres.md", "pg-deno").text, t),
      );
      const [line] = commandLines(docBlock("permissions.md", "perm-pg"));
      assert.match(line, /^deno run .* pg\.ts$/);
      const r = sh(placeholders(line, t), dir);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stderr, "");
      assert.match(r.stdout, /^\d+n\n/);
      assert.match(r.stdout, /state: "held"/);
    } finally {
      cleanup();
    }
  });

  test("docs/postgres.md: scan lists the held name, watch reports it present, then released once the example lets go, then the loop ends", () => {
    const { dir, cleanup } = project();
    try {
      writeFileSync(
        join(dir, "pg.ts"),
        placeholders(docBlock("postgres.md", "pg-watch").text, t),
      );
      const [line] = commandLines(docBlock("permissions.md", "perm-pg"));
      const r = sh(placeholders(line, t), dir);
      assert.equal(r.code, 0, r.stderr);
      assert.equal(r.stderr, "");
      assert.match(
        r.stdout,
        /^held sync\/main \d+ sync\npresent sync\/main \d+\nreleased sync\/main 0\n$/,
      );
    } finally {
      cleanup();
    }
  });

  test("on the oldest Deno the README claims (2.7.1, the first 2.7 on npm), from a clone: the quick start refuses a second run with the first one's pid, and the PostgreSQL example runs", async () => {
    const readme = readFileSync(join(root, "README.md"), "utf8");
    assert.match(readme, /\*\*Deno 2\.7 or newer\.\*\*/);
    const got = spawnSync("npx", [
      "--yes",
      "deno@2.7.1",
      "eval",
      "console.log(Deno.execPath())",
    ], { encoding: "utf8", env: readerEnv });
    assert.equal(got.status, 0, got.stderr);
    const old = got.stdout.trim().split("\n").at(-1)!;
    const oldDeno = (line: string) => line.replace(/^deno /, `${old} `);
    const { dir, cleanup } = project();
    try {
      writeFileSync(join(dir, "main.ts"), readmeBlock("quick-start").text);
      const [line] = commandLines(readmeBlock("deno-run")).map(oldDeno);
      const first = background(line, dir);
      try {
        await waitFor(
          () => /working as pid \d+/.test(first.out.stdout),
          `the first run on Deno 2.7.1: ${first.out.stderr}`,
        );
        const pid = first.out.stdout.match(/working as pid (\d+)/)![1];
        const second = sh(line, dir);
        assert.equal(second.code, 75, second.stderr);
        assert.match(second.stderr, new RegExp(`active as pid ${pid} `));
      } finally {
        first.child.kill("SIGKILL");
        await first.exited;
      }
      writeFileSync(
        join(dir, "pg.ts"),
        placeholders(docBlock("postgres.md", "pg-deno").text, t),
      );
      const [pgLine] = commandLines(docBlock("permissions.md", "perm-pg"))
        .map((l) => oldDeno(placeholders(l, t)));
      const r = sh(pgLine, dir);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /^\d+n\n/);
      assert.match(r.stdout, /state: "held"/);
    } finally {
      cleanup();
    }
  });

  // The installed CLI loads pg by its full npm: specifier: `deno install
  // -g` does not take the clone's import map along.
  test(
    "the runlock command on PostgreSQL: the --db install line, db-setup piped to psql, run, status and wait",
    async () => {
      const { work, dir, cleanup } = project();
      try {
        const [installLine] = commandLines(readmeBlock("deno-install-cli-db"));
        assert.deepEqual(
          commandLines(docBlock("permissions.md", "perm-cli-db")),
          [installLine],
        );
        const { env } = install(placeholders(installLine, t), dir, work);
        const psqlBin = psqlPath();
        assert.ok(psqlBin, "psql");
        env.PATH = `${dirname(psqlBin)}${delimiter}${env.PATH}`;
        const [setup] = commandLines(docBlock("postgres.md", "pg-db-setup"));
        const s = sh(placeholders(setup, t), dir, env);
        assert.equal(s.code, 0, s.stderr);
        assert.doesNotMatch(s.stderr, /ERROR/);

        writeFileSync(join(dir, "sync.sh"), SYNC_SH, { mode: 0o755 });
        const [run, status, wait] = commandLines(docBlock("cli.md", "cli-db"))
          .map((l) => placeholders(l, t));
        const guarded = background(run.replace(/\s*&$/, ""), dir, env);
        await waitFor(
          () => guarded.out.stdout.includes("syncing"),
          `run --db (${run}): ${guarded.out.stderr} / status: ${
            JSON.stringify(sh(status, dir, env))
          }`,
          10_000,
        );
        const held = sh(status, dir, env);
        assert.equal(held.code, 0, held.stderr);
        assert.match(held.stdout, /^held by pid \d+ on .*: \.\/sync\.sh\n$/);
        // The SQL that finds the holder's session names it.
        const found = psql(
          t.app,
          docBlock("postgres.md", "pg-evict").text.replace(/\n--.*$/m, ""),
        );
        const probe = pgLocks(t.app);
        const backend = (await probe.inspect("sync/main")).backendPid;
        await probe.end();
        assert.ok(backend && found.includes(String(backend)), found);
        const waiting = background(wait, dir, env);
        writeFileSync(join(dir, "done"), "");
        assert.equal(await guarded.exited, 0, guarded.out.stderr);
        assert.equal(await waiting.exited, 0, waiting.out.stderr);
      } finally {
        cleanup();
      }
    },
  );

  test("fencing: the documented UPDATE accepts a token at or above the last one and refuses a lower one", () => {
    const update = docBlock("postgres.md", "pg-fence").text
      .replace(/--.*$/gm, "").trim().replace(/;$/, "");
    const out = psql(
      t.owner,
      `CREATE TABLE sync_state (id integer, cursor text, fence bigint);
       INSERT INTO sync_state VALUES (1, '', 0);
       PREPARE f(text, bigint) AS ${update};
       EXECUTE f('a', 7); EXECUTE f('b', 3);
       SELECT cursor || ':' || fence FROM sync_state;`,
    );
    assert.match(out, /a:7/);
  });
});

describe("the docs' Node and Bun forms, run as written", {
  skip: runtime === "deno",
}, () => {
  /** The scratch project the npm build installed the package into. */
  const scratch = (() => {
    let dir = new URL(".", import.meta.url).pathname;
    while (dir !== "/" && !existsSync(join(dir, "node_modules", "runlock"))) {
      dir = dirname(dir.replace(/\/$/, ""));
    }
    return dir;
  })();

  test(
    "README: the Node program is refused while `npx runlock run` holds the lock, naming that run's pid",
    { skip: runtime !== "node" },
    async () => {
      const dir = mkdtempSync(join(scratch, ".docs-"));
      try {
        writeFileSync(
          join(dir, "main.mjs"),
          readmeBlock("node-quick-start").text,
        );
        const [hold, node] = commandLines(readmeBlock("node-refused"));
        assert.equal(node, "node main.mjs");
        const env = {
          ...process.env as Record<string, string>,
          PATH: `${dirname(process.execPath)}${delimiter}${process.env.PATH}`,
        };
        const holding = background(hold.replace(/\s+#.*$/, ""), dir, env, {
          group: true,
        });
        const lock = join(dir, ".state", "run.lock");
        await waitFor(
          () => existsSync(lock) && readFileSync(lock, "utf8").includes("\n"),
          "npx runlock run",
        );
        const pid = readFileSync(lock, "utf8").split("\n")[0];
        const r = sh(node, dir, env);
        assert.equal(r.code, 75, r.stderr);
        assert.match(
          r.stderr,
          new RegExp(`another run is active as pid ${pid} `),
        );
        // Ctrl-C in its terminal: npx's SIGTERM alone left `runlock run`
        // and its `sleep 60` to run out their minute, holding the lock.
        holding.interrupt();
        await holding.exited;
        await waitFor(() => !existsSync(lock), "the holder's release");
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  test(
    "README: the CLI in brief through npx in a project with the package (run, status, ls, wait), on this Node",
    { skip: runtime !== "node" },
    async () => {
      const dir = mkdtempSync(join(scratch, ".docs-"));
      try {
        const env = {
          ...process.env as Record<string, string>,
          PATH: `${dirname(process.execPath)}${delimiter}${process.env.PATH}`,
        };
        writeFileSync(join(dir, "sync.sh"), SYNC_SH, { mode: 0o755 });
        const [run, status, ls, wait] = commandLines(readmeBlock("cli-brief"))
          .map((l) => `npx ${l.replace(/\s+#.*$/, "")}`);
        await cliBrief([run, status, ls, wait], dir, env);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );

  test(
    "docs/postgres.md: the Node form runs on this runtime (Node 20 included) against a real server",
    { skip: !hasPg },
    async () => {
      const cluster = await startCluster();
      const dir = mkdtempSync(join(scratch, ".docs-"));
      try {
        const t = pgTarget(cluster);
        const block = docBlock("postgres.md", "pg-node");
        writeFileSync(
          join(dir, "pg.mjs"),
          placeholders(block.text, t).replaceAll(t.app, t.owner),
        );
        const r = spawnSync(process.execPath, ["pg.mjs"], {
          cwd: dir,
          encoding: "utf8",
        });
        assert.equal(r.status, 0, r.stderr);
        assert.match(r.stdout, /^\d+n\n$/);
      } finally {
        rmSync(dir, { recursive: true, force: true });
        cluster.stop();
      }
    },
  );
});
