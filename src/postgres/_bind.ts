// Binding a new lock session to this client, or refusing a connection that
// cannot hold a session-level advisory lock (docs/postgres.md, "Poolers,
// proxies and failover"). A pooler or balancer that moves statements
// between server sessions breaks such a lock: another client's statement
// on the holder's server session is granted it again (it is reentrant).
//
// Steps, once, right after connecting:
// 1. read pg_backend_pid(). If BackendKeyData names another process, a
//    pooler answered the startup, and:
//    a. a second connection, while the first is idle, must not get the
//       same server session (a transaction or statement pooler hands it
//       over, PgBouncer last-used first; a session pooler never);
//    b. the session opens a transaction and stays in one for life
//       (`Session.pinned`): no pooler hands a server session in a
//       transaction to another client, and each drops (or resets) one its
//       client left in a transaction, with what it held.
// 2. claim the server session: set SESSION_SETTING to a random nonce, and
//    the session settings, only if nobody claimed it, and read
//    pg_backend_pid() again: a prior claim or a changed pid is refused.
//    Through a pooler the claim is inside 1b's transaction, so a client
//    that dies before committing it leaves none.
// 1a may pass by chance under load; 1b keeps the lock safe all the same,
// and `guarded` (_sql.ts) and the heartbeat make a statement that reaches
// another server session fail rather than act there.
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
  const [first] = await session.query(BACKEND, [], timeout);
  const backend = first?.backend as number;
  if (session.backendPid !== backend) {
    await notShared(backend, context);
    try {
      await session.query("BEGIN", [], timeout);
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
  const [claim] = await session.query(claimStatement(names), [
    nonce,
    ...names.map((n) => unescape(context.settings[n])),
  ], timeout);
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
 * How long step 1a may take: a transaction pooler answers at once, while a
 * full session pooler makes it wait, which says nothing against the first.
 */
const SECOND_LOOK_MS = 1_000;

/**
 * Step 1a: a second connection must not get the first one's idle server
 * session (`backend`); one that fails or times out says nothing.
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
      Math.min(context.timeout, SECOND_LOOK_MS),
    );
    same = row?.backend === backend;
  } catch {
    /* nothing learned */
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
