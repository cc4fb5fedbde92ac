// Creating the schema and the table of lock records on first use.
import type { Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";

/**
 * Creates `schema` (if missing) and its `runlock_locks` table, if missing.
 * `timeout` (ms) bounds each short statement.
 */
export async function createTable(
  session: Session,
  sql: Statements,
  schema: string,
  timeout: number,
): Promise<void> {
  const rows = await session.query(
    `SELECT to_regnamespace($1) IS NOT NULL AS schema, to_regclass($2) IS NOT NULL AS table`,
    [`"${schema.replaceAll('"', '""')}"`, sql.table],
    undefined,
    false,
    timeout,
  );
  if (rows[0].table === true) return;
  try {
    // DDL may wait for a concurrent creator's transaction: more time.
    await session.query(
      rows[0].schema === true ? sql.ensureTable : sql.ensureSchemaAndTable,
      [],
      undefined,
      false,
      3 * timeout,
    );
  } catch (err) {
    // A multi-statement string stops at the error, inside BEGIN.
    await session.query("ROLLBACK").catch(() => {});
    throw err;
  }
}
