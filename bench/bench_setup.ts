// Set-up for `deno task bench` (bench/bench.ts): the machine's description,
// the C floor compiled on the fly, the npm package built from this checkout
// in an isolated copy, the pinned incumbents installed into a cache outside
// the repo, and the worker transpiled for Node and Bun. Nothing here writes
// into the checkout.
import { spawnSync, type SpawnSyncOptions } from "node:child_process";
import {
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { cpus, loadavg, release, tmpdir, totalmem } from "node:os";
import { dirname, join, relative } from "node:path";
import process from "node:process";
import ts from "npm:typescript@5.9.3";
import { NPM_PINS } from "../scripts/_pins.ts";

/** Versions of everything installed for the benchmark, pinned. */
export const PINS = {
  "proper-lockfile": "4.1.2",
  lockfile: "1.0.4",
  bun: "1.4.5", // the Bun that scripts/test_npm.ts tests
};

export const root = join(dirname(new URL(import.meta.url).pathname), "..");

/** Runs a command; returns its stdout, or throws with its stderr. */
export function run(
  cmd: string,
  args: string[],
  options: SpawnSyncOptions = {},
): string {
  const result = spawnSync(cmd, args, { encoding: "utf8", ...options });
  if (result.error) throw result.error;
  if (result.status !== 0) {
    throw new Error(
      `${cmd} ${args.join(" ")} exited with ${result.status}: ${
        String(result.stderr ?? "").trim().slice(-2000)
      }`,
    );
  }
  return String(result.stdout ?? "");
}

/** The first line of a command's output, or undefined if it cannot run. */
export function probeCommand(cmd: string, args: string[]): string | undefined {
  const result = spawnSync(cmd, args, { encoding: "utf8" });
  if (result.error || result.status !== 0) return undefined;
  return `${result.stdout}${result.stderr}`.trim().split("\n")[0];
}

export interface Machine {
  cpu: string;
  cores: number;
  memoryGiB: number;
  os: string;
  kernel: string;
  /** The file system type of the directory the locks live in. */
  filesystem: string;
  benchDir: string;
  loadavgStart: number[];
  loadavgEnd?: number[];
}

function osName(): string {
  try {
    const text = readFileSync("/etc/os-release", "utf8");
    return /^PRETTY_NAME="?([^"\n]*)"?/m.exec(text)?.[1] ?? process.platform;
  } catch {
    return process.platform;
  }
}

function filesystemOf(dir: string): string {
  // findmnt names ext4 as ext4; `stat -f` says "ext2/ext3" for all three.
  return probeCommand("findmnt", ["-n", "-o", "FSTYPE", "-T", dir]) ??
    probeCommand("stat", ["-f", "-c", "%T", dir]) ?? "unknown";
}

export function describeMachine(benchDir: string): Machine {
  const cpu = cpus();
  return {
    cpu: cpu[0]?.model.trim() ?? "unknown",
    cores: cpu.length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    os: osName(),
    kernel: release(),
    filesystem: filesystemOf(benchDir),
    benchDir,
    loadavgStart: loadavg().map((x) => Math.round(x * 100) / 100),
  };
}

/** Compiles bench/floor.c; returns the binary, or a note saying why not. */
export function compileFloor(
  outDir: string,
): { binary?: string; cc?: string; note?: string } {
  const cc = process.env.CC ?? "cc";
  const version = probeCommand(cc, ["--version"]);
  if (version === undefined) {
    return { note: `no C compiler (${cc}): the C floor is skipped` };
  }
  const binary = join(outDir, "floor");
  try {
    run(cc, ["-O2", "-o", binary, join(root, "bench", "floor.c")]);
  } catch (err) {
    return { note: `the C floor did not compile: ${(err as Error).message}` };
  }
  return { binary, cc: version };
}

/** Every file of the checkout that git would see (tracked or not ignored). */
function checkoutFiles(): string[] {
  const result = spawnSync(
    "git",
    ["ls-files", "-z", "--cached", "--others", "--exclude-standard"],
    { cwd: root, encoding: "utf8" },
  );
  if (result.status === 0) {
    return result.stdout.split("\0").filter((f) =>
      f !== "" && existsSync(join(root, f))
    );
  }
  const walk = (dir: string): string[] =>
    readdirSync(join(root, dir), { withFileTypes: true }).flatMap((e) => {
      const rel = dir ? `${dir}/${e.name}` : e.name;
      if (e.isDirectory()) {
        return [".git", "npm", "node_modules", "bench"].includes(e.name)
          ? []
          : walk(rel);
      }
      return [rel];
    });
  return walk("");
}

/**
 * A snapshot of the library to benchmark, in `dir`: the working tree
 * (tracked and untracked files, as git sees them), or the git ref named by
 * RUNLOCK_BENCH_REF (e.g. HEAD, while the working tree is mid-edit). The
 * harness (bench/bench*.ts, bench/floor.c) always comes from the working
 * tree. Deno, Node and Bun all run this one snapshot.
 */
export function snapshot(dir: string): string {
  const ref = process.env.RUNLOCK_BENCH_REF;
  mkdirSync(dir, { recursive: true });
  if (ref) {
    const tar = spawnSync("git", ["archive", "--format=tar", ref], {
      cwd: root,
      maxBuffer: 1 << 30,
    });
    if (tar.status !== 0) {
      throw new Error(`git archive ${ref} failed: ${tar.stderr}`);
    }
    run("tar", ["-x", "-C", dir], { input: tar.stdout });
  } else {
    for (const file of checkoutFiles()) {
      mkdirSync(dirname(join(dir, file)), { recursive: true });
      copyFileSync(join(root, file), join(dir, file));
    }
  }
  const harness = readdirSync(join(root, "bench"))
    .filter((f) => /^bench.*\.ts$/.test(f))
    .map((f) => `bench/${f}`);
  for (const file of [...harness, "bench/floor.c"]) {
    mkdirSync(dirname(join(dir, file)), { recursive: true });
    copyFileSync(join(root, file), join(dir, file));
  }
  return dir;
}

/**
 * Builds the npm package from the snapshot, inside it, so that the build's
 * `rm -rf npm/` never races a test run in the checkout. Returns the package
 * directory, and a note when the build script failed after the package was
 * complete (its later steps compile the tests, which the benchmark does not
 * need).
 */
export function buildPackage(snap: string): { dir: string; note?: string } {
  const given = process.env.RUNLOCK_BENCH_PACKAGE;
  if (given) return { dir: given };
  const dir = join(snap, "npm", "package");
  try {
    run(Deno.execPath(), ["run", "--allow-all", "scripts/build_npm.ts"], {
      cwd: snap,
      env: { ...process.env, NO_COLOR: "1" },
    });
    return { dir };
  } catch (err) {
    const complete = [
      "package.json",
      "esm/mod.js",
      "cjs/mod.cjs",
      "bin/runlock.js",
    ]
      .every((f) => existsSync(join(dir, f)));
    if (!complete) throw err;
    const last = (err as Error).message.split("\n").filter((l) =>
      /error/i.test(l)
    ).pop() ?? "";
    return {
      dir,
      note: `scripts/build_npm.ts failed after writing the package (${
        last.trim().slice(0, 200)
      }); the package it wrote is used`,
    };
  }
}

/**
 * The pinned incumbents, koffi and Bun, installed once into a cache outside
 * the repo (keyed by the pins) and reused by later runs.
 */
export function installDeps(withBun: boolean): string {
  const koffi = NPM_PINS.koffi;
  // The package's own dependencies (pg: the PostgreSQL client, which the
  // CLI's bun --compile binary bundles), then the incumbents.
  const pg = NPM_PINS.pg;
  const deps: Record<string, string> = {
    koffi,
    pg,
    "proper-lockfile": PINS["proper-lockfile"],
    lockfile: PINS.lockfile,
  };
  if (withBun) deps.bun = PINS.bun;
  const key = Object.entries(deps).map(([n, v]) => `${n}@${v}`).join(" ");
  const hash = Array.from(key).reduce(
    (h, c) => (Math.imul(h, 31) + c.charCodeAt(0)) >>> 0,
    7,
  ).toString(16);
  const dir = process.env.RUNLOCK_BENCH_DEPS ??
    join(tmpdir(), `runlock-bench-deps-${hash}`);
  const done = join(dir, ".installed");
  if (existsSync(done) && readFileSync(done, "utf8") === key) return dir;
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  writeFileSync(
    join(dir, "package.json"),
    JSON.stringify({ name: "runlock-bench-deps", private: true }, null, 2),
  );
  console.error(`bench: installing ${key} into ${dir}`);
  run("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    ...Object.entries(deps).map(([n, v]) => `${n}@${v}`),
  ], { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
  writeFileSync(done, key);
  return dir;
}

/**
 * A per-run directory from which Node and Bun import runlock: a copy of the
 * package in node_modules/runlock, and links to the cached dependencies.
 */
export function stagePackage(
  pkg: string,
  deps: string,
  runDir: string,
): string {
  const modules = join(runDir, "node_modules");
  mkdirSync(modules, { recursive: true });
  for (const name of readdirSync(join(deps, "node_modules"))) {
    if (name === "runlock") continue;
    symlinkSync(join(deps, "node_modules", name), join(modules, name));
  }
  const manifest = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
  const target = join(modules, "runlock");
  mkdirSync(target, { recursive: true });
  for (const entry of [...manifest.files, "package.json"]) {
    const from = join(pkg, entry);
    if (existsSync(from)) {
      cpSync(from, join(target, entry), { recursive: true });
    }
  }
  writeFileSync(
    join(runDir, "package.json"),
    JSON.stringify({ name: "runlock-bench-run", private: true }, null, 2),
  );
  return target;
}

/** A bench/ script (bench_worker.ts by default) as an ES module that Node
 * and Bun can run. */
export function transpileWorker(
  outFile: string,
  script = "bench_worker.ts",
): string {
  const source = readFileSync(join(root, "bench", script), "utf8");
  const { outputText } = ts.transpileModule(source, {
    fileName: script,
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ES2022,
    },
  });
  writeFileSync(outFile, outputText);
  return outFile;
}

/** Where a path is, relative to the repo, for messages. */
export function shown(path: string): string {
  const rel = relative(root, path);
  return rel.startsWith("..") ? path : rel;
}
