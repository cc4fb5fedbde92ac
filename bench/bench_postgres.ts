// The PostgreSQL section of `deno task bench`, kept apart from the
// file-lock sections. It runs only once the backend exists in the snapshot
// being measured (src/postgres/mod.ts) and a server can be had
// (RUNLOCK_TEST_PG_URL, or PostgreSQL binaries for a throwaway cluster);
// otherwise it is skipped with a note.
//
// The figures come from the backend's own measurement script,
// tests/fixtures/pg_measure.ts, run as a separate process (so the benchmark
// never loads a database client): warm acquire+release against the same
// SQL sent by hand over one connection, hand-off after a release and after
// the holder's SIGKILL, and connect cost. Its method is its own (medians of
// rounds, not best of interleaved rounds); the JSON says so. The backend's
// goals are checked on its figures.
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";

export interface PostgresContext {
  /** The snapshot being measured. */
  snapshot: string;
  note: (text: string) => void;
  log: (text: string) => void;
}

export interface PostgresGoal {
  goal: string;
  value?: number;
  limit: number;
  unit: string;
  pass?: boolean;
  detail: string;
}

export interface PostgresSection {
  skipped?: string;
  source?: string;
  /** The script's figures, as it printed them ("0.204 ms", "1.13x"). */
  figures?: Record<string, string>;
  goals?: PostgresGoal[];
}

function hasPostgres(): boolean {
  if (process.env.RUNLOCK_TEST_PG_URL) return true;
  const root = "/usr/lib/postgresql";
  if (
    existsSync(root) &&
    readdirSync(root).some((v) => existsSync(join(root, v, "bin", "initdb")))
  ) {
    return true;
  }
  return spawnSync("sh", ["-c", "command -v initdb"]).status === 0;
}

/** The number in the first figure whose name matches, in ms or as a ratio. */
function pick(
  figures: Record<string, string>,
  name: RegExp,
): number | undefined {
  for (const [k, v] of Object.entries(figures)) {
    if (name.test(k)) {
      const n = Number.parseFloat(v);
      return Number.isFinite(n) ? n : undefined;
    }
  }
  return undefined;
}

export function postgresSection(ctx: PostgresContext): PostgresSection {
  const skip = (why: string): PostgresSection => {
    const skipped = `PostgreSQL section skipped: ${why}`;
    ctx.note(skipped);
    return { skipped };
  };
  if (!existsSync(join(ctx.snapshot, "src", "postgres", "mod.ts"))) {
    return skip("this snapshot has no src/postgres/mod.ts");
  }
  const script = join(ctx.snapshot, "tests", "fixtures", "pg_measure.ts");
  if (!existsSync(script)) {
    return skip("the backend has no tests/fixtures/pg_measure.ts to run");
  }
  if (!hasPostgres()) {
    return skip(
      "no server (set RUNLOCK_TEST_PG_URL, or install PostgreSQL for a throwaway cluster)",
    );
  }
  ctx.log("PostgreSQL: tests/fixtures/pg_measure.ts");
  const result = spawnSync(
    Deno.execPath(),
    ["run", "--allow-all", "--quiet", script],
    {
      cwd: ctx.snapshot,
      encoding: "utf8",
      timeout: 180_000,
      env: { ...process.env, NO_COLOR: "1" },
    },
  );
  if (result.status !== 0) {
    return skip(
      `pg_measure.ts exited with ${result.status ?? result.signal}: ${
        String(result.stderr).trim().split("\n").slice(-3).join(" ")
      }`,
    );
  }
  const figures: Record<string, string> = {};
  for (const line of String(result.stdout).split("\n")) {
    const at = line.lastIndexOf(": ");
    if (at > 0) figures[line.slice(0, at)] = line.slice(at + 2).trim();
  }
  const goals: PostgresGoal[] = [];
  const goal = (
    text: string,
    value: number | undefined,
    limit: number,
    unit: string,
  ) =>
    goals.push({
      goal: text,
      value,
      limit,
      unit,
      pass: value === undefined ? undefined : value <= limit,
      detail: value === undefined
        ? "not found in pg_measure.ts's output"
        : "median, from pg_measure.ts",
    });
  goal(
    "PostgreSQL: acquire+release on a warm pgLocks ≤ 2× the same SQL by hand",
    pick(figures, /^ratio$/),
    2,
    "×",
  );
  goal(
    "PostgreSQL: hand-off after SIGKILL ≤ 100 ms (median)",
    pick(figures, /SIGKILL, median/),
    100,
    "ms",
  );
  goal(
    "PostgreSQL: hand-off after a release ≤ 10 ms (median)",
    pick(figures, /after release/),
    10,
    "ms",
  );
  return {
    source:
      "tests/fixtures/pg_measure.ts of the measured snapshot, on a throwaway cluster or RUNLOCK_TEST_PG_URL (medians; its own method)",
    figures,
    goals,
  };
}
