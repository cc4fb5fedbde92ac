// Every lock name of the table at once (scan() and each poll of watch()):
// one statement on a probe session, read as inspect() reads one name.
import { setTimeout } from "node:timers";
import { interpret } from "./_probe.ts";
import type { Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";
import type { PgInspection } from "./types.ts";

/** One name a scan read. */
export interface Scanned {
  info: PgInspection;
  /**
   * How sure the read is (see the `scan` statement):
   * - `settled`: what a probe says, and will say until something happens;
   * - `pending`: an acquire in flight (the key granted, its holder still
   *   in the statement that writes the record): `info` says what a probe
   *   says now (a foreign holder), not what it will say once it commits;
   * - `unsettled`: maybe half way through an acquire or a release (who
   *   holds the key, or whether the record's backend is the holder's,
   *   could not be told): a look a moment later may say otherwise.
   */
  certainty: "settled" | "pending" | "unsettled";
}

/** Pauses before each read again of a scan that read something unsettled. */
const AGAIN_MS = [2, 4, 8];

/**
 * Checks scan()'s and watch()'s `prefix`: a string of at most 1024
 * characters (a name's limit) without NUL; `""` (the default) matches
 * every name.
 *
 * @param prefix The caller's value.
 * @param action What is refused, for the message (`scan the locks`).
 * @returns The prefix.
 * @throws {TypeError} it is not such a string.
 */
export function checkPrefix(prefix: unknown, action: string): string {
  const value = prefix ?? "";
  if (
    typeof value !== "string" || value.length > 1024 || value.includes("\0")
  ) {
    throw new TypeError(
      `Cannot ${action} as 'prefix' must be a string of at most 1024 characters without NUL: current value is ${
        typeof value === "string" && value.length > 80
          ? `a string of ${value.length} characters`
          : typeof value === "string"
          ? JSON.stringify(value)
          : String(value)
      }`,
    );
  }
  return value;
}

/** Checks an optional `signal`: an AbortSignal or undefined. */
export function checkSignal(
  signal: unknown,
  action: string,
): AbortSignal | undefined {
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot ${action} as 'signal' must be an AbortSignal: current value is ${
        String(signal)
      }`,
    );
  }
  return signal;
}

/** Reads the `scan` statement once: each row as an inspection. */
async function readOnce(
  session: Session,
  sql: Statements,
  timeout: number,
  prefix: string,
  names: readonly string[],
): Promise<Scanned[]> {
  const rows = await session.query(
    sql.scan,
    [prefix, names],
    "runlock_scan",
    false,
    timeout,
  );
  const seen = new Set<string>();
  const out: Scanned[] = [];
  for (const row of rows) {
    const name = row.name as string;
    // A key held in shared mode by several sessions (not runlock's doing)
    // gives one row per session: the name once is enough.
    if (seen.has(name)) continue;
    seen.add(name);
    let { info } = interpret(name, BigInt(row.key as string), row);
    let certainty: Scanned["certainty"] = "settled";
    if (info.foreign) {
      certainty = row.holder_state === "active"
        ? "pending"
        : row.holder_state === null
        ? "unsettled"
        : "settled"; // an idle session holds it: another application's
    } else if (info.state === "stale" && row.record_backend_alive === true) {
      if (row.record_backend_checked === true) {
        // The holder dropped the key and its release is committing: what
        // every probe will say once it has. (A backend_start after the
        // record's start would be a later backend with a recycled pid:
        // not joined, so the record reads stale.)
        info = interpret(name, 0n, { fence: row.fence, backend_pid: null })
          .info;
      } else certainty = "unsettled";
    }
    out.push({ info, certainty });
  }
  return out.sort((a, b) =>
    a.info.path < b.info.path ? -1 : a.info.path > b.info.path ? 1 : 0
  );
}

/**
 * Every name of the table that starts with `prefix` (literally) and is
 * held or stale, plus the `names` given even when they are free (and
 * those whose release is committing); sorted by name. What was read half
 * way through an acquire or a release is read again, three times at most
 * (about 15 ms), and comes back `pending` or `unsettled` if it is still so
 * then. Statement errors propagate (a missing table: SQLSTATE 42P01).
 *
 * @param session A probe session.
 * @param sql The statements of the table.
 * @param timeout Milliseconds the statement may take (see Session.query).
 * @param prefix The literal prefix; `""` for every name.
 * @param names Names to list even when free.
 * @returns What each name's probe says, sorted by name.
 */
export async function scanRows(
  session: Session,
  sql: Statements,
  timeout: number,
  prefix: string,
  names: readonly string[] = [],
): Promise<Scanned[]> {
  let found = await readOnce(session, sql, timeout, prefix, names);
  for (const ms of AGAIN_MS) {
    if (found.every((s) => s.certainty === "settled")) break;
    await new Promise((r) => setTimeout(r, ms));
    found = await readOnce(session, sql, timeout, prefix, names);
  }
  return found;
}

/** What {@linkcode scanTable} read, and whether the table exists. */
export interface TableScan {
  rows: Scanned[];
  table: boolean;
}

/**
 * {@linkcode scanRows} where the table may not exist yet (probes create
 * nothing): `tableKnown` false first asks whether it exists, rather than
 * let the statement fail (each failure is an ERROR line in the server's
 * log, and a watch polls). A table dropped since is no table, but a
 * missing relation that is another's (a function of a row-level security
 * policy, a view an admin put in) is an error, never "no locks".
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
): Promise<TableScan> {
  if (!tableKnown && !(await tableExists(session, sql, timeout))) {
    return { rows: [], table: false };
  }
  try {
    return {
      rows: await scanRows(session, sql, timeout, prefix, names),
      table: true,
    };
  } catch (err) {
    if (
      (err as { code?: unknown } | null)?.code === "42P01" &&
      session.lost === undefined &&
      !(await tableExists(session, sql, timeout).catch(() => true))
    ) {
      return { rows: [], table: false };
    }
    throw err;
  }
}

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
