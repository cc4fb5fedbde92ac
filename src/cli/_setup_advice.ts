/**
 * The PostgreSQL backend's advice for a role that may not create runlock's
 * table, laid out for a terminal: the explanation in plain lines, and the
 * SQL on lines of its own, as psql takes it when pasted (not inside the
 * `$'...'` quoting that printable() gives a whole message with line
 * breaks). Only what came from outside is made printable: the lock name,
 * the server's description and its message.
 *
 * @module
 */

import type { SetupAdvice } from "../postgres/_schema.ts";
import { printable } from "./_format.ts";
import { Said } from "./_said.ts";

/**
 * Where the backend keeps the advice's parts on its RunlockError: the
 * symbol SETUP_ADVICE of src/postgres/_schema.ts (Symbol.for, one symbol
 * in every copy of the module). Named here rather than imported, so that
 * the CLI loads the backend only when asked for it (see _backend.ts).
 */
const SETUP_ADVICE = Symbol.for("runlock.postgres.setupAdvice");

/** What refused() keeps under SETUP_ADVICE. */
interface Kept {
  /** What runlock was doing: "acquire the lock". */
  action: string;
  /** The server, as messages name it (no password). */
  server: string;
  /** The advice, in parts. */
  advice: SetupAdvice;
}

/**
 * `err` laid out as lines when it is the backend's refusal to create its
 * table (a RunlockError carrying the advice's parts), else `err` itself.
 *
 * @param err What the backend threw.
 * @param name The lock's name, as the command was given it.
 * @returns The error to throw.
 */
export function setupAdvice(err: unknown, name: string): unknown {
  const kept = (err as { [SETUP_ADVICE]?: Kept } | null)?.[SETUP_ADVICE];
  if (kept === undefined) return err;
  const a = kept.advice;
  // A SQL line holds names (the schema, the role) in SQL's own quotes. A
  // name with a character that must not reach a terminal (a role may be
  // named anything) makes that line printable(), and the line then needs
  // editing before it pastes; every other line is printed as it is.
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
