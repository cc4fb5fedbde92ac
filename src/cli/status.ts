/**
 * `runlock status`: who holds a lock and what it runs, or "free", or
 * "stale"; exit 0 when held.
 *
 * @module
 */

import { onePath, parse } from "./_args.ts";
import { backend } from "./_backend.ts";
import {
  describeState,
  pidWarning,
  printable,
  printableErrors,
  toJson,
} from "./_format.ts";
import type { Command } from "./_help.ts";
import type { CliIo } from "./_io.ts";
import { databaseUrl, DB_HELP, DB_OPTIONS } from "./_postgres.ts";

async function status(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(
    args,
    { json: "flag", ...DB_OPTIONS },
    "status",
  );
  const name = onePath(rest, "status");
  const locks = await backend(databaseUrl(options));
  try {
    locks.check(name);
    const info = await locks.inspect(name);
    if (options.has("json")) {
      io.out(JSON.stringify(toJson(info)));
    } else if (info.state === "invalid") {
      io.err(`runlock: ${describeState(info)}`);
    } else {
      io.out(describeState(info));
      if (info.state !== "free") {
        for (const [key, value] of Object.entries(info.meta).sort()) {
          if (key !== "cmd") io.out(`  ${printable(key)}=${printable(value)}`);
        }
      }
      const warning = pidWarning(info);
      if (warning) io.err(`runlock: ${warning}`);
    }
    return info.state === "held" ? 0 : info.state === "invalid" ? 2 : 1;
  } finally {
    await locks.end();
  }
}

export const statusCommand: Command = {
  name: "status",
  usage: "runlock status [--json] [--db=URL [--schema=NAME]] [--] <path|name>",
  help: `Print who holds the lock and what it runs:
  held by pid 4242 on build-7 since 09:52:11 (3m ago): ./sync.sh
then one "  KEY=VALUE" line per other --meta field; or "free", or
"stale: last holder pid N is gone". Warns on stderr when the live
holder's pid does not mean the same process here (in another PID
namespace, another kernel boot, on another host): do not kill it
from here.
Exit 0 when a live run holds it, 1 when free or stale, 2 when the
file is invalid or on error. --json prints the inspect() result
(with meta, bootId, pidNamespace, pidValidHere, pidElsewhere, and
child: the pid of the command runlock run handed the lock to).
${DB_HELP}`,
  run: printableErrors(status),
};
