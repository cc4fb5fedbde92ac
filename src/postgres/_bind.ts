// Binding a new lock session to this client, and refusing a connection
// that cannot hold a session-level advisory lock.
//
// A session-level advisory lock belongs to one server session. Between
// runlock and the server there may be a pooler or a balancer that sends
// one client's statements to several server sessions, or one server
// session's statements from several clients: PgBouncer in transaction or
// statement mode, pgpool-II's load balancing, a managed proxy. There a
// lock taken by one statement is not held by the next one's session, and
// another client's statement on the holder's server session is granted
// the same lock again (advisory locks are reentrant within a session).
//
// So each lock session is bound, once, right after it connects:
// 1. it claims its server session: it sets the custom setting
//    SESSION_SETTING to a random nonce, only if no client set one there
//    before. A server session that has one already serves another runlock
//    client (a transaction pooler that kept it after that client's
//    statement; PgBouncer resets settings only at the end of a session,
//    with server_reset_query): refused.
// 2. when the connection's BackendKeyData names another process than
//    pg_backend_pid() (a pooler answered the startup, not the server),
//    a second connection asks whether it is handed the same server
//    session now that the first is idle: a transaction or statement
//    pooler does that (PgBouncer reuses the last server session first),
//    a session pooler never. If it is: refused (and the second connection
//    clears the nonce it found, so that no server session keeps it).
// 3. it sets runlock's session settings by statement, guarded by the
//    nonce, and reads pg_backend_pid() again: a different number means its
//    statements do not stay on one server session: refused.
// From then on every advisory lock function a lock session calls is
// guarded by its nonce (`guarded`, _sql.ts), and the heartbeat asks
// pg_locks whether this very server session still holds the key: a
// statement a pooler sends elsewhere fails, and can neither take, keep nor
// release a lock on another client's server session. The checks of steps
// 1-3 make the refusal come at the first acquire rather than at the first
// moment two clients meet on one server session.
import { PoolerError } from "./errors.ts";
import { GUARD_MARK, guarded, SESSION_SETTING } from "./_sql.ts";
import type { Session } from "./_session.ts";

/** A statement of binding, with its name for messages. */
const CLAIM = `WITH b AS MATERIALIZED (
    SELECT pg_catalog.current_setting('${SESSION_SETTING}', true) AS before
  ) SELECT b.before, pg_catalog.pg_backend_pid() AS backend,
    CASE WHEN COALESCE(b.before, '') OPERATOR(pg_catalog.=) ''
      THEN pg_catalog.set_config('${SESSION_SETTING}', $1, false) END AS claimed
  FROM b`;

/** Asked on a second connection: is this the first one's server session? */
const SAME = `WITH b AS MATERIALIZED (
    SELECT pg_catalog.current_setting('${SESSION_SETTING}', true)
      OPERATOR(pg_catalog.=) $1 AS same
  ) SELECT b.same,
    CASE WHEN b.same THEN pg_catalog.set_config('${SESSION_SETTING}', '', false)
    END AS cleared
  FROM b`;

/**
 * The statement that sets `names` on the bound session ($1 the nonce,
 * then one value each) and reads pg_backend_pid() again.
 */
function settingsStatement(names: string[]): string {
  const sets = names.map((name, i) =>
    `pg_catalog.set_config('${name.replaceAll("'", "''")}', $${i + 2}, false)`
  );
  return `SELECT pg_catalog.pg_backend_pid() AS backend${
    sets.map((s) => `,\n    ${s}`).join("")
  }
  FROM (SELECT ${guarded("true", "boolean", 1)} AS ok) g`;
}

/** A value as the startup "options" string wrote it, unescaped. */
function unescape(value: string): string {
  return value.replace(/\\(.)/g, "$1");
}

/** A random nonce: 128 bits in hex. */
function newNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** What binding needs. */
export interface BindContext {
  /** The lock name, for messages. */
  name: string;
  /** runlock's session settings (as the startup options write them). */
  settings: Record<string, string>;
  /** Milliseconds a short statement may take. */
  timeout: number;
  /** Opens a second session through the same URL (for step 2). */
  open(signal: AbortSignal): Promise<Session>;
}

/**
 * Binds a new lock session to this client (see the top of this file), or
 * throws a PoolerError and destroys it.
 */
export async function bind(
  session: Session,
  context: BindContext,
): Promise<void> {
  try {
    await bindOrRefuse(session, context);
  } catch (err) {
    session.destroy("was refused: it cannot hold a lock");
    throw err;
  }
}

async function bindOrRefuse(
  session: Session,
  context: BindContext,
): Promise<void> {
  const { name, timeout } = context;
  const nonce = newNonce();
  const [claim] = await session.query(
    CLAIM,
    [nonce],
    undefined,
    false,
    timeout,
  );
  const before = claim?.before;
  if (typeof before === "string" && before !== "") {
    throw new PoolerError(
      name,
      "the server session it was given is already bound to another runlock " +
        "client (so server sessions are shared between clients)",
    );
  }
  const backend = claim?.backend as number;
  if (session.backendPid !== backend) await notShared(nonce, context);
  const names = Object.keys(context.settings);
  let set: Record<string, unknown> | undefined;
  try {
    [set] = await session.query(
      settingsStatement(names),
      [nonce, ...names.map((n) => unescape(context.settings[n]))],
      undefined,
      false,
      timeout,
    );
  } catch (err) {
    if (String((err as Error)?.message).includes(GUARD_MARK)) {
      throw new PoolerError(
        name,
        "its second statement ran on another server session than its first",
        { cause: err },
      );
    }
    throw err;
  }
  if (set?.backend !== backend) {
    throw new PoolerError(
      name,
      `its statements ran on two server sessions (pg_backend_pid() ${backend}, then ${
        String(set?.backend)
      })`,
    );
  }
  session.nonce = nonce;
}

/**
 * How long step 2 may take. A transaction pooler hands the second
 * connection the first one's idle server session at once; a session
 * pooler whose pool is full makes it wait for a free one, which says
 * nothing against the first, and must not hold up the acquire.
 */
const SECOND_LOOK_MS = 1_000;

/**
 * Step 2: through a pooler, a second connection must not be handed the
 * first one's server session while the first is idle. A second connection
 * that fails, or gets no server session within SECOND_LOOK_MS, says
 * nothing against the first.
 */
async function notShared(nonce: string, context: BindContext): Promise<void> {
  let second: Session | undefined;
  let same = false;
  try {
    second = await context.open(AbortSignal.timeout(SECOND_LOOK_MS));
    const [row] = await second.query(
      SAME,
      [nonce],
      undefined,
      false,
      Math.min(context.timeout, SECOND_LOOK_MS),
    );
    same = row?.same === true;
  } catch {
    // Nothing learned.
  } finally {
    // Dropped, not closed politely: a statement still waiting for a
    // server session (a full pool) is abandoned with it.
    second?.destroy();
  }
  if (same) {
    throw new PoolerError(
      context.name,
      "a second connection was handed the first one's server session while " +
        "the first was idle (so server sessions are shared between clients)",
    );
  }
}
