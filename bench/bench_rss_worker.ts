// The memory figure of the benchmark's scale section (bench/bench_scale.ts):
// one process making `cycles` acquire/release cycles, and a bare control
// process making the same system calls without runlock. Prints the resident
// set size (and the heap) at checkpoints, as one JSON line.
//
//   bench_rss_worker <json>   {"dir", "cycles", "bare": boolean, "turnEvery"}
//
// No static node: imports: on Deno the first one loads Deno's Node layer,
// whose memory would then count on both sides. Node and Bun reach node:fs
// and koffi (for the bare control's flock) through dynamic imports.
// Environment: RUNLOCK_BENCH_ENTRY and RUNLOCK_BENCH_DEPS, as for
// bench_worker.ts.

type Runlock = typeof import("../mod.ts");

interface RssRequest {
  dir: string;
  cycles: number;
  bare: boolean;
  /** A macrotask turn every this many cycles, as a server's loop has. */
  turnEvery: number;
}

interface NodeProcess {
  argv: string[];
  env: Record<string, string | undefined>;
  pid: number;
  memoryUsage(): { rss: number; heapUsed: number };
  stdout: { write(s: string): void };
}

const isDeno = "Deno" in globalThis;
const proc = (globalThis as unknown as { process?: NodeProcess }).process;
const args = isDeno ? Deno.args : proc!.argv.slice(2);
const req: RssRequest = JSON.parse(args[0]);
const pid = isDeno ? Deno.pid : proc!.pid;

function memory(): { rss: number; heap: number } {
  const m = isDeno ? Deno.memoryUsage() : proc!.memoryUsage();
  return { rss: m.rss, heap: m.heapUsed };
}

/** The bare calls of one acquire+release, as bench_worker.ts's bareAcquire. */
async function bareCycle(): Promise<(i: number) => void> {
  const dir = req.dir;
  const lockPath = `${dir}/bare.lock`;
  const record = (started: string) =>
    new TextEncoder().encode(
      `${pid}\nrunlock 1\nhost=bench\nstarted=${started}\nruntime=x\n`,
    );
  if (isDeno) {
    return (i) => {
      const real = Deno.realPathSync(dir); // pinning's realpath
      const temp = `${real}/.bare.lock.${i.toString(16)}.tmp`;
      const file = Deno.openSync(temp, {
        read: true,
        write: true,
        createNew: true,
        mode: 0o644,
      });
      file.tryLockSync(true);
      file.writeSync(record(new Date().toISOString()));
      Deno.linkSync(temp, lockPath);
      Deno.removeSync(temp);
      file.statSync();
      Deno.lstatSync(lockPath);
      Deno.removeSync(lockPath);
      file.close();
    };
  }
  const fs = await import("node:fs");
  const { createRequire } = await import("node:module");
  const require = createRequire(`${proc!.env.RUNLOCK_BENCH_DEPS}/package.json`);
  // deno-lint-ignore no-explicit-any
  const koffi = require("koffi") as any;
  const flock = koffi.load("libc.so.6").func("int flock(int, int)");
  const LOCK_EX_NB = 2 | 4;
  return (i) => {
    const temp = `${dir}/.bare.lock.${i.toString(16)}.tmp`;
    const fd = fs.openSync(temp, "wx+", 0o644);
    flock(fd, LOCK_EX_NB);
    fs.writeSync(fd, record(new Date().toISOString()));
    fs.linkSync(temp, lockPath);
    fs.unlinkSync(temp);
    fs.fstatSync(fd);
    fs.lstatSync(lockPath);
    fs.unlinkSync(lockPath);
    fs.closeSync(fd);
  };
}

async function libCycle(): Promise<(i: number) => void> {
  const lib: Runlock = isDeno
    ? await import("../mod.ts")
    : await import(proc!.env.RUNLOCK_BENCH_ENTRY!);
  const path = `${req.dir}/run.lock`;
  return () => lib.acquireSync(path).releaseSync();
}

const cycle = req.bare ? await bareCycle() : await libCycle();
const turn = () => new Promise<void>((resolve) => setTimeout(resolve, 0));
const points: { cycles: number; rssMb: number; heapMb: number }[] = [];
const point = (cycles: number) => {
  const m = memory();
  points.push({
    cycles,
    rssMb: Math.round(m.rss / 1e5) / 10,
    heapMb: Math.round(m.heap / 1e5) / 10,
  });
};
cycle(0); // loaded and warm
point(0);
const every = Math.max(1, Math.floor(req.cycles / 8));
const t0 = performance.now();
for (let i = 1; i <= req.cycles; i++) {
  cycle(i);
  if (i % req.turnEvery === 0) await turn();
  if (i % every === 0) point(i);
}
const seconds = Math.round(performance.now() - t0) / 1000;
const line = JSON.stringify({ points, seconds }) + "\n";
if (isDeno) Deno.stdout.writeSync(new TextEncoder().encode(line));
else proc!.stdout.write(line);
