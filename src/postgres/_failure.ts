// What a failure means: the server's SQLSTATE, a session's end, a guard's
// refusal (a statement that reached another client's server session).
import { GUARD_MARK } from "./_sql.ts";

/**
 * A PostgreSQL error's SQLSTATE, or undefined for other errors. Only an
 * error the server sent counts (node-postgres's DatabaseError, which
 * carries the report's severity): a socket's EPIPE or ECONNRESET is also
 * five capital letters.
 */
export function sqlState(err: unknown): string | undefined {
  const e = err as { code?: unknown; severity?: unknown } | null;
  const code = e?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) &&
      typeof e?.severity === "string"
    ? code
    : undefined;
}

/**
 * Whether a statement failed because it reached a server session this
 * client did not bind: its guard (see `guarded` in _sql.ts) refused it.
 */
export function isGuardError(err: unknown): boolean {
  const message = (err as { message?: unknown } | null)?.message;
  return typeof message === "string" && message.includes(GUARD_MARK);
}

/**
 * Whether an error means the session itself is gone (as opposed to one
 * statement failing): no SQLSTATE (socket errors, "Connection terminated"),
 * a FATAL/PANIC report, class 08 (connection exception) or 57P0x (the
 * server is shutting down or terminated us: admin_shutdown 57P01,
 * crash_shutdown 57P02, cannot_connect_now 57P03).
 */
export function isSessionError(err: unknown): boolean {
  const state = sqlState(err);
  const severity = (err as { severity?: unknown } | null)?.severity;
  return state === undefined || severity === "FATAL" ||
    severity === "PANIC" || state.startsWith("08") ||
    state.startsWith("57P") || isGuardError(err);
}

/** What a guard's refusal means, in a person's words. */
export const REROUTED =
  "had a statement sent to a server session this client did not open " +
  "(a pooler in transaction or statement mode, or a load balancer, between " +
  "runlock and PostgreSQL)";

/** A short description of why a session ended. */
export function describe(err: unknown): string {
  if (isGuardError(err)) return REROUTED;
  const e = err as { message?: unknown; code?: unknown } | null;
  const message = typeof e?.message === "string" ? e.message : String(err);
  return typeof e?.code === "string" && !message.includes(e.code)
    ? `${message} (${e.code})`
    : message;
}

/** Socket errors of a server, or a path to it, that is not there (yet). */
export const SOCKET_GONE = new Set(
  "ECONNREFUSED ECONNRESET EPIPE ETIMEDOUT EHOSTUNREACH ENETUNREACH".split(" "),
);

/** An error's `cause`, if it has one. */
export function causeOf(err: unknown): unknown {
  return (err as { cause?: unknown } | null)?.cause;
}

/** An error's message, or the value itself as text. */
export function messageOf(err: unknown): string {
  return String((err as { message?: unknown } | null)?.message ?? err);
}
