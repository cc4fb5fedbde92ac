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
   * How sure the read is (see the `scan` statement):
   * - `settled`: what a probe says, and will say until something happens;
   * - `pending`: an acquire or a release in flight (its session still in
   *   the statement that writes the record): `info` says what a probe
   *   says now (a foreign holder, a stale record), not what it will say
   *   once it commits;
   * - `unsettled`: maybe half way through an acquire or a release (who
   *   holds the key, or whether the record's backend is the holder's,
   *   could not be told): a look a moment later may say otherwise.
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
    "runlock_scan",
    false,
    timeout,
  );
  const seen = new Set<string>();
  const out: Read[] = [];
  for (const row of rows) {
    const name = row.name as string;
    // A key held in shared mode by several sessions (not runlock's doing)
    // gives one row per session: the name once is enough.
    if (seen.has(name)) continue;
    seen.add(name);
    const { info } = interpret(name, BigInt(row.key as string), row);
    let certainty: Scanned["certainty"] = "settled";
    if (
      (info.foreign || info.state === "stale") && row.record_writing === true
    ) {
      // Another session has written (or row-locked) the record and not
      // committed yet: an acquire or a release in flight, whatever
      // pg_stat_activity can be read.
      certainty = "pending";
    } else if (info.foreign) {
      // An acquire in flight while its holder is in its statement. An idle
      // holder is another application's, or (pg_stat_activity being read
      // apart from pg_locks) one that has just begun an acquire: a second
      // read must agree.
      certainty = row.holder_state === "active" ? "pending" : "unsettled";
    } else if (info.state === "stale" && row.record_backend_alive === true) {
      // A release in flight while its backend is in its statement; else a
      // backend on its way out (a crash), or a release just committed.
      certainty = row.record_backend_checked === true &&
          row.record_backend_state === "active"
        ? "pending"
        : "unsettled";
    }
    // A plain stale read: its record may be one whose release committed
    // after our snapshot, by a backend gone before pg_stat_activity was
    // read. Settled by a second read (see scanRows).
    const recheck = info.state === "stale" && certainty === "settled";
    out.push({ info, certainty: recheck ? "recheck" : certainty });
  }
  return out.sort((a, b) =>
    a.info.path < b.info.path ? -1 : a.info.path > b.info.path ? 1 : 0
  );
}

/**
 * Every name of the table that starts with `prefix` (literally) and is
 * held or stale, plus the `names` given even when they are free; sorted
 * by name. What was read half way through an acquire or a release is read
 * again, three times at most (about 15 ms), and comes back `pending` or
 * `unsettled` if it is still so then. A stale record is believed when two
 * reads in a row agree, or when it is the one in `known` (a watch's last
 * report). Statement errors propagate (a missing table: SQLSTATE 42P01).
 *
 * A stale read needs the second read because pg_locks, the record and
 * pg_stat_activity are each read at their own moment: a holder that
 * releases after the statement's snapshot and closes its session before
 * pg_stat_activity is read looks like one that crashed. Once it has
 * left pg_stat_activity it has either committed its release or never
 * will, so a later statement's snapshot reads the record as it stays.
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
 * `tableKnown` false first asks whether it exists, rather than let the
 * statement fail (each failure is an ERROR line in the server's log, and
 * a status command or a watch polls). A table dropped since is no table,
 * but a missing relation that is another's (a function of a row-level
 * security policy, a view an admin put in) is an error, never "no locks".
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
  const rows = await session.query(
    sql.tableExists,
    [sql.table],
    undefined,
    false,
    timeout,
  );
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
