// The table of lock records: its name, its columns, and the DDL and grants
// a DBA runs once (runlock also creates it on first use: _schema.ts).

/** Double-quotes an identifier (`"a""b"`), for the one thing we cannot bind. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/**
 * The table's columns, for the DDL run on first use and the DDL printed
 * for a DBA (`setupSql`): one definition, so the two cannot drift.
 */
export const tableDefinition = (table: string) =>
  `CREATE TABLE IF NOT EXISTS ${table} (
        name pg_catalog.text PRIMARY KEY,
        key bigint NOT NULL UNIQUE,
        fence bigint NOT NULL,
        pid integer NOT NULL,
        host pg_catalog.text NOT NULL,
        started pg_catalog.timestamptz NOT NULL,
        runtime pg_catalog.text NOT NULL,
        meta pg_catalog.jsonb NOT NULL DEFAULT '{}',
        backend_pid integer
      )`;

/** The table `schema.runlock_locks`, quoted. */
export function tableName(schema: string): string {
  return `${quoteIdent(schema)}.runlock_locks`;
}

/** A string literal, read the same whatever standard_conforming_strings. */
function quoteLiteral(text: string): string {
  const body = `'${text.replaceAll("'", "''")}'`;
  return text.includes("\\") ? `E${body.replaceAll("\\", "\\\\")}` : body;
}

/**
 * The statements a DBA runs once so that roles without CREATE can take
 * locks, idempotent: the schema (when `withSchema`), the table, and, for
 * `role`, the grants of `grantStatements`. The schema is created only when
 * pg_namespace lacks it: `CREATE SCHEMA IF NOT EXISTS` checks CREATE on
 * the database first, which the owner of an existing schema may lack.
 */
export function setupStatements(
  schema: string,
  role: string | undefined,
  withSchema: boolean,
): string[] {
  const statements = [
    `${tableDefinition(tableName(schema)).replaceAll("\n      ", "\n")};`,
    ...(role === undefined ? [] : grantStatements(schema, role)),
  ];
  if (!withSchema) return statements;
  let tag = "$runlock$";
  while (schema.includes(tag)) tag = `${tag.slice(0, -1)}_$`;
  return [
    [
      `DO ${tag}`,
      `BEGIN`,
      `  IF NOT EXISTS (SELECT FROM pg_catalog.pg_namespace`,
      `                 WHERE nspname OPERATOR(pg_catalog.=) ${
        quoteLiteral(schema)
      }) THEN`,
      `    CREATE SCHEMA ${quoteIdent(schema)};`,
      `  END IF;`,
      `END`,
      `${tag};`,
    ].join("\n"),
    ...statements,
  ];
}

/**
 * What a role needs to take locks in a table it did not create: USAGE on
 * the schema; SELECT, INSERT and UPDATE on the table (never DELETE: rows
 * are kept, so fences never restart).
 */
export function grantStatements(schema: string, role: string): string[] {
  return [
    `GRANT USAGE ON SCHEMA ${quoteIdent(schema)} TO ${quoteIdent(role)};`,
    `GRANT SELECT, INSERT, UPDATE ON ${tableName(schema)} TO ${
      quoteIdent(role)
    };`,
  ];
}
