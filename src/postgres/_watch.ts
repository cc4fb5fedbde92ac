// PgLocks.watch(): polls the scan statement on a session of its own and
// compares each poll with what it reported last. Polling, as PostgreSQL
// announces no advisory lock change (LISTEN/NOTIFY would need every
// holder's help, and a crashed holder sends nothing).
import { clearTimeout, setTimeout } from "node:timers";
import { RunlockError } from "../errors.ts";
import { MAX_TIMER_MS } from "./_clock.ts";
import { isSessionError, SOCKET_GONE } from "./_failure.ts";
import type { WatchHost } from "./_host.ts";
import { keyOf, lockTagOf } from "./_key.ts";
import {
  checkInterval,
  checkOptionsObject,
  checkPrefix,
  checkSignal,
} from "./_options.ts";
import { find, interpret } from "./_probe.ts";
import type {
  PgChange,
  PgChangeKind,
  PgInspection,
  PgWatchOptions,
} from "./_probe_types.ts";
import { scanLabel, type Scanned, scanTable } from "./_scan.ts";
import type { Session } from "./_session.ts";

/** How long polls may fail on a lost or refused connection before giving up. */
const RECONNECT_MS = 30_000;

const ACTION = "watch the locks";

/** Whether `a` and `b` describe the same holding (or the same stale record). */
function same(a: PgInspection, b: PgInspection): boolean {
  return a.state === b.state && a.fence === b.fence && a.pid === b.pid &&
    a.backendPid === b.backendPid && a.foreign === b.foreign;
}

/**
 * The change from what was reported last for a name (`prev`; undefined
 * when nothing, or free) to what a probe says now, or undefined for none.
 */
export function kindOf(
  prev: PgInspection | undefined,
  next: PgInspection,
): PgChangeKind | undefined {
  const was = prev?.state ?? "free";
  switch (next.state) {
    case "free":
    case "invalid":
      return was === "held" || was === "stale" ? "released" : undefined;
    case "stale":
      return was === "stale" && same(prev!, next) ? undefined : "crashed";
    case "held":
      if (was === "free" || was === "invalid") return "started";
      if (was === "stale") return "taken over";
      if (same(prev!, next)) return undefined;
      if (
        prev!.backendPid === next.backendPid && prev!.foreign !== next.foreign
      ) {
        // Its record was deleted or rewritten by hand: "lost". Or the
        // record of the session seen holding the key has been committed:
        // the holder reported was that run's, unrecorded (its record's
        // commit not seen in flight: see the scan statement); "started"
        // again, this time with the run's pid, host and fence.
        return next.foreign ? "lost" : "started";
      }
      // Another holding: the one seen last ended (released or crashed:
      // both fell between two polls) and a new one began.
      return "taken over";
  }
}

/** Resolves after `ms`, or at once (false) when `signal` aborts. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<boolean> {
  if (signal?.aborted) return Promise.resolve(false);
  const end = performance.now() + ms;
  return new Promise((resolve) => {
    let timer: ReturnType<typeof setTimeout>;
    const done = (value: boolean) => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", abort);
      resolve(value);
    };
    const abort = () => done(false);
    const arm = () => {
      const left = end - performance.now();
      if (left <= 0) done(true);
      else timer = setTimeout(arm, Math.min(left, MAX_TIMER_MS));
    };
    signal?.addEventListener("abort", abort, { once: true });
    arm();
  });
}

/** A name's inspection when its record is gone and no one holds its key. */
function gone(schema: string, name: string): PgInspection {
  return interpret(name, keyOf(name, schema), {}).info;
}

/**
 * PgLocks.watch(): checks the options at once (before any query), then
 * returns the iterable; each iteration opens a session of its own.
 */
export function watchLocks(
  host: WatchHost,
  options: PgWatchOptions | undefined,
): AsyncIterable<PgChange[]> {
  const o = checkOptionsObject(options, ACTION);
  const prefix = checkPrefix(o.prefix, ACTION);
  const interval = checkInterval(o.interval, ACTION);
  const signal = checkSignal(o.signal, ACTION);
  return {
    [Symbol.asyncIterator]: () => iterate(host, prefix, interval, signal),
  };
}

/**
 * The polling generator with a stop of its own (return(), end()) that
 * ends a next() in flight at once: a generator's return() would wait
 * behind it until a change came.
 */
function iterate(
  host: WatchHost,
  prefix: string,
  interval: number,
  signal: AbortSignal | undefined,
): AsyncIterator<PgChange[], void, undefined> {
  const own = new AbortController();
  const abort = () => own.abort(signal!.reason);
  if (signal?.aborted) own.abort(signal.reason);
  else signal?.addEventListener("abort", abort, { once: true });
  const gen = poll(host, prefix, interval, own.signal);
  let pending: Promise<unknown> = Promise.resolve();
  const stop = async () => {
    own.abort();
    await pending.catch(() => {});
    await gen.return();
  };
  const untrack = host.track(stop);
  const finish = () => {
    untrack();
    signal?.removeEventListener("abort", abort);
  };
  return {
    next() {
      const p = gen.next();
      pending = p;
      p.then((r) => r.done && finish(), finish);
      return p;
    },
    async return() {
      finish();
      await stop();
      return { done: true, value: undefined };
    },
  };
}

async function* poll(
  host: WatchHost,
  prefix: string,
  interval: number,
  signal: AbortSignal | undefined,
): AsyncGenerator<PgChange[], void, undefined> {
  const label = scanLabel(prefix);
  /** What was reported last, per name not free. */
  const last = new Map<string, PgInspection>();
  /** Unsettled reads held back one poll, per name. */
  const held = new Map<string, PgInspection>();
  let session: Session | undefined;
  let table = false;
  let failingSince: number | undefined;
  let first = true;

  /** Opens the session if needed and reads the table, or undefined on abort. */
  const read = async (): Promise<Scanned[] | undefined> => {
    session ??= await host.openProbe(label, ACTION, signal);
    const s = session;
    const work = scanTable(
      s,
      host.sql,
      host.statementTimeout,
      prefix,
      [...last.keys()],
      table,
      last,
    );
    // A statement waiting for a lock would not notice a closed socket
    // until granted: cancel it, and drop the session at once.
    const stop = () => {
      void s.cancel();
      s.destroy("was closed by the watch's signal");
    };
    signal?.addEventListener("abort", stop, { once: true });
    try {
      const scan = await work;
      table = scan.table;
      return scan.rows;
    } catch (err) {
      if (signal?.aborted) return undefined;
      throw err;
    } finally {
      signal?.removeEventListener("abort", stop);
    }
  };

  /** One poll's changes; `last` and `held` change only once it is whole. */
  const compare = async (rows: Scanned[]): Promise<PgChange[]> => {
    const now = new Map(last);
    const wait = new Map(held);
    const changes: PgChange[] = [];
    const report = (path: string, kind: PgChangeKind, info: PgInspection) => {
      changes.push({ path, kind, inspection: info });
      if (info.state === "free") now.delete(path);
      else now.set(path, info);
    };
    const listed = new Set<string>();
    for (const { info, certainty } of rows) {
      listed.add(info.path);
      // An acquire committing: reported once it has.
      if (certainty === "pending") continue;
      const kind = kindOf(now.get(info.path), info);
      if (kind === undefined) {
        wait.delete(info.path);
        // Keep the newest read (an application name may change).
        if (info.state !== "free") now.set(info.path, info);
        continue;
      }
      if (certainty === "unsettled") {
        // Maybe half way through an acquire or a release: reported only
        // when the next poll reads the same.
        const before = wait.get(info.path);
        if (before === undefined || !same(before, info)) {
          wait.set(info.path, info);
          continue;
        }
      }
      wait.delete(info.path);
      report(info.path, kind, info);
    }
    // Reported names missing from the table: their record was deleted by
    // hand (runlock never does), and whoever holds the key still holds it.
    for (const [path, prev] of last) {
      if (listed.has(path)) continue;
      wait.delete(path);
      let info = gone(host.schema, path);
      if (table) {
        const key = keyOf(path, host.schema);
        const found = await find(
          session!,
          host.sql,
          host.statementTimeout,
          path,
          key,
          lockTagOf(key),
        );
        // A record again (written after our read): the next poll has it.
        const recorded = found.info.state === "stale" ||
          (found.info.state === "held" && !found.info.foreign);
        if (recorded) continue;
        info = found.info;
      }
      const kind = kindOf(prev, info);
      if (kind !== undefined) report(path, kind, info);
    }
    last.clear();
    for (const [k, v] of now) last.set(k, v);
    held.clear();
    for (const [k, v] of wait) held.set(k, v);
    return changes.sort((a, b) =>
      a.path < b.path ? -1 : a.path > b.path ? 1 : 0
    );
  };

  try {
    while (!signal?.aborted) {
      if (!first && !(await sleep(interval, signal))) return;
      let changes: PgChange[];
      try {
        const rows = await read();
        if (rows === undefined) return; // aborted
        if (first) {
          // Not an acquire still committing: its "started" comes later.
          changes = rows.filter((r) =>
            r.info.state !== "free" && r.certainty !== "pending"
          ).map((r) => ({
            path: r.info.path,
            kind: "present",
            inspection: r.info,
          }));
          for (const { inspection } of changes) {
            last.set(inspection.path, inspection);
          }
        } else {
          changes = await compare(rows);
        }
      } catch (err) {
        if (signal?.aborted) return;
        const lost = session?.lost !== undefined;
        if (lost) session = undefined;
        const now = performance.now();
        failingSince ??= now;
        if (first || !(lost || isConnectError(err))) {
          throw host.refused(label, ACTION, err);
        }
        if (now - failingSince >= RECONNECT_MS) {
          const e = host.refused(label, ACTION, err);
          throw new RunlockError(
            label,
            `${e.message} (the watch retried for ${
              Math.round((now - failingSince) / 1000)
            } s, one poll every ${interval} ms, and gave up)`,
            { cause: e.cause ?? err },
          );
        }
        continue; // the next poll opens a new session
      }
      failingSince = undefined;
      if (first || changes.length > 0) yield changes;
      first = false;
    }
  } finally {
    const s = session;
    session = undefined;
    await s?.close();
  }
}

/**
 * Whether a failure to connect is one a restart or a network outage gives
 * (the server refused, went away, or is starting or stopping), rather than
 * one that will stay (a wrong password, a missing grant).
 */
function isConnectError(err: unknown): boolean {
  const cause = err instanceof RunlockError ? err.cause : err;
  const code = (cause as { code?: unknown } | null)?.code;
  if (typeof code === "string" && SOCKET_GONE.has(code)) return true;
  if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) {
    // cannot_connect_now (57P03: starting up, shutting down), the
    // shutdowns (57P01, 57P02), connection exceptions (08xxx), and
    // insufficient resources (53xxx: too_many_connections 53300, as when
    // every client reconnects at once after a restart; out of memory).
    return code.startsWith("57P") || code.startsWith("08") ||
      code.startsWith("53");
  }
  return cause !== undefined && isSessionError(cause) &&
    !(cause instanceof TypeError);
}
