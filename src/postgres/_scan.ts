// Every lock name of the table at once (scan() and each poll of watch()):
// one statement on a probe session, read as inspect() reads one name.
import { delay } from "./_clock.ts";
import { sqlState } from "./_failure.ts";
import { interpret } from "./_probe.ts";
import type { PgInspection } from "./_probe_types.ts";
import type { Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";

/** One name a scan read. */
export interface Scanned {
  info: PgInspection;
  /**
   * How sure the read is (see the `scan` statement): `settled`; `pending`,
   * an acquire or release in flight (`info` is what a probe says before
   * it commits); `unsettled`, maybe half way through one: a look a moment
   * later may say otherwise.
   */
  certainty: "settled" | "pending" | "unsettled";
}

/** A read before it is compared with the one before it (see scanRows). */
type Read = Omit<Scanned, "certainty"> & {
  certainty: Scanned["certainty"] | "recheck";
};

/** Pauses before each read again of a scan that read something unsettled. */
const AGAIN_MS = [2, 4, 8];

/** Reads the `scan` statement once: each row as an inspection. */
async function readOnce(
  session: Session,
  sql: Statements,
  timeout: number,
  prefix: string,
  names: readonly string[],
): Promise<Read[]> {
  const rows = await session.query(
    sql.scan,
    [prefix, names],
    timeout,
    "runlock_scan",
  );
  const seen = new Set<string>();
  const out: Read[] = [];
  for (const row of rows) {
    const name = row.name as string;
    // A key held shared by several sessions gives a row per session.
    if (seen.has(name)) continue;
    seen.add(name);
    const { info } = interpret(name, BigInt(row.key as string), row);
    let certainty: Scanned["certainty"] = "settled";
    if (
      (info.foreign || info.state === "stale") && row.record_writing === true
    ) {
      // The record written (or row-locked) and not committed yet.
      certainty = "pending";
    } else if (info.foreign) {
      // An idle holder is another application's, or (pg_stat_activity is
      // read apart from pg_locks) one just beginning an acquire.
      certainty = row.holder_state === "active" ? "pending" : "unsettled";
    } else if (info.state === "stale" && row.record_backend_alive === true) {
      // Else a backend on its way out, or a release just committed.
      certainty = row.record_backend_checked === true &&
          row.record_backend_state === "active"
        ? "pending"
        : "unsettled";
    }
    const recheck = info.state === "stale" && certainty === "settled";
    out.push({ info, certainty: recheck ? "recheck" : certainty });
  }
  return out.sort((a, b) =>
    a.info.path < b.info.path ? -1 : a.info.path > b.info.path ? 1 : 0
  );
}

/**
 * Every name starting with `prefix` (literally) that is held or stale,
 * plus `names` even when free; sorted by name. A read half way through an
 * acquire or a release is read again, three times at most (about 15 ms).
 * A stale record is believed when two reads in a row agree, or it is the
 * one in `known` (a watch's last report): a holder that releases after
 * the snapshot and is gone before pg_stat_activity is read looks crashed,
 * and once gone, a later snapshot reads its record as it stays. Statement
 * errors propagate (a missing table: 42P01).
 *
 * @param session A probe session.
 * @param sql The statements of the table.
 * @param timeout Milliseconds the statement may take (see Session.query).
 * @param prefix The literal prefix; `""` for every name.
 * @param names Names to list even when free.
 * @param known What was reported last, per name (a watch's).
 * @returns What each name's probe says, sorted by name.
 */
export async function scanRows(
  session: Session,
  sql: Statements,
  timeout: number,
  prefix: string,
  names: readonly string[] = [],
  known?: ReadonlyMap<string, PgInspection>,
): Promise<Scanned[]> {
  const agrees = (a: PgInspection | undefined, b: PgInspection) =>
    a !== undefined && a.state === "stale" && a.fence === b.fence &&
    a.pid === b.pid && a.started?.getTime() === b.started?.getTime();
  let before: Map<string, PgInspection> | undefined;
  let found: Scanned[] = [];
  for (let i = 0; i <= AGAIN_MS.length; i++) {
    if (i > 0) await delay(AGAIN_MS[i - 1]);
    const read = await readOnce(session, sql, timeout, prefix, names);
    found = read.map(({ info, certainty }) => ({
      info,
      certainty: certainty !== "recheck"
        ? certainty
        : agrees(before?.get(info.path), info) ||
            agrees(known?.get(info.path), info)
        ? "settled"
        : "unsettled",
    }));
    if (found.every((s) => s.certainty === "settled")) break;
    before = new Map(read.map((r) => [r.info.path, r.info]));
  }
  return found;
}

/**
 * `read()` where the table may not exist yet (probes create nothing):
 * unless `tableKnown`, ask first, as each failure is an ERROR line in the
 * server's log and watches poll. A missing relation that is not our table
 * (one a row-level security policy uses) is an error, never "no locks".
 *
 * @returns What `read` returned, or undefined when there is no table.
 */
export async function ifTable<T>(
  session: Session,
  sql: Statements,
  timeout: number,
  tableKnown: boolean,
  read: () => Promise<T>,
): Promise<T | undefined> {
  if (!tableKnown && !(await tableExists(session, sql, timeout))) {
    return undefined;
  }
  try {
    return await read();
  } catch (err) {
    if (
      sqlState(err) === "42P01" && session.lost === undefined &&
      !(await tableExists(session, sql, timeout).catch(() => true))
    ) {
      return undefined;
    }
    throw err;
  }
}

/**
 * {@linkcode scanRows} where the table may not exist yet (see
 * {@linkcode ifTable}).
 *
 * @returns The rows (`[]` without a table) and whether the table exists.
 */
export async function scanTable(
  session: Session,
  sql: Statements,
  timeout: number,
  prefix: string,
  names: readonly string[],
  tableKnown: boolean,
  known?: ReadonlyMap<string, PgInspection>,
): Promise<{ rows: Scanned[]; table: boolean }> {
  const rows = await ifTable(
    session,
    sql,
    timeout,
    tableKnown,
    () => scanRows(session, sql, timeout, prefix, names, known),
  );
  return { rows: rows ?? [], table: rows !== undefined };
}

/** Whether the table exists. */
async function tableExists(
  session: Session,
  sql: Statements,
  timeout: number,
): Promise<boolean> {
  const rows = await session.query(sql.tableExists, [sql.table], timeout);
  return rows[0].table === true;
}

/**
 * `work`, or the signal's reason as soon as it aborts (the work itself
 * runs on; its result is dropped).
 */
export function abortable<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
): Promise<T> {
  if (signal === undefined) return work;
  if (signal.aborted) {
    work.catch(() => {});
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const abort = () => {
      work.catch(() => {});
      reject(signal.reason);
    };
    signal.addEventListener("abort", abort, { once: true });
    work.then(resolve, reject).finally(() =>
      signal.removeEventListener("abort", abort)
    );
  });
}

/** What a scan's messages name: `prefix*`, or `*` for every name. */
export function scanLabel(prefix: string): string {
  return `${prefix}*`;
}
