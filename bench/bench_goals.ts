// The goals of `deno task bench`, checked on one run's figures, as ratios
// against baselines of the same run (never as timed tests). The file locks'
// goals first, then watch()'s, then the others. Every goal's
// detail carries the figures that explain a miss: the two sides' times, the
// bare runtime's own ratio, the system calls counted by the audit.
import type { ScaleSection } from "./bench_scale.ts";
import type { SyscallAudit } from "./bench_syscalls.ts";
import type { WatchResult } from "./bench_watch.ts";

export interface Goal {
  goal: string;
  value?: number;
  limit: number;
  unit: string;
  pass?: boolean;
  detail: string;
  /**
   * What the goal is about: the file locks (speed, scale), watch(), scan(),
   * start-up, or the PostgreSQL backend.
   */
  part: "locks" | "watch" | "scan" | "startup" | "postgres";
}

interface GoalRow {
  id: string;
  best: number;
  median: number;
  ratio?: number;
  vsBare?: number;
  extra?: Record<string, unknown>;
}

export interface GoalInput {
  groups: { id: string; rows: GoalRow[] }[];
  syscalls?: SyscallAudit;
  scale?: ScaleSection;
  watched?: WatchResult[];
}

/** The median of `xs` (not empty). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/**
 * The largest of `xs`: `Math.max(...xs)` overflows the stack past ~120,000
 * arguments, which 4 contenders' acquisitions in 2.5 s reach.
 */
export function maxOf(xs: number[]): number {
  let max = -Infinity;
  for (const x of xs) if (x > max) max = x;
  return max;
}

export function fmt(x: number | undefined, digits = 2): string {
  if (x === undefined || Number.isNaN(x)) return "";
  if (x >= 1000) return x.toFixed(0);
  if (x >= 100) return x.toFixed(1);
  return x.toFixed(digits);
}

const WHO: Record<string, string> = { deno: "Deno", node: "Node", bun: "Bun" };

/** The goals of the file locks, watch(), scan() and start-up. */
export function checkGoals(input: GoalInput): Goal[] {
  const goals: Goal[] = [];
  const find = (gid: string, id: string) =>
    input.groups.find((g) => g.id === gid)?.rows.find((r) => r.id === id);
  const versus = (gid: string, a: string, b: string, what: string) => {
    const x = find(gid, a);
    const y = find(gid, b);
    return x && y ? `; ${what} ${fmt(x.best / y.best)}×` : "";
  };
  /** "; 11 file-system calls (C floor 9)", from the strace audit. */
  const calls = (id: string, floorCase: string) => {
    const [side, c] = id.split(":");
    const mine = input.syscalls?.sides[side]?.[c.split("@")[0]];
    const floor = input.syscalls?.sides.c?.[floorCase];
    if (!mine) return "";
    const names = Object.entries(mine.fs)
      .filter(([, n]) => n >= 0.05)
      .map(([k, n]) => `${k} ${n}`)
      .join(", ");
    return `; ${mine.fsTotal} file-system call${
      mine.fsTotal === 1 ? "" : "s"
    } (${names})${floor ? ` against the C floor's ${floor.fsTotal}` : ""}`;
  };
  const ratio = (
    goal: string,
    gid: string,
    id: string,
    limit: number,
    against: "ratio" | "vsBare" = "ratio",
    context = "",
    part: Goal["part"] = "locks",
  ) => {
    const row = find(gid, id);
    const value = row?.[against];
    goals.push({
      goal,
      value,
      limit,
      unit: "×",
      pass: value === undefined ? undefined : value <= limit,
      detail: row
        ? `${fmt(row.best)} µs vs ${
          against === "ratio" ? "C floor" : "bare Deno.*"
        }${context}`
        : "not measured",
      part,
    });
  };

  // acquire+release, ext4 (the lock directory's file system)
  const tmpfs = (id: string) =>
    versus("acquire-tmpfs", `${id}@tmpfs`, "c:acquire@tmpfs", "on tmpfs");
  for (
    const [id, limit, what] of [
      ["node:acquireSync", 1.3, "Node sync"],
      ["node:acquire", 1.4, "Node async"],
      ["bun:acquireSync", 1.3, "Bun sync"],
      ["bun:acquire", 1.3, "Bun async"],
    ] as const
  ) {
    ratio(
      `acquire+release, ${what} ≤ ${limit}× C floor`,
      "acquire",
      id,
      limit,
      "ratio",
      `${tmpfs(id)}${calls(id, "acquire")}`,
    );
  }
  ratio(
    "acquire+release, Deno sync ≤ 1.5× C floor",
    "acquire",
    "deno:acquireSync",
    1.5,
    "ratio",
    `${
      versus(
        "acquire",
        "deno:bareAcquire",
        "c:acquire",
        "bare Deno.* calls (with realpath) are",
      )
    }${calls("deno:acquireSync", "acquire")}`,
  );
  ratio(
    "acquire+release, Deno sync ≤ 1.15× its bare Deno.* calls (with the realpath pinning needs)",
    "acquire",
    "deno:acquireSync",
    1.15,
    "vsBare",
    `${
      (() => {
        const a = find("acquire", "deno:acquireSync");
        const b = find("acquire", "deno:bareAcquire");
        return a && b
          ? ` (${fmt(b.best)} µs): ${fmt(Math.abs(a.best - b.best))} µs ${
            a.best >= b.best ? "more" : "less"
          }`
          : "";
      })()
    }${calls("deno:acquireSync", "acquire")}${
      calls("deno:bareAcquire", "acquire").replace("; ", "; bare: ")
    }`,
  );

  // probes
  for (const rt of ["node", "bun"]) {
    ratio(
      `held() on a held lock, ${WHO[rt]} ≤ 2× floor probe`,
      "held",
      `${rt}:heldHeld`,
      2,
      "ratio",
      `${
        versus(
          "held",
          `${rt}:heldHeld`,
          "c:probe_noread",
          "against the floor without read",
        )
      }${
        versus(
          "held",
          "c:probe_held",
          "c:probe",
          "the same 6 calls made from C are",
        )
      }${calls(`${rt}:heldHeld`, "probe_noread")}`,
    );
    ratio(
      `inspect() on a held lock, ${WHO[rt]} ≤ 2.5× floor probe`,
      "inspect",
      `${rt}:inspectHeld`,
      2.5,
      "ratio",
      `${
        versus(
          "inspect",
          "c:probe_inspect",
          "c:probe",
          "the same 6 calls made from C are",
        )
      }${calls(`${rt}:inspectHeld`, "probe")}`,
    );
  }
  ratio(
    "held() on a held lock, Deno ≤ 1.15× its safe bare sequence (lstat, open, fstat, flock, read, kill(pid, 0), close)",
    "held",
    "deno:heldHeld",
    1.15,
    "vsBare",
    `${
      versus(
        "held",
        "deno:bareSafeProbe",
        "c:probe",
        "the safe bare sequence is",
      )
    } the C probe${calls("deno:heldHeld", "probe_noread")}`,
  );
  for (const rt of ["deno", "node", "bun"]) {
    for (
      const [c, what] of [["heldFree", "held()"], ["inspectFree", "inspect()"]]
    ) {
      ratio(
        `${what} on a free lock, ${WHO[rt]} ≤ 3× the floor's failed open`,
        "free",
        `${rt}:${c}`,
        3,
        "ratio",
        calls(`${rt}:${c}`, "probe_missing"),
      );
    }
  }

  // the incumbent
  {
    const pl = find("acquire", "node:properLockfile");
    const ours = find("acquire", "node:acquire");
    const value = pl && ours
      ? Math.round((pl.best / ours.best) * 1000) / 1000
      : undefined;
    goals.push({
      goal: "≥ 5× faster than proper-lockfile at acquire+release (Node, async)",
      value,
      limit: 5,
      unit: "× faster",
      pass: value === undefined ? undefined : value >= 5,
      detail: pl && ours
        ? `${pl.best.toFixed(1)} µs vs ${ours.best.toFixed(1)} µs`
        : "not measured",
      part: "locks",
    });
  }

  scaleGoals(input.scale, goals);

  // hand-off
  /** The floor of a hand-off after SIGKILL, measured beside runlock's. */
  const killFloor = (rt: string, median: number) => {
    const f = find("handoff", `${rt}:floor:kill`);
    return f
      ? `; the C floor (the same holder SIGKILLed while a C process waits in flock(LOCK_EX)) ${
        fmt(f.median)
      } ms (median), runlock ${fmt(Math.abs(median - f.median))} ms ${
        median >= f.median ? "above" : "below"
      } it`
      : "";
  };
  for (const rt of ["deno", "node", "bun"]) {
    for (const [kind, limit] of [["release", 2], ["kill", 10]] as const) {
      const row = find("handoff", `${rt}:runlock:${kind}`);
      if (!row) continue;
      goals.push({
        goal: `hand-off after ${kind === "kill" ? "SIGKILL" : "release"}, ${
          WHO[rt]
        } ≤ ${limit} ms (median)`,
        value: row.median,
        limit,
        unit: "ms",
        pass: row.median <= limit,
        detail: `median of ${(row.extra!.samples as number[]).length}, worst ${
          fmt(row.extra!.max as number)
        } ms${kind === "kill" ? killFloor(rt, row.median) : ""}`,
        part: "locks",
      });
    }
    // The holder's teardown (the kernel closes a dying process's files
    // after freeing its address space) is in every figure after SIGKILL,
    // and it depends on the holder's runtime and heap: the part that is
    // runlock's is what it adds to the floor.
    const kill = find("handoff", `${rt}:runlock:kill`);
    const floor = find("handoff", `${rt}:floor:kill`);
    const above = kill?.extra?.aboveFloorMs as number[] | undefined;
    if (kill && floor && above?.length) {
      const own = median(above);
      goals.push({
        goal: `hand-off after SIGKILL, ${
          WHO[rt]
        } ≤ the C floor + 2 ms (a C waiter in flock(LOCK_EX) on the holder's other lock, woken by the same SIGKILL; median of the differences)`,
        value: own,
        limit: 2,
        unit: "ms",
        pass: own <= 2,
        detail: `runlock ${fmt(kill.median)} ms, the C floor ${
          fmt(floor.median)
        } ms (medians); each kill's difference ${
          above.map((x) => fmt(x)).join(", ")
        } ms`,
        part: "locks",
      });
    }
  }

  // watch()
  for (const w of input.watched ?? []) {
    const who = WHO[w.runtime] ?? w.runtime;
    if (w.runtime !== "deno") {
      goals.push({
        goal:
          `watch(): a SIGKILLed holder's crashed change, ${who} ≤ 10 ms (median)`,
        value: w.crashed.median,
        limit: 10,
        unit: "ms",
        pass: w.crashed.median <= 10,
        detail: `best ${fmt(w.crashed.best)}, max ${fmt(w.crashed.max)} ms; ${
          w.floor
            ? `a C waiter in flock(LOCK_EX) on the same holders: median ${
              fmt(w.floor.median)
            }, best ${fmt(w.floor.best)} ms (samples interleaved)`
            : "no C floor"
        }`,
        part: "watch",
      });
    }
    // "None measurable": within 0.1 ms of CPU per second of the same
    // process idle without the watch (the figure's own noise here).
    // With a long window (a periodic cost of the watch's own: Deno's
    // re-scan every 60 s), the larger of the two figures.
    const long = w.idle.long;
    const added = Math.max(w.idle.addedMsPerS, long?.addedMsPerS ?? -Infinity);
    goals.push({
      goal:
        `watch(): an idle watch of ${w.idle.locks} held runs, ${who}: no CPU measurable between changes (≤ 0.1 ms/s over the same process without it)`,
      value: added,
      limit: 0.1,
      unit: "ms/s",
      pass: added <= 0.1,
      detail: `${fmt(w.idle.cpuMs)} ms of CPU over ${w.idle.ms} ms watching, ${
        fmt(w.idle.baselineCpuMs)
      } ms over the same time after the watch ended (medians of ${w.idle.windows.length} windows: ${
        w.idle.windows.map((x) => fmt(x)).join(", ")
      }; after: ${w.idle.baselineWindows.map((x) => fmt(x)).join(", ")})${
        long
          ? `; over one window of ${
            fmt(long.ms / 1000)
          } s watching (a re-scan at least every 60 s in it), ${
            fmt(long.cpuMs)
          } ms: ${fmt(long.addedMsPerS)} ms/s added`
          : ""
      }`,
      part: "watch",
    });
  }

  // npm lockfile, start-up, scan()
  {
    const lf = find("acquire", "node:lockfileSync");
    const sync = find("acquire", "node:acquireSync");
    const v = lf && sync
      ? Math.round((sync.best / lf.best) * 1000) / 1000
      : undefined;
    goals.push({
      goal: "faster than npm lockfile, or within 1.2× (Node, sync)",
      value: v,
      limit: 1.2,
      unit: "×",
      pass: v === undefined ? undefined : v <= 1.2,
      detail: lf && sync
        ? `${sync.best.toFixed(1)} µs vs ${lf.best.toFixed(1)} µs${
          versus(
            "acquire",
            "c:acquire",
            "node:lockfileSync",
            "the C floor of the protocol (9 calls) against npm lockfile (3 calls: open, close, unlink) is",
          )
        }`
        : "not measured",
      part: "locks",
    });
  }
  for (const [rt, limit] of [["node", 10], ["deno", 5]] as const) {
    const row = find("startup", `${rt}:import`);
    if (!row) continue;
    const added = row.extra!.addedBest as number;
    goals.push({
      goal: `importing runlock adds ≤ ${limit} ms to a ${WHO[rt]} start`,
      value: added,
      limit,
      unit: "ms",
      pass: added <= limit,
      detail: `best ${row.best.toFixed(1)} ms vs empty ${
        (row.best - added).toFixed(1)
      } ms`,
      part: "startup",
    });
  }
  for (const rt of ["deno", "node"]) {
    if (!find("scan", `${rt}:scan`)) continue;
    ratio(
      `scan() of 10,000 locks, ${WHO[rt]} ≤ 3× floor`,
      "scan",
      `${rt}:scan`,
      3,
      "ratio",
      "",
      "scan",
    );
  }
  return goals;
}

function scaleGoals(s: ScaleSection | undefined, goals: Goal[]): void {
  if (!s) return;
  const z = s.sizes;
  const quick = z.files < 100_000 ? " (quick sizes)" : "";
  const push = (g: Omit<Goal, "pass" | "part">, pass: boolean) =>
    goals.push({ ...g, pass, part: "locks" });
  for (const [rt, v] of Object.entries(s.newName)) {
    push({
      goal: `a new name in a directory of ${
        z.files.toLocaleString("en")
      } files, ${WHO[rt]} ≤ 3× an empty directory${quick}`,
      value: v.ratio,
      limit: 3,
      unit: "×",
      detail: `median ${fmt(v.fullMedianUs)} µs vs ${
        fmt(v.emptyMedianUs)
      } µs (p90 ${fmt(v.fullP90Us)} vs ${fmt(v.emptyP90Us)})${
        v.floorRatio === undefined
          ? ""
          : `; the C floor's acquire+release in the same two directories: ${
            fmt(v.floorRatio)
          }×`
      }`,
    }, v.ratio <= 3);
  }
  for (const [rt, v] of Object.entries(s.manyLocks)) {
    const short = v.reached < z.locks;
    push({
      goal: `holding ${z.locks.toLocaleString("en")} locks in one directory, ${
        WHO[rt]
      }: the last ${z.block} acquisitions ≤ 2× the first ${z.block}${quick}`,
      value: v.ratio,
      limit: 2,
      unit: "×",
      detail: `${
        short ? `stopped by its time budget at ${v.reached} locks; ` : ""
      }${fmt(v.lastUs)} µs vs ${fmt(v.firstUs)} µs per acquisition; by block: ${
        v.blocksUs.join(", ")
      }${
        v.floorBlocksUs
          ? `; the C floor, taking as many just before: ${
            fmt(v.floorRatio!)
          }× (by block: ${v.floorBlocksUs.join(", ")})`
          : ""
      }`,
    }, !short && v.ratio <= 2);
  }
  for (const [rt, v] of Object.entries(s.waiters)) {
    const limit = z.waiters >= 50
      ? 0.5
      : 0.5 * (z.waiters / 50) * (z.waitMs / 6000);
    push({
      goal: `${z.waiters} waiters on a held lock for ${z.waitMs / 1000} s, ${
        WHO[rt]
      }: ≤ ${fmt(limit)} CPU-seconds in all${quick}`,
      value: v.cpuSeconds,
      limit,
      unit: "CPU-s",
      detail: `each waiter ${fmt(v.cpuMsEach.median)} ms median, ${
        fmt(v.cpuMsEach.max)
      } ms at most; ${
        v.warmCpuSeconds === undefined
          ? ""
          : `as many processes that waited once before, ${
            fmt(v.warmCpuSeconds)
          } CPU-s; `
      }the control (as many processes asleep on a timer) ${
        fmt(v.idleCpuSeconds)
      } CPU-s${
        v.startCpuSeconds === undefined
          ? ""
          : `; of the ${fmt(v.cpuSeconds)}, ${
            fmt(v.startCpuSeconds)
          } in each wait's first 0.5 s (one-time set-up, first attempt, watches, first looks; control ${
            fmt(v.idleStartCpuSeconds ?? NaN)
          }) and ${fmt(v.cpuSeconds - v.startCpuSeconds)} after`
      }`,
    }, v.cpuSeconds <= limit);
    push({
      goal: `timeout overshoot with ${z.waiters} waiters, ${
        WHO[rt]
      }: median ≤ 20 ms${quick}`,
      value: v.overshootMs.median,
      limit: 20,
      unit: "ms",
      detail: `p90 ${fmt(v.overshootMs.p90)} ms, worst ${
        fmt(v.overshootMs.worst)
      } ms`,
    }, v.overshootMs.median <= 20);
    push({
      goal: `timeout overshoot with ${z.waiters} waiters, ${
        WHO[rt]
      }: worst ≤ 100 ms${quick}`,
      value: v.overshootMs.worst,
      limit: 100,
      unit: "ms",
      detail: `median ${fmt(v.overshootMs.median)} ms, p90 ${
        fmt(v.overshootMs.p90)
      } ms`,
    }, v.overshootMs.worst <= 100);
  }
  for (const [rt, v] of Object.entries(s.rss)) {
    const at = (p: { rssMb: number; heapMb: number }[]) =>
      p.map((x) => x.rssMb).join(" → ");
    push({
      goal: `${z.cycles.toLocaleString("en")} acquire/release cycles, ${
        WHO[rt]
      }: RSS ≤ 1.5× a bare control's${quick}`,
      value: v.ratio,
      limit: 1.5,
      unit: "×",
      detail: `${fmt(v.runlockMb)} MB vs ${fmt(v.bareMb)} MB; runlock ${
        at(v.runlock)
      } MB (heap at the end ${
        v.runlock[v.runlock.length - 1].heapMb
      } MB); bare ${at(v.bare)} MB`,
    }, v.ratio <= 1.5);
  }
}
