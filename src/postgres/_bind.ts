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
//    client (a transaction pooler handed it on between that client's
//    statements): refused, and the server session is marked shared
//    (SHARED_SETTING), which its claimant finds at step 4.
// 2. when the connection's BackendKeyData names another process than
//    pg_backend_pid() (a pooler answered the startup, not the server),
//    a second connection asks whether it is handed a server session a
//    runlock client claimed: a transaction or statement pooler hands it
//    the first one's, now idle (PgBouncer reuses the last server session
//    first), a session pooler never (a claimed server session is in a
//    transaction, or was dropped with its client: see step 4). If it is:
//    refused (and a server session of another client's is marked shared).
// 3. it sets runlock's session settings by statement, guarded by the
//    nonce, and reads pg_backend_pid() again: a different number means its
//    statements do not stay on one server session: refused.
// 4. through a pooler, it opens a transaction on its server session (or is
//    refused), and stays in one for as long as it lives: a pooler hands no
//    server session in a transaction to another client, whatever its mode.
//    Steps 1-3 are checks a pooler may pass by chance (a transaction pooler
//    that happens to give the same server session back); step 4 makes
//    what follows safe all the same: a lock is taken, held and released
//    only inside it.
// From then on every advisory lock function a lock session calls is
// guarded by its nonce (`guarded`, _sql.ts), and the heartbeat asks
// pg_locks whether this very server session still holds the key: a
// statement a pooler sends elsewhere fails, and can neither take, keep nor
// release a lock on another client's server session. The checks of steps
// 1-3 make the refusal come at the first acquire rather than at the first
// moment two clients meet on one server session.
import { PoolerError } from "./errors.ts";
import {
  GUARD_MARK,
  guarded,
  SESSION_SETTING,
  SHARED_SETTING,
} from "./_sql.ts";
import { isGuardError, type Session } from "./_session.ts";

/**
 * Step 1: claims the server session ($1 the nonce) where no client did;
 * where one did, marks it shared instead.
 */
const CLAIM = `WITH b AS MATERIALIZED (
    SELECT pg_catalog.current_setting('${SESSION_SETTING}', true) AS before
  ) SELECT b.before, pg_catalog.pg_backend_pid() AS backend,
    CASE WHEN COALESCE(b.before, '') OPERATOR(pg_catalog.=) ''
      THEN pg_catalog.set_config('${SESSION_SETTING}', $1, false)
      ELSE pg_catalog.set_config('${SHARED_SETTING}', 'yes', false) END AS set
  FROM b`;

/**
 * Step 2, on a second connection: whether it reached the first one's
 * server session ($1 its nonce), or one another client claimed (then
 * marked shared). `same`: the nonce there, if any, is the first's.
 */
const SAME = `WITH b AS MATERIALIZED (
    SELECT pg_catalog.current_setting('${SESSION_SETTING}', true) AS nonce
  ) SELECT b.nonce OPERATOR(pg_catalog.=) $1 AS same,
    COALESCE(b.nonce, '') OPERATOR(pg_catalog.<>) '' AS claimed,
    CASE WHEN COALESCE(b.nonce, '') OPERATOR(pg_catalog.<>) ''
      AND b.nonce OPERATOR(pg_catalog.<>) $1
      THEN pg_catalog.set_config('${SHARED_SETTING}', 'yes', false) END AS set
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
  FROM (SELECT ${guarded("true", "boolean", 1)} AS ok) g WHERE g.ok`;
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
      `the server session it was given is already bound to another runlock ` +
        `client (so server sessions are shared between clients), or a role ` +
        `or database default sets ${SESSION_SETTING} (ALTER ROLE … SET), ` +
        `which a pooler that refuses startup options lets through`,
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
  if (session.backendPid !== backend) await pinTo(session, backend, context);
}

/**
 * Step 4, through a pooler: opens a transaction and checks, in it, that it
 * is the server session this client bound. A pooler never hands a server
 * session in a transaction to another client, so from then on the
 * session stays in one (every statement is followed by `COMMIT; BEGIN`,
 * see `Session.pinned`), and no other client can run anything on its
 * server session while it waits, holds or releases a lock; nor is any key
 * taken before. A BEGIN that reached another server session is a pooler
 * that moves a client's statements: refused.
 */
async function pinTo(
  session: Session,
  backend: number,
  context: BindContext,
): Promise<void> {
  const { name, timeout } = context;
  try {
    await session.query("BEGIN", [], undefined, false, timeout);
    const [row] = await session.query(
      PIN_CHECK,
      [session.nonce],
      undefined,
      false,
      timeout,
    );
    if (row?.backend !== backend) throw new Error("another server session");
    if (row?.shared === "yes") {
      throw new PoolerError(
        name,
        "another runlock client was handed its server session between its " +
          "statements (so server sessions are shared between clients)",
      );
    }
  } catch (err) {
    if (err instanceof PoolerError) throw err;
    if (session.lost !== undefined && !isGuardError(err)) throw err;
    throw new PoolerError(
      name,
      "its transaction began on another server session than its first statements ran on",
      { cause: err },
    );
  }
  session.pinned = true;
}

/** Run in step 4's transaction: pg_backend_pid(), on the bound session only. */
const PIN_CHECK = `SELECT pg_catalog.pg_backend_pid() AS backend,
    pg_catalog.current_setting('${SHARED_SETTING}', true) AS shared
  FROM (SELECT ${guarded("true", "boolean", 1)} AS ok) g WHERE g.ok`;

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
    same = row?.claimed === true;
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
      "a second connection was handed a server session a runlock client had " +
        "claimed (so server sessions are shared between clients)",
    );
  }
}
