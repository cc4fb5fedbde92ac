// `deno task bench`: acquire+release cost, as ratios against a baseline
// measured in the same run (these machines are too noisy for absolute
// numbers):
//   baseline  the protocol's own system calls made directly with Deno.*
//             (create O_EXCL, flock, write, link, unlink temp, fstat;
//             lstat, unlink, close)
//   runlock   acquireSync + releaseSync on an empty directory
//   crowded   both again in a directory holding 2000 other files and 100
//             temp files of dead processes: the litter sweep must stay off
//             the hot path, so runlock's ratio must not grow there
// Rounds alternate between the cases so that drift hits them all alike.
import { join } from "node:path";
import process from "node:process";
import { acquireSync } from "../mod.ts";

const ROUNDS = Number(process.env.RUNLOCK_BENCH_ROUNDS ?? 7);
const N = Number(process.env.RUNLOCK_BENCH_N ?? 3000);

const root = Deno.makeTempDirSync({ prefix: "runlock-bench-" });
const plain = join(root, "plain");
const crowded = join(root, "crowded");
Deno.mkdirSync(plain);
Deno.mkdirSync(crowded);
for (let i = 0; i < 2000; i++) {
  Deno.writeTextFileSync(join(crowded, `f${i}`), "");
}
for (let i = 0; i < 100; i++) {
  const hex = i.toString(16).padStart(16, "0");
  Deno.writeTextFileSync(
    join(crowded, `.run.lock.${hex}.tmp`),
    "1\nrunlock 1\n",
  );
}

const record = new TextEncoder().encode(
  `${Deno.pid}\nrunlock 1\nhost=bench\nstarted=${
    new Date().toISOString()
  }\nruntime=deno\n`,
);
let serial = 0;

function baseline(dir: string): void {
  const path = join(dir, "run.lock");
  const temp = join(dir, `.run.lock.${(serial++).toString(16)}.tmp`);
  const file = Deno.openSync(temp, {
    read: true,
    write: true,
    createNew: true,
    mode: 0o644,
  });
  file.tryLockSync(true);
  file.writeSync(record);
  Deno.linkSync(temp, path);
  Deno.removeSync(temp);
  file.statSync();
  Deno.lstatSync(path);
  Deno.removeSync(path);
  file.close();
}

function runlock(dir: string): void {
  acquireSync(join(dir, "run.lock")).releaseSync();
}

function time(f: (dir: string) => void, dir: string): number {
  const start = performance.now();
  for (let i = 0; i < N; i++) f(dir);
  return ((performance.now() - start) * 1000) / N;
}

const median = (xs: number[]) => xs.sort((a, b) => a - b)[xs.length >> 1];
const cases: [string, (dir: string) => void, string][] = [
  ["baseline", baseline, plain],
  ["runlock", runlock, plain],
  ["baseline, crowded dir", baseline, crowded],
  ["runlock, crowded dir", runlock, crowded],
];
const results = cases.map(() => [] as number[]);
runlock(crowded); // this process's one-time sweep, as in any real process
for (let round = 0; round < ROUNDS; round++) {
  cases.forEach(([, f, dir], i) => results[i].push(time(f, dir)));
}
const us = results.map(median);
console.log(`acquire+release, median of ${ROUNDS} rounds of ${N}:`);
for (const [i, [name]] of cases.entries()) {
  const base = us[i - (i % 2)];
  console.log(
    `  ${name.padEnd(22)} ${us[i].toFixed(1).padStart(7)} µs   ${
      (us[i] / base).toFixed(2)
    }x its baseline`,
  );
}
Deno.removeSync(root, { recursive: true });
