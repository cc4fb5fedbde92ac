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
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";

const BUN = "1.4.5";
const PUBLINT = "0.3.25";
const ATTW = "0.18.5";

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const npmDir = join(root, "npm");
const scratch = join(npmDir, "scratch");
const results: string[] = [];

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

step(
  "build",
  () =>
    run(Deno.execPath(), [
      "run",
      "--allow-all",
      join(root, "scripts/build_npm.ts"),
    ]),
);

let tarball = "";
step("npm pack", () => {
  run("npm", ["pack", "--silent", "--pack-destination", npmDir], {
    cwd: join(npmDir, "package"),
  });
  tarball = join(npmDir, readdirSync(npmDir).find((f) => f.endsWith(".tgz"))!);
});

step("install the tarball into a scratch project", () => {
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    JSON.stringify({ name: "scratch", private: true, type: "module" }, null, 2),
  );
  const deps = [tarball];
  if (!process.env.RUNLOCK_SKIP_BUN) deps.push(`bun@${BUN}`);
  run("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    ...deps,
  ], { cwd: scratch });
  // The same compiled tests twice: once importing the ESM entry, once the
  // CommonJS entry (through createRequire).
  for (const entry of ["esm", "cjs"]) {
    const dir = join(scratch, `tests-${entry}`);
    cpSync(join(npmDir, "tests"), dir, { recursive: true });
    cpSync(join(dir, `_entry.${entry}.js`), join(dir, "_entry.js"));
    cpSync(join(dir, `_cli_entry.${entry}.js`), join(dir, "_cli_entry.js"));
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
for (const version of versions) {
  const [cmd, prefix] = version === systemMajor
    ? ["node", []]
    : ["npx", ["--yes", `node@${version}`]];
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
