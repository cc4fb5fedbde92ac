/**
 * Where the locks are: lock files (the library), or a PostgreSQL database
 * (`--db=URL` or `RUNLOCK_DATABASE_URL`), behind one small interface that
 * the commands use. The PostgreSQL backend is imported here and only here,
 * when asked for: file-lock users never load it, nor its database client.
 *
 * @module
 */

import { hostname } from "node:os";
import { process } from "../_process.ts";
import { acquire, HeldError, inspect } from "../../mod.ts";
import { UsageError } from "./_args.ts";
import type { Info } from "./_format.ts";
import { checkLockPath } from "./_paths.ts";
import { granted } from "./_permissions.ts";

/** How often `run` checks that its lock file is still its own (ms). */
const LOSS_CHECK_MS = 200;

/** A held lock of either backend, as `run` uses it. */
export interface HeldLock {
  /** Aborted when the lock is lost. */
  readonly signal: AbortSignal;
  /** Releases the lock. */
  release(): Promise<void>;
}

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
  acquire: (path, options) =>
    acquire(path, { ...options, checkInterval: LOSS_CHECK_MS }),
  isHeld: (err): err is Error => err instanceof HeldError,
  poll: 100,
  end: () => Promise.resolve(),
};

/** A database URL, and where it came from (for messages). */
export interface Url {
  /** The URL as given. */
  text: string;
  /** Where it came from, as messages name it. */
  from: "option '--db'" | "RUNLOCK_DATABASE_URL";
}

/** The database URL: --db=URL, else RUNLOCK_DATABASE_URL, else none. */
export function databaseUrl(
  options: Map<string, string | true>,
): Url | undefined {
  const given = options.get("db");
  if (typeof given === "string") {
    if (given === "") {
      throw new UsageError("option '--db' needs a URL: --db=postgres://...");
    }
    return { text: given, from: "option '--db'" };
  }
  // Under Deno, without --allow-env, the variable is not read (no prompt).
  const variable = "RUNLOCK_DATABASE_URL";
  if (!granted({ name: "env", variable })) return undefined;
  const text = process.env[variable];
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
    // no URL is where redact() has least to go on.
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
  i: Omit<Info, "bootId" | "pidNamespace" | "pidValidHere" | "pidElsewhere">,
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
  };
}

/** The PostgreSQL backend's module, loaded on first use. */
export function postgres(): Promise<typeof import("../postgres/mod.ts")> {
  return import("../postgres/mod.ts");
}

/** Locks on a PostgreSQL database. */
async function database(url: Url): Promise<Backend> {
  const pg = await postgres();
  let locks: ReturnType<typeof pg.pgLocks>;
  try {
    locks = pg.pgLocks(url.text);
  } catch (err) {
    throw badUrl(url, err);
  }
  const here = hostHere();
  return {
    // Any text is a lock name.
    check: () => {},
    inspect: async (name) => pgInfo(await locks.inspect(name), here),
    acquire: (name, options) => locks.acquire(name, options),
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
