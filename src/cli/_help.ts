/**
 * The usage and `--help` texts, from what each {@linkcode Command} says.
 *
 * @module
 */

import { VERSION } from "../version.ts";
import type { CliIo } from "./_io.ts";

/** One `runlock` command: its name, how it is written, what it does. */
export interface Command {
  /** The word after `runlock`. */
  name: string;
  /**
   * How it is written, from "runlock": one line, or more whose
   * continuations are indented under the command's options.
   */
  usage: string;
  /** What it does, for `--help`: lines without indentation. */
  help: string;
  /** Runs it with the words after its name; returns the exit code. */
  run(args: string[], io: CliIo): Promise<number>;
}

/** Every line of `text` but blank ones indented, the first by `first`. */
function indent(text: string, first: string, rest = first): string {
  return text.split("\n").map((line, i) =>
    line === "" ? "" : (i === 0 ? first : rest) + line
  ).join("\n");
}

/** The usage lines of `commands`, indented under "usage:". */
function usageOf(...commands: readonly Command[]): string {
  return `usage:\n${commands.map((c) => indent(c.usage, "  ")).join("\n")}`;
}

/** The usage of every command, as a usage error outside one prints it. */
export function usage(commands: readonly Command[]): string {
  return `${usageOf(...commands)}\n  runlock --help | --version`;
}

/** The usage of one command, as a usage error in it prints it. */
export function commandUsage(c: Command): string {
  return `${
    usageOf(c)
  }\n  runlock ${c.name} --help: what it does and its options`;
}

/** `runlock COMMAND --help`. */
export function commandHelp(c: Command): string {
  return `${
    usageOf(c)
  }\n\n${c.help}\n\nrunlock --help: every command, the PostgreSQL form (--db=URL), exit codes.`;
}

/** `runlock --help`. */
export function help(commands: readonly Command[]): string {
  const described = commands.map((c) =>
    indent(c.help, `  ${c.name.padEnd(8)} `, " ".repeat(11))
  ).join("\n");
  return `runlock ${VERSION}: one run at a time per lock file, and everyone can see who.

${usage(commands)}

commands:
${described}

  On a terminal, run --wait and wait keep one updating line on stderr: who
  holds the lock, what it runs, and how long runlock has waited. Nothing of
  that when stderr is not a terminal. ls --watch on a terminal redraws a
  table in place (on the alternate screen, given back when it ends); through
  a pipe it prints one line per change (--json: one JSON object a line).

  A lock name, path, host or command that holds a character that does
  not print (a control character such as ESC or a newline, DEL, U+202E),
  or that begins with $', is shown quoted as bash reads $'...': \\n, \\r,
  \\t, \\xHH below U+0080 (\\x1b is ESC), else \\uHHHH (\\u0085), with \\\\
  and \\' for a backslash and a quote; pasted into a shell, such a path
  names the same file. Any other text is printed as it is. --json prints
  them exact.

PostgreSQL (--db=URL, or RUNLOCK_DATABASE_URL for status, run and wait):
  the positional argument is a lock name (sync/main), held through a
  database session on postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE, for
  runs on several hosts. Same output, JSON and exit codes (status --json
  adds fence and backendPid); run holds the session while the command runs.
  The URL is never printed. ls --db=URL [<prefix>] lists the lock names
  that start with <prefix>; ls --watch --db follows them by polling
  pg_locks (every --interval=MS, 1000 by default): PostgreSQL tells nobody
  when an advisory lock is taken or dropped. ls takes --db only, not the
  variable. The table is runlock_locks in the schema --schema=NAME (or
  RUNLOCK_DATABASE_SCHEMA, which ls reads too; default public): the one
  that runlock db-setup --schema=NAME prepares. The schema is part of the
  lock: runs that name another schema never exclude each other.

exit codes: 0 ok/held, 1 free/stale/timeout, 2 usage or error, 75 held by
another run (run), 126/127 command not executable/not found; run otherwise
exits with the command's code, also after a lost lock (stderr says so).`;
}
