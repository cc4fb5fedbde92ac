// `deno task bench`: runlock against the physical floor and the incumbents.
//
// Every figure is measured in this one run, and every ratio is between two
// figures of this run: these machines are shared and noisy, and noise only
// ever adds time, so each side is timed in interleaved rounds (one batch of
// each implementation per round, in a rotating order) and the best round of
// each side is compared with the best round of the other.
//
//   floor        bench/floor.c, compiled here with `cc`: exactly the system
//                calls of one acquire+release and of one probe
//                (PROTOCOL.md), nothing else
//   Deno.*       the same calls made bare through Deno.* (Deno's op floor)
//   runlock      on Deno (from the sources; with --allow-all and with the
//                scoped permissions the README recommends), Node and Bun
//                (from the npm package, built from this checkout)
//   incumbents   proper-lockfile and npm `lockfile` on Node, `flock(1)`
//
// Sections: micro (per call), hand-off, contention, scale (a directory of
// 100,000 files, 5,000 locks held, 50 waiters, memory over 400,000 cycles:
// bench/bench_scale.ts), watch() (a SIGKILLed holder's crashed change, an
// idle watch of 1,000 runs: bench/bench_watch.ts), start-up and CLI, system
// calls (strace, when installed), PostgreSQL.
// Output: a table on stdout, bench/results.json, bench/chart.svg (drawn by
// bench/bench_chart.ts from the JSON). The goals (bench/bench_goals.ts, and
// the PostgreSQL section's) are checked here, as PASS/MISS lines with the
// measured ratio, never in tests.
//
// Knobs: RUNLOCK_BENCH_ROUNDS (15), RUNLOCK_BENCH_QUICK=1 (a short run for
// development), RUNLOCK_BENCH_SECTIONS (comma list of micro, handoff,
// contention, scale, watch, startup, syscalls, postgres), RUNLOCK_BENCH_SCALE
// (comma list of newname, many, waiters, rss), RUNLOCK_BENCH_DIR (where the
// locks live; default the OS temp dir), RUNLOCK_BENCH_OUT (default bench/),
// RUNLOCK_BENCH_PACKAGE (a built npm package to use instead of building
// one), RUNLOCK_BENCH_DEPS (the dependency cache), RUNLOCK_SKIP_BUN=1.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";
import { drawChart, formatFiles } from "./bench_chart.ts";
import { type PostgresSection, postgresSection } from "./bench_postgres.ts";
import {
  buildPackage,
  compileFloor,
  describeMachine,
  installDeps,
  PINS,
  probeCommand,
  root,
  run,
  shown,
  snapshot,
  stagePackage,
  transpileWorker,
} from "./bench_setup.ts";
import { checkGoals, fmt, type Goal, maxOf, median } from "./bench_goals.ts";
import { type ScaleSection, scaleSection, scaleTables } from "./bench_scale.ts";
import { auditSyscalls, type SyscallAudit } from "./bench_syscalls.ts";
import { type WatchResult, watchSection } from "./bench_watch.ts";

const QUICK = process.env.RUNLOCK_BENCH_QUICK === "1";
const ROUNDS = Number(process.env.RUNLOCK_BENCH_ROUNDS ?? (QUICK ? 4 : 15));
const BATCH_MS = QUICK ? 10 : 25;
const SECTIONS = new Set(
  (process.env.RUNLOCK_BENCH_SECTIONS ??
    "micro,handoff,contention,scale,watch,startup,syscalls,postgres").split(
      ",",
    ),
);
const WITH_BUN = !process.env.RUNLOCK_SKIP_BUN;
const OUT = process.env.RUNLOCK_BENCH_OUT ?? join(root, "bench");
const SCAN_LOCKS = 10_000;
const CONTENDERS = Number(process.env.RUNLOCK_BENCH_CONTENDERS ?? 4);
const CONTEND_MS = QUICK ? 1000 : 2500;

const started = performance.now();
const notes: string[] = [];
function note(text: string): void {
  notes.push(text);
  log(`note: ${text}`);
}
function log(text: string): void {
  const s = ((performance.now() - started) / 1000).toFixed(0).padStart(3);
  writeSync(2, `[bench ${s}s] ${text}\n`);
}

// ---------------------------------------------------------------------------
// Set-up

const benchDir = mkdtempSync(
  join(process.env.RUNLOCK_BENCH_DIR ?? tmpdir(), "runlock-bench-"),
);
const scratch = mkdtempSync(join(tmpdir(), "runlock-bench-build-"));
const machine = describeMachine(benchDir);
// acquire+release again on tmpfs, where no disk journal hides the runtime's
// own overhead (skipped when the locks already live on tmpfs).
const tmpfsRoot = (() => {
  const given = process.env.RUNLOCK_BENCH_TMPFS ?? "/dev/shm";
  if (given === "0" || machine.filesystem === "tmpfs") return undefined;
  if (
    probeCommand("findmnt", ["-n", "-o", "FSTYPE", "-T", given]) !== "tmpfs"
  ) {
    return undefined;
  }
  try {
    return mkdtempSync(join(given, "runlock-bench-"));
  } catch {
    return undefined;
  }
})();
log(
  `${machine.cpu}, ${machine.cores} cores, ${machine.filesystem} at ${benchDir}, load ${
    machine.loadavgStart.join(" ")
  }`,
);

// Temp directories go away however the run ends (an uncaught error
// included); the dependency cache stays.
let cleaned = false;
function cleanup(): void {
  if (cleaned) return;
  cleaned = true;
  for (const dir of [benchDir, tmpfsRoot, scratch]) {
    if (dir) rmSync(dir, { recursive: true, force: true });
  }
}
globalThis.addEventListener("unload", cleanup);
globalThis.addEventListener("unhandledrejection", cleanup);
globalThis.addEventListener("error", cleanup);

const floor = compileFloor(scratch);
if (floor.note) note(floor.note);

// Every Deno process started here (the workers, the waiters and their
// controls alike) skips Deno's update check: without a network it is tried
// again by every process (a read of the system's CA certificates and a TLS
// connection attempt, about 2.5 ms of CPU half a second after start), where
// a user's machine with a network makes it once a day. It is the runtime's,
// not runlock's, and it fell inside a waiter's 6 s.
process.env.DENO_NO_UPDATE_CHECK = "1";
note(
  "Deno processes run with DENO_NO_UPDATE_CHECK=1: offline, Deno's update check is tried by every process (about 2.5 ms of CPU each, measured with process.cpuUsage), where a machine with a network makes it once a day",
);

const snap = snapshot(join(scratch, "snapshot"));
const runlock: typeof import("../mod.ts") = await import(join(snap, "mod.ts"));
log(
  `building the npm package from ${
    process.env.RUNLOCK_BENCH_REF ?? "the working tree"
  }`,
);
const built = buildPackage(snap);
if (built.note) note(built.note);
const pkg = built.dir;
log("installing the pinned incumbents (cached between runs)");
const deps = installDeps(WITH_BUN);
// Nothing after the install reaches the network, and Node reads the file
// NODE_EXTRA_CA_CERTS names at every start: set to a system bundle (some
// 140 certificates) it costs each Node process 40 to 50 ms of CPU before
// its first line, which a start-up figure would count as Node's own.
if (process.env.NODE_EXTRA_CA_CERTS !== undefined) {
  delete process.env.NODE_EXTRA_CA_CERTS;
  note(
    "NODE_EXTRA_CA_CERTS is unset for every process the benchmark starts after its npm install: Node reads that file at each start (40 to 50 ms of CPU for a system bundle), and nothing measured here makes a TLS connection",
  );
}
const runDir = join(scratch, "run");
mkdirSync(runDir);
const pkgDir = stagePackage(pkg, deps, runDir);
const workerJs = transpileWorker(join(runDir, "bench_worker.mjs"));
/** Another bench/ script, transpiled for Node and Bun on first use. */
const transpiled = (script: string) => {
  const out = join(runDir, `${script}.mjs`);
  if (!existsSync(out)) transpileWorker(out, `${script}.ts`);
  return out;
};
const workerTs = join(snap, "bench", "bench_worker.ts");
const bunPath = join(runDir, "node_modules", ".bin", "bun");
const hasFlock = probeCommand("flock", ["--version"]) !== undefined;
const versions: Record<string, string> = {
  deno: Deno.version.deno,
  node: (probeCommand("node", ["--version"]) ?? "none").replace(/^v/, ""),
};
if (WITH_BUN) versions.bun = probeCommand(bunPath, ["--version"]) ?? "none";
if (!hasFlock) note("no flock(1): its rows are skipped");

/** How to start a worker of each runtime. */
const workerCommands: Record<string, string[]> = {
  deno: [Deno.execPath(), "run", "--allow-all", workerTs],
  "deno-scoped": [
    Deno.execPath(),
    "run",
    `--allow-read=${benchDir}`,
    `--allow-write=${benchDir}`,
    "--allow-env",
    "--allow-sys=hostname",
    workerTs,
  ],
  node: ["node", workerJs],
};
if (WITH_BUN) workerCommands.bun = [bunPath, workerJs];

const workerEnv = (cmd: string[]) => ({
  ...process.env,
  RUNLOCK_BENCH_ENTRY: join(pkgDir, "esm", "mod.js"),
  RUNLOCK_BENCH_DEPS: runDir,
  RUNLOCK_BENCH_SELF: JSON.stringify(cmd),
  NO_COLOR: "1",
});

/** A long-lived process answering one line per request line. */
class LineServer {
  readonly child: ChildProcess;
  readonly #next: () => Promise<string>;
  constructor(cmd: string[], env: Record<string, string | undefined>) {
    this.child = spawn(cmd[0], cmd.slice(1), {
      stdio: ["pipe", "pipe", "inherit"],
      env,
      cwd: snap,
    });
    const lines = createInterface({ input: this.child.stdout! })[
      Symbol.asyncIterator
    ]();
    this.#next = async () => {
      const { value, done } = await lines.next();
      if (done) throw new Error(`${cmd.join(" ")} exited`);
      return value as string;
    };
  }
  async ask(line: string): Promise<string> {
    this.child.stdin!.write(line + "\n");
    return await this.#next();
  }
  close(): void {
    this.child.stdin!.end();
  }
}

/** A runtime worker (bench/bench_worker.ts) speaking JSON lines. */
class Worker extends LineServer {
  constructor(readonly name: string) {
    super(
      [...workerCommands[name], "serve"],
      workerEnv(workerCommands[name]),
    );
  }
  // deno-lint-ignore no-explicit-any
  async request(req: Record<string, unknown>): Promise<any> {
    const answer = JSON.parse(await this.ask(JSON.stringify(req)));
    if (answer.error) throw new Error(`${this.name}: ${answer.error}`);
    return answer;
  }
}

// ---------------------------------------------------------------------------
// Results

interface Measure {
  id: string;
  side: string;
  case: string;
  label: string;
  kind: "floor" | "bare" | "baseline" | "runlock" | "incumbent";
  runtime: string;
  /** µs per call, one per round. */
  rounds: number[];
  n?: number;
  best?: number;
  median?: number;
}

interface Row {
  id: string;
  label: string;
  kind: Measure["kind"];
  runtime: string;
  unit: "µs" | "ms";
  best: number;
  median: number;
  /** Best against the best of the group's C floor. */
  ratio?: number;
  /** For Deno rows: best against the best of bare Deno.* on the same side. */
  vsBare?: number;
  extra?: Record<string, unknown>;
}

interface Group {
  id: string;
  title: string;
  floor?: string;
  rows: Row[];
  note?: string;
}

const groups: Group[] = [];
const quantile = (xs: number[], q: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};
const round3 = (x: number) => Math.round(x * 1000) / 1000;

// The lock every probe looks at, held by this process (another process than
// every worker) for the whole run; and a path where no lock exists.
const probeDir = join(benchDir, "probe");
const heldLock = runlock.acquireSync(join(probeDir, "held.lock"));
const freePath = join(probeDir, "free.lock");
const hasScan = "scan" in runlock;

// ---------------------------------------------------------------------------
// Micro: one call, against the floor

async function micro(): Promise<void> {
  const workers = Object.keys(workerCommands).map((name) => new Worker(name));
  const scanDir = join(benchDir, "scan");
  if (hasScan) {
    mkdirSync(scanDir);
    const started = new Date().toISOString();
    for (let i = 0; i < SCAN_LOCKS; i++) {
      writeFileSync(
        join(scanDir, `lock-${String(i).padStart(5, "0")}.lock`),
        `2147483646\nrunlock 1\nhost=bench\nstarted=${started}\nruntime=deno\n`,
      );
    }
  } else {
    note(
      "scan() is not exported by this snapshot's mod.ts: the scan rows are skipped",
    );
  }
  const measures: Measure[] = [];
  const sides = new Map<string, (c: string, n: number) => Promise<number>>();
  for (const w of workers) {
    const { cases } = await w.request({
      cmd: "setup",
      dir: join(benchDir, w.name),
      held: heldLock.path,
      free: freePath,
      scanDir,
      scanCount: SCAN_LOCKS,
      // Deno asks for --allow-all for anything under /dev, so the scoped
      // worker has no tmpfs rows when tmpfs is /dev/shm.
      tmpfsDir: tmpfsRoot &&
          !(w.name === "deno-scoped" && tmpfsRoot.startsWith("/dev/"))
        ? join(tmpfsRoot, w.name)
        : undefined,
    });
    sides.set(
      w.name,
      async (c, n) => (await w.request({ cmd: "time", case: c, n })).us,
    );
    const runtime = w.name === "deno-scoped" ? "deno" : w.name;
    const who = w.name === "deno-scoped"
      ? "Deno (scoped perms)"
      : { deno: "Deno", node: "Node", bun: "Bun" }[w.name]!;
    const labels: Record<string, [string, Measure["kind"]]> = {
      bareAcquire: [`${who}: bare Deno.* calls, with realpath`, "bare"],
      bareProbe: [`${who}: bare Deno.* open, flock, read, close`, "bare"],
      bareSafeProbe: [
        `${who}: bare Deno.* lstat, open, fstat, flock, read, kill, close`,
        "bare",
      ],
      acquireSync: [`${who}: runlock acquireSync+releaseSync`, "runlock"],
      acquire: [`${who}: runlock acquire+release (async)`, "runlock"],
      heldHeld: [`${who}: runlock held()`, "runlock"],
      heldFree: [`${who}: runlock held()`, "runlock"],
      inspectHeld: [`${who}: runlock inspect()`, "runlock"],
      inspectFree: [`${who}: runlock inspect()`, "runlock"],
      scan: [`${who}: runlock scan()`, "runlock"],
      lockfileSync: [`${who}: npm lockfile lockSync+unlockSync`, "incumbent"],
      properLockfileSync: [
        `${who}: proper-lockfile lockSync+unlock`,
        "incumbent",
      ],
      properLockfile: [
        `${who}: proper-lockfile lock+unlock (async)`,
        "incumbent",
      ],
    };
    for (const c of cases as string[]) {
      const [base, where] = c.split("@");
      const [label0, kind] = labels[base] ?? [`${who}: ${base}`, "runlock"];
      const label = where ? `${label0} (${where})` : label0;
      measures.push({
        id: `${w.name}:${c}`,
        side: w.name,
        case: c,
        label,
        kind,
        runtime,
        rounds: [],
      });
    }
  }
  let floorServer: LineServer | undefined;
  if (floor.binary) {
    floorServer = new LineServer([floor.binary, "serve"], process.env);
    const fs = floorServer;
    sides.set("c", async (c, n) => {
      const path = c === "acquire"
        ? join(benchDir, "c", "run.lock")
        : c === "acquire@tmpfs"
        ? join(tmpfsRoot!, "c", "run.lock")
        : c === "probe_missing"
        ? freePath
        : c === "scan"
        ? scanDir
        : heldLock.path;
      const answer = await fs.ask(`${c.split("@")[0]} ${n} ${path}`);
      if (!/^[0-9.]+$/.test(answer)) throw new Error(`floor: ${answer}`);
      return Number(answer) / 1000;
    });
    mkdirSync(join(benchDir, "c"));
    const acquireLabel = "C floor: the protocol's 9 system calls";
    const cCases: [string, string][] = [
      ["acquire", acquireLabel],
      ["probe", "C floor: open, flock, read, close"],
      ["probe_noread", "C floor: open, flock, close"],
      ["probe_missing", "C floor: open (ENOENT)"],
      [
        "probe_held",
        "C: held()'s 6 calls (open, fstat, flock, read 32 B, kill, close)",
      ],
      [
        "probe_inspect",
        "C: inspect()'s 6 calls (the same, reading the record)",
      ],
    ];
    if (hasScan) cCases.push(["scan", "C floor: readdir + probe each"]);
    if (tmpfsRoot) {
      mkdirSync(join(tmpfsRoot, "c"));
      cCases.push(["acquire@tmpfs", `${acquireLabel} (tmpfs)`]);
    }
    for (const [c, label] of cCases) {
      measures.push({
        id: `c:${c}`,
        side: "c",
        case: c,
        label,
        kind: "floor",
        runtime: "c",
        rounds: [],
      });
    }
  }

  const time = (m: Measure, n: number) => sides.get(m.side)!(m.case, n);
  // Warm-up and calibration: n such that one batch takes about BATCH_MS.
  log(`micro: warming up ${measures.length} implementations`);
  for (const m of measures) {
    const n0 = m.case === "scan" ? 1 : 50;
    await time(m, n0);
    const us = await time(m, n0);
    m.n = m.case === "scan"
      ? Math.max(1, Math.round((BATCH_MS * 4000) / us))
      : Math.min(50_000, Math.max(5, Math.round((BATCH_MS * 1000) / us)));
  }
  for (let r = 0; r < ROUNDS; r++) {
    log(`micro: round ${r + 1}/${ROUNDS}`);
    for (let i = 0; i < measures.length; i++) {
      const m = measures[(i + r * 3) % measures.length];
      m.rounds.push(await time(m, m.n!));
    }
  }
  for (const m of measures) {
    m.best = Math.min(...m.rounds);
    m.median = median(m.rounds);
  }
  for (const w of workers) w.close();
  floorServer?.close();

  const byId = new Map(measures.map((m) => [m.id, m]));
  const group = (
    id: string,
    title: string,
    floorId: string,
    bareCase: string | undefined,
    ids: string[],
    groupNote?: string,
  ) => {
    const f = byId.get(floorId);
    const rows: Row[] = [];
    for (const mid of ids) {
      const m = byId.get(mid);
      if (!m) continue;
      const bare = bareCase ? byId.get(`${m.side}:${bareCase}`) : undefined;
      rows.push({
        id: m.id,
        label: m.label,
        kind: m.kind,
        runtime: m.runtime,
        unit: "µs",
        best: round3(m.best!),
        median: round3(m.median!),
        ratio: f ? round3(m.best! / f.best!) : undefined,
        vsBare: bare && m.runtime === "deno" && m.kind !== "bare"
          ? round3(m.best! / bare.best!)
          : undefined,
        extra: { n: m.n, rounds: m.rounds.map(round3) },
      });
    }
    groups.push({
      id,
      title,
      floor: f ? f.id : undefined,
      rows,
      note: groupNote,
    });
  };
  const each = (cases: string[], sidesList = Object.keys(workerCommands)) =>
    sidesList.flatMap((s) => cases.map((c) => `${s}:${c}`));
  group(
    "acquire",
    "acquire+release (uncontended)",
    "c:acquire",
    "bareAcquire",
    [
      "c:acquire",
      ...each(["bareAcquire", "acquireSync", "acquire"]),
      "node:lockfileSync",
      "node:properLockfileSync",
      "node:properLockfile",
    ],
  );
  if (tmpfsRoot) {
    group(
      "acquire-tmpfs",
      "acquire+release (uncontended) on tmpfs: no disk journal, the runtime's own overhead shows",
      "c:acquire@tmpfs",
      "bareAcquire@tmpfs",
      [
        "c:acquire@tmpfs",
        ...each(["bareAcquire@tmpfs", "acquireSync@tmpfs", "acquire@tmpfs"]),
        "node:lockfileSync@tmpfs",
      ],
    );
  }
  group(
    "held",
    "held() on a held lock",
    "c:probe",
    "bareSafeProbe",
    [
      "c:probe_noread",
      "c:probe",
      "c:probe_held",
      ...each(["bareProbe", "bareSafeProbe", "heldHeld"]),
    ],
    "ratio against the probe floor with read (a probe reads the record); the floor without read is shown too. × Deno.*: against the safe bare sequence (Deno.open has no O_NOFOLLOW, no O_NONBLOCK)",
  );
  group(
    "inspect",
    "inspect() on a held lock",
    "c:probe",
    "bareSafeProbe",
    ["c:probe", "c:probe_inspect", ...each(["bareSafeProbe", "inspectHeld"])],
  );
  group(
    "free",
    "held() and inspect() on a free lock (no file)",
    "c:probe_missing",
    undefined,
    ["c:probe_missing", ...each(["heldFree", "inspectFree"])],
  );
  if (hasScan) {
    group(
      "scan",
      `scan() of ${SCAN_LOCKS.toLocaleString("en")} locks`,
      "c:scan",
      undefined,
      ["c:scan", ...each(["scan"])],
    );
  }
}

// ---------------------------------------------------------------------------
// Hand-off: release → waiting acquire, SIGKILLed holder → waiter

async function handoff(): Promise<void> {
  const rows: Row[] = [];
  const samples = QUICK ? 5 : 15;
  const killSamples = QUICK ? 3 : 12;
  const dir = join(benchDir, "handoff");
  mkdirSync(dir);
  const runtimes = Object.keys(workerCommands).filter((n) =>
    n !== "deno-scoped"
  );
  for (const name of runtimes) {
    const w = new Worker(name);
    const who = { deno: "Deno", node: "Node", bun: "Bun" }[name]!;
    const libs: ["runlock" | "proper-lockfile", string][] = [[
      "runlock",
      `${who}: runlock`,
    ]];
    if (name === "node") {
      libs.push(["proper-lockfile", "Node: proper-lockfile"]);
    }
    for (const [lib, label] of libs) {
      for (const kind of ["release", "kill"] as const) {
        log(`hand-off: ${label}, after ${kind}`);
        const n = lib === "proper-lockfile" && kind === "kill"
          ? (QUICK ? 1 : 2)
          : kind === "kill"
          ? killSamples
          : samples;
        const { ms, floorMs } = await w.request({
          cmd: "handoff",
          kind,
          lib,
          path: join(dir, `${name}-${lib}-${kind}.lock`),
          samples: n,
          settle: 20,
          floor: kind === "kill" && lib === "runlock"
            ? floor.binary
            : undefined,
        });
        if (floorMs?.length) {
          rows.push({
            id: `${name}:floor:kill`,
            label:
              `${who}: C floor, a C waiter in flock(LOCK_EX) on the holder's other lock, after the same SIGKILL`,
            kind: "floor",
            runtime: name,
            unit: "ms",
            best: round3(Math.min(...floorMs)),
            median: round3(median(floorMs)),
            extra: {
              kind,
              samples: floorMs.map(round3),
              max: round3(Math.max(...floorMs)),
            },
          });
        }
        rows.push({
          id: `${name}:${lib}:${kind}`,
          label: `${label}, after ${kind === "kill" ? "SIGKILL" : "release"}`,
          kind: lib === "runlock" ? "runlock" : "incumbent",
          runtime: name,
          unit: "ms",
          best: round3(Math.min(...ms)),
          median: round3(median(ms)),
          extra: {
            kind,
            samples: ms.map(round3),
            max: round3(Math.max(...ms)),
            // Each sample less the floor's from the same SIGKILL: the
            // holder's teardown varies from kill to kill (bimodal for a
            // Node holder, about 4 or 17 ms), which a difference of two
            // medians of a few samples does not cancel.
            ...(floorMs?.length
              ? {
                aboveFloorMs: (ms as number[]).map((x: number, i: number) =>
                  round3(x - floorMs[i])
                ),
              }
              : {}),
          },
        });
      }
    }
    w.close();
  }
  groups.push({
    id: "handoff",
    title: "hand-off latency (median of samples; waiter in another process)",
    rows,
    note:
      `release: from the waiter's "release" request to the holder process until the waiter's acquire resolves (an upper bound: it includes the holder's wake-up); kill: from SIGKILL of the holder. proper-lockfile waits with retries every 1-10 ms (runlock's poll bounds) and stale: 2000 ms, its minimum (default 10 s); a SIGKILLed holder's kernel teardown is part of every "kill" figure: the kernel closes a dying process's files only after tearing down its address space, so the C floor (a C process waiting in flock(LOCK_EX) on a second lock of the same holder, in another directory, woken by the same SIGKILL) is the physical floor of each hand-off after SIGKILL`,
  });
}

// ---------------------------------------------------------------------------
// Contention: N processes looping acquire/release on one lock

async function contention(): Promise<void> {
  const rows: Row[] = [];
  const dir = join(benchDir, "contention");
  mkdirSync(dir);
  const plans: [string, "runlock" | "proper-lockfile", string][] = Object.keys(
    workerCommands,
  )
    .filter((n) => n !== "deno-scoped")
    .map((
      n,
    ) => [
      n,
      "runlock",
      `${{ deno: "Deno", node: "Node", bun: "Bun" }[n]}: runlock`,
    ]);
  plans.push(["node", "proper-lockfile", "Node: proper-lockfile"]);
  for (const [name, lib, label] of plans) {
    log(`contention: ${CONTENDERS} × ${label}, ${CONTEND_MS} ms`);
    const path = join(dir, `${name}-${lib}.lock`);
    const startAt = Date.now() + 2000;
    const cmd = workerCommands[name];
    const children = Array.from({ length: CONTENDERS }, () => {
      const arg = JSON.stringify({ lib, path, startAt, duration: CONTEND_MS });
      return new Promise<string>((resolve, reject) => {
        const child = spawn(cmd[0], [...cmd.slice(1), "contend", arg], {
          stdio: ["ignore", "pipe", "inherit"],
          env: workerEnv(cmd),
          cwd: snap,
        });
        let out = "";
        child.stdout!.on("data", (d) => out += d);
        child.on(
          "exit",
          (code) =>
            code === 0
              ? resolve(out)
              : reject(new Error(`${label} contender exited with ${code}`)),
        );
      });
    });
    const results = (await Promise.all(children)).map((o) => JSON.parse(o));
    const waits = results.flatMap((r) => r.waits as number[]);
    const acquired = results.reduce((s, r) => s + r.acquired, 0);
    const perProcess = results.map((r) => r.acquired as number);
    const starved = results.reduce((s, r) => s + r.starved, 0);
    rows.push({
      id: `${name}:${lib}:contention`,
      label,
      kind: lib === "runlock" ? "runlock" : "incumbent",
      runtime: name,
      unit: "ms",
      best: round3(maxOf(waits)),
      median: round3(median(waits)),
      extra: {
        contenders: CONTENDERS,
        durationMs: CONTEND_MS,
        acquisitions: acquired,
        perSecond: Math.round(acquired / (CONTEND_MS / 1000)),
        perProcess,
        p99: round3(quantile(waits, 0.99)),
        worst: round3(maxOf(waits)),
        starvedAtDeadline: starved,
      },
    });
  }
  groups.push({
    id: "contention",
    title:
      `contention: ${CONTENDERS} processes looping acquire/release on one lock for ${CONTEND_MS} ms`,
    rows,
    note:
      "columns: acquisitions per second (all processes), median wait, p99 wait, worst wait, acquisitions per process; a contender still waiting at the deadline counts its wait so far",
  });
}

// ---------------------------------------------------------------------------
// Start-up and the CLI, end to end

function timeCommand(cmd: string[], expect: number): number {
  const t0 = performance.now();
  const result = spawnSync(cmd[0], cmd.slice(1), {
    stdio: ["ignore", "ignore", "pipe"],
    cwd: runDir,
    env: { ...process.env, NO_COLOR: "1" },
  });
  const ms = performance.now() - t0;
  if (result.status !== expect) {
    throw new Error(
      `${
        cmd.join(" ")
      } exited with ${result.status} (expected ${expect}): ${result.stderr}`,
    );
  }
  return ms;
}

function startup(): void {
  const samples = QUICK ? 5 : 21;
  const cliDir = join(benchDir, "cli");
  mkdirSync(cliDir);
  writeFileSync(join(runDir, "empty.mjs"), "");
  writeFileSync(
    join(runDir, "import.mjs"),
    `import { acquire } from "runlock";\nif (typeof acquire !== "function") process.exit(3);\n`,
  );
  writeFileSync(join(runDir, "empty.ts"), "");
  writeFileSync(
    join(runDir, "import.ts"),
    `import { acquire } from ${
      JSON.stringify(join(snap, "mod.ts"))
    };\nif (typeof acquire !== "function") Deno.exit(3);\n`,
  );
  const deno = Deno.execPath();
  const held = heldLock.path;
  const cliTs = join(snap, "src", "cli.ts");
  const nodeBin = join(pkgDir, "bin", "runlock.js");
  let bunBinary: string | undefined;
  if (WITH_BUN) {
    bunBinary = join(runDir, "runlock-bun");
    try {
      run(bunPath, ["build", "--compile", nodeBin, "--outfile", bunBinary], {
        cwd: runDir,
      });
    } catch (err) {
      note(`bun build --compile failed: ${(err as Error).message}`);
      bunBinary = undefined;
    }
  }
  const perms = [
    `--allow-read=${benchDir}`,
    `--allow-write=${benchDir}`,
  ];
  type Cmd = {
    id: string;
    label: string;
    cmd: string[];
    expect: number;
    group: string;
    runtime: string;
    kind: Row["kind"];
  };
  const cmds: Cmd[] = [
    {
      id: "node:empty",
      label: "Node: empty script",
      cmd: ["node", "empty.mjs"],
      expect: 0,
      group: "startup",
      runtime: "node",
      kind: "baseline",
    },
    {
      id: "node:import",
      label: "Node: import runlock",
      cmd: ["node", "import.mjs"],
      expect: 0,
      group: "startup",
      runtime: "node",
      kind: "runlock",
    },
    {
      id: "deno:empty",
      label: "Deno: empty script",
      cmd: [deno, "run", "empty.ts"],
      expect: 0,
      group: "startup",
      runtime: "deno",
      kind: "baseline",
    },
    {
      id: "deno:import",
      label: "Deno: import runlock",
      cmd: [deno, "run", "import.ts"],
      expect: 0,
      group: "startup",
      runtime: "deno",
      kind: "runlock",
    },
  ];
  if (WITH_BUN) {
    cmds.push(
      {
        id: "bun:empty",
        label: "Bun: empty script",
        cmd: [bunPath, "empty.mjs"],
        expect: 0,
        group: "startup",
        runtime: "bun",
        kind: "baseline",
      },
      {
        id: "bun:import",
        label: "Bun: import runlock",
        cmd: [bunPath, "import.mjs"],
        expect: 0,
        group: "startup",
        runtime: "bun",
        kind: "runlock",
      },
    );
  }
  const flockFile = join(cliDir, "flock.lock");
  const runFile = join(cliDir, "run.lock");
  if (hasFlock) {
    cmds.push(
      {
        id: "flock:held",
        label: "flock -n FILE true (held: exits 1)",
        cmd: ["flock", "-n", held, "true"],
        expect: 1,
        group: "status",
        runtime: "c",
        kind: "incumbent",
      },
      {
        id: "flock:free",
        label: "flock -n FILE true (free: runs true)",
        cmd: ["flock", "-n", flockFile, "true"],
        expect: 0,
        group: "run",
        runtime: "c",
        kind: "incumbent",
      },
    );
  }
  cmds.push(
    {
      id: "node:status",
      label: "Node: runlock status FILE",
      cmd: ["node", nodeBin, "status", held],
      expect: 0,
      group: "status",
      runtime: "node",
      kind: "runlock",
    },
    {
      id: "deno:status",
      label: "Deno: runlock status FILE",
      cmd: [deno, "run", ...perms, cliTs, "status", held],
      expect: 0,
      group: "status",
      runtime: "deno",
      kind: "runlock",
    },
    {
      id: "node:run",
      label: "Node: runlock run FILE -- true",
      cmd: ["node", nodeBin, "run", runFile, "--", "true"],
      expect: 0,
      group: "run",
      runtime: "node",
      kind: "runlock",
    },
    {
      id: "deno:run",
      label: "Deno: runlock run FILE -- true",
      cmd: [
        deno,
        "run",
        ...perms,
        "--allow-run",
        "--allow-env",
        cliTs,
        "run",
        runFile,
        "--",
        "true",
      ],
      expect: 0,
      group: "run",
      runtime: "deno",
      kind: "runlock",
    },
  );
  if (bunBinary) {
    cmds.push(
      {
        id: "bun:status",
        label: "Bun binary: runlock status FILE",
        cmd: [bunBinary, "status", held],
        expect: 0,
        group: "status",
        runtime: "bun",
        kind: "runlock",
      },
      {
        id: "bun:run",
        label: "Bun binary: runlock run FILE -- true",
        cmd: [bunBinary, "run", runFile, "--", "true"],
        expect: 0,
        group: "run",
        runtime: "bun",
        kind: "runlock",
      },
    );
  }
  log(`start-up: ${cmds.length} commands × ${samples}, interleaved`);
  for (const c of cmds) timeCommand(c.cmd, c.expect); // warm caches
  const times = new Map<string, number[]>(cmds.map((c) => [c.id, []]));
  for (let r = 0; r < samples; r++) {
    for (const c of cmds) times.get(c.id)!.push(timeCommand(c.cmd, c.expect));
  }
  const titles: Record<string, [string, string | undefined]> = {
    startup: [
      "start-up: a process that imports runlock (and does nothing)",
      undefined,
    ],
    status: ["CLI: ask whether a lock is held, as a process", "flock:held"],
    run: [
      "CLI: take a free lock, run `true`, release, as a process",
      "flock:free",
    ],
  };
  for (const [gid, [title, floorId]] of Object.entries(titles)) {
    const members = cmds.filter((c) => c.group === gid);
    const floorBest = floorId && times.has(floorId)
      ? Math.min(...times.get(floorId)!)
      : undefined;
    groups.push({
      id: gid,
      title,
      floor: floorBest ? floorId : undefined,
      rows: members.map((c) => {
        const t = times.get(c.id)!;
        const empty = gid === "startup" && c.kind === "runlock"
          ? times.get(c.id.replace(":import", ":empty"))
          : undefined;
        return {
          id: c.id,
          label: c.label,
          kind: c.kind,
          runtime: c.runtime,
          unit: "ms",
          best: round3(Math.min(...t)),
          median: round3(median(t)),
          ratio: floorBest ? round3(Math.min(...t) / floorBest) : undefined,
          extra: {
            samples: t.map(round3),
            command: c.cmd.map((a) => a.replace(runDir, "$RUN")).join(" "),
            ...(empty
              ? {
                addedBest: round3(Math.min(...t) - Math.min(...empty)),
                addedMedian: round3(median(t) - median(empty)),
              }
              : {}),
          },
        };
      }),
      note: gid === "startup"
        ? "import cost = best(import) − best(empty) on the same runtime"
        : undefined,
    });
  }
}

// ---------------------------------------------------------------------------
// Run

let postgres: PostgresSection | undefined;
let syscalls: SyscallAudit | undefined;
let scale: ScaleSection | undefined;
let watched: WatchResult[] | undefined;
try {
  if (SECTIONS.has("micro")) await micro();
  if (SECTIONS.has("handoff")) await handoff();
  if (SECTIONS.has("contention")) await contention();
  if (SECTIONS.has("scale")) {
    scale = await scaleSection({
      benchDir,
      memoryDir: tmpfsRoot,
      floor: floor.binary,
      runtimes: Object.keys(workerCommands).filter((n) => n !== "deno-scoped"),
      command: (rt, script) =>
        rt === "deno"
          ? [
            Deno.execPath(),
            "run",
            "--allow-all",
            join(snap, "bench", `${script}.ts`),
          ]
          : [rt === "bun" ? bunPath : "node", transpiled(script)],
      env: workerEnv,
      cwd: snap,
      hold: (path) => {
        const lock = runlock.acquireSync(path);
        return () => lock.releaseSync();
      },
      quick: QUICK,
      log,
      note,
    });
  }
  if (SECTIONS.has("watch")) {
    watched = await watchSection(
      Object.keys(workerCommands).filter((n) => n !== "deno-scoped").map(
        (name) => ({
          name,
          command: name === "deno"
            ? [
              Deno.execPath(),
              "run",
              "--allow-all",
              "--quiet",
              join(snap, "bench", "bench_watch.ts"),
            ]
            : [name === "bun" ? bunPath : "node", transpiled("bench_watch")],
          env: {
            RUNLOCK_BENCH_ENTRY: join(pkgDir, "esm", "mod.js"),
            RUNLOCK_BENCH_DIR: benchDir,
            NO_COLOR: "1",
          },
        }),
      ),
      floor.binary,
      log,
    );
  }
  if (SECTIONS.has("startup")) startup();
  if (SECTIONS.has("syscalls")) {
    log("system calls: strace");
    syscalls = auditSyscalls({
      benchDir,
      held: heldLock.path,
      free: freePath,
      workerCommands,
      workerEnv,
      floorBinary: floor.binary,
      note,
    });
  }
  if (SECTIONS.has("postgres")) {
    postgres = postgresSection({ snapshot: snap, note, log });
  }
} finally {
  heldLock.releaseSync();
}

// ---------------------------------------------------------------------------
// Goals, checked on this run's figures

const goals: Goal[] = checkGoals({ groups, syscalls, scale, watched });
goals.push(
  ...(postgres?.goals ?? []).map((g) => ({ ...g, part: "postgres" as const })),
);

// ---------------------------------------------------------------------------
// Output

machine.loadavgEnd = loadavg().map((x) => Math.round(x * 100) / 100);
const loaded = Math.max(...machine.loadavgStart, ...machine.loadavgEnd) >
  machine.cores * 0.5;
if (loaded) {
  note(
    `the machine was loaded (load average ${
      machine.loadavgStart.join(" ")
    } at start, ${
      machine.loadavgEnd.join(" ")
    } at end, ${machine.cores} cores): figures are noisier, ratios still compare like with like`,
  );
}
versions.cc = floor.cc ?? "none";
versions.flock = probeCommand("flock", ["--version"]) ?? "none";
versions.strace = probeCommand("strace", ["-V"]) ?? "none";
versions["proper-lockfile"] = PINS["proper-lockfile"];
versions.lockfile = PINS.lockfile;
versions.runlock = JSON.parse(
  Deno.readTextFileSync(join(snap, "deno.json")),
).version;
versions.source = process.env.RUNLOCK_BENCH_REF
  ? `${process.env.RUNLOCK_BENCH_REF} (${
    run("git", ["rev-parse", "--short", process.env.RUNLOCK_BENCH_REF], {
      cwd: root,
    }).trim()
  })`
  : `working tree at ${
    run("git", ["rev-parse", "--short", "HEAD"], { cwd: root }).trim()
  }`;

const results = {
  schema: 1,
  date: new Date().toISOString(),
  durationSeconds: Math.round((performance.now() - started) / 1000),
  machine: { ...machine, tmpfs: tmpfsRoot ?? null, loaded },
  versions,
  settings: {
    rounds: ROUNDS,
    batchMs: BATCH_MS,
    quick: QUICK,
    sections: [...SECTIONS],
    contenders: CONTENDERS,
    contendMs: CONTEND_MS,
  },
  groups,
  goals,
  syscalls,
  scale,
  watch: watched,
  postgres,
  notes,
};

function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length))
  );
  const line = (cells: string[]) =>
    cells.map((c, i) => i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))
      .join("  ");
  return [
    line(header),
    widths.map((w) => "-".repeat(w)).join("  "),
    ...rows.map(line),
  ]
    .join("\n");
}

const out: string[] = [];
out.push(
  `runlock benchmark, ${results.date}: ${machine.cpu} (${machine.cores} cores), ${machine.os}, ${machine.filesystem}; deno ${
    versions.deno ?? "?"
  }, node ${versions.node ?? "?"}, bun ${versions.bun ?? "-"}; load ${
    machine.loadavgStart.join(" ")
  } → ${machine.loadavgEnd.join(" ")}`,
);
out.push(
  `source: ${versions.source}; best of ${ROUNDS} interleaved rounds per implementation; ratios are best against best in this run`,
);
for (const g of groups) {
  out.push("", `## ${g.title}`);
  if (g.id === "contention") {
    out.push(table(
      [
        "implementation",
        "acq/s",
        "median ms",
        "p99 ms",
        "worst ms",
        "per process",
      ],
      g.rows.map((r) => [
        r.label,
        String(r.extra!.perSecond),
        fmt(r.median),
        fmt(r.extra!.p99 as number),
        fmt(r.extra!.worst as number),
        (r.extra!.perProcess as number[]).join("/"),
      ]),
    ));
  } else if (g.id === "handoff") {
    out.push(table(
      ["implementation", "median ms", "best ms", "worst ms", "samples"],
      g.rows.map((r) => [
        r.label,
        fmt(r.median),
        fmt(r.best),
        fmt(r.extra!.max as number),
        String((r.extra!.samples as number[]).length),
      ]),
    ));
  } else {
    const unit = g.rows[0]?.unit ?? "µs";
    const isStartup = g.id === "startup";
    const hasBare = g.rows.some((r) => r.vsBare !== undefined);
    const header = [
      "implementation",
      `best ${unit}`,
      `median ${unit}`,
      isStartup ? "added ms" : "× floor",
    ];
    if (hasBare) header.push("× Deno.*");
    out.push(table(
      header,
      g.rows.map((r) => {
        const cells = [
          r.label,
          fmt(r.best),
          fmt(r.median),
          isStartup
            ? fmt(r.extra!.addedBest as number | undefined, 1)
            : r.ratio === undefined
            ? ""
            : `${fmt(r.ratio)}×`,
        ];
        if (hasBare) {
          cells.push(r.vsBare === undefined ? "" : `${fmt(r.vsBare)}×`);
        }
        return cells;
      }),
    ));
  }
  if (g.note) out.push(`(${g.note})`);
}
if (syscalls) {
  out.push("", "## system calls per operation (strace -f, mean of many calls)");
  out.push(syscalls.table);
}
if (postgres?.figures) {
  out.push("", `## PostgreSQL (${postgres.source})`);
  out.push(table(
    ["figure", "value"],
    Object.entries(postgres.figures).map(([k, v]) => [k, v]),
  ));
}
if (scale) out.push(scaleTables(scale));
if (watched) {
  out.push(
    "",
    "## watch(): a SIGKILLed holder's `crashed` change, and an idle watch",
  );
  out.push(table(
    [
      "runtime",
      "SIGKILL → crashed (median, best, max ms)",
      "C waiter in flock (median, best ms)",
      `idle watch of ${watched[0]?.idle.locks ?? 0} held runs (CPU ms/s added)`,
    ],
    watched.map((w) => [
      w.runtime,
      `${fmt(w.crashed.median)}  ${fmt(w.crashed.best)}  ${fmt(w.crashed.max)}`,
      w.floor ? `${fmt(w.floor.median)}  ${fmt(w.floor.best)}` : "",
      fmt(w.idle.addedMsPerS, 3),
    ]),
  ));
}
for (
  const [title, which] of [
    ["goals of the file locks", (g: Goal) => g.part === "locks"],
    ["goals of watch()", (g: Goal) => g.part === "watch"],
    [
      "other goals",
      (g: Goal) => g.part !== "locks" && g.part !== "watch",
    ],
  ] as const
) {
  out.push("", `## ${title}`);
  for (const g of goals.filter(which)) {
    const verdict = g.pass === undefined ? "N/A " : g.pass ? "PASS" : "MISS";
    out.push(
      `${verdict}  ${g.goal}: ${
        g.value === undefined ? "not measured" : `${fmt(g.value)} ${g.unit}`
      } (${g.detail})${
        g.part === "locks" || g.part === "watch" ? "" : ` [${g.part}]`
      }`,
    );
  }
}
if (notes.length > 0) out.push("", "## notes", ...notes.map((n) => `- ${n}`));
console.log(out.join("\n"));

mkdirSync(OUT, { recursive: true });
const jsonPath = join(OUT, "results.json");
writeFileSync(jsonPath, JSON.stringify(results, null, 2) + "\n");
const svgPath = join(OUT, "chart.svg");
writeFileSync(svgPath, drawChart(results));
formatFiles([jsonPath, svgPath]);
log(`wrote ${shown(jsonPath)} and ${shown(svgPath)}`);
cleanup();
