/**
 * `runlock db-setup`: the SQL that creates the PostgreSQL backend's table
 * once, with the grants the URL's role needs.
 *
 * @module
 */

import { process } from "../_process.ts";
import { redact } from "../_redact.ts";
import { parse, UsageError } from "./_args.ts";
import type { Command } from "./_help.ts";
import type { CliIo } from "./_io.ts";
import { envValue } from "../platform/runtime.ts";
import {
  databaseUrl,
  DB_OPTIONS,
  postgres,
  SCHEMA_VARIABLE,
} from "./_postgres.ts";

async function dbSetup(args: string[], io: CliIo): Promise<number> {
  const { options, rest } = parse(args, DB_OPTIONS);
  if (rest.length > 0) {
    throw new UsageError(
      `db-setup: unexpected argument '${redact(rest[0])}'`,
    );
  }
  // The schema, read here without a URL too: the URL only names the role.
  const given = options.get("schema");
  options.delete("schema");
  const schema = typeof given === "string"
    ? given
    : envValue(SCHEMA_VARIABLE) || undefined;
  const url = databaseUrl(options);
  let role: string | undefined;
  if (url !== undefined) {
    let user = "";
    try {
      // The role as node-postgres works it out: `?user=`, the URL's user,
      // PGUSER, then the login name; an empty host is allowed.
      let u: URL;
      try {
        u = new URL(url.text);
      } catch {
        u = new URL(url.text.replace("@/", "@___DUMMY___/"));
      }
      if (u.protocol !== "postgres:" && u.protocol !== "postgresql:") {
        throw new TypeError("not postgres://");
      }
      user = u.searchParams.get("user") || decodeURIComponent(u.username) ||
        envValue("PGUSER") ||
        envValue(process.platform === "win32" ? "USERNAME" : "USER") || "";
    } catch {
      throw new UsageError(
        `${url.from}: needs a postgres://USER@HOST/DATABASE URL`,
      );
    }
    role = user === "" ? undefined : user;
  }
  const pg = await postgres();
  let sql: string;
  try {
    sql = pg.pgSetupSql({ schema, role });
  } catch (err) {
    const message = (err as Error).message;
    throw new UsageError(
      `db-setup: ${
        typeof given === "string"
          ? message
          : message.replace("'schema'", SCHEMA_VARIABLE)
      }`,
    );
  }
  io.out(sql.trimEnd());
  return 0;
}

export const dbSetupCommand: Command = {
  name: "db-setup",
  usage: "runlock db-setup [--db=URL] [--schema=NAME]",
  help: `Print the SQL that creates the PostgreSQL backend's table
(NAME.runlock_locks, default schema public) once, and grants the
role of --db's URL what it needs to take locks (USAGE on the
schema; SELECT, INSERT, UPDATE on the table). For a role that may
not create the table on first use: run the SQL as the schema's
owner, e.g. runlock db-setup --db=URL | psql OWNER_URL. Connects
to nothing. Exit 0. The schema is --schema=NAME, else the variable
RUNLOCK_DATABASE_SCHEMA, which run, status, wait and ls read too:
give them the same --schema=NAME (or set the variable for all).`,
  run: dbSetup,
};
