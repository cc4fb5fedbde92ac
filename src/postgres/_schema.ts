// Creating the schema and the table of lock records on first use; and,
// for a role that may not create them, the error that says which grant or
// which DDL (run once by someone who may) fixes it.
import { sqlState } from "./_failure.ts";
import type { Session } from "./_session.ts";
import { checkIdentifier } from "./_options.ts";
import { grantStatements, quoteIdent, setupStatements } from "./_ddl.ts";
import type { Statements } from "./_sql.ts";

/**
 * The server refused to create the schema or the table for lack of a
 * privilege (42501). Its message says what runlock was creating, the
 * grant that lets the role create it, and the DDL to run once instead;
 * `refused` (in _messages.ts) puts the lock name and the server in front.
 */
export class CreateRefused extends Error {
  /** The advice in parts, for a caller that lays it out (the CLI). */
  readonly advice: SetupAdvice;
  /** Creates the error; `cause` is the server's error. */
  constructor(advice: SetupAdvice, options: ErrorOptions) {
    super(adviceText(advice), options);
    this.name = "CreateRefused";
    this.advice = advice;
  }
}

/**
 * What the server refused to create, and the two ways out, in parts: the
 * library's message joins them (adviceText); the CLI prints each part on
 * lines of its own, quoting for the terminal only what came from outside
 * (the lock name, the server's words), so that the SQL pastes into psql.
 */
export interface SetupAdvice {
  /** What runlock was creating: `runlock's table "s".runlock_locks`. */
  what: string;
  /** The server's message (its words, in its language). */
  serverMessage: string;
  /** The role the session runs as (its current_user). */
  role: string;
  /** Who may run the SQL: `the schema's owner or a superuser`. */
  owner: string;
  /** The grant that lets `role` create it on first use. */
  grant: string;
  /** ` --schema=NAME` for `runlock db-setup`, or "" for public. */
  schemaArgument: string;
  /** The DDL and grants to run once instead, as lines. */
  sql: string[];
}

/**
 * The symbol under which a RunlockError that {@linkcode refused} made of a
 * CreateRefused keeps its {@linkcode SetupAdvice} (not enumerable): the
 * CLI reads it to print the SQL as lines. Symbol.for, so that it is one
 * symbol in every copy of the module (ESM and CommonJS builds).
 */
export const SETUP_ADVICE: unique symbol = Symbol.for(
  "runlock.postgres.setupAdvice",
) as never;

/**
 * Creates `schema` (if missing) and its `runlock_locks` table, if missing.
 * `timeout` (ms) bounds each short statement.
 *
 * @throws {CreateRefused} the role may not create them (42501).
 */
export async function createTable(
  session: Session,
  sql: Statements,
  schema: string,
  timeout: number,
): Promise<void> {
  const rows = await session.query(sql.tableState, [
    quoteIdent(schema),
    sql.table,
  ], timeout);
  if (rows[0].table === true) return;
  const schemaExists = rows[0].schema === true;
  try {
    // DDL may wait for a concurrent creator's transaction: more time.
    // A pinned session (_bind.ts) is in a transaction already, and must
    // stay in it: the DDL without its own BEGIN and COMMIT.
    const ddl = session.pinned
      ? (schemaExists ? sql.ensureTableIn : sql.ensureSchemaAndTableIn)
      : (schemaExists ? sql.ensureTable : sql.ensureSchemaAndTable);
    await session.query(ddl, [], 3 * timeout);
  } catch (err) {
    // A multi-statement string stops at the error, inside BEGIN (a pinned
    // session rolled back already, and begun anew).
    if (!session.pinned) await session.query("ROLLBACK").catch(() => {});
    if (sqlState(err) !== "42501") throw err;
    // insufficient_privilege: say who needs which grant. If even this
    // question fails, the server's own error is the best we have.
    const who = await session.query(sql.identity, [], timeout).catch(() =>
      undefined
    );
    if (who === undefined) throw err;
    throw new CreateRefused(
      setupAdvice(
        schema,
        schemaExists,
        String(who[0].role),
        String(who[0].database),
        (err as Error).message,
      ),
      { cause: err },
    );
  }
}

/** What runlock was creating, the grant that fixes it, and the DDL. */
function setupAdvice(
  schema: string,
  schemaExists: boolean,
  role: string,
  database: string,
  serverMessage: string,
): SetupAdvice {
  const what = schemaExists
    ? `runlock's table ${quoteIdent(schema)}.runlock_locks`
    : `the schema ${JSON.stringify(schema)} and runlock's table ${
      quoteIdent(schema)
    }.runlock_locks in it`;
  const grant = schemaExists
    ? `GRANT CREATE ON SCHEMA ${quoteIdent(schema)} TO ${quoteIdent(role)};`
    : `GRANT CREATE ON DATABASE ${quoteIdent(database)} TO ${
      quoteIdent(role)
    };`;
  const owner = schemaExists
    ? "the schema's owner or a superuser"
    : "the database's owner or a superuser";
  return {
    what,
    serverMessage,
    role,
    owner,
    grant,
    schemaArgument: schemaArgument(schema),
    sql: setupStatements(schema, role, !schemaExists).flatMap((statement) =>
      statement.split("\n")
    ),
  };
}

/** The library's message: the advice on indented lines. */
function adviceText(a: SetupAdvice): string {
  return [
    `refused to create ${a.what}, which runlock creates on first use: ` +
    `${a.serverMessage} (42501). Either let role ${
      JSON.stringify(a.role)
    } create it, once, as ${a.owner}:`,
    `  ${a.grant}`,
    `or create it once yourself (as ${a.owner}; \`runlock db-setup --db=URL` +
    `${a.schemaArgument}\` prints the same) and give the role only what it ` +
    `needs to take locks:`,
    ...a.sql.map((l) => `  ${l}`),
  ].join("\n");
}

/**
 * ` --schema=NAME` for a command line to paste into a POSIX shell (quoted
 * where the shell would split or expand it), or "" for public.
 */
export function schemaArgument(schema: string): string {
  if (schema === "public") return "";
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(schema)
    ? ` --schema=${schema}`
    : ` --schema='${schema.replaceAll("'", `'\\''`)}'`;
}

/** Options of {@linkcode pgSetupSql}. */
export interface PgSetupOptions {
  /** The schema of the table, as in `pgLocks(url, { schema })`. Default `"public"`. */
  schema?: string;
  /**
   * The role that will take locks: the SQL then also grants it what it
   * needs (USAGE on the schema; SELECT, INSERT, UPDATE on the table).
   */
  role?: string;
}

/**
 * The SQL that creates runlock's table of lock records once, for a
 * database whose lock users may not create it (since PostgreSQL 15, a
 * role that does not own schema `public` may not create in it). Run it
 * as the schema's owner or a superuser, e.g. `| psql`; it is idempotent.
 * The lock users then need only USAGE on the schema and SELECT, INSERT
 * and UPDATE on the table, which it grants to `role`. The CLI prints the
 * same: `runlock db-setup --db=URL [--schema=NAME]`.
 *
 * Otherwise {@linkcode pgLocks} creates the table (and the schema) on
 * first use, which needs CREATE on the schema (and on the database for a
 * new schema); when refused, its RunlockError names the grant and quotes
 * this SQL.
 *
 * @param options `schema` (default `"public"`) and the lock users' `role`.
 * @returns The statements, one per line group, with `--` comments.
 * @throws {TypeError} `schema` or `role` is not a name of 1 to 63 bytes
 *   in UTF-8 without control characters.
 *
 * @example The table in schema ops, for role app
 * ```ts
 * import { pgSetupSql } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const sql = pgSetupSql({ schema: "ops", role: "app" });
 * assert.match(sql, /CREATE TABLE IF NOT EXISTS "ops"\.runlock_locks/);
 * assert.match(sql, /GRANT SELECT, INSERT, UPDATE ON "ops"\.runlock_locks TO "app";/);
 * ```
 */
export function pgSetupSql(options: PgSetupOptions = {}): string {
  const action = "print runlock's setup SQL";
  const schema = checkIdentifier(options.schema ?? "public", "schema", action);
  const role = options.role === undefined
    ? undefined
    : checkIdentifier(options.role, "role", action);
  // The comments name nothing of the caller's: a name is spliced only
  // into the statements, quoted (and checked to hold no line break).
  const lines = [
    `-- runlock's table of lock records (runlock_locks), which the`,
    `-- PostgreSQL backend otherwise creates on first use. Run this once,`,
    `-- as a role that may create in the schema (its owner, or a`,
    `-- superuser); running it again changes nothing.`,
  ];
  if (schema !== "public") {
    lines.push(
      `-- The schema is created only if it is missing (which needs CREATE`,
      `-- on the database).`,
    );
  }
  lines.push(...setupStatements(schema, undefined, schema !== "public"));
  if (role === undefined) {
    lines.push(
      `-- A role that takes locks needs USAGE on the schema and SELECT,`,
      `-- INSERT, UPDATE on the table (name it to print its grants).`,
    );
  } else {
    lines.push(
      `-- What the role that takes locks needs (no CREATE, no DELETE;`,
      `-- probes need only SELECT):`,
      ...grantStatements(schema, role),
    );
  }
  return lines.join("\n") + "\n";
}
