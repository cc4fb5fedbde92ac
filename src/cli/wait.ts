/**
 * `runlock wait`: waits until no live run holds a lock; exit 1 on timeout.
 *
 * @module
 */

import { onePath, parse, seconds } from "./_args.ts";
import { backend } from "./_backend.ts";
import { describeState, printable, printableErrors } from "./_format.ts";
import type { Command } from "./_help.ts";
import { type CliIo, Progress } from "./_io.ts";
import { databaseUrl, DB_HELP, DB_OPTIONS } from "./_postgres.ts";

async function wait(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(
    args,
    { timeout: "value", ...DB_OPTIONS },
    "wait",
  );
  const timeout = seconds("timeout", options.get("timeout"));
  const name = onePath(rest, "wait");
  const locks = await backend(databaseUrl(options));
  const progress = new Progress(io);
  try {
    locks.check(name);
    const deadline = timeout === undefined
      ? Infinity
      : Date.now() + timeout * 1000;
    for (let interval = 5;; interval = Math.min(interval * 2, locks.poll)) {
      const info = await locks.inspect(name);
      if (info.state === "invalid") {
        throw new Error(`${name}: ${info.reason}`);
      }
      if (info.state !== "held") return 0;
      progress.update(info);
      const left = deadline - Date.now();
      if (left <= 0) {
        progress.done();
        io.err(
          `runlock: timed out after ${timeout}s: ${printable(name)} is still ${
            describeState(info)
          }`,
        );
        return 1;
      }
      await new Promise((resolve) =>
        setTimeout(resolve, Math.min(interval, left))
      );
    }
  } finally {
    progress.done();
    await locks.end();
  }
}

export const waitCommand: Command = {
  name: "wait",
  usage:
    "runlock wait [--timeout=SECONDS] [--db=URL [--schema=NAME]] [--] <path|name>",
  help: `Wait until no live run holds the lock. Exit 0 then, 1 on timeout
(saying on stderr who still holds it).
${DB_HELP}`,
  run: printableErrors(wait),
};
