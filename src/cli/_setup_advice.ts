/**
 * The PostgreSQL backend's advice for a role that may not create runlock's
 * table, laid out for a terminal: the SQL on lines of its own, as psql
 * takes it when pasted, not inside the `$'...'` that printable() would
 * give the whole message.
 *
 * @module
 */

import type { SetupAdvice } from "../postgres/_schema.ts";
import { printable, Said } from "./_format.ts";

/**
 * SETUP_ADVICE of src/postgres/_schema.ts (Symbol.for): named, not
 * imported, so that the CLI loads the backend only when asked for it.
 */
const SETUP_ADVICE = Symbol.for("runlock.postgres.setupAdvice");

/** What refused() keeps under SETUP_ADVICE. */
interface Kept {
  /** What runlock was doing: "acquire the lock". */
  action: string;
  /** The server, without password. */
  server: string;
  advice: SetupAdvice;
}

/** `err` laid out when it is the backend's refusal to create its table. */
export function setupAdvice(err: unknown, name: string): unknown {
  const kept = (err as { [SETUP_ADVICE]?: Kept } | null)?.[SETUP_ADVICE];
  if (kept === undefined) return err;
  const a = kept.advice;
  // A name that must not reach a terminal (a role may be named anything)
  // makes its SQL line printable(), to be edited before it pastes.
  const sql = (line: string) => `  ${printable(line)}`;
  return new Said([
    `${printable(name)}: cannot ${kept.action}:`,
    `PostgreSQL at ${printable(kept.server)}`,
    `refused to create ${printable(a.what)},`,
    `which runlock creates on first use: ${
      printable(a.serverMessage)
    } (42501).`,
    `Either let role ${
      printable(JSON.stringify(a.role))
    } create it, once, as ${a.owner}:`,
    "",
    sql(a.grant),
    "",
    `or create it once yourself, as ${a.owner},`,
    `and give the role only what it needs to take locks, as`,
    `  runlock db-setup --db=URL${printable(a.schemaArgument)}`,
    `also prints:`,
    "",
    ...a.sql.map(sql),
  ], { cause: err });
}
