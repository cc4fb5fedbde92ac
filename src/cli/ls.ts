/**
 * `runlock ls`: one line per lock file in a directory (or its tree).
 *
 * @module
 */

import { statSync } from "node:fs";
import { scan } from "../../mod.ts";
import { onePath, parse, UsageError } from "./_args.ts";
import { ago, type Info, pidWarning, toJson } from "./_format.ts";
import type { Command } from "./_help.ts";
import type { CliIo } from "./_io.ts";

async function ls(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, {
    json: "flag",
    recursive: "flag",
    db: "value",
  }, "ls");
  if (options.has("db")) {
    throw new UsageError(
      "ls: lists the lock files in a directory; it has no PostgreSQL form " +
        "(the records are rows of the runlock_locks table)",
    );
  }
  const dir = onePath(rest, "ls", "<dir>");
  let kind: "directory" | "other" | "missing";
  try {
    kind = statSync(dir).isDirectory() ? "directory" : "other";
  } catch (err) {
    if ((err as { code?: string }).code !== "ENOENT") throw err;
    kind = "missing";
  }
  if (kind === "other") throw new Error(`ls: ${dir} is not a directory`);
  // A directory that does not exist (yet) holds no locks: an empty answer,
  // as scan() gives, for a UI that polls it; said on stderr for a person.
  if (kind === "missing" && !options.has("json")) {
    io.err(`runlock: ls: ${dir} does not exist: no locks`);
  }
  const found: Info[] = await scan(dir, {
    recursive: options.has("recursive"),
  });
  if (options.has("json")) {
    io.out(JSON.stringify(found.map(toJson)));
    return 0;
  }
  const now = Date.now();
  const rows = found.map((info) => [
    info.state,
    info.pid === 0 ? "-" : String(info.pid),
    info.host || "-",
    info.started ? ago(now - info.started.getTime()) : "-",
    info.state === "invalid" ? info.reason ?? "-" : info.meta.cmd || "-",
    info.path,
  ]);
  const widths = rows.reduce(
    (w, row) => w.map((n, i) => Math.max(n, [...row[i]].length)),
    [0, 0, 0, 0, 0, 0],
  );
  for (const row of rows) {
    io.out(
      row.map((cell, i) =>
        i === row.length - 1
          ? cell
          : cell + " ".repeat(widths[i] - [...cell].length)
      ).join("  "),
    );
  }
  for (const info of found) {
    const warning = pidWarning(info);
    if (warning) io.err(`runlock: ${info.path}: ${warning}`);
  }
  return 0;
}

/** `runlock ls [--json] [--recursive] [--] <dir>`. */
export const lsCommand: Command = {
  name: "ls",
  usage: "runlock ls [--json] [--recursive] [--] <dir>",
  help: `One line per lock file in <dir> (any file name; --recursive: the
whole tree, no symlinks followed): state, pid, host, age, command,
path. Exit 0. --json prints an array of inspect() results.`,
  run: ls,
};
