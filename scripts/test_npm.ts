// `deno task test:npm`: the npm package, tested as a user gets it. Builds it
// (scripts/build_npm.ts), packs it, installs the tarball into a scratch
// project, then runs the same test suite there on Node (20, 22, 24; ESM and
// CommonJS entry points) and Bun, the cross-runtime tests, a `bun build
// --compile` single binary, publint and arethetypeswrong.
//
// Knobs: RUNLOCK_NODE_VERSIONS (default "20,22,24"), RUNLOCK_SKIP_BUN=1.
import { spawnSync, type SpawnSyncOptions } from "node:child_process";
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

const BUN = "1.4.5";
const PUBLINT = "0.3.25";
const ATTW = "0.18.5";

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const npmDir = join(root, "npm");
const scratch = join(npmDir, "scratch");
const results: string[] = [];
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
    console.error(`\nFAILED (${seconds}s): ${cmd} ${args.join(" ")}`);
    process.exit(1);
  }
  return void seconds;
}

function step(name: string, f: () => void): void {
  const started = Date.now();
  f();
  results.push(`${name} (${((Date.now() - started) / 1000).toFixed(1)}s)`);
}

// Build, pack and install exactly as the README's "From a clone" block says
// (tests/_readme.ts reads it): its first line in the clone, its second in
// the scratch project, with the README's placeholder /path/to/runlock
// replaced by this clone.
const [packLine, installLine] = commandLines(readmeBlock("npm-from-clone"));
const tarball = join(npmDir, `runlock-${version}.tgz`);
step(`README: ${packLine.replace(/\s+#.*$/, "")} (build and pack)`, () => {
  run("sh", ["-c", packLine], { cwd: root });
  if (!existsSync(tarball)) {
    throw new Error(`the README's pack line made no ${tarball}`);
  }
});

step("README: npm install of the tarball into a scratch project", () => {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    JSON.stringify({ name: "scratch", private: true, type: "module" }, null, 2),
  );
  run("sh", ["-c", installLine.replaceAll("/path/to/runlock", root)], {
    cwd: scratch,
  });
  if (!process.env.RUNLOCK_SKIP_BUN) {
    run("npm", [
      "install",
      "--no-audit",
      "--no-fund",
      "--loglevel=error",
      `bun@${BUN}`,
    ], { cwd: scratch });
  }
  // The same compiled tests twice: once importing the ESM entry, once the
  // CommonJS entry (through createRequire).
  for (const entry of ["esm", "cjs"]) {
    const dir = join(scratch, `tests-${entry}`);
    cpSync(join(npmDir, "tests"), dir, { recursive: true });
    cpSync(join(dir, `_entry.${entry}.js`), join(dir, "_entry.js"));
    cpSync(join(dir, `_cli_entry.${entry}.js`), join(dir, "_cli_entry.js"));
  }
});

step("README: the npm CLI line in the scratch project", () => {
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
const BIN_TESTS = new Set(["cli_test.js", "cli_tty_test.js"]);
const testFiles = (dir: string) =>
  readdirSync(join(scratch, dir))
    .filter((f) => f.endsWith("_test.js"))
    .filter((f) => !(dir.endsWith("cjs") && BIN_TESTS.has(f)))
    .map((f) => join(dir, f));

const versions = (process.env.RUNLOCK_NODE_VERSIONS ?? "20,22,24").split(",");
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
for (const version of versions) {
  const [cmd, prefix] = nodeCommand(version);
  for (const entry of ["esm", "cjs"]) {
    step(
      `node ${version} (${entry})`,
      () =>
        run(cmd, [
          ...prefix,
          "--test",
          "--test-concurrency=2",
          ...testFiles(`tests-${entry}`),
        ], {
          cwd: scratch,
        }),
    );
  }
}

// The README's Node example (try/finally, for Node 20 and 22 without
// `await using`), as written, on each Node version: it takes and releases
// the lock, and exits 75 with the holder's message when a run holds it.
const example = readmeBlock("node-quick-start");
writeFileSync(join(scratch, "main.mjs"), example.text);
for (const version of versions) {
  const [cmd, prefix] = nodeCommand(version);
  step(`README: the Node example on Node ${version}`, () => {
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

const bun = join(scratch, "node_modules", ".bin", "bun");
if (!process.env.RUNLOCK_SKIP_BUN) {
  for (const entry of ["esm", "cjs"]) {
    step(
      `bun ${BUN} (${entry})`,
      () =>
        run(bun, [
          "test",
          "--timeout",
          "60000",
          ...testFiles(`tests-${entry}`).map((f) => `./${f}`),
        ], {
          cwd: scratch,
        }),
    );
  }
}

if (!process.env.RUNLOCK_SKIP_BUN) {
  const binDir = mkdtempSync(join(tmpdir(), "runlock-bin-"));
  const binary = join(binDir, "runlock-child");
  step("bun build --compile (single binary)", () =>
    run(bun, [
      "build",
      "--compile",
      join("tests-esm", "fixtures", "child.js"),
      "--outfile",
      binary,
    ], { cwd: scratch }));
  const cliBinary = join(binDir, "runlock");
  step("bun build --compile of the runlock CLI", () =>
    run(bun, [
      "build",
      "--compile",
      join("node_modules", "runlock", "bin", "runlock.js"),
      "--outfile",
      cliBinary,
    ], { cwd: scratch }));
  step(
    "CLI tests against the bun --compile binary of the CLI",
    () =>
      run(Deno.execPath(), [
        "test",
        "--allow-all",
        join(root, "tests", "cli_test.ts"),
        join(root, "tests", "cli_tty_test.ts"),
      ], {
        cwd: root,
        env: { ...process.env, RUNLOCK_CLI: cliBinary },
      }),
  );
  step(
    "cross-runtime tests (deno, node, bun, compiled binaries)",
    () =>
      run(Deno.execPath(), [
        "test",
        "--allow-all",
        join(root, "tests", "interop_test.ts"),
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

step(
  "publint --strict",
  () =>
    run("npx", [
      "--yes",
      `publint@${PUBLINT}`,
      "--strict",
      join(npmDir, "package"),
    ]),
);
step(
  "arethetypeswrong",
  () =>
    run("npx", ["--yes", `@arethetypeswrong/cli@${ATTW}`, tarball], {
      cwd: npmDir,
    }),
);

console.log(`\nnpm package checks passed:\n  ${results.join("\n  ")}`);
if (!existsSync(tarball)) process.exit(1);
