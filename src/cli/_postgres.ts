/**
 * The CLI's side of the PostgreSQL backend: the URL (`--db=URL`, else
 * RUNLOCK_DATABASE_URL) and the schema (`--schema=NAME`, else
 * RUNLOCK_DATABASE_SCHEMA), pgLocks() with its refusals in the command
 * line's words, and its inspections as {@linkcode Info}. The backend is
 * imported only from here, when asked for: file-lock users never load it.
 *
 * @module
 */

import type { PgInspection, PgLocks } from "../postgres/mod.ts";
import { UsageError } from "./_args.ts";
import type { Info } from "./_format.ts";
import { envValue, hostName } from "../platform/runtime.ts";

/** The options every command that takes locks knows (for `parse`). */
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

/** A database URL and schema, and where each came from (for messages). */
export interface Url {
  text: string;
  from: "option '--db'" | "RUNLOCK_DATABASE_URL";
  /** Undefined for pgLocks' default, public. */
  schema?: { name: string; from: "option '--schema'" | typeof SCHEMA_VARIABLE };
}

/**
 * The database URL and schema, or undefined for lock files. A --schema
 * without a URL is a usage error; the variable without one is not read, as
 * a shell may set it for every command.
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

/** The PostgreSQL backend's module, loaded on first use. */
export function postgres(): Promise<typeof import("../postgres/mod.ts")> {
  return import("../postgres/mod.ts");
}

/**
 * pgLocks() for `url`, in its schema. What it refuses is a usage error
 * naming the option or variable, not the API's "Cannot create pgLocks as
 * 'url' ..."; the URL is quoted only as pgLocks() quotes it: redacted.
 */
export async function openLocks(url: Url): Promise<PgLocks> {
  const pg = await postgres();
  try {
    return pg.pgLocks(
      url.text,
      url.schema === undefined ? {} : { schema: url.schema.name },
    );
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    const api = /^Cannot create pgLocks as /;
    if (url.schema !== undefined && message.includes("'schema'")) {
      throw new UsageError(
        message.replace(api, "").replace("'schema'", url.schema.from),
      );
    }
    const name = url.from === "option '--db'" ? "--db" : url.from;
    if (
      /^Cannot create pgLocks as 'url' must (be a|start with) postgres/.test(
        message,
      )
    ) {
      // Not echoed: a value that is no URL is where redact() has least to
      // go on. One that starts as a URL has parts that do not parse.
      if (/^postgres(ql)?:\/\//i.test(url.text)) {
        throw new UsageError(
          `${name} is not a URL: check host, port; percent-encode @:/?# in passwords`,
        );
      }
      throw new UsageError(
        name === "--db"
          ? "--db must be a postgres:// URL, e.g. postgres://user@host/db"
          : `${name} must be a URL such as postgres://user@host/db`,
      );
    }
    throw new UsageError(message.replace(api, "").replaceAll("'url'", name));
  }
}

/**
 * A function that completes a PostgreSQL inspection to an Info: a database
 * record names no boot or PID namespace, so the host is all there is to
 * compare with this one, and only a difference is certain.
 */
export function pgInfo(): (i: PgInspection) => Info {
  const here = hostName();
  return (i) => {
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
  };
}
