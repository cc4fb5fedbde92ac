// The system-call audit of `deno task bench`: every runtime worker and the C
// floor run each operation k times under `strace -f`, between two marker
// calls (a failing stat of ".runlock-bench-mark-<case>-begin"/"-end"), and
// the calls between the markers are counted and divided by k. Skipped, with
// a note, where strace is missing or not permitted.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { probeCommand } from "./bench_setup.ts";

/** File-system calls: what the protocol is made of. Everything else
 * (futex, mmap, madvise, epoll, ...) is the runtime's own business. */
const FS_CALLS = new Set([
  "open",
  "openat",
  "openat2",
  "close",
  "flock",
  "fcntl",
  "read",
  "pread64",
  "write",
  "pwrite64",
  "lseek",
  "link",
  "linkat",
  "unlink",
  "unlinkat",
  "rename",
  "renameat",
  "renameat2",
  "stat",
  "lstat",
  "fstat",
  "newfstatat",
  "statx",
  "access",
  "faccessat",
  "faccessat2",
  "readlink",
  "readlinkat",
  "getdents64",
  "mkdir",
  "mkdirat",
  "kill",
]);

/** Which C floor case each worker case is held against. */
const FLOOR_OF: Record<string, string> = {
  acquireSync: "acquire",
  acquire: "acquire",
  bareAcquire: "acquire",
  heldHeld: "probe_noread",
  inspectHeld: "probe",
  bareProbe: "probe",
  bareSafeProbe: "probe",
  heldFree: "probe_missing",
  inspectFree: "probe_missing",
};

const OPS: [string, string, string[]][] = [
  ["acquire+release", "acquire", ["bareAcquire", "acquireSync", "acquire"]],
  ["held() on a held lock", "probe_noread", ["bareSafeProbe", "heldHeld"]],
  ["inspect() on a held lock", "probe", ["bareProbe", "inspectHeld"]],
  ["held()/inspect() on a free lock", "probe_missing", [
    "heldFree",
    "inspectFree",
  ]],
];

export interface Counts {
  /** File-system calls per operation, by name. */
  fs: Record<string, number>;
  fsTotal: number;
  /** Other calls per operation (runtime housekeeping), by name. */
  other: Record<string, number>;
  otherTotal: number;
}

export interface SyscallAudit {
  k: number;
  /** side → case → counts. */
  sides: Record<string, Record<string, Counts>>;
  table: string;
}

export interface AuditContext {
  benchDir: string;
  held: string;
  free: string;
  workerCommands: Record<string, string[]>;
  workerEnv: (cmd: string[]) => Record<string, string | undefined>;
  floorBinary: string | undefined;
  note: (text: string) => void;
}

const CALL = /^\d+\s+([a-z_0-9]+)\(/;
const MARK = /runlock-bench-mark-([A-Za-z_]+)-(begin|end)/;

/** Counts the calls between each case's markers, per call. */
export function countTrace(text: string, k: number): Record<string, Counts> {
  const raw: Record<string, Record<string, number>> = {};
  let current: string | undefined;
  for (const line of text.split("\n")) {
    const mark = MARK.exec(line);
    if (mark) {
      if (!line.includes("resumed>")) {
        current = mark[2] === "begin" ? mark[1] : undefined;
        if (current) raw[current] = {};
      }
      continue;
    }
    if (current === undefined) continue;
    const call = CALL.exec(line);
    if (!call) continue; // "<... resumed>", signals, exits
    raw[current][call[1]] = (raw[current][call[1]] ?? 0) + 1;
  }
  const out: Record<string, Counts> = {};
  for (const [name, calls] of Object.entries(raw)) {
    const c: Counts = { fs: {}, fsTotal: 0, other: {}, otherTotal: 0 };
    for (const [call, count] of Object.entries(calls)) {
      const per = Math.round((count / k) * 100) / 100;
      if (FS_CALLS.has(call)) {
        c.fs[call] = per;
        c.fsTotal += per;
      } else {
        c.other[call] = per;
        c.otherTotal += per;
      }
    }
    c.fsTotal = Math.round(c.fsTotal * 100) / 100;
    c.otherTotal = Math.round(c.otherTotal * 100) / 100;
    out[name] = c;
  }
  return out;
}

function describe(c: Counts): string {
  const fs = Object.entries(c.fs)
    .filter(([, n]) => n >= 0.05)
    .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
    .map(([call, n]) => `${call} ${Number.isInteger(n) ? n : n.toFixed(2)}`)
    .join(", ");
  return `${String(c.fsTotal).padStart(5)}  ${fs}${
    c.otherTotal >= 0.05 ? `  (+${c.otherTotal.toFixed(2)} other)` : ""
  }`;
}

export function auditSyscalls(ctx: AuditContext): SyscallAudit | undefined {
  if (probeCommand("strace", ["-V"]) === undefined) {
    ctx.note("no strace: the system-call audit is skipped");
    return undefined;
  }
  const k = 100;
  const sides: Record<string, Record<string, Counts>> = {};
  const trace = join(ctx.benchDir, "audit.trace");
  const strace = (
    cmd: string[],
    input?: string,
    env?: Record<string, string | undefined>,
  ) => {
    rmSync(trace, { force: true });
    const result = spawnSync(
      "strace",
      ["-f", "-qq", "-s", "80", "-o", trace, ...cmd],
      { input, env, encoding: "utf8", stdio: ["pipe", "pipe", "pipe"] },
    );
    if (result.status !== 0) {
      throw new Error(
        `strace ${cmd.join(" ")}: exit ${result.status}: ${
          String(result.stderr).slice(-500)
        }`,
      );
    }
    return readFileSync(trace, "utf8");
  };
  try {
    if (ctx.floorBinary) {
      const dir = join(ctx.benchDir, "c");
      mkdirSync(dir, { recursive: true });
      const input = [
        `acquire ${k} ${join(dir, "audit.lock")}`,
        `probe ${k} ${ctx.held}`,
        `probe_noread ${k} ${ctx.held}`,
        `probe_missing ${k} ${ctx.free}`,
      ].join("\n") + "\n";
      sides.c = countTrace(
        strace([ctx.floorBinary, "serve", "mark"], input),
        k,
      );
    }
    for (const [name, cmd] of Object.entries(ctx.workerCommands)) {
      const req = {
        dir: join(ctx.benchDir, `audit-${name}`),
        held: ctx.held,
        free: ctx.free,
        scanDir: "",
        cases: Object.keys(FLOOR_OF),
        k,
      };
      sides[name] = countTrace(
        strace(
          [...cmd, "audit", JSON.stringify(req)],
          undefined,
          ctx.workerEnv(cmd),
        ),
        k,
      );
    }
  } catch (err) {
    ctx.note(`the system-call audit failed: ${(err as Error).message}`);
    return undefined;
  }
  const lines: string[] = [];
  for (const [title, floorCase, cases] of OPS) {
    lines.push(`${title}:`);
    const floor = sides.c?.[floorCase];
    if (floor) lines.push(`  ${"C floor".padEnd(28)} ${describe(floor)}`);
    for (const [side, counts] of Object.entries(sides)) {
      if (side === "c") continue;
      for (const c of cases) {
        if (!counts[c]) continue;
        const label = `${side} ${c}`;
        lines.push(`  ${label.padEnd(28)} ${describe(counts[c])}`);
      }
    }
  }
  return { k, sides, table: lines.join("\n") };
}
