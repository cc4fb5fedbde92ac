// `deno task soak --seconds N`: the long soak (tests/_soak.ts). Deno, Node
// and Bun workers loop acquire/release on a few locks while a killer
// SIGKILLs holders, SIGSTOPs/SIGCONTs workers and deletes lock files by
// hand; mutual exclusion is then checked from the shared append-only log.
// Prints the report and exits 1 on any violation.
//
//   --seconds N         how long (default 60)
//   --locks N           lock paths (default 3)
//   --per-runtime N     workers of each runtime (default 2)
//   --runtimes a,b      default deno,node,bun
//   --every MS          mean pause between the killer's actions (default 60)
//   --moves             each lock in a directory of its own, half of the
//                       deletions made by moving that directory away and
//                       making a new one (mv d d.old && mkdir d)
//   --scratch DIR       an npm scratch project with runlock, bun and the
//                       compiled tests (npm/scratch after `deno task
//                       test:npm`); built into npm/soak when not given
//   --report FILE       also write the report there as JSON
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import process from "node:process";
import { parseArgs } from "node:util";
import { tempDir } from "../tests/_helpers.ts";
import { soak, summary } from "../tests/_soak.ts";

const BUN = "1.4.5";

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: {
    seconds: { type: "string", default: "60" },
    locks: { type: "string", default: "3" },
    "per-runtime": { type: "string", default: "2" },
    runtimes: { type: "string", default: "deno,node,bun" },
    every: { type: "string", default: "60" },
    moves: { type: "boolean", default: false },
    scratch: { type: "string" },
    report: { type: "string" },
  },
});

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const runtimes = values.runtimes!.split(",");

function run(cmd: string, args: string[], cwd: string): void {
  const r = spawnSync(cmd, args, { cwd, stdio: "inherit" });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed`);
}

/** The npm package, installed with bun into a scratch project. */
function scratchProject(): string {
  if (values.scratch) return values.scratch;
  const scratch = join(root, "npm", "soak");
  console.log("building the npm package for the Node and Bun workers ...");
  run(
    Deno.execPath(),
    ["run", "--allow-all", "scripts/build_npm.ts", "--pack"],
    root,
  );
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    JSON.stringify({ name: "soak", private: true, type: "module" }),
  );
  const version = JSON.parse(Deno.readTextFileSync(join(root, "deno.json")))
    .version;
  run("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    join(root, "npm", `runlock-${version}.tgz`),
    ...(runtimes.includes("bun") ? [`bun@${BUN}`] : []),
  ], scratch);
  cpSync(join(root, "npm", "tests"), join(scratch, "tests-esm"), {
    recursive: true,
  });
  cpSync(
    join(scratch, "tests-esm", "_entry.esm.js"),
    join(scratch, "tests-esm", "_entry.js"),
  );
  return scratch;
}

const needsNpm = runtimes.some((r) => r !== "deno");
const scratch = needsNpm ? scratchProject() : "";
const fixture = join(scratch, "tests-esm", "fixtures", "soak_worker.js");
if (needsNpm && !existsSync(fixture)) {
  throw new Error(`no compiled soak worker at ${fixture}`);
}

function command(runtime: string): string[] | undefined {
  if (runtime === "deno") return undefined; // the source, under this Deno
  if (runtime === "node") return ["node", fixture];
  return [join(scratch, "node_modules", ".bin", "bun"), fixture];
}

const perRuntime = Number(values["per-runtime"]);
const workers = runtimes.flatMap((runtime) =>
  Array.from({ length: perRuntime }, () => ({
    runtime,
    command: command(runtime),
  }))
);
const { dir, cleanup } = tempDir();
try {
  console.log(
    `soaking ${values.seconds} s: ${workers.length} workers (${
      runtimes.join(", ")
    }) on ${values.locks} locks in ${dir}`,
  );
  const report = await soak({
    seconds: Number(values.seconds),
    locks: Number(values.locks),
    workers,
    dir,
    every: Number(values.every),
    moves: values.moves,
    log: (line) => console.log(line),
  });
  console.log(summary(report));
  if (values.report) {
    const version = (cmd: string) =>
      spawnSync(cmd, ["--version"], { encoding: "utf8" }).stdout.trim();
    const versions = {
      deno: Deno.version.deno,
      ...(runtimes.includes("node") ? { node: version("node") } : {}),
      ...(runtimes.includes("bun")
        ? { bun: version(join(scratch, "node_modules", ".bin", "bun")) }
        : {}),
    };
    const written = {
      finished: new Date().toISOString(),
      command: `deno run --allow-all scripts/soak.ts ${
        process.argv.slice(2).join(" ")
      }`,
      versions,
      ...report,
      summary: summary(report).split("\n"),
    };
    writeFileSync(values.report, JSON.stringify(written, null, 2) + "\n");
    console.log(`report written to ${values.report}`);
  }
  if (report.violations.length > 0) {
    // Keep the log for a post-mortem.
    const kept = `${values.report ?? join(root, "npm", "soak")}.log`;
    cpSync(join(dir, "log"), kept);
    console.log(`violations: the log is kept at ${kept}`);
    process.exitCode = 1;
  }
} finally {
  cleanup();
}
