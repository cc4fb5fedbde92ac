/**
 * Where the locks are: lock files (the library), or a PostgreSQL database
 * (`--db=URL` or `RUNLOCK_DATABASE_URL`, its table in the schema
 * `--schema=NAME` or `RUNLOCK_DATABASE_SCHEMA`, default public, as
 * `runlock db-setup` prepares it), behind one small interface that
 * the commands use. The PostgreSQL backend is imported here and only here,
 * when asked for: file-lock users never load it, nor its database client.
 *
 * @module
 */

import { hostname } from "node:os";
import { acquire, type AcquireOptions, HeldError, inspect } from "../../mod.ts";
import type { HeldLock } from "../contract.ts";
import { CHILD_OPTION } from "../file/_inherit.ts";
import { UsageError } from "./_args.ts";
import type { Info } from "./_format.ts";
import { checkLockPath } from "./_paths.ts";
import { envValue, granted } from "./_permissions.ts";
import { setupAdvice } from "./_setup_advice.ts";

/** How often `run` checks that its lock file is still its own (ms). */
const LOSS_CHECK_MS = 200;

/** Where the locks are: lock files, or a PostgreSQL database. */
export interface Backend {
  /**
   * Throws when `name` cannot name a lock here (a directory, a path on
   * /proc), before anything looks at it.
   */
  check(name: string): void;
  /** Describes the lock `name` without taking it. */
  inspect(name: string): Promise<Info>;
  /** Takes the lock `name`, waiting up to `timeout` ms. */
  acquire(
    name: string,
    options: {
      timeout: number;
      signal: AbortSignal;
      meta: Record<string, string>;
    },
  ): Promise<HeldLock>;
  /** Whether `err` says that another run holds the lock. */
  isHeld(err: unknown): err is Error;
  /** The longest pause between two probes of `wait`, in ms. */
  poll: number;
  /** Closes what the backend opened. */
  end(): Promise<void>;
}

/** Lock files, through the library. */
const files: Backend = {
  check: checkLockPath,
  inspect,
  // The periodic check is one lstat: every 200 ms, a lost lock is noticed
  // within 200 ms on every runtime (at once where a directory watch runs:
  // Node and Bun; Deno's would keep the process alive).
  // The record keeps a `child=` line for the command's PID, which `run`
  // writes once the command runs (PROTOCOL.md, "Handing the lock to a
  // command").
  acquire: (path, options) =>
    acquire(path, {
      ...options,
      checkInterval: LOSS_CHECK_MS,
      [CHILD_OPTION]: true,
    } as AcquireOptions),
  isHeld: (err): err is Error => err instanceof HeldError,
  poll: 100,
  end: () => Promise.resolve(),
};

/**
 * The options of the PostgreSQL backend, which every command that takes
 * locks knows (for `parse`): `--db=URL` and `--schema=NAME`.
 */
export const DB_OPTIONS = { db: "value", schema: "value" } as const;

/** The variable that names the schema, as --schema does. */
export const SCHEMA_VARIABLE = "RUNLOCK_DATABASE_SCHEMA";

/** What `--help` of run, status and wait says of `--db` and `--schema`. */
export const DB_HELP =
  `With --db=URL (or RUNLOCK_DATABASE_URL), <name> is a PostgreSQL lock,
its record in the table runlock_locks of the schema --schema=NAME (or
RUNLOCK_DATABASE_SCHEMA; default public): the schema that
runlock db-setup --schema=NAME prepares. The schema is part of the
lock: runs that name another schema never exclude each other.`;

/** A database URL, and where it came from (for messages). */
export interface Url {
  /** The URL as given. */
  text: string;
  /** Where it came from, as messages name it. */
  from: "option '--db'" | "RUNLOCK_DATABASE_URL";
  /**
   * The schema of runlock's table (`--schema=NAME`, else
   * RUNLOCK_DATABASE_SCHEMA), or undefined for pgLocks' default, public.
   */
  schema?: { name: string; from: "option '--schema'" | typeof SCHEMA_VARIABLE };
}

/**
 * The database URL: --db=URL, else RUNLOCK_DATABASE_URL, else none; with
 * the schema of --schema=NAME, else RUNLOCK_DATABASE_SCHEMA. A --schema
 * without a URL is a usage error (lock files have no schema); the variable
 * without one is not read, as a shell may set it for every command.
 */
export function databaseUrl(
  options: Map<string, string | true>,
): Url | undefined {
  const url = urlOf(options);
  const given = options.get("schema");
  if (typeof given === "string") {
    if (given === "") {
      throw new UsageError("option '--schema' needs a name: --schema=NAME");
    }
    if (url === undefined) {
      throw new UsageError(
        "option '--schema' is the PostgreSQL backend's: give --db=URL (or RUNLOCK_DATABASE_URL) too",
      );
    }
    return { ...url, schema: { name: given, from: "option '--schema'" } };
  }
  if (url === undefined) return undefined;
  const name = envValue(SCHEMA_VARIABLE);
  return name ? { ...url, schema: { name, from: SCHEMA_VARIABLE } } : url;
}

/** The URL of --db=URL, else RUNLOCK_DATABASE_URL, else none. */
function urlOf(options: Map<string, string | true>): Url | undefined {
  const given = options.get("db");
  if (typeof given === "string") {
    if (given === "") {
      throw new UsageError("option '--db' needs a URL: --db=postgres://...");
    }
    return { text: given, from: "option '--db'" };
  }
  const variable = "RUNLOCK_DATABASE_URL";
  const text = envValue(variable);
  return text ? { text, from: variable } : undefined;
}

/**
 * The usage error for a database URL that pgLocks() refused, in the
 * command line's words: "--db must be a postgres:// URL, e.g. ...", not
 * the API's "Cannot create pgLocks as 'url' must be ...". The URL itself
 * is quoted only as pgLocks() quotes it: through redact(), without its
 * password.
 *
 * @param url The URL, and where it came from.
 * @param err What pgLocks() threw.
 * @returns The error to throw.
 */
export function badUrl(url: Url, err: unknown): UsageError {
  const name = url.from === "option '--db'" ? "--db" : url.from;
  const message = err instanceof Error ? err.message : String(err);
  if (
    /^Cannot create pgLocks as 'url' must (be a|start with) postgres/.test(
      message,
    )
  ) {
    // Not echoed: it was typed (or set) by the reader, and a value that is
    // no URL is where redact() has least to go on. One that starts as a
    // PostgreSQL URL is one whose parts do not parse (a port that is not a
    // number, an unclosed IPv6 bracket, a password's '@' or '/').
    if (/^postgres(ql)?:\/\//i.test(url.text)) {
      return new UsageError(
        `${name} is not a URL: check host, port; percent-encode @:/?# in ` +
          `passwords`,
      );
    }
    return new UsageError(
      name === "--db"
        ? "--db must be a postgres:// URL, e.g. postgres://user@host/db"
        : `${name} must be a URL such as postgres://user@host/db`,
    );
  }
  // Any other refusal of the URL (a bad percent-escape, an '@' after the
  // host, ...), said of the option: its value already redacted by pgLocks.
  return new UsageError(
    message.replace(/^Cannot create pgLocks as /, "")
      .replaceAll("'url'", name),
  );
}

/**
 * pgLocks() for `url`, in its schema; a URL or a schema that it refuses is
 * a usage error naming the option (or the variable) it came from.
 */
export function openLocks(
  pg: typeof import("../postgres/mod.ts"),
  url: Url,
): ReturnType<typeof pg.pgLocks> {
  try {
    return pg.pgLocks(
      url.text,
      url.schema === undefined ? {} : { schema: url.schema.name },
    );
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    if (url.schema !== undefined && message.includes("'schema'")) {
      // "Cannot create pgLocks as 'schema' must be a name of 1 to 63
      // bytes ...: current value is "..."" (JSON: printable as it is).
      throw new UsageError(
        message.replace(/^Cannot create pgLocks as /, "")
          .replace(
            "'schema'",
            url.schema.from === "option '--schema'"
              ? "option '--schema'"
              : url.schema.from,
          ),
      );
    }
    throw badUrl(url, err);
  }
}

/** This host's name, when it may be read without a prompt. */
export function hostHere(): string {
  if (!granted({ name: "sys", kind: "hostname" })) return "";
  try {
    return hostname();
  } catch {
    return "";
  }
}

/**
 * A PostgreSQL lock's inspection as an {@linkcode Info}: a database record
 * names no boot or PID namespace, so the host (`here`: this host's name,
 * or `""`) is all there is to compare, and only a difference is certain.
 */
export function pgInfo(
  i: Omit<
    Info,
    "bootId" | "pidNamespace" | "pidValidHere" | "pidElsewhere" | "child"
  >,
  here: string,
): Info {
  const elsewhere = i.pid !== 0 && i.host !== "" && here !== "" &&
    i.host !== here;
  return {
    ...i,
    bootId: "",
    pidNamespace: "",
    pidValidHere: elsewhere ? false : undefined,
    pidElsewhere: elsewhere ? "host" : undefined,
    child: 0,
  };
}

/** The PostgreSQL backend's module, loaded on first use. */
export function postgres(): Promise<typeof import("../postgres/mod.ts")> {
  return import("../postgres/mod.ts");
}

/** Locks on a PostgreSQL database. */
async function database(url: Url): Promise<Backend> {
  const pg = await postgres();
  const locks = openLocks(pg, url);
  const here = hostHere();
  return {
    // Any text is a lock name.
    check: () => {},
    inspect: async (name) => pgInfo(await locks.inspect(name), here),
    // A role that may not create runlock's table: the advice's SQL on
    // lines of its own (inspect creates nothing, so never meets it).
    acquire: (name, options) =>
      locks.acquire(name, options).catch((err) => {
        throw setupAdvice(err, name);
      }),
    // The class that module re-exports, which is runlock's own (one copy
    // under Deno; the npm build keeps it one copy too).
    isHeld: (err): err is Error =>
      err instanceof pg.HeldError || err instanceof HeldError,
    poll: 250,
    end: () => locks.end(),
  };
}

/** The backend the options ask for. */
export function backend(url: Url | undefined): Promise<Backend> {
  return url === undefined ? Promise.resolve(files) : database(url);
}
