// Probing a lock name: reading its record and who holds its key in
// pg_locks, and what that means (free, held, stale, invalid, foreign).
import { process } from "../_process.ts";
import { HeldError } from "../errors.ts";
import { delay } from "./_clock.ts";
import type { LockTag } from "./_key.ts";
import { ownedByThisProcess } from "./_lock.ts";
import type { PgInspection } from "./_probe_types.ts";
import { hostName } from "../platform/runtime.ts";
import type { Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";
import { ForeignHolderError } from "./errors.ts";

/** What a probe read. */
export interface Found {
  info: PgInspection;
  /** Another name with the same key (a collision), if any. */
  other: string | undefined;
}

/**
 * The HeldError for a lock a probe found held: a ForeignHolderError for a
 * holder without a record, `byThisProcess` for this process (see
 * ownedByThisProcess), else naming the record's pid and host.
 *
 * @param name The lock name.
 * @param info What the probe read (state `held`).
 * @returns The error to throw.
 */
export function heldError(name: string, info: PgInspection): HeldError {
  if (info.foreign) {
    const m = /session \d+(?: \(application "(.*)"\))?/.exec(
      info.reason ?? "",
    );
    return new ForeignHolderError(name, info.backendPid, m?.[1] ?? "");
  }
  const since = ownedByThisProcess(info);
  if (since !== undefined) return heldHere(name, since);
  return new HeldError(name, info.pid, info.host, { started: info.started });
}

/** The HeldError for a lock this very process holds, taken at `since`. */
export function heldHere(name: string, since: Date): HeldError {
  return new HeldError(name, process.pid, hostName(), {
    started: since,
    byThisProcess: true,
  });
}

/** Turns the inspect statement's row into an inspection. */
export function interpret(
  name: string,
  key: bigint,
  row: Record<string, unknown> | undefined,
): Found {
  const r = row ?? {};
  const holder = (r.holder_backend as number | null) ?? 0;
  const recorded = r.fence !== null && r.fence !== undefined;
  const info: PgInspection = {
    path: name,
    state: "free",
    pid: 0,
    host: "",
    started: undefined,
    foreign: false,
    reason: undefined,
    meta: {},
    runtime: "",
    fence: recorded ? BigInt(r.fence as string) : undefined,
    backendPid: holder,
  };
  const other = typeof r.other_name === "string" ? r.other_name : undefined;
  const fill = () => {
    info.pid = r.pid as number;
    info.host = r.host as string;
    info.started = r.started as Date;
    info.meta = (r.meta ?? {}) as Record<string, string>;
    info.runtime = r.runtime as string;
  };
  if (holder !== 0) {
    if (recorded && r.backend_pid === holder) {
      info.state = "held";
      fill();
    } else if (other !== undefined && r.other_backend === holder) {
      info.state = "invalid";
      info.reason = `collides with ${
        JSON.stringify(other)
      } (same advisory key ${key}), which pid ${r.other_pid} on ${
        r.other_host || "?"
      } holds`;
    } else {
      info.state = "held";
      info.foreign = true;
      const app = r.holder_application as string | null;
      info.reason = `held by database session ${holder}${
        app ? ` (application ${JSON.stringify(app)})` : ""
      }, which wrote no runlock record`;
    }
  } else if (other !== undefined) {
    info.state = "invalid";
    info.reason = `collides with ${
      JSON.stringify(other)
    } (same advisory key ${key}); acquire would fail until one is renamed`;
  } else if (recorded && r.backend_pid !== null) {
    info.state = "stale";
    fill();
  }
  return { info, other };
}

/**
 * Reads the record and pg_locks for a name; a foreign holder is read
 * again, briefly (see the `inspect` statement).
 */
export async function find(
  session: Session,
  sql: Statements,
  timeout: number,
  name: string,
  key: bigint,
  tag: LockTag,
): Promise<Found> {
  let found: Found | undefined;
  for (let i = 0; i < 4; i++) {
    if (i > 0) await delay(2 * i);
    const rows = await session.query(
      sql.inspect,
      [name, String(key), tag.classid, tag.objid],
      timeout,
      "runlock_inspect",
    );
    found = interpret(name, key, rows[0]);
    if (!found.info.foreign) break;
  }
  return found!;
}
