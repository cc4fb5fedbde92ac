// `deno task test:npm`: the npm package, tested as a user gets it. Builds it
// (scripts/build_npm.ts), packs it, installs the tarball into a scratch
// project, then runs the same test suite there on Node (20, 22, 24; ESM and
// CommonJS entry points) and Bun, the cross-runtime tests, a `bun build
// --compile` single binary, publint and arethetypeswrong.
//
// A failing step is reported and the others still run (all failures at
// once, in one CI run); only a failed build or install stops it. Exit 1 if
// any step failed.
//
// Knobs: RUNLOCK_NODE_VERSIONS (default "20,22,24"), RUNLOCK_SKIP_BUN=1,
// RUNLOCK_PG_NETNS_NODE (which Node versions run the PostgreSQL host-loss
// test; default: the last of RUNLOCK_NODE_VERSIONS; "all", or "" for none),
// RUNLOCK_PG_CJS=all (the whole PostgreSQL suite with the CommonJS entry
// too, not only the contract test).
import { spawn, spawnSync, type SpawnSyncOptions } from "node:child_process";
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
import { findPgBin, startCluster } from "../tests/fixtures/pg_cluster.ts";

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

/** `run`, without blocking: other steps may run meanwhile. */
function runBeside(
  cmd: string,
  args: string[],
  options: { cwd: string },
): Promise<void> {
  const started = Date.now();
  console.log(`\n$ ${cmd} ${args.join(" ")} (beside the next step)`);
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: "inherit", ...options });
    child.on("error", reject);
    child.on("close", (code, signal) => {
      const seconds = ((Date.now() - started) / 1000).toFixed(1);
      if (code === 0) resolve();
      else {
        reject(
          new Error(
            `FAILED (${seconds}s, exit ${code ?? signal}): ${cmd} ${
              args.join(" ")
            }`,
          ),
        );
      }
    });
  });
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

await step("README: npm install of the tarball into a scratch project", () => {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    JSON.stringify({ name: "scratch", private: true, type: "module" }, null, 2),
  );
  run("sh", ["-c", installLine.replaceAll("/path/to/runlock", root)], {
    cwd: scratch,
  });
  // What the tests import besides runlock: fast-check (the property tests),
  // at the version deno.json pins for the Deno run; and Bun.
  const fastCheck = JSON.parse(readFileSync(join(root, "deno.json"), "utf8"))
    .imports["fast-check"].replace(/^npm:/, "");
  run("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    fastCheck,
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
// set; the CommonJS set still runs cli_module_test (require("runlock/cli")).
const BIN_TESTS = new Set([
  "cli_test.js",
  "cli_tty_test.js",
  "cli_postgres_test.js",
]);
const versions = (process.env.RUNLOCK_NODE_VERSIONS ?? "20,22,24").split(",");

// The PostgreSQL tests (each file starts its own throwaway cluster) cost
// about 50 s per runtime and entry, a third of it the host-loss test's wait
// for a cut link (root only). To keep the whole command near 9 minutes on 2
// cores: the CommonJS set runs only the contract test (the backend's code
// is the same; what differs is require("runlock/postgres") sharing
// require("runlock")'s error classes, which that test checks), and the
// host-loss test runs on Bun and one Node version. RUNLOCK_PG_CJS=all and
// RUNLOCK_PG_NETNS_NODE=all run them everywhere.
const PG_CJS_TESTS = new Set(["postgres_contract_test.js"]);
const pgCjsAll = process.env.RUNLOCK_PG_CJS === "all";
const netnsNode = (process.env.RUNLOCK_PG_NETNS_NODE ?? versions.at(-1)!)
  .split(",");
const netnsOn = (rt: string) =>
  rt === "bun" || netnsNode.includes("all") || netnsNode.includes(rt);
// The tests of the backend on non-default server settings, stopped
// processes, waiting and identity start clusters of their own and wait out
// the timeouts they prove (15 to 20 s a file): they run on Bun and the same
// one Node version (the backend's code and its client are the same on every
// Node); RUNLOCK_PG_NETNS_NODE=all runs them everywhere too.
const PG_ONE_NODE_TESTS = new Set([
  "postgres_settings_test.js",
  "postgres_stop_test.js",
  "postgres_wait_test.js",
  "postgres_identity_test.js",
  "postgres_chaos_test.js",
]);

/** The test files of `dir` (tests-esm, tests-cjs) for runtime `rt`. */
const testFiles = (dir: string, rt: string) =>
  readdirSync(join(scratch, dir))
    .filter((f) => f.endsWith("_test.js"))
    .filter((f) => !(dir.endsWith("cjs") && BIN_TESTS.has(f)))
    .filter((f) =>
      !(dir.endsWith("cjs") && !pgCjsAll && f.startsWith("postgres") &&
        !PG_CJS_TESTS.has(f))
    )
    .filter((f) =>
      (f !== "postgres_netns_test.js" && !PG_ONE_NODE_TESTS.has(f)) ||
      netnsOn(rt)
    )
    .map((f) => join(dir, f));
const systemMajor = spawnSync("node", [
  "-p",
  "process.versions.node.split('.')[0]",
], {
  encoding: "utf8",
}).stdout.trim();
function nodeCommand(version: string): [string, string[]] {
  return version === systemMajor
    ? ["node", []]
    : ["npx", ["--yes", `node@${version}`]];
}
// Each Node version's CommonJS set runs beside the next version's ESM set
// (two test processes at a time; the host-loss and injection tests, which
// must run alone, are in ESM sets only).
let beside: Promise<void> | undefined;
for (const version of versions) {
  const [cmd, prefix] = nodeCommand(version);
  const args = (entry: string) => [
    ...prefix,
    "--test",
    "--test-concurrency=2",
    ...testFiles(`tests-${entry}`, version),
  ];
  await step(
    `node ${version} (esm)`,
    () => run(cmd, args("esm"), { cwd: scratch }),
  );
  await beside;
  beside = step(
    `node ${version} (cjs)`,
    () => runBeside(cmd, args("cjs"), { cwd: scratch }),
  );
}

// The README's Node example (try/finally, for Node 20 and 22 without
// `await using`), as written, on each Node version: it takes and releases
// the lock, and exits 75 with the holder's message when a run holds it.
const example = readmeBlock("node-quick-start");
writeFileSync(join(scratch, "main.mjs"), example.text);
for (const version of versions) {
  const [cmd, prefix] = nodeCommand(version);
  await step(`README: the Node example on Node ${version}`, () => {
    const lock = join(scratch, ".state", "run.lock");
    const free = spawnSync(cmd, [...prefix, "main.mjs"], {
      cwd: scratch,
      encoding: "utf8",
    });
    if (free.status !== 0 || existsSync(lock)) {
      throw new Error(`main.mjs on a free lock: ${free.status} ${free.stderr}`);
    }
    const holder = spawnSync("sh", [
      "-c",
      `mkdir -p .state; python3 tests-esm/fixtures/record_holder.py .state/run.lock & pid=$!
       while [ ! -s .state/run.lock ]; do sleep 0.05; done
       "$@" main.mjs; code=$?; kill $pid; wait $pid 2>/dev/null; echo "exit=$code pid=$pid"`,
      "sh",
      cmd,
      ...prefix,
    ], { cwd: scratch, encoding: "utf8" });
    const m = holder.stdout.match(/exit=(\d+) pid=(\d+)/);
    if (
      !m || m[1] !== "75" ||
      !holder.stderr.includes(`another run is active as pid ${m[2]}`)
    ) {
      throw new Error(
        `main.mjs while held: ${holder.stdout} ${holder.stderr}`,
      );
    }
  });
}

await beside;

const bun = join(scratch, "node_modules", ".bin", "bun");
if (!process.env.RUNLOCK_SKIP_BUN) {
  for (const entry of ["esm", "cjs"]) {
    await step(
      `bun ${BUN} (${entry})`,
      () =>
        run(bun, [
          "test",
          "--timeout",
          "300000", // a hang detector: a loaded machine is slow, not wrong
          ...testFiles(`tests-${entry}`, "bun").map((f) => `./${f}`),
        ], {
          cwd: scratch,
        }),
    );
  }
}

if (!process.env.RUNLOCK_SKIP_BUN) {
  const binDir = mkdtempSync(join(tmpdir(), "runlock-bin-"));
  const binary = join(binDir, "runlock-child");
  await step("bun build --compile (single binary)", () =>
    run(bun, [
      "build",
      "--compile",
      join("tests-esm", "fixtures", "child.js"),
      "--outfile",
      binary,
    ], { cwd: scratch }));
  const cliBinary = join(binDir, "runlock");
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
  const hasPg = Boolean(process.env.RUNLOCK_TEST_PG_URL) ||
    findPgBin() !== undefined;
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
  await step(
    "CLI tests against the bun --compile binary of the CLI",
    () =>
      run(Deno.execPath(), [
        "test",
        "--allow-all",
        ...["cli_test.ts", "cli_tty_test.ts", "cli_postgres_test.ts"]
          .map((f) => join(root, "tests", f))
          .filter((f) => existsSync(f)),
      ], {
        cwd: root,
        env: { ...process.env, RUNLOCK_CLI: cliBinary },
      }),
  );
  await step(
    "cross-runtime tests (deno, node, bun, compiled binaries; file locks and PostgreSQL)",
    () =>
      run(Deno.execPath(), [
        "test",
        "--allow-all",
        join(root, "tests", "interop_test.ts"),
        join(root, "tests", "postgres_stress_test.ts"),
      ], {
        cwd: root,
        env: {
          ...process.env,
          RUNLOCK_INTEROP_SCRATCH: scratch,
          RUNLOCK_INTEROP_BINARY: binary,
          RUNLOCK_INTEROP_CLI: cliBinary,
        },
      }),
  );
  rmSync(binDir, { recursive: true, force: true });
}

await step(
  "publint --strict",
  () =>
    run("npx", [
      "--yes",
      `publint@${PUBLINT}`,
      "--strict",
      join(npmDir, "package"),
    ]),
);
await step(
  "arethetypeswrong",
  () =>
    run("npx", ["--yes", `@arethetypeswrong/cli@${ATTW}`, tarball], {
      cwd: npmDir,
    }),
);

summary();
if (failures.length > 0 || !existsSync(tarball)) process.exit(1);
