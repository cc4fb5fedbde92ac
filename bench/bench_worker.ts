// The runtime side of `deno task bench` (bench/bench.ts). The same file
// runs on Deno (from the sources) and, transpiled by bench.ts, on Node and
// Bun (against the built npm package), so that every runtime is timed by
// the same code.
//
//   bench_worker serve                 a timing server: one JSON request per
//                                      line on stdin, one JSON answer per
//                                      line on stdout (see `serve` below)
//   bench_worker hold <path>           a holder for hand-off: acquire, print
//                                      "held", then obey stdin: "release"
//                                      (prints "released"), "acquire"
//   bench_worker hold-pl <path>        the same with proper-lockfile (Node)
//   bench_worker contend <json>        one of N processes looping
//                                      acquire/release on one lock
//   bench_worker audit <json>          each case k times between marker
//                                      system calls, for an strace of it
//
// Environment: RUNLOCK_BENCH_ENTRY (the library to import on Node and Bun),
// RUNLOCK_BENCH_DEPS (a directory whose node_modules holds the incumbents),
// RUNLOCK_BENCH_SELF (a JSON array: the command that starts this worker, for
// the holders it spawns).
import { type ChildProcess, spawn } from "node:child_process";
import { closeSync, mkdirSync, openSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import { basename, dirname, join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";

type Runlock = typeof import("../mod.ts");
type Lock = Awaited<ReturnType<Runlock["acquire"]>>;

/** proper-lockfile 4, the most used npm lock (a directory next to the file). */
interface ProperLockfile {
  lock(file: string, options?: object): Promise<() => Promise<void>>;
  lockSync(file: string, options?: object): () => void;
}

/** npm `lockfile` 1: an O_EXCL file, no PID, no crash safety. */
interface NpmLockfile {
  lockSync(path: string, options?: object): void;
  unlockSync(path: string): void;
}

const isDeno = "Deno" in globalThis;
const isBun = "Bun" in globalThis;
const runtime = isDeno ? "deno" : isBun ? "bun" : "node";

const lib: Runlock = isDeno
  ? await import("../mod.ts")
  : await import(process.env.RUNLOCK_BENCH_ENTRY!);

function incumbents(): { pl: ProperLockfile; lf: NpmLockfile } | undefined {
  const deps = process.env.RUNLOCK_BENCH_DEPS;
  if (isDeno || !deps) return undefined;
  const require = createRequire(join(deps, "package.json"));
  return {
    pl: require("proper-lockfile") as ProperLockfile,
    lf: require("lockfile") as NpmLockfile,
  };
}

const self: string[] = JSON.parse(process.env.RUNLOCK_BENCH_SELF ?? "[]");

function say(value: unknown): void {
  process.stdout.write(JSON.stringify(value) + "\n");
}

const sleep = (ms: number) =>
  new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Where the cases work: set by the orchestrator's "setup" request. */
interface Paths {
  /** A directory of this worker's own for acquire cases. */
  dir: string;
  /** A lock held by another process for the whole run. */
  held: string;
  /** A path where no lock file exists. */
  free: string;
  /** A directory of 10,000 lock files, when scan() exists. */
  scanDir: string;
  /** How many lock files scanDir holds. */
  scanCount?: number;
  /** A directory on tmpfs for the acquire cases again, if there is one. */
  tmpfsDir?: string;
}

/** Runs a case n times; returns the elapsed milliseconds. */
type Case = (n: number) => number | Promise<number>;

// Retries for proper-lockfile waiters: the same 1 to 10 ms poll bounds as
// runlock's waiting, so that hand-off compares mechanisms, not settings.
const PL_RETRIES = { retries: 1e6, factor: 2, minTimeout: 1, maxTimeout: 10 };
// proper-lockfile's smallest allowed staleness (its default is 10 s).
const PL_STALE = 2000;

/** The acquire+release cases, working in `dir`. */
function acquireCases(dir: string): Record<string, Case> {
  mkdirSync(dir, { recursive: true });
  const lockPath = join(dir, "run.lock");
  const table: Record<string, Case> = {
    acquireSync(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) lib.acquireSync(lockPath).releaseSync();
      return performance.now() - start;
    },
    async acquire(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) await (await lib.acquire(lockPath)).release();
      return performance.now() - start;
    },
  };
  if (isDeno) table.bareAcquire = bareAcquire(dir);
  const inc = incumbents();
  if (inc) {
    const target = join(dir, "pl.target");
    closeSync(openSync(target, "a"));
    const lfPath = join(dir, "lockfile.lock");
    Object.assign(table, {
      async properLockfile(n: number) {
        const start = performance.now();
        for (let i = 0; i < n; i++) await (await inc.pl.lock(target))();
        return performance.now() - start;
      },
      properLockfileSync(n: number) {
        const start = performance.now();
        for (let i = 0; i < n; i++) inc.pl.lockSync(target)();
        return performance.now() - start;
      },
      lockfileSync(n: number) {
        const start = performance.now();
        for (let i = 0; i < n; i++) {
          inc.lf.lockSync(lfPath);
          inc.lf.unlockSync(lfPath);
        }
        return performance.now() - start;
      },
    });
  }
  return table;
}

function cases(paths: Paths): Record<string, Case> {
  const table: Record<string, Case> = {
    ...acquireCases(paths.dir),
    async heldHeld(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        if (!await lib.held(paths.held)) throw new Error("not held");
      }
      return performance.now() - start;
    },
    async heldFree(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        if (await lib.held(paths.free)) throw new Error("held");
      }
      return performance.now() - start;
    },
    async inspectFree(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        if ((await lib.inspect(paths.free)).state !== "free") {
          throw new Error("not free");
        }
      }
      return performance.now() - start;
    },
    async inspectHeld(n) {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        if ((await lib.inspect(paths.held)).state !== "held") {
          throw new Error("not held");
        }
      }
      return performance.now() - start;
    },
  };
  const scan = (lib as unknown as Record<string, unknown>).scan;
  if (typeof scan === "function") {
    table.scan = async (n) => {
      const start = performance.now();
      for (let i = 0; i < n; i++) {
        const found = await scan(paths.scanDir);
        if (Array.isArray(found) && found.length !== paths.scanCount) {
          throw new Error(
            `scan() found ${found.length} locks, not ${paths.scanCount}`,
          );
        }
      }
      return performance.now() - start;
    };
  }
  if (isDeno) {
    table.bareProbe = bareProbe(paths.held);
    table.bareSafeProbe = bareSafeProbe(paths.held);
  }
  if (paths.tmpfsDir) {
    for (const [name, run] of Object.entries(acquireCases(paths.tmpfsDir))) {
      if (name !== "properLockfile" && name !== "properLockfileSync") {
        table[`${name}@tmpfs`] = run;
      }
    }
  }
  return table;
}

/**
 * The floor that Deno's own op overhead allows: the protocol's system calls
 * made bare through `Deno.*`, with no checks, no errors mapped, no record
 * parsed, plus the realpath that pinning the directory needs on Deno (it has
 * no directory descriptors to pin: the baseline counts it).
 * (Deno.removeSync adds an lstat before each unlink.)
 */
function bareAcquire(dir: string): Case {
  const record = new TextEncoder().encode(
    `${Deno.pid}\nrunlock 1\nhost=bench\nstarted=${
      new Date().toISOString()
    }\nruntime=deno\n`,
  );
  let serial = 0;
  return (n) => {
    const start = performance.now();
    for (let i = 0; i < n; i++) {
      const real = Deno.realPathSync(dir);
      const lockPath = `${real}/bare.lock`;
      const temp = `${real}/.bare.lock.${(serial++).toString(16)}.tmp`;
      const file = Deno.openSync(temp, {
        read: true,
        write: true,
        createNew: true,
        mode: 0o644,
      });
      file.tryLockSync(true);
      file.writeSync(record);
      Deno.linkSync(temp, lockPath);
      Deno.removeSync(temp);
      file.statSync();
      Deno.lstatSync(lockPath);
      Deno.removeSync(lockPath);
      file.close();
    }
    return performance.now() - start;
  };
}

/**
 * The probe's calls bare through Deno.*: open, flock, read, close (what the
 * C probe makes, but without its O_NOFOLLOW and O_NONBLOCK, which Deno.open
 * lacks).
 */
function bareProbe(held: string): Case {
  const buf = new Uint8Array(4097);
  return (n) => {
    const start = performance.now();
    for (let i = 0; i < n; i++) {
      const file = Deno.openSync(held, { read: true });
      file.tryLockSync(false);
      file.readSync(buf);
      file.close();
    }
    return performance.now() - start;
  };
}

/**
 * The safe probe bare through Deno.*: lstat (refuse a symlink or a FIFO,
 * since Deno.open has neither O_NOFOLLOW nor O_NONBLOCK), open, fstat (the
 * same inode as the lstat?), flock, read, kill(pid, 0), close. The
 * baseline for Deno's held(). The kill is the protocol's (PROTOCOL.md,
 * Probes): a dead PID under a held flock is a takeover in progress, which
 * held() must not report as a live holder, so held() asks it of every held
 * runlock record.
 */
function bareSafeProbe(held: string): Case {
  const buf = new Uint8Array(4097);
  // As held() does: without --allow-run (the scoped permissions) it cannot
  // ask, and answers what the flock says.
  const ask = Deno.permissions.querySync({ name: "run" }).state === "granted";
  return (n) => {
    const start = performance.now();
    for (let i = 0; i < n; i++) {
      const before = Deno.lstatSync(held);
      if (!before.isFile) throw new Error("not a file");
      const file = Deno.openSync(held, { read: true });
      if (file.statSync().ino !== before.ino) throw new Error("replaced");
      file.tryLockSync(false);
      file.readSync(buf);
      let pid = 0;
      for (let j = 0; buf[j] >= 48 && buf[j] <= 57; j++) {
        pid = pid * 10 + buf[j] - 48;
      }
      if (ask) Deno.kill(pid, 0 as unknown as Deno.Signal);
      file.close();
    }
    return performance.now() - start;
  };
}

/** Lines from a child's stdout, one at a time. */
function lineReader(child: ChildProcess): () => Promise<string> {
  const lines = createInterface({ input: child.stdout! })[
    Symbol.asyncIterator
  ]();
  return async () => {
    const { value, done } = await lines.next();
    if (done) throw new Error("the holder exited");
    return value as string;
  };
}

function spawnHolder(
  mode: string,
  path: string,
  also?: string,
): ChildProcess {
  const args = also === undefined ? [mode, path] : [mode, path, also];
  return spawn(self[0], [...self.slice(1), ...args], {
    stdio: ["pipe", "pipe", "inherit"],
    env: process.env,
  });
}

interface HandoffRequest {
  kind: "release" | "kill";
  lib: "runlock" | "proper-lockfile";
  path: string;
  samples: number;
  /** How long the waiter waits before the holder lets go, in ms. */
  settle: number;
  /**
   * kill: the C floor's binary (bench/floor.c). Each sample then has the
   * floor's beside it, from the same SIGKILL: the holder also holds a
   * second lock (in another directory), on whose file a C process waits in
   * flock(LOCK_EX).
   */
  floor?: string;
}

/** Until `child` has exited. */
function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return Promise.resolve();
  }
  return new Promise((resolve) => child.once("exit", () => resolve()));
}

/**
 * The floor of a hand-off after SIGKILL, made ready: a C process blocked in
 * flock(LOCK_EX) on `path` (the holder's second lock), whose line "woke"
 * comes when the kernel closes the dead holder's descriptor, after the
 * holder's teardown. Resolves, once it is waiting, to its wake-up (read by
 * this process, as runlock's acquire resolves in it) and its end.
 */
async function floorWaiter(
  binary: string,
  path: string,
): Promise<{ woke: () => Promise<number>; end: () => Promise<void> }> {
  const c = spawn(binary, ["waitlock", path], {
    stdio: ["pipe", "pipe", "inherit"],
  });
  const line = lineReader(c);
  if (await line() !== "waiting") throw new Error("floor waitlock failed");
  return {
    woke: async () => {
      if (await line() !== "woke") throw new Error("floor waitlock failed");
      return performance.now();
    },
    end: async () => {
      c.stdin!.end();
      await exited(c);
    },
  };
}

/**
 * Hand-off latency, from the moment the waiter tells the holder (another
 * process) to release, or SIGKILLs it, to the moment the waiter's pending
 * acquire resolves. Measured on one clock, the waiter's; the "release" figure
 * includes the holder's wake-up on its stdin, so it is an upper bound.
 */
async function handoff(
  req: HandoffRequest,
): Promise<{ ms: number[]; floorMs?: number[] }> {
  const pl = req.lib === "proper-lockfile" ? incumbents()!.pl : undefined;
  if (pl) closeSync(openSync(req.path, "a"));
  const mode = pl ? "hold-pl" : "hold";
  const wait = async (): Promise<() => Promise<void>> => {
    if (pl) {
      return await pl.lock(req.path, { stale: PL_STALE, retries: PL_RETRIES });
    }
    const lock = await lib.acquire(req.path, { timeout: 30_000 });
    return () => lock.release();
  };
  const ms: number[] = [];
  const floor: number[] = [];
  const paired = req.kind === "kill" && req.floor !== undefined && !pl;
  // The floor's lock: in a directory of its own, so that its events never
  // reach the waiter's watch.
  const floorPath = paired
    ? join(`${dirname(req.path)}-floor`, basename(req.path))
    : undefined;
  if (floorPath) mkdirSync(dirname(floorPath), { recursive: true });
  let holder: ChildProcess | undefined;
  let next: (() => Promise<string>) | undefined;
  try {
    for (let i = 0; i < req.samples; i++) {
      if (holder === undefined || req.kind === "kill") {
        holder = spawnHolder(mode, req.path, floorPath);
        next = lineReader(holder);
      } else {
        holder.stdin!.write("acquire\n");
      }
      const line = await next!();
      if (line !== "held") throw new Error(`holder said ${line}`);
      const c = floorPath
        ? await floorWaiter(req.floor!, floorPath)
        : undefined;
      const pending = wait();
      // A random phase, so that a SIGKILL does not always land at the same
      // point of the waiter's poll schedule.
      await sleep(req.settle + Math.random() * 10);
      const woke = c?.woke();
      const t0 = performance.now();
      if (req.kind === "kill") holder.kill("SIGKILL");
      else holder.stdin!.write("release\n");
      const release = await pending;
      ms.push(performance.now() - t0);
      if (c) {
        floor.push((await woke!) - t0);
        await c.end();
      }
      await release();
      if (req.kind === "kill") {
        const dead = holder;
        if (dead.exitCode === null && dead.signalCode === null) {
          await new Promise((resolve) => dead.once("exit", resolve));
        }
        holder = undefined;
      } else if (await next!() !== "released") {
        throw new Error("holder did not release");
      }
    }
  } finally {
    holder?.kill("SIGKILL");
  }
  return paired ? { ms, floorMs: floor } : { ms };
}

/**
 * Holds `path` (and `also`, the floor's lock, when given) until told to
 * release, or SIGKILLed.
 */
async function hold(path: string, pl: boolean, also?: string): Promise<void> {
  const inc = pl ? incumbents()! : undefined;
  if (also !== undefined) await lib.acquire(also);
  const take = async (): Promise<() => Promise<void>> => {
    if (inc) return await inc.pl.lock(path, { stale: PL_STALE });
    const lock: Lock = await lib.acquire(path);
    return () => lock.release();
  };
  let release: (() => Promise<void>) | undefined = await take();
  process.stdout.write("held\n");
  for await (const line of createInterface({ input: process.stdin })) {
    if (line === "release" && release) {
      await release();
      release = undefined;
      process.stdout.write("released\n");
    } else if (line === "acquire" && !release) {
      release = await take();
      process.stdout.write("held\n");
    }
  }
  await release?.();
}

interface ContendRequest {
  lib: "runlock" | "proper-lockfile";
  path: string;
  /** Epoch ms at which every contender starts. */
  startAt: number;
  /** How long to loop, in ms. */
  duration: number;
}

/** One contender: loops acquire/release until the deadline. */
async function contend(req: ContendRequest): Promise<void> {
  const pl = req.lib === "proper-lockfile" ? incumbents()!.pl : undefined;
  if (pl) closeSync(openSync(req.path, "a"));
  await sleep(Math.max(0, req.startAt - Date.now()));
  const deadline = performance.now() + req.duration;
  const waits: number[] = [];
  let starved = 0;
  while (performance.now() < deadline) {
    const t0 = performance.now();
    try {
      let release: () => Promise<void>;
      if (pl) {
        release = await pl.lock(req.path, {
          stale: PL_STALE,
          retries: PL_RETRIES,
        });
      } else {
        const lock = await lib.acquire(req.path, {
          timeout: Math.max(1, deadline - t0),
        });
        release = () => lock.release();
      }
      waits.push(performance.now() - t0);
      await release();
    } catch (err) {
      // Still waiting at the deadline: count the wait as it stood.
      const name = (err as Error).name;
      if (
        name !== "HeldError" && (err as { code?: string }).code !== "ELOCKED"
      ) {
        throw err;
      }
      starved++;
      waits.push(performance.now() - t0);
      break;
    }
  }
  say({ acquired: waits.length - starved, starved, waits });
}

interface AuditRequest extends Paths {
  cases: string[];
  k: number;
}

function mark(dir: string, name: string, when: string): void {
  try {
    statSync(join(dir, `.runlock-bench-mark-${name}-${when}`));
  } catch {
    // The marker is a failing system call that strace shows; nothing else.
  }
}

/** Each case k times (after k to warm up), between two marker calls. */
async function audit(req: AuditRequest): Promise<void> {
  const table = cases(req);
  for (const name of req.cases) {
    const run = table[name];
    if (!run) continue;
    await run(req.k);
    mark(req.dir, name, "begin");
    await run(req.k);
    mark(req.dir, name, "end");
  }
  say({ done: true });
}

/**
 * Requests, one JSON object a line:
 *   {"cmd":"info"}                        → runtime, version, exports
 *   {"cmd":"setup", dir, held, free, scanDir} → the case names available
 *   {"cmd":"time", "case", "n"}           → {"us"}: mean µs per run
 *   {"cmd":"handoff", ...HandoffRequest}  → {"ms": [...]}
 * Errors are answered as {"error": message}.
 */
async function serve(): Promise<void> {
  let table: Record<string, Case> = {};
  for await (const line of createInterface({ input: process.stdin })) {
    if (line.trim() === "") continue;
    const req = JSON.parse(line);
    try {
      switch (req.cmd) {
        case "info":
          say({
            runtime,
            version: isDeno
              ? Deno.version.deno
              : isBun
              ? (globalThis as unknown as { Bun: { version: string } }).Bun
                .version
              : process.versions.node,
            exports: Object.keys(lib).sort(),
          });
          break;
        case "setup":
          table = cases(req);
          say({ cases: Object.keys(table) });
          break;
        case "time": {
          const ms = await table[req.case](req.n);
          say({ us: (ms * 1000) / req.n });
          break;
        }
        case "handoff":
          say(await handoff(req));
          break;
        default:
          throw new Error(`unknown request ${req.cmd}`);
      }
    } catch (err) {
      say({ error: err instanceof Error ? err.stack ?? err.message : err });
    }
  }
}

const [mode, arg, also] = process.argv.slice(2);
if (mode === "serve") await serve();
else if (mode === "hold") await hold(arg, false, also);
else if (mode === "hold-pl") await hold(arg, true);
else if (mode === "contend") await contend(JSON.parse(arg));
else if (mode === "audit") await audit(JSON.parse(arg));
else {
  console.error(`bench_worker: unknown mode ${mode}`);
  process.exit(2);
}
