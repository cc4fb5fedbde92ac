// `deno task chaos:postgres --seconds N`: the fenced register under random
// faults (tests/fixtures/chaos_run.ts, checked by
// tests/fixtures/chaos_check.ts): Deno, Node and Bun workers loop acquire ->
// guarded write -> release on a PostgreSQL server of their own while holders
// are SIGKILLed, SIGSTOPped and evicted, waiters are SIGSTOPped, the server
// is restarted and crashed, a holder's link is cut, and the workers' role
// has synchronous_commit = off in every other phase. Writes the report and
// exits 1 on any violation (the log is then kept next to the report).
//
//   --seconds N        seconds of faults (default 60; then on until every
//                      fault kind happened)
//   --per-runtime N    workers of each runtime (default 3), plus one Deno
//                      worker in a network namespace when run as root
//   --runtimes a,b     default deno,node,bun
//   --names N          lock names (default 2)
//   --every MS         mean pause between two faults (default 2000)
//   --phase S          seconds of each synchronous_commit phase (default 30)
//   --scratch DIR      an npm scratch project with runlock, bun and the
//                      compiled tests (npm/scratch after `deno task
//                      test:npm`); built into npm/chaos when not given
//   --report FILE      default evidence/chaos_postgres_report.json
//   --before FILE      an earlier report (e.g. on the code before a fix),
//                      whose commit, counts and violations go into this one
import { spawnSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import process from "node:process";
import { parseArgs } from "node:util";
import { summary } from "../tests/fixtures/chaos_check.ts";
import { chaos, violationCount } from "../tests/fixtures/chaos_run.ts";

const BUN = "1.4.5";

const { values } = parseArgs({
  args: process.argv.slice(2),
  options: {
    seconds: { type: "string", default: "60" },
    "per-runtime": { type: "string", default: "3" },
    runtimes: { type: "string", default: "deno,node,bun" },
    names: { type: "string", default: "2" },
    every: { type: "string", default: "2000" },
    phase: { type: "string", default: "30" },
    scratch: { type: "string" },
    report: { type: "string" },
    before: { type: "string" },
  },
});

const root = join(dirname(new URL(import.meta.url).pathname), "..");
const runtimes = values.runtimes!.split(",");
const reportFile = values.report ??
  join(root, "evidence", "chaos_postgres_report.json");
const git = (...args: string[]) =>
  spawnSync("git", args, { cwd: root, encoding: "utf8" }).stdout.trim();

function sh(cmd: string, args: string[], cwd: string): void {
  const r = spawnSync(cmd, args, { cwd, stdio: "inherit" });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed`);
}

/**
 * The npm package and bun in a scratch project, with the compiled tests
 * (whose fixtures/chaos_worker.js the Node and Bun workers run) in
 * tests-esm/ importing the package's ES module entry.
 */
function scratchProject(): string {
  if (values.scratch) return values.scratch;
  const scratch = join(root, "npm", "chaos");
  console.log("building the npm package for the Node and Bun workers ...");
  sh(Deno.execPath(), ["task", "pack"], root);
  rmSync(scratch, { recursive: true, force: true });
  mkdirSync(scratch, { recursive: true });
  writeFileSync(
    join(scratch, "package.json"),
    '{"private":true,"type":"module"}',
  );
  const { version } = JSON.parse(
    Deno.readTextFileSync(join(root, "deno.json")),
  );
  const tests = join(scratch, "tests-esm");
  sh("npm", [
    "install",
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    join(root, "npm", `runlock-${version}.tgz`),
    ...(runtimes.includes("bun") ? [`bun@${BUN}`] : []),
  ], scratch);
  cpSync(join(root, "npm", "tests"), tests, { recursive: true });
  cpSync(
    join(tests, "_entry_postgres.esm.js"),
    join(tests, "_entry_postgres.js"),
  );
  return scratch;
}

const scratch = runtimes.some((r) => r !== "deno") ? scratchProject() : "";
const worker = join(scratch, "tests-esm", "fixtures", "chaos_worker.js");
if (scratch && !existsSync(worker)) {
  throw new Error(`no compiled chaos worker at ${worker}`);
}
const bun = join(scratch, "node_modules", ".bin", "bun");
const command = (rt: string) =>
  rt === "deno" ? undefined : rt === "node" ? ["node", worker] : [bun, worker];
const workers = runtimes.flatMap((runtime) =>
  Array.from(
    { length: Number(values["per-runtime"]) },
    () => ({ runtime, command: command(runtime) }),
  )
);

const commit = git("rev-parse", "HEAD");
const dirty = git("status", "--porcelain", "--untracked-files=no", "src");
console.log(
  `chaos: ${values.seconds} s, ${workers.length} workers (${
    runtimes.join(", ")
  }) at ${commit}${dirty ? " (src/ has uncommitted changes)" : ""}`,
);
const started = new Date();
const report = await chaos({
  seconds: Number(values.seconds),
  workers,
  names: Number(values.names),
  every: Number(values.every),
  phase: Number(values.phase),
  deadline: Number(values.seconds) + 120,
  say: (line) => console.log(line),
  keepLog: `${reportFile}.log`,
});
/** What an earlier run found, in short. */
function earlier(file: string): Record<string, unknown> {
  const r = JSON.parse(Deno.readTextFileSync(file));
  const keys = [
    "started",
    "command",
    "commit",
    "srcUncommitted",
    "seconds",
    "recheckedWith",
    "violationsByRule",
    "violationsByCase",
    "summary",
  ];
  return {
    ...Object.fromEntries(keys.map((k) => [k, r[k]])),
    violations: r.violations.slice(0, 12),
  };
}
const version = (cmd: string) =>
  spawnSync(cmd, ["--version"], { encoding: "utf8" }).stdout?.trim();
const written = {
  started: started.toISOString(),
  finished: new Date().toISOString(),
  command: `deno task chaos:postgres ${process.argv.slice(2).join(" ")}`,
  commit,
  srcUncommitted: dirty.split("\n").filter(Boolean),
  versions: {
    deno: Deno.version.deno,
    ...(runtimes.includes("node") ? { node: version("node") } : {}),
    ...(runtimes.includes("bun") ? { bun: version(bun) } : {}),
  },
  ...report,
  summary: summary(report).split("\n"),
  ...(values.before ? { before: earlier(values.before) } : {}),
};
writeFileSync(reportFile, JSON.stringify(written, null, 2) + "\n");
console.log(summary(report));
console.log(`report written to ${reportFile}`);
if (violationCount(report) > 0) {
  console.log(`violations: the log is kept at ${reportFile}.log`);
  process.exitCode = 1;
} else rmSync(`${reportFile}.log`, { force: true });
