// `deno task test:npm`: the npm package, tested as a user gets it. Builds it
// (scripts/build_npm.ts), packs it, installs the tarball into a scratch
// project, then runs the same test suite there on Node (20, 22, 24; ESM and
// CommonJS entry points) and Bun, the cross-runtime tests, a `bun build
// --compile` single binary, publint and arethetypeswrong.
//
// Order, to stay within the time budget on 2 cores (the suites mostly wait
// on child processes, so several fit side by side):
// 1. build, pack, install, and the steps that block this process (the bun
//    --compile builds, the binary's --db check), one after another;
// 2. the suites side by side, up to RUNLOCK_NPM_JOBS (default 4) at once,
//    the longest first: each Node version's ESM set, Bun's ESM set split in
//    two `bun test` processes (Bun runs a process's files one after
//    another), the CommonJS sets, the README's Node example, the CLI tests
//    against the compiled CLI, the cross-runtime tests, publint and attw.
//    Each step's output is kept and printed whole when the step ends, under
//    a line naming it, so that the log reads one step at a time;
// 3. the tests that must not run beside the suites, after them (ALONE):
//    the PostgreSQL host-loss test and the poolers' test (races between a
//    holder's signal and the server's release, through a cut link, that a
//    loaded machine could decide the wrong way) and the error injection test (strace, each run with a deadline;
//    CPU-bound), one runtime after another.
//
// The CommonJS entry points are the very same compiled code as the ESM
// ones, bundled once more as CommonJS (import.meta.url defined from
// __filename, koffi and pg loaded through createRequire and import()).
// What the CommonJS sets check is that these entry points load and work:
// on every Node version and on Bun a subset that goes through each part
// that differs (CJS_SUBSET: the core API and its record, the FFI
// module and the *at() calls, the inotify close watcher and waiting,
// require("runlock/cli"), require("runlock/postgres") sharing
// require("runlock")'s error classes). RUNLOCK_CJS=all runs the full
// CommonJS suite everywhere.
//
// A failing step is reported and the others still run (all failures at
// once, in one CI run); only a failed build or install stops it. Exit 1 if
// any step failed.
//
// Knobs: RUNLOCK_NODE_VERSIONS (default "20,22,24"), RUNLOCK_SKIP_BUN=1,
// RUNLOCK_NPM_JOBS (steps at once in phase 2; default 4),
// RUNLOCK_CJS=all, RUNLOCK_PG_NETNS_NODE (which Node versions run the
// PostgreSQL host-loss test; default: the last of RUNLOCK_NODE_VERSIONS;
// "all", or "" for none), RUNLOCK_PG_NODE (which Node versions run the
// PostgreSQL backend's own tests and the docs' Node forms; the same default,
// "all", or "" for none: Bun runs them still), RUNLOCK_PG_CJS=all (the
// whole PostgreSQL suite with the CommonJS entry too, not only the contract
// test).
import {
  spawn,
  type SpawnOptions,
  spawnSync,
  type SpawnSyncOptions,
} from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { commandLines, readmeBlock } from "../tests/_readme.ts";
import { NPM_PINS } from "./_pins.ts";
import { startCluster } from "../tests/fixtures/pg_cluster.ts";
import { pgServerAvailable } from "../tests/fixtures/pg_available.ts";

const BUN = "1.4.5";
const PUBLINT = "0.3.25";
const ATTW = "0.18.5";

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const npmDir = join(root, "npm");
const scratch = join(npmDir, "scratch");
const results: string[] = [];
const failures: string[] = [];
const { version } = JSON.parse(
  readFileSync(join(root, "deno.json"), "utf8"),
) as { version: string };

function run(
  cmd: string,
  args: string[],
  options: SpawnSyncOptions = {},
): void {
  const started = Date.now();
  console.log(`\n$ ${cmd} ${args.join(" ")}`);
  const result = spawnSync(cmd, args, { stdio: "inherit", ...options });
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  if (result.status !== 0) {
    throw new Error(
      `FAILED (${seconds}s, exit ${result.status ?? result.signal}): ${cmd} ${
        args.join(" ")
      }`,
    );
  }
}

/** The output of a command run by `runBuffered`. */
interface Output {
  status: number | null;
  signal: NodeJS.Signals | null;
  /** stdout and stderr as they came, interleaved. */
  text: string;
  stdout: string;
  stderr: string;
}

/** Runs a command without blocking, keeping its output. */
function exec(
  cmd: string,
  args: string[],
  options: SpawnOptions = {},
): Promise<Output> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, {
      ...options,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let text = "", stdout = "", stderr = "";
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      text += d;
      stdout += d;
    });
    child.stderr!.setEncoding("utf8").on("data", (d: string) => {
      text += d;
      stderr += d;
    });
    child.on("error", (err) => {
      text += `${err}\n`;
      resolve({ status: null, signal: null, text, stdout, stderr });
    });
    child.on(
      "close",
      (status, signal) => resolve({ status, signal, text, stdout, stderr }),
    );
  });
}

/**
 * `run`, without blocking (other steps run meanwhile): the command and its
 * output go to `log`, printed when the step ends.
 */
async function runBuffered(
  log: string[],
  cmd: string,
  args: string[],
  options: SpawnOptions = {},
): Promise<void> {
  const started = Date.now();
  log.push(`$ ${cmd} ${args.join(" ")}\n`);
  const r = await exec(cmd, args, options);
  log.push(r.text);
  const seconds = ((Date.now() - started) / 1000).toFixed(1);
  if (r.status !== 0) {
    throw new Error(
      `FAILED (${seconds}s, exit ${r.status ?? r.signal}): ${cmd} ${
        args.join(" ")
      }`,
    );
  }
}

function summary(): void {
  console.log(`\nnpm package checks:\n  ${results.join("\n  ")}`);
  if (failures.length > 0) {
    console.error(`\n${failures.length} failed:\n  ${failures.join("\n  ")}`);
  }
}

/** Runs one step; a failure is recorded, and ends the run if `fatal`. */
async function step(
  name: string,
  f: () => void | Promise<void>,
  fatal = false,
): Promise<void> {
  const started = Date.now();
  const took = () => `${((Date.now() - started) / 1000).toFixed(1)}s`;
  try {
    await f();
    results.push(`${name} (${took()})`);
  } catch (err) {
    console.error(`\n${err instanceof Error ? err.message : err}`);
    results.push(`FAILED: ${name} (${took()})`);
    failures.push(name);
    if (fatal) {
      summary();
      process.exit(1);
    }
  }
}

/**
 * A step of phase 2: runs beside others; what it prints goes to its `log`,
 * printed whole, under a line naming the step, when it ends.
 */
function bufferedStep(
  name: string,
  f: (log: string[]) => Promise<void>,
): () => Promise<void> {
  return async () => {
    const log: string[] = [];
    const started = Date.now();
    console.log(`\n[started] ${name}`);
    await step(name, async () => {
      try {
        await f(log);
      } finally {
        const s = ((Date.now() - started) / 1000).toFixed(1);
        console.log(
          `\n===== ${name} (${s}s) =====\n${log.join("").trimEnd()}\n` +
            `===== end of ${name} =====`,
        );
      }
    });
  };
}

/** Runs `jobs` with at most `limit` at once, in the order given. */
async function pool(
  jobs: (() => Promise<void>)[],
  limit: number,
): Promise<void> {
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) await jobs[next++]();
  };
  await Promise.all(Array.from({ length: limit }, worker));
}

// Build, pack and install exactly as the README's "From a clone" block says
// (tests/_readme.ts reads it): its first line in the clone, its second in
// the scratch project, with the README's placeholder /path/to/runlock
// replaced by this clone.
const [packLine, installLine] = commandLines(readmeBlock("npm-from-clone"));
const tarball = join(npmDir, `runlock-${version}.tgz`);
await step(
  `README: ${packLine.replace(/\s+#.*$/, "")} (build and pack)`,
  () => {
    run("sh", ["-c", packLine], { cwd: root });
    if (!existsSync(tarball)) {
      throw new Error(`the README's pack line made no ${tarball}`);
    }
  },
  true,
);

await step(
  "the packed package.json lists only the tested platform (Linux x64) and ships the changelog",
  () => {
    const listed = spawnSync(
      "tar",
      ["-xOzf", tarball, "package/package.json"],
      {
        encoding: "utf8",
      },
    );
    if (listed.status !== 0) throw new Error(listed.stderr);
    const pkg = JSON.parse(listed.stdout);
    const want = { os: ["linux"], cpu: ["x64"] };
    const got = { os: pkg.os, cpu: pkg.cpu };
    if (JSON.stringify(got) !== JSON.stringify(want)) {
      throw new Error(
        `package.json: ${JSON.stringify(got)}, not ${JSON.stringify(want)}`,
      );
    }
    if (process.platform !== "linux" || process.arch !== "x64") {
      throw new Error(
        `the package lists Linux x64, but this test runs on ${process.platform} ${process.arch}`,
      );
    }
    const files =
      spawnSync("tar", ["-tzf", tarball], { encoding: "utf8" }).stdout;
    if (!files.split("\n").includes("package/CHANGELOG.md")) {
      throw new Error("the tarball has no CHANGELOG.md");
    }
  },
);

await step("README: npm install of the tarball into a scratch project", () => {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    JSON.stringify({ name: "scratch", private: true, type: "module" }, null, 2),
  );
  // The README's line as a user runs it. npm's only warning may be the one
  // the README explains (koffi's install script); the README's line that
  // records the choice ends it, and everything below runs on an install
  // where koffi's script never ran.
  const warnings = (line: string) => {
    console.log(`\n$ ${line}`);
    const r = spawnSync("sh", ["-c", line], { cwd: scratch, encoding: "utf8" });
    const output = r.stdout + r.stderr;
    if (r.status !== 0) {
      throw new Error(`FAILED (exit ${r.status}): ${line}\n${output}`);
    }
    // npm's warnings are shown when they are wrong (in the errors below),
    // and otherwise said in one line: the test command prints no warning.
    const found = output.split("\n").filter((l) => /^npm warn/i.test(l));
    if (found.length === 0) process.stdout.write(output);
    return found;
  };
  const first = warnings(installLine.replaceAll("/path/to/runlock", root));
  const unexplained = first.filter((l) =>
    !/^npm warn install-scripts( |$)/.test(l)
  );
  if (unexplained.length > 0) {
    throw new Error(
      `npm warned what the README does not explain:\n${first.join("\n")}`,
    );
  }
  if (first.length > 0) {
    if (!first.some((l) => /koffi@/.test(l))) {
      throw new Error(
        `an install-scripts warning not about koffi:\n${first.join("\n")}`,
      );
    }
    console.log(
      "npm's only warning: koffi's install script, which the README explains",
    );
    const [deny] = commandLines(readmeBlock("npm-deny-scripts"));
    run("sh", ["-c", deny.replace(/\s+#.*$/, "")], { cwd: scratch });
    rmSync(join(scratch, "node_modules"), { recursive: true, force: true });
    const again = warnings("npm install --no-audit --no-fund");
    if (again.length > 0) {
      throw new Error(
        `npm still warns after the README's deny line:\n${again.join("\n")}`,
      );
    }
  } else {
    console.log(
      "npm printed no install-scripts warning: the README's deny line is not needed here",
    );
  }
  // What the tests import besides runlock: pg (the optional peer the
  // PostgreSQL backend loads), fast-check (the property tests), at the
  // versions scripts/_pins.ts pins; and Bun.
  run("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    `pg@${NPM_PINS.pg}`,
    `fast-check@${NPM_PINS["fast-check"]}`,
    ...(process.env.RUNLOCK_SKIP_BUN ? [] : [`bun@${BUN}`]),
  ], { cwd: scratch });
  // The same compiled tests twice: once importing the ESM entry, once the
  // CommonJS entry (through createRequire).
  for (const entry of ["esm", "cjs"]) {
    const dir = join(scratch, `tests-${entry}`);
    cpSync(join(npmDir, "tests"), dir, { recursive: true });
    cpSync(join(dir, `_entry.${entry}.js`), join(dir, "_entry.js"));
    cpSync(join(dir, `_cli_entry.${entry}.js`), join(dir, "_cli_entry.js"));
    cpSync(
      join(dir, `_entry_postgres.${entry}.js`),
      join(dir, "_entry_postgres.js"),
    );
  }
}, true);

await step("README: the npm CLI line in the scratch project", () => {
  for (const line of commandLines(readmeBlock("npm-cli"))) {
    const r = spawnSync("sh", ["-c", line], { cwd: scratch, encoding: "utf8" });
    if (r.status !== 1 || r.stdout !== "free\n") {
      throw new Error(
        `README line '${line}': expected "free" and exit 1, got ${r.status}: ${r.stdout}${r.stderr}`,
      );
    }
  }
});

// The CLI tests run the package's bin, which is the same file whichever
// library entry the tests import: they run once per runtime, with the ESM
// set; the CommonJS set still runs cli/module_test (require("runlock/cli")).
// Test files are named by their path under tests/ (npm/tests/).
const BIN_TESTS = new Set([
  "cli/commands_test.js",
  "cli/errors_test.js",
  "cli/run_kill_test.js",
  "cli/run_tty_test.js",
  "cli/ls_watch_narrow_test.js",
  "cli/db_test.js",
  "cli/db_schema_test.js",
  "cli/ls_watch_test.js",
]);
const versions = (process.env.RUNLOCK_NODE_VERSIONS ?? "20,22,24").split(",");

// The PostgreSQL tests (tests/postgres/; each file starts its own throwaway
// cluster) cost
// about 50 s per runtime and entry, a third of it the host-loss test's wait
// for a cut link (root only). The CommonJS set runs only the contract test
// (the backend's code is the same; what differs is require("runlock/
// postgres") sharing require("runlock")'s error classes, which that test
// checks), and the host-loss test runs on Bun and one Node version.
// RUNLOCK_PG_CJS=all and RUNLOCK_PG_NETNS_NODE=all run them everywhere
// (RUNLOCK_PG_NODE: the backend's other tests, below).
const pgCjsAll = process.env.RUNLOCK_PG_CJS === "all";
// The chaos run's checker reads logs written by hand: it needs no server,
// so it is not one of the PostgreSQL tests that the CommonJS set leaves out.
const PG_NO_SERVER = new Set(["postgres/chaos_check_test.js"]);
/** Whether runtime `rt` is among the Node versions a knob names, or Bun. */
const knobOn = (knob: string | undefined) => {
  const named = (knob ?? versions.at(-1)!).split(",");
  return (rt: string) =>
    rt === "bun" || named.includes("all") || named.includes(rt);
};
const netnsOn = knobOn(process.env.RUNLOCK_PG_NETNS_NODE);
// The PostgreSQL backend's own tests (beyond the contract test, which every
// runtime and entry runs, and the client's) start clusters of their own and
// wait out the timeouts they prove; the docs' Node forms run npm and npx in
// a project. They run on Bun and the same one Node version: the backend's
// code and its client are the same on every Node, and so are the docs (the
// README's Node example runs on every version, below). On a machine of 2
// cores, running them on each Node version costs some 90 CPU-seconds of the
// 1,400 that all of CI takes. RUNLOCK_PG_NODE=all runs them on every Node
// version.
const pgNodeOn = knobOn(process.env.RUNLOCK_PG_NODE);
const PG_ONE_NODE_TESTS = new Set([
  "postgres/backend_test.js",
  "postgres/stress_test.js",
  "cli/db_test.js",
  "cli/db_schema_test.js",
  "postgres/settings_test.js",
  "postgres/stop_test.js",
  "postgres/wait_test.js",
  "postgres/reconnect_test.js",
  "postgres/failover_test.js",
  "postgres/secrets_test.js",
  "postgres/pooler_sessions_test.js",
  "postgres/poolers_test.js",
  "postgres/identity_test.js",
  "postgres/chaos_test.js",
  "postgres/watch_test.js",
  "docs/readme_test.js",
]);
// The tests that run after the suites, not beside them (see the header).
// file/injected_errors_test skips itself in the CommonJS copy (once per
// runtime).
const ALONE = new Set([
  "postgres/host_loss_test.js",
  "postgres/poolers_test.js",
  "file/injected_errors_test.js",
]);
// The CommonJS subset, on every Node version and on Bun (see the header):
// each part of the CommonJS bundles that differs from the ESM ones
// (createRequire of koffi or bun:ffi from import.meta.url defined as
// __filename's URL, import("pg") from CommonJS, the cli and postgres
// entries) is gone through by at least one of these.
const CJS_SUBSET = new Set([
  "file/acquire_test.js", // the API through require("runlock"): record, probes
  "platform/ffi_test.js", // koffi loaded lazily, the *at() calls
  "file/wait_close_wake_test.js", // the inotify close watcher (its own FFI binding)
  "file/wait_test.js", // waiting: the watch of the lock file, the timer
  "cli/module_test.js", // require("runlock/cli")
  "contract_test.js", // require("runlock/postgres"), pg by import()
]);
const cjsAll = process.env.RUNLOCK_CJS === "all";

/**
 * The test files of `dir` (tests-esm, tests-cjs) for runtime `rt`: the
 * ones run beside others, or with `alone` those run after them. Each is
 * filtered by its path under `dir` (file/wait_test.js); the CommonJS set
 * leaves out tests/postgres/ but PG_NO_SERVER (the contract test, which it
 * runs, sits at the top of tests/).
 */
const testFiles = (dir: string, rt: string, alone = false) =>
  (readdirSync(join(scratch, dir), { recursive: true }) as string[])
    .filter((f) => f.endsWith("_test.js"))
    .filter((f) => ALONE.has(f) === alone)
    .filter((f) => !(dir.endsWith("cjs") && BIN_TESTS.has(f)))
    .filter((f) =>
      !(dir.endsWith("cjs") && !pgCjsAll && f.startsWith("postgres/") &&
        !PG_NO_SERVER.has(f))
    )
    .filter((f) => !(dir.endsWith("cjs") && !cjsAll && !CJS_SUBSET.has(f)))
    .filter((f) => f !== "postgres/host_loss_test.js" || netnsOn(rt))
    .filter((f) => !PG_ONE_NODE_TESTS.has(f) || pgNodeOn(rt))
    .sort()
    .map((f) => join(dir, f));
const systemMajor = spawnSync("node", [
  "-p",
  "process.versions.node.split('.')[0]",
], {
  encoding: "utf8",
}).stdout.trim();
const nodeBins = new Map<string, string>();
/**
 * The binary of Node `version`: the machine's `node`, or the npm registry's
 * `node@<version>` (fetched by npx once, then run by its path: an npx in
 * front of each run would reach the registry each time, and needs the
 * environment's CA certificates to).
 */
function nodeBinary(version: string): string {
  if (version === systemMajor) return "node";
  let bin = nodeBins.get(version);
  if (bin === undefined) {
    const r = spawnSync(
      "npx",
      ["--yes", `node@${version}`, "-p", "process.execPath"],
      { encoding: "utf8" },
    );
    bin = r.stdout?.trim().split("\n").at(-1) ?? "";
    if (r.status !== 0 || !bin.startsWith("/")) {
      throw new Error(`npx --yes node@${version}: ${r.status} ${r.stderr}`);
    }
    nodeBins.set(version, bin);
  }
  return bin;
}
/**
 * The environment of the suites: this process's without
 * NODE_EXTRA_CA_CERTS. The suites make no TLS connection, and Node reads
 * that file at every start: where the machine sets it (this one sets it to
 * its system bundle, some 140 certificates), each of the thousands of Node
 * processes the suites start parsed it first, 40-50 ms of CPU
 * (cli/commands_test and file/litter_test on Node 20: 44.5 CPU-s with it,
 * 34.1 without). What
 * reaches the registry (npx, npm) keeps it.
 */
const suiteEnv: NodeJS.ProcessEnv = { ...process.env };
delete suiteEnv.NODE_EXTRA_CA_CERTS;
const nodeArgs = (files: string[], concurrency = 2) => [
  "--test",
  `--test-concurrency=${concurrency}`,
  ...files,
];

const bun = join(scratch, "node_modules", ".bin", "bun");
const bunArgs = (files: string[]) => [
  "test",
  "--timeout",
  "300000", // a hang detector: a loaded machine is slow, not wrong
  ...files.map((f) => `./${f}`),
];
// Rough seconds a file takes (Node 20, alone): to split Bun's files into
// two `bun test` processes of about equal length. Others count 2 s.
const COST: Record<string, number> = {
  "postgres/backend_test.js": 33,
  "cli/db_test.js": 16,
  "cli/db_schema_test.js": 4,
  "cli/commands_test.js": 40,
  "file/other_users_test.js": 12,
  "file/litter_test.js": 10,
  "file/names_mode_memory_test.js": 8,
  "contract_test.js": 10,
  "postgres/stress_test.js": 7,
  "cli/run_tty_test.js": 12,
  "cli/ls_watch_test.js": 8,
  "file/watch_test.js": 8,
  "postgres/watch_test.js": 12,
  "file/record_property_test.js": 7,
  "file/scan_test.js": 5,
  "file/stress_test.js": 5,
  "file/wait_test.js": 5,
  "file/soak_test.js": 4,
  "file/path_pinning_test.js": 7,
  "postgres/settings_test.js": 15,
  "postgres/stop_test.js": 15,
  "postgres/wait_test.js": 15,
  "postgres/reconnect_test.js": 16,
  "postgres/failover_test.js": 4,
  "postgres/secrets_test.js": 8,
  "postgres/pooler_sessions_test.js": 4,
  "postgres/poolers_test.js": 40,
  "postgres/identity_test.js": 15,
  "postgres/chaos_test.js": 15,
};
/** `files` in two lists of about equal cost. */
function halves(files: string[]): [string[], string[]] {
  // f is tests-esm/<path>: its cost is under <path>.
  const cost = (f: string) => COST[f.replace(/^[^/]*\//, "")] ?? 2;
  const sorted = [...files].sort((a, b) => cost(b) - cost(a));
  const out: [string[], string[]] = [[], []];
  const sum = [0, 0];
  for (const f of sorted) {
    const i = sum[0] <= sum[1] ? 0 : 1;
    out[i].push(f);
    sum[i] += cost(f);
  }
  return out;
}

// Phase 1, the steps that block this process: the bun --compile builds and
// the binary's --db check (startCluster waits on initdb synchronously).
const binDir = mkdtempSync(join(tmpdir(), "runlock-bin-"));
const binary = join(binDir, "runlock-child");
const cliBinary = join(binDir, "runlock");
if (!process.env.RUNLOCK_SKIP_BUN) {
  await step("bun build --compile (single binary)", () =>
    run(bun, [
      "build",
      "--compile",
      join("tests-esm", "fixtures", "child.js"),
      "--outfile",
      binary,
    ], { cwd: scratch }));
  await step("bun build --compile of the runlock CLI", () =>
    run(bun, [
      "build",
      "--compile",
      join("node_modules", "runlock", "bin", "runlock.js"),
      "--outfile",
      cliBinary,
    ], { cwd: scratch }));
  // `runlock --db` from the single binary: `bun build --compile` bundles
  // the `pg` that the package depends on (the bin leaves it external), so
  // the binary needs no node_modules. Run from a directory without one.
  const help = spawnSync(cliBinary, ["--help"], { encoding: "utf8" }).stdout ??
    "";
  const hasPg = pgServerAvailable;
  if (!help.includes("--db")) {
    console.error(
      "\n*** the bun --compile binary with --db: SKIPPED (this CLI has no --db) ***",
    );
    results.push("the bun --compile binary with --db: SKIPPED (no --db)");
  } else if (!hasPg && process.env.CI !== "true") {
    console.error(
      "\n*** the bun --compile binary with --db: SKIPPED (no PostgreSQL binaries, no RUNLOCK_TEST_PG_URL) ***",
    );
    results.push("the bun --compile binary with --db: SKIPPED (no PostgreSQL)");
  } else {
    await step(
      "the bun --compile binary with --db, outside node_modules",
      async () => {
        if (!hasPg) throw new Error("CI=true and no PostgreSQL binaries");
        const cluster = await startCluster();
        try {
          const db = `--db=${cluster.url}`;
          for (
            const [args, status, stdout] of [
              [["status", db, "npm/binary"], 1, "free\n"],
              [
                ["run", db, "npm/binary", "--", "sh", "-c", "echo ran"],
                0,
                "ran\n",
              ],
            ] as const
          ) {
            console.log(
              `\n$ ${cliBinary} ${args.join(" ").replace(cluster.url, "URL")}`,
            );
            const r = spawnSync(cliBinary, args, {
              cwd: binDir,
              encoding: "utf8",
            });
            if (r.status !== status || r.stdout !== stdout) {
              throw new Error(
                `expected exit ${status} and ${
                  JSON.stringify(stdout)
                }, got ${r.status}: ${r.stdout}${r.stderr}${r.error ?? ""}`,
              );
            }
          }
        } finally {
          cluster.stop();
        }
      },
    );
  }
}

// Phase 2: the suites side by side, the longest first.
// A Node version the registry cannot give fails its step; its suites then
// fail theirs, and the other versions' still run.
for (const version of versions) {
  await step(`node ${version}`, () => {
    console.log(`node ${version}: ${nodeBinary(version)}`);
  });
}
const jobs: (() => Promise<void>)[] = [];
for (const version of versions) {
  jobs.push(bufferedStep(
    `node ${version} (esm)`,
    (log) =>
      runBuffered(
        log,
        nodeBinary(version),
        nodeArgs(testFiles("tests-esm", version)),
        { cwd: scratch, env: suiteEnv },
      ),
  ));
}
if (!process.env.RUNLOCK_SKIP_BUN) {
  halves(testFiles("tests-esm", "bun")).forEach((files, i) =>
    jobs.push(bufferedStep(
      `bun ${BUN} (esm, part ${i + 1} of 2)`,
      (log) =>
        runBuffered(log, bun, bunArgs(files), { cwd: scratch, env: suiteEnv }),
    ))
  );
}
for (const version of versions) {
  jobs.push(bufferedStep(
    `node ${version} (cjs${cjsAll ? "" : ", subset"})`,
    (log) =>
      runBuffered(
        log,
        nodeBinary(version),
        nodeArgs(testFiles("tests-cjs", version)),
        { cwd: scratch, env: suiteEnv },
      ),
  ));
}
if (!process.env.RUNLOCK_SKIP_BUN) {
  jobs.push(bufferedStep(
    "CLI tests against the bun --compile binary of the CLI",
    (log) =>
      runBuffered(log, Deno.execPath(), [
        "test",
        "--allow-all",
        ...[...BIN_TESTS]
          .map((f) => f.replace(/\.js$/, ".ts"))
          .map((f) => join(root, "tests", f))
          .filter((f) => existsSync(f)),
      ], {
        cwd: root,
        env: { ...suiteEnv, RUNLOCK_CLI: cliBinary },
      }),
  ));
  jobs.push(bufferedStep(
    "cross-runtime tests (deno, node, bun, compiled binaries; file locks and PostgreSQL)",
    (log) =>
      runBuffered(log, Deno.execPath(), [
        "test",
        "--allow-all",
        join(root, "tests", "file", "cross_runtime_test.ts"),
        join(root, "tests", "postgres", "stress_test.ts"),
      ], {
        cwd: root,
        env: {
          ...suiteEnv,
          RUNLOCK_INTEROP_SCRATCH: scratch,
          RUNLOCK_INTEROP_BINARY: binary,
          RUNLOCK_INTEROP_CLI: cliBinary,
        },
      }),
  ));
  jobs.push(bufferedStep(
    `bun ${BUN} (cjs${cjsAll ? "" : ", subset"})`,
    (log) =>
      runBuffered(log, bun, bunArgs(testFiles("tests-cjs", "bun")), {
        cwd: scratch,
        env: suiteEnv,
      }),
  ));
}

// The README's Node example (try/finally, for Node 20 and 22 without
// `await using`), as written, on each Node version (one after another: they
// share its lock file): it takes and releases the lock, and exits 75 with
// the holder's message when a run holds it.
const example = readmeBlock("node-quick-start");
writeFileSync(join(scratch, "main.mjs"), example.text);
jobs.push(bufferedStep(
  `README: the Node example on Node ${versions.join(", ")}`,
  async (log) => {
    for (const version of versions) {
      const cmd = nodeBinary(version);
      log.push(`$ ${cmd} main.mjs\n`);
      const lock = join(scratch, ".state", "run.lock");
      const free = await exec(cmd, ["main.mjs"], {
        cwd: scratch,
        env: suiteEnv,
      });
      if (free.status !== 0 || existsSync(lock)) {
        throw new Error(
          `Node ${version}: main.mjs on a free lock: ${free.status} ${free.stderr}`,
        );
      }
      const holder = await exec("sh", [
        "-c",
        `mkdir -p .state; python3 tests-esm/fixtures/record_holder.py .state/run.lock & pid=$!
       while [ ! -s .state/run.lock ]; do sleep 0.05; done
       "$@" main.mjs; code=$?; kill $pid; wait $pid 2>/dev/null; echo "exit=$code pid=$pid"`,
        "sh",
        cmd,
      ], { cwd: scratch, env: suiteEnv });
      log.push(holder.text);
      const m = holder.stdout.match(/exit=(\d+) pid=(\d+)/);
      if (
        !m || m[1] !== "75" ||
        !holder.stderr.includes(`another run is active as pid ${m[2]}`)
      ) {
        throw new Error(
          `Node ${version}: main.mjs while held: ${holder.stdout} ${holder.stderr}`,
        );
      }
    }
  },
));
jobs.push(bufferedStep(
  "publint --strict",
  (log) =>
    runBuffered(log, "npx", [
      "--yes",
      `publint@${PUBLINT}`,
      "--strict",
      join(npmDir, "package"),
    ]),
));
jobs.push(bufferedStep(
  "arethetypeswrong",
  (log) =>
    runBuffered(log, "npx", [
      "--yes",
      `@arethetypeswrong/cli@${ATTW}`,
      tarball,
    ], { cwd: npmDir }),
));
const limit = Number(process.env.RUNLOCK_NPM_JOBS ?? 4);
console.log(`\nphase 2: ${jobs.length} steps, ${limit} at a time`);
await pool(jobs, limit > 0 ? limit : 1);

// Phase 3: the tests that must not run beside the suites, nor beside each
// other (one file at a time), their output as it comes.
// file/injected_errors_test skips
// itself in the CommonJS copy; the host-loss test is there only with
// RUNLOCK_PG_CJS=all.
const aloneFiles = (rt: string) =>
  ["esm", "cjs"].flatMap((entry) =>
    testFiles(`tests-${entry}`, rt, true)
      .filter((f) =>
        entry === "esm" || !f.endsWith("/file/injected_errors_test.js")
      )
  );
for (const version of versions) {
  const files = aloneFiles(version);
  if (files.length === 0) continue;
  await step(
    `node ${version}, one file at a time: ${files.join(", ")}`,
    () =>
      run(nodeBinary(version), nodeArgs(files, 1), {
        cwd: scratch,
        env: suiteEnv,
      }),
  );
}
if (!process.env.RUNLOCK_SKIP_BUN) {
  const files = aloneFiles("bun");
  await step(
    `bun ${BUN}, one file at a time: ${files.join(", ")}`,
    () => run(bun, bunArgs(files), { cwd: scratch, env: suiteEnv }),
  );
}
rmSync(binDir, { recursive: true, force: true });

summary();
if (failures.length > 0 || !existsSync(tarball)) process.exit(1);
