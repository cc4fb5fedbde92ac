// Creating the schema and the table of lock records on first use; and,
// for a role that may not create them, the error that says which grant or
// which DDL (run once by someone who may) fixes it.
import { type Session, sqlState } from "./_session.ts";
import {
  grantStatements,
  quoteIdent,
  setupStatements,
  type Statements,
} from "./_sql.ts";

/**
 * The server refused to create the schema or the table for lack of a
 * privilege (42501). Its message says what runlock was creating, the
 * grant that lets the role create it, and the DDL to run once instead;
 * `refused` (in _options.ts) puts the lock name and the server in front.
 */
export class CreateRefused extends Error {
  /** Creates the error; `cause` is the server's error. */
  constructor(message: string, options: ErrorOptions) {
    super(message, options);
    this.name = "CreateRefused";
  }
}

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
  const rows = await session.query(
    sql.tableState,
    [quoteIdent(schema), sql.table],
    undefined,
    false,
    timeout,
  );
  if (rows[0].table === true) return;
  const schemaExists = rows[0].schema === true;
  try {
    // DDL may wait for a concurrent creator's transaction: more time.
    await session.query(
      schemaExists ? sql.ensureTable : sql.ensureSchemaAndTable,
      [],
      undefined,
      false,
      3 * timeout,
    );
  } catch (err) {
    // A multi-statement string stops at the error, inside BEGIN.
    await session.query("ROLLBACK").catch(() => {});
    if (sqlState(err) !== "42501") throw err;
    // insufficient_privilege: say who needs which grant. If even this
    // question fails, the server's own error is the best we have.
    const who = await session.query(
      sql.identity,
      [],
      undefined,
      false,
      timeout,
    ).catch(() => undefined);
    if (who === undefined) throw err;
    throw new CreateRefused(
      createAdvice(
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
function createAdvice(
  schema: string,
  schemaExists: boolean,
  role: string,
  database: string,
  serverMessage: string,
): string {
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
  const ddl = setupStatements(schema, role, !schemaExists);
  return [
    `refused to create ${what}, which runlock creates on first use: ` +
    `${serverMessage} (42501). Either let role ${
      JSON.stringify(role)
    } create it, once, as ${owner}:`,
    `  ${grant}`,
    `or create it once yourself (as ${owner}; \`runlock db-setup --db=URL` +
    `${
      schema === "public" ? "" : ` --schema=${schema}`
    }\` prints the same) and give the role only what it needs to take locks:`,
    ...ddl.flatMap((statement) => statement.split("\n")).map((l) => `  ${l}`),
  ].join("\n");
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
 * @throws {TypeError} `schema` or `role` is not a name of 1 to 63 characters.
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
  const name = (value: unknown, what: string, fallback?: string) => {
    const v = value ?? fallback;
    if (v === undefined) return undefined;
    if (
      typeof v !== "string" || v === "" || v.length > 63 || v.includes("\0")
    ) {
      throw new TypeError(
        `Cannot print runlock's setup SQL as '${what}' must be a name of 1 to 63 characters: current value is ${
          JSON.stringify(v)
        }`,
      );
    }
    return v;
  };
  const schema = name(options.schema, "schema", "public")!;
  const role = name(options.role, "role");
  const table = `${quoteIdent(schema)}.runlock_locks`;
  const lines = [
    `-- runlock's table of lock records, ${table}, which the PostgreSQL`,
    `-- backend otherwise creates on first use. Run this once, as a role`,
    `-- that may create in the schema (its owner, or a superuser);`,
    `-- running it again changes nothing.`,
  ];
  if (schema !== "public") {
    lines.push(
      `-- CREATE SCHEMA needs CREATE on the database: leave it out if the`,
      `-- schema exists.`,
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
      `-- What role ${JSON.stringify(role)} needs to take locks (no CREATE,`,
      `-- no DELETE; probes need only SELECT):`,
      ...grantStatements(schema, role),
    );
  }
  return lines.join("\n") + "\n";
}
