// Messages that name the server (never the password) and say what to do.
import { redact } from "../_redact.ts";
import { RunlockError } from "../errors.ts";
import { ClientMissing } from "./_client.ts";
import { describe, isSessionError, messageOf, sqlState } from "./_failure.ts";
import type { Options } from "./_options.ts";
import { CreateRefused, schemaArgument, SETUP_ADVICE } from "./_schema.ts";
import type { Target } from "./_url.ts";

/** `text` with the target's secrets and any URL's password masked. */
function scrub(target: Target, text: string): string {
  return redact(text, { secrets: target.secrets, as: "message" });
}

/**
 * The error's message and SQLSTATE, then the server's DETAIL and HINT (often
 * the fix), on one line.
 */
function serverSaid(err: unknown): string {
  const e = err as { detail?: unknown; hint?: unknown } | null;
  const line = (v: unknown) =>
    typeof v === "string" ? v.trim().replace(/\s*\n\s*/g, " ") : "";
  const detail = line(e?.detail);
  const hint = line(e?.hint);
  return `${describe(err)}${detail ? `; detail: ${detail}` : ""}${
    hint ? `; hint: ${hint}` : ""
  }`;
}

/**
 * A RunlockError for a statement the server refused, saying what to do
 * where the cause is a setting or a privilege of the server's. `schema`
 * goes into the `runlock db-setup` command it suggests.
 */
export function refused(
  target: Target,
  name: string,
  action: string,
  err: unknown,
  schema: string,
): RunlockError {
  if (err instanceof RunlockError) return err;
  if (err instanceof CreateRefused) {
    // In parts too, for the CLI, each part scrubbed.
    const error = new RunlockError(
      name,
      scrub(
        target,
        `${name}: cannot ${action}: PostgreSQL at ${target.text} ${err.message}`,
      ),
      { cause: err.cause },
    );
    const a = err.advice;
    Object.defineProperty(error, SETUP_ADVICE, {
      value: {
        action,
        server: scrub(target, target.text),
        advice: {
          ...a,
          what: scrub(target, a.what),
          serverMessage: scrub(target, a.serverMessage),
        },
      },
    });
    return error;
  }
  const how = isSessionError(err)
    ? "lost the connection to"
    : "got an error from";
  const state = sqlState(err);
  const message = describe(err);
  const said = serverSaid(err);
  const setup = `\`runlock db-setup --db=URL${schemaArgument(schema)}\``;
  const probe = /^(inspect|scan|watch)/.test(action);
  const advice = state === "25006"
    // read_only_sql_transaction: with default_transaction_read_only
    // pinned off, only a hot standby causes it.
    ? ": the server accepts no writes, as a hot standby (a replica in recovery) does; " +
      "runlock writes a record with each lock, and an advisory lock taken on a standby " +
      "excludes no one on the primary: point the URL at the primary"
    : state === "42501" && /row-level security|row security/i.test(message)
    // Row-level security has no SQLSTATE of its own: the message is the
    // only tell, and in another language the advice below says so too.
    ? ": a row-level security policy on runlock's table refused it, not a missing grant; " +
      "runlock's records must all be visible and writable to every lock user (a hidden " +
      "record reads as a free lock): disable row-level security on runlock_locks, or " +
      "exempt these roles from it"
    : state === "42501"
    // Privileges are checked for current_user, which ALTER ROLE ... SET
    // role makes another than the URL's user; the advice says so rather
    // than ask a session that just failed.
    ? `: ${
      probe
        ? "probes (inspect, held, activePid, scan, watch) need USAGE on the schema and SELECT on its runlock_locks table, nothing more"
        : "the role needs USAGE on the schema and SELECT, INSERT and UPDATE on its runlock_locks table"
    } (${setup} prints the grants), granted to the role the session runs as: ` +
      "its current_user, another role than the URL's user when that user has " +
      "ALTER ROLE ... SET role; or, if the server's message names a row-level " +
      "security policy, that policy refused it"
    : "";
  return new RunlockError(
    name,
    scrub(
      target,
      `${name}: cannot ${action}: ${how} PostgreSQL at ${target.text}: ${said}${advice}`,
    ),
    { cause: err },
  );
}

/**
 * A RunlockError for a connection that failed, saying why in words;
 * `purpose` is named when the server is full.
 */
export function connectError(
  target: Target,
  options: Options,
  name: string,
  err: unknown,
  purpose: "lock" | "probe" | "watch" = "lock",
): RunlockError {
  if (err instanceof ClientMissing) {
    // Its cause (a registry's error) may name a URL.
    const why = messageOf(err.cause).split("\n")[0];
    return new RunlockError(
      name,
      `${name}: ${err.message.replace(why, scrub(target, why))}`,
      { cause: err },
    );
  }
  // Never decided on the server's message, which may name anything (a
  // role called timeout_svc) in any language: on codes and the client's
  // own fixed texts.
  const code = (err as { code?: unknown } | null)?.code;
  const state = sqlState(err);
  const message = describe(err);
  const said = serverSaid(err);
  const own = state === undefined
    ? String((err as { message?: unknown } | null)?.message ?? "")
    : "";
  const reason = code === "ECONNREFUSED"
    ? "connection refused (is the server running, and listening there?)"
    : code === "ENOTFOUND" || code === "EAI_AGAIN"
    ? "the host name does not resolve"
    // connectionTimeoutMillis: pg 8.23's text, and other releases'.
    : state === undefined &&
        /^timeout expired$|due to connection timeout/.test(own)
    ? `no answer within ${options.connectTimeout} ms`
    // The server answered "N" to the client's SSLRequest.
    : state === undefined &&
        own === "The server does not support SSL connections"
    ? `the server does not accept SSL (TLS) connections, which ${
      target.tls || "the client's settings"
    } asks for${
      /^(sslmode|PGSSLMODE)=prefer\b/.test(target.tls)
        ? " (node-postgres reads prefer as require, with no fallback)"
        : ""
    }: use sslmode=disable for a server without TLS, or enable ssl on the server`
    : state === "28P01"
    ? "password authentication failed (check the password in the URL)"
    // PostgreSQL 13 and older lack idle_session_timeout (the name is
    // quoted alike in any language).
    : state === "42704" && message.includes('"idle_session_timeout"')
    ? `the server is older than PostgreSQL 14, which runlock needs (${said})`
    : state === "53300"
    ? `the server has no free connection (${said}): max_connections, or a ` +
      `CONNECTION LIMIT of the role or the database, is reached; ${
        purpose === "probe"
          ? "inspect needs a session of its own (one per pgLocks object, kept for later probes and scans)"
          : purpose === "watch"
          ? "each watch needs a session of its own, for as long as it runs"
          : "each held lock needs a session of its own, for as long as it is held"
      }. Release locks or close other sessions, or raise the limit`
    : (state === undefined || state === "08P01") &&
        /unsupported startup parameter/i.test(message)
    // PgBouncer's refusal of the startup "options" (its English text).
    ? `${said}: a connection pooler refused the session settings runlock ` +
      `sends at startup (options: -c ...); connect to the server itself (a ` +
      `lock is a session, which a pooler cannot promise)`
    : said;
  return new RunlockError(
    name,
    scrub(
      target,
      `${name}: cannot connect to PostgreSQL at ${target.text}: ${reason}`,
    ),
    { cause: err },
  );
}
