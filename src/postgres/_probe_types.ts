// What the probes read (PgLocks.inspect, scan, watch), and the options of
// scan and watch; exported by mod.ts.
import type { ChangeKind, LockChange, LockInspection } from "../contract.ts";

/**
 * What {@linkcode PgLocks.inspect} found for a lock name. The fields of a
 * file lock's `Inspection`, plus the record's `meta`, `runtime` and
 * `fence`, and the holder's server process (`backendPid`).
 *
 * @example Reading an inspection
 * ```ts
 * import { pgLocks, type PgInspection } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
 * await using locks = pgLocks(url);
 * await using lock = await locks.acquire("example/inspection", { meta: { cmd: "sync" } });
 * const info: PgInspection = await locks.inspect("example/inspection");
 * assert.equal(info.state, "held");
 * assert.equal(info.pid, Deno.pid);
 * assert.deepEqual(info.meta, { cmd: "sync" });
 * assert.equal(info.fence, lock.fence);
 * assert.equal(info.runtime, "deno");
 * ```
 */
export interface PgInspection extends LockInspection {
  /** The lock name. */
  path: string;
  /**
   * - `free`: no record, or its holder released it.
   * - `held`: a live session holds the lock (its advisory lock is granted
   *   in `pg_locks`).
   * - `stale`: a record whose holder's session is gone (crashed, killed,
   *   evicted) without releasing; the next acquire takes over.
   * - `invalid`: the name's advisory key collides with another name's
   *   (see `reason`); acquire fails with {@linkcode KeyCollisionError}.
   */
  state: "free" | "held" | "stale" | "invalid";
  /** The holder's PID (held) or the last holder's (stale); else 0. */
  pid: number;
  /** The holder's host, or `""`. */
  host: string;
  /** When the holder took the lock. */
  started: Date | undefined;
  /**
   * `true` when the key is held by a database session that is not a
   * runlock holder (another application's advisory lock on the same
   * key); `pid` is then 0 and `reason` names the session.
   */
  foreign: boolean;
  /** For `invalid` and foreign holders: what was found. */
  reason: string | undefined;
  /** The holder's `meta` (held or stale), else `{}`. */
  meta: Record<string, string>;
  /** The holder's runtime (`deno`, `node`, `bun`), or `""`. */
  runtime: string;
  /** The last fence given out for this name, or undefined if never taken. */
  fence: bigint | undefined;
  /**
   * The server process of the session holding the lock (0 when none):
   * `SELECT pg_terminate_backend(backendPid)` evicts a hung holder.
   */
  backendPid: number;
}

/**
 * Options for {@linkcode PgLocks.scan}.
 *
 * @example The runs of one job, giving up after 5 seconds
 * ```ts
 * import type { PgScanOptions } from "@runlock/runlock/postgres";
 *
 * const options: PgScanOptions = {
 *   prefix: "sync/",
 *   signal: AbortSignal.timeout(5_000),
 * };
 * ```
 */
export interface PgScanOptions {
  /**
   * Only names that start with this text, matched literally (`%` and `_`
   * are ordinary characters, not wildcards). Default `""`: every name.
   */
  prefix?: string;
  /** Stops the scan: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * Options for {@linkcode PgLocks.watch}.
 *
 * @example Polling every 250 ms until shutdown
 * ```ts
 * import type { PgWatchOptions } from "@runlock/runlock/postgres";
 *
 * const shutdown = new AbortController();
 * const options: PgWatchOptions = {
 *   prefix: "sync/",
 *   interval: 250,
 *   signal: shutdown.signal,
 * };
 * ```
 */
export interface PgWatchOptions {
  /** Only names that start with this text, literally (as in `scan`). */
  prefix?: string;
  /**
   * Milliseconds from the end of one poll to the start of the next: a
   * positive finite number. Default 1000.
   */
  interval?: number;
  /** Ends the iteration (and closes the watch's session) when it aborts. */
  signal?: AbortSignal;
}

/**
 * What happened to a lock name, as {@linkcode PgLocks.watch} reports it
 * (the same kinds as a file watch's):
 *
 * - `present`: held or stale when the watch began (first batch only);
 * - `started`: a run took the free name;
 * - `released`: its holder released it (or its record was deleted);
 * - `crashed`: its holder's session ended without releasing it (the
 *   process died or was killed, `pg_terminate_backend`, a server restart,
 *   a lost network): the record is stale. Whether the process itself
 *   still runs, the server cannot tell (its `lock.signal` tells it);
 * - `taken over`: a new holder (a new fence) after a stale record, or
 *   after another holder whose end fell between two polls;
 * - `lost`: the holder's session still holds the key but its record was
 *   deleted or rewritten under it (by hand: runlock never does); the
 *   inspection is then a foreign holder's.
 *
 * @example Reacting to each kind
 * ```ts
 * import type { PgChangeKind } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * function verb(kind: PgChangeKind): string {
 *   return kind === "crashed" ? "died holding" : kind;
 * }
 * assert.equal(verb("crashed"), "died holding");
 * ```
 */
export type PgChangeKind = ChangeKind;

/**
 * One change {@linkcode PgLocks.watch} reports.
 *
 * @example Printing a change
 * ```ts
 * import type { PgChange } from "@runlock/runlock/postgres";
 *
 * function line(c: PgChange): string {
 *   return `${c.kind} ${c.path} pid ${c.inspection.pid} on ${c.inspection.host}`;
 * }
 * ```
 */
export interface PgChange extends LockChange<PgInspection> {
  /** The lock name. */
  path: string;
  /**
   * What a probe read after the change: for `released`, state `free`;
   * for `crashed`, `stale` with the last holder's pid, host and meta.
   */
  inspection: PgInspection;
}
