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
// 1. it reads pg_backend_pid(). When the connection's BackendKeyData
//    names another process (a pooler answered the startup, not the
//    server), the session is pooled, and:
//    a. a second connection reads pg_backend_pid() too, while the first
//       is idle: a transaction or statement pooler hands it the first
//       one's server session (PgBouncer reuses the last one first), a
//       session pooler never. The same number: refused.
//    b. it opens a transaction, and stays in one for as long as it lives
//       (`Session.pinned`: each statement is followed by COMMIT AND CHAIN,
//       or ROLLBACK AND CHAIN after a failure, in one statement): a pooler
//       hands no server session in a transaction to another client,
//       whatever its mode, and drops (or resets) one whose client left it
//       in a transaction, with whatever that session held.
// 2. it claims its server session: it sets the custom setting
//    SESSION_SETTING to a random nonce, and runlock's session settings,
//    only if no client claimed it before; in the same statement it reads
//    pg_backend_pid() again. A server session claimed before serves
//    another runlock client, and a different number means its statements
//    do not stay on one server session: both refused. Through a pooler
//    the claim is inside step 1b's transaction: a client that dies or is
//    refused before it is committed leaves no claim behind.
// Step 1a is a check a pooler may pass by chance (under load, a
// transaction pooler may give the second connection another server
// session); step 1b makes what follows safe all the same: a lock is taken,
// held and released only inside the transaction. Every advisory lock
// function a lock session calls is also guarded by its nonce (`guarded`,
// _sql.ts), and the heartbeat asks pg_locks whether this very server
// session still holds the key: a statement that reaches another server
// session fails, and can neither take, keep nor release a lock there.
import { messageOf } from "./_failure.ts";
import type { Session } from "./_session.ts";
import { SESSION_SETTING } from "./_settings.ts";
import { PoolerError } from "./errors.ts";

/** Step 1, and 1a on the second connection. */
const BACKEND = "SELECT pg_catalog.pg_backend_pid() AS backend";

/**
 * Step 2: claims the server session ($1 the nonce) and sets `names` ($2
 * on, one value each) where no client claimed it before; reads
 * pg_backend_pid() again.
 */
function claimStatement(names: string[]): string {
  const set = (name: string, value: string) =>
    `CASE WHEN COALESCE(b.before, '') OPERATOR(pg_catalog.=) ''
      THEN pg_catalog.set_config('${
      name.replaceAll("'", "''")
    }', ${value}, false)
    END`;
  return `WITH b AS MATERIALIZED (
    SELECT pg_catalog.current_setting('${SESSION_SETTING}', true) AS before
  ) SELECT b.before, pg_catalog.pg_backend_pid() AS backend,
    ${set(SESSION_SETTING, "$1")} AS claimed${
    names.map((name, i) => `,\n    ${set(name, `$${i + 2}`)}`).join("")
  }
  FROM b`;
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
interface BindContext {
  /** The lock name, for messages. */
  name: string;
  /** runlock's session settings (as the startup options write them). */
  settings: Record<string, string>;
  /** Milliseconds a short statement may take. */
  timeout: number;
  /** Opens a second session through the same URL (for step 1a). */
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
  const [first] = await session.query(
    BACKEND,
    [],
    undefined,
    false,
    timeout,
  );
  const backend = first?.backend as number;
  if (session.backendPid !== backend) {
    await notShared(backend, context);
    try {
      await session.query("BEGIN", [], undefined, false, timeout);
    } catch (err) {
      // PgBouncer in statement mode: "transaction blocks not allowed".
      throw new PoolerError(
        name,
        `the pooler refused to open a transaction (${
          messageOf(err).split("\n")[0]
        })`,
        { cause: err },
      );
    }
    session.pinned = true;
  }
  const nonce = newNonce();
  const names = Object.keys(context.settings);
  const [claim] = await session.query(
    claimStatement(names),
    [nonce, ...names.map((n) => unescape(context.settings[n]))],
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
  if (claim?.backend !== backend) {
    throw new PoolerError(
      name,
      `its statements ran on two server sessions (pg_backend_pid() ${backend}, then ${
        String(claim?.backend)
      })`,
    );
  }
  session.nonce = nonce;
}

/**
 * How long step 1a may take. A transaction pooler hands the second
 * connection the first one's idle server session at once; a session
 * pooler whose pool is full makes it wait for a free one, which says
 * nothing against the first, and must not hold up the acquire.
 */
const SECOND_LOOK_MS = 1_000;

/**
 * Step 1a: through a pooler, a second connection must not be handed the
 * first one's server session (`backend`) while the first is idle. A
 * second connection that fails, or gets no server session within
 * SECOND_LOOK_MS, says nothing against the first. Neither changes
 * anything on the server.
 */
async function notShared(
  backend: number,
  context: BindContext,
): Promise<void> {
  let second: Session | undefined;
  let same = false;
  try {
    second = await context.open(AbortSignal.timeout(SECOND_LOOK_MS));
    const [row] = await second.query(
      BACKEND,
      [],
      undefined,
      false,
      Math.min(context.timeout, SECOND_LOOK_MS),
    );
    same = row?.backend === backend;
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
