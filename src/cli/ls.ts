/**
 * `runlock ls`: one line per lock file in a directory (or its tree), or
 * per PostgreSQL lock name under a prefix (`--db`); with `--watch`, the
 * same kept up to date as runs start, end and crash.
 *
 * @module
 */

import { statSync } from "node:fs";
import { process } from "../_process.ts";
import { scan, type Skipped, watch } from "../../mod.ts";
import { onePath, parse, UsageError } from "./_args.ts";
import type { LockChange } from "../contract.ts";
import {
  alignRows,
  type Info,
  lsCells,
  pidWarning,
  printable,
  printableErrors,
  toJson,
} from "./_format.ts";
import type { Command } from "./_help.ts";
import { type CliIo, stdio } from "./_io.ts";
import {
  endings,
  follow,
  jsonSink,
  lineSink,
  LiveTable,
  type Sink,
  stdoutScreen,
} from "./_live.ts";
import {
  databaseUrl,
  DB_OPTIONS,
  openLocks,
  pgInfo,
  type Url,
} from "./_postgres.ts";
import { signalNumber } from "./_signals.ts";

/** How often `ls --watch --db` polls pg_locks by default (ms). */
const INTERVAL_MS = 1000;
/** The bounds of `--interval` (ms): 10 ms to an hour. */
const INTERVAL_MIN = 10;
const INTERVAL_MAX = 3_600_000;

/** What `ls` was asked to list, and how. */
interface Request {
  json: boolean;
  recursive: boolean;
  watch: boolean;
  /** The database (`--db`), or undefined for lock files. */
  url: Url | undefined;
  /** The directory, or the name prefix (`""`: every name) with `--db`. */
  where: string;
  interval: number;
}

function request(args: string[]): Request {
  const { options, rest } = parse(args, {
    json: "flag",
    recursive: "flag",
    watch: "flag",
    interval: "value",
    ...DB_OPTIONS,
  }, "ls");
  const watching = options.has("watch");
  // Only --db: RUNLOCK_DATABASE_URL, set for run and status, would turn
  // `ls DIR` into a listing of a database.
  if (options.has("schema") && !options.has("db")) {
    throw new UsageError(
      "ls: option '--schema' is the PostgreSQL backend's: it needs --db=URL",
    );
  }
  const url = options.has("db") ? databaseUrl(options) : undefined;
  const given = options.get("interval");
  if (given !== undefined && !watching) {
    throw new UsageError(
      "ls: option '--interval' is how often ls --watch --db polls pg_locks: it needs --watch",
    );
  }
  if (given !== undefined && url === undefined) {
    throw new UsageError(
      "ls: option '--interval' is for --db (PostgreSQL, polled): lock files are watched, not polled",
    );
  }
  const interval = typeof given === "string" ? Number(given) : INTERVAL_MS;
  if (
    typeof given === "string" &&
    (!/^\d+$/.test(given) || interval < INTERVAL_MIN || interval > INTERVAL_MAX)
  ) {
    throw new UsageError(
      `option '--interval' must be a whole number of milliseconds from ${INTERVAL_MIN} to ${INTERVAL_MAX}: current value is '${given}'`,
    );
  }
  if (url !== undefined && options.has("recursive")) {
    throw new UsageError(
      "ls: option '--recursive' is for directories: with --db, a prefix (sync/) lists every name that starts with it",
    );
  }
  const where = onePath(rest, "ls", url === undefined ? "<dir>" : "");
  return {
    json: options.has("json"),
    recursive: options.has("recursive"),
    watch: watching,
    url,
    where,
    interval,
  };
}

/** Whether `dir` is a directory, something else, or missing. */
function kindOf(dir: string): "directory" | "other" | "missing" {
  try {
    return statSync(dir).isDirectory() ? "directory" : "other";
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "ENOENT") return "missing";
    const why = code === "ENOTDIR"
      ? "a parent of the path is not a directory"
      : code === "ELOOP"
      ? "too many symbolic links on the way"
      : code === "EACCES" || code === "EPERM"
      ? "permission denied"
      : undefined;
    if (why === undefined) throw err;
    throw new Error(`ls: ${printable(dir)}: ${why}`);
  }
}

/** `found` as a JSON array, or aligned lines. */
function print(found: Info[], json: boolean, io: CliIo): void {
  if (json) {
    io.out(JSON.stringify(found.map(toJson)));
    return;
  }
  const now = Date.now();
  for (const line of alignRows(found.map((info) => lsCells(info, now)))) {
    io.out(line);
  }
  for (const info of found) {
    const warning = pidWarning(info);
    if (warning) io.err(`runlock: ${printable(info.path)}: ${warning}`);
  }
}

async function ls(args: string[], io: CliIo): Promise<number> {
  const req = request(args);
  if (req.url === undefined) {
    const kind = kindOf(req.where);
    if (kind === "other") {
      throw new Error(`ls: ${printable(req.where)} is not a directory`);
    }
    if (req.watch) {
      if (kind === "missing") {
        throw new Error(
          `ls: ${printable(req.where)} does not exist: nothing to watch`,
        );
      }
      return await live(req, io);
    }
    // An error, as for ls(1): an empty answer would hide a typo.
    if (kind === "missing") {
      throw new Error(`ls: ${printable(req.where)} does not exist`);
    }
    const skipped: Skipped[] = [];
    const found = await scan(req.where, {
      recursive: req.recursive,
      onSkip: (s) => skipped.push(s),
    });
    print(found, req.json, io);
    for (const s of skipped) io.err(skipLine(s));
    if (found.length === 0 && !req.json) {
      io.err(
        `runlock: ls: no locks in ${printable(req.where)}${
          req.recursive ? " or below" : ""
        }`,
      );
    }
    return 0;
  }
  if (req.watch) return await live(req, io);
  const locks = await openLocks(req.url);
  try {
    const found = await locks.scan({ prefix: req.where });
    print(found.map(pgInfo()), req.json, io);
    return 0;
  } finally {
    await locks.end();
  }
}

/** What ls says of an entry scan() or watch() left out. */
function skipLine(s: Skipped): string {
  const why = s.reason === "temp name"
    ? "named like runlock's temp files (.NAME.<16 hex digits>.tmp: litter, or a lock being taken), so not read; if it is a lock, runlock status names its holder"
    : "its name is not UTF-8 (shown with \uFFFD), and runlock opens files by names it can spell, so what it holds is not listed";
  return `runlock: ls: skipped ${printable(s.path)}: ${why}`;
}

/** What the live table's title says is watched. */
function titleOf(req: Request): string {
  if (req.url === undefined) {
    return `runlock ls --watch${req.recursive ? " --recursive" : ""} ${
      printable(req.where)
    }`;
  }
  const names = req.where === ""
    ? "every name"
    : `names under '${printable(req.where)}'`;
  return `runlock ls --watch --db: ${names}, pg_locks polled every ${req.interval} ms`;
}

/**
 * `ls --watch`: a live table on a terminal, else JSON lines or plain
 * lines, until a signal (exit 128 + N) or a reader gone (exit 0).
 */
async function live(req: Request, io: CliIo): Promise<number> {
  const stop = new AbortController();
  const ours = io === stdio;
  const terminal = ours && !req.json && process.stdout.isTTY === true &&
    process.env.TERM !== "dumb";
  const table = terminal
    ? new LiveTable(
      stdoutScreen,
      titleOf(req),
      req.url === undefined ? { base: req.where } : { key: "NAME" },
    )
    : undefined;
  const sink: Sink = table ??
    (req.json ? jsonSink(io, stop) : lineSink(io, stop));
  const undo = endings(stop, table, ours);
  let end: (() => Promise<void>) | undefined;
  // Under the live table, said once it is gone: it would draw over them.
  const skipped: Skipped[] = [];
  try {
    let changes: AsyncIterable<LockChange<Info>[]>;
    if (req.url === undefined) {
      changes = watch(req.where, {
        recursive: req.recursive,
        signal: stop.signal,
        onSkip: (s) => table ? skipped.push(s) : io.err(skipLine(s)),
      });
    } else {
      const locks = await openLocks(req.url);
      end = () => locks.end();
      const info = pgInfo();
      const polled = locks.watch({
        prefix: req.where,
        interval: req.interval,
        signal: stop.signal,
      });
      changes = (async function* () {
        for await (const batch of polled) {
          yield batch.map((c) => ({
            path: c.path,
            kind: c.kind,
            inspection: info(c.inspection),
          }));
        }
      })();
    }
    await follow(changes, sink, stop);
  } finally {
    sink.close();
    undo();
    for (const s of skipped) io.err(skipLine(s));
    if (!stop.signal.aborted) stop.abort("done");
    await end?.();
  }
  const reason = stop.signal.reason;
  if (reason === "done" && req.url === undefined) {
    io.err(
      `runlock: ls: ${
        printable(req.where)
      } is gone (removed or moved): nothing left to watch`,
    );
    return 1;
  }
  if (reason === "done") return 0;
  if (reason === "EPIPE") return 0;
  if (typeof reason === "string") return 128 + signalNumber(reason);
  throw reason;
}

export const lsCommand: Command = {
  name: "ls",
  usage: `runlock ls [--json] [--recursive] [--] <dir>
runlock ls --watch [--json] [--recursive] [--] <dir>
runlock ls --db=URL [--schema=NAME] [--json] [--watch [--interval=MS]]
          [--] [<prefix>]`,
  help: `One line per lock file in <dir> (any file name; --recursive: the
whole tree, no symlinks followed): state, pid, host, age, command,
path. Exit 0. --json prints an array of inspect() results.
--watch: keep watching. On a terminal, a live table redrawn in place
as runs start, end and crash (and as their ages grow); with --json,
one JSON line per change, {"kind": ..., and the fields of --json},
kind one of present (the first lines: what is there), started,
released, crashed (its holder died; the file is stale), taken over,
lost (the file deleted or replaced under a live holder); otherwise
one plain line per change: the kind, then the columns above.
Lock files are watched through the kernel (inotify), not polled.
--db=URL: the PostgreSQL lock names that start with <prefix> (all
without one), from the runlock_locks table and pg_locks; --watch
polls them every --interval=MS (default ${INTERVAL_MS}). The table is the
one of the schema --schema=NAME (or RUNLOCK_DATABASE_SCHEMA; default
public), as runlock db-setup --schema=NAME prepares it. ls takes the
URL from --db only, never from RUNLOCK_DATABASE_URL.
Ends on Ctrl-C, SIGTERM or SIGHUP (exit 128+N), when <dir> is
removed (exit 1, said on stderr), or at its next line after the
reader of its output has gone (exit 0: ls --watch --json DIR |
head -n 3).`,
  run: printableErrors(ls),
};
