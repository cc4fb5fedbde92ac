/**
 * The `runlock` command: ask who holds a lock, guard a command with it, wait
 * for it, or list every lock in a directory, from a shell or cron, with the
 * same lock the library uses: a lock file, or a PostgreSQL lock with `--db`.
 *
 * ```sh
 * runlock status .state/run.lock            # exit 0 held, 1 free or stale, 2 invalid/error
 * runlock run .state/run.lock -- ./sync.sh  # exit 75 if another run holds it
 * runlock wait --timeout=60 .state/run.lock # exit 0 once free, 1 on timeout
 * runlock ls --recursive .state             # one line per lock: state, pid, host, age, cmd, path
 * runlock ls --watch .state                 # live: each run's start, release, crash, takeover
 * runlock run --db=postgres://app@db/app sync/main -- ./sync.sh   # the lock on PostgreSQL
 * runlock db-setup --db=postgres://app@db/app | psql postgres://owner@db/app  # the table, once
 * ```
 *
 * Built on the public API only; the PostgreSQL backend is imported only
 * when `--db` (or `RUNLOCK_DATABASE_URL`) asks for it. Deno, from a clone:
 * `deno run --allow-read=.state --allow-write=.state --allow-sys=hostname
 * src/cli.ts ...`, plus `--allow-run --allow-env` for `run` (it starts the
 * command with runlock's environment); `status`, `wait` and `ls` need only
 * `--allow-read`. With `--db`: `--allow-net=HOST:PORT --allow-env`, and
 * `--allow-sys=hostname` to record and compare the host; no `--allow-read`
 * or `--allow-write`. `RUNLOCK_DATABASE_URL` is read only when Deno grants
 * `--allow-env` for it. npm: the `runlock` bin, and
 * `import { main } from "runlock/cli"`.
 *
 * @module
 */

import { process } from "./_process.ts";
import { redact } from "./_redact.ts";
import { EX_USAGE, HelpWanted, UsageError } from "./cli/_args.ts";
import {
  type Command,
  commandHelp,
  commandUsage,
  help,
  usage,
} from "./cli/_help.ts";
import { type CliIo, stdio } from "./cli/_io.ts";
import { dbSetupCommand } from "./cli/db_setup.ts";
import { lsCommand } from "./cli/ls.ts";
import { runCommand } from "./cli/run.ts";
import { statusCommand } from "./cli/status.ts";
import { nearest } from "./cli/_suggest.ts";
import { waitCommand } from "./cli/wait.ts";
import { VERSION } from "./version.ts";

export type { CliIo } from "./cli/_io.ts";

/** Every command, in the order the usage and --help list them. */
const COMMANDS: readonly Command[] = [
  statusCommand,
  runCommand,
  waitCommand,
  lsCommand,
  dbSetupCommand,
];

/**
 * Runs the `runlock` command line and returns its exit code.
 *
 * @param args The arguments after the program name.
 * @param io Where output goes (defaults to stdout and stderr, with the
 * waiting line when stderr is a terminal).
 * @returns The exit code.
 *
 * @example Asking for the status of a lock nobody holds
 * ```ts
 * import { main } from "@runlock/runlock/cli";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const lines: string[] = [];
 * const io = { out: (t: string) => lines.push(t), err: (t: string) => lines.push(t) };
 * assert.equal(await main(["status", `${dir}/run.lock`], io), 1);
 * assert.deepEqual(lines, ["free"]);
 * ```
 *
 * @example Listing the locks of a directory, one line each
 * ```ts
 * import { main } from "@runlock/runlock/cli";
 * import { acquire } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * await using _lock = await acquire(`${dir}/sync.lock`, { meta: { cmd: "./sync.sh --full" } });
 * const lines: string[] = [];
 * const io = { out: (t: string) => lines.push(t), err: (t: string) => lines.push(t) };
 * assert.equal(await main(["ls", dir], io), 0);
 * assert.equal(lines.length, 1);
 * assert.match(lines[0], new RegExp(`^held  ${Deno.pid}  .*  \\./sync\\.sh --full  ${dir}/sync\\.lock$`));
 * ```
 */
export async function main(args: string[], io: CliIo = stdio): Promise<number> {
  const [command, ...rest] = args;
  const found = COMMANDS.find((c) => c.name === command);
  try {
    if (found) return await found.run(rest, io);
    switch (command) {
      case "--help":
      case "-h":
      case "help": {
        // `help run` is `run --help`; `help nosuch` is a usage error.
        const about = COMMANDS.find((c) => c.name === rest[0]);
        if (command === "help" && rest[0] !== undefined && !about) {
          throw unknownCommand(rest[0]);
        }
        io.out(about ? commandHelp(about) : help(COMMANDS));
        return 0;
      }
      case "--version":
      case "-V":
        io.out(`runlock ${VERSION}`);
        return 0;
      case undefined:
        throw new UsageError("missing command");
      default:
        if (command.startsWith("-")) {
          // `runlock --db=URL status k`: named without its value, which
          // may hold a password.
          const option = redact(command.split("=")[0]);
          const later = rest.find((a) => COMMANDS.some((c) => c.name === a));
          const written = command.includes("=") ? `${option}=...` : option;
          throw new UsageError(
            `'${option}' is an option: write it after the command` +
              (later ? `, as in 'runlock ${later} ${written} ...'` : ""),
          );
        }
        throw unknownCommand(command);
    }
  } catch (err) {
    if (err instanceof HelpWanted && found) {
      io.out(commandHelp(found));
      return 0;
    }
    if (err instanceof UsageError) {
      io.err(
        `runlock: ${err.message}\n${
          found ? commandUsage(found) : usage(COMMANDS)
        }`,
      );
      return EX_USAGE;
    }
    io.err(`runlock: ${err instanceof Error ? err.message : String(err)}`);
    return 2;
  }
}

/** The usage error of a word that is no command, redacted (a URL). */
function unknownCommand(word: string): UsageError {
  const meant = nearest(word, COMMANDS.map((c) => c.name));
  return new UsageError(
    `unknown command '${redact(word)}'` +
      (meant ? `; did you mean '${meant}'?` : ""),
  );
}

if (import.meta.main) {
  // Not a top-level await: the npm package also ships this module as
  // CommonJS (`require("runlock/cli")`), which has none.
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
