// One PostgreSQL session (one connection, one server backend), the unit a
// lock lives in: the advisory lock belongs to the session and ends with it.
// The client library itself is behind _client.ts.
import { clearInterval, setInterval } from "node:timers";
import { loadClient, type PgClient, sendCancel } from "./_client.ts";
import { deadline, pause } from "./_clock.ts";
import {
  describe,
  isGuardError,
  isSessionError,
  messageOf,
  REROUTED,
} from "./_failure.ts";

/** How to open a session. */
export interface SessionConfig {
  /** The caller's URL (never printed: it may hold a password). */
  url: string;
  /** Server settings sent in the startup packet, as `-c name=value`. */
  settings: Record<string, string>;
  /** Milliseconds before a connection attempt is abandoned. */
  connectTimeout: number;
  /**
   * Set once a server or pooler refused the startup packet's `options`
   * (PgBouncer with its default settings): sessions then open without
   * them, and lock sessions set their settings by statement (_bind.ts).
   */
  optionsRefused?: boolean;
}

/**
 * Whether a failed connection was refused for its `options` startup
 * parameter: PgBouncer, unless told to ignore it, answers
 * "unsupported startup parameter: options" (08P01).
 */
function refusesOptions(err: unknown): boolean {
  return /unsupported startup parameter:? *"?options/i.test(messageOf(err));
}

// What keeps the process alive while a caller awaits a statement. Sockets
// stay unreferenced for their whole life (so idle sessions and held locks
// never keep a process alive); while any caller awaits something, one
// referenced timer does: cheaper than a socket's ref()/unref() per
// statement, which under Deno 2.9 sometimes left a pending read uncounted
// ("Top-level await promise never resolved" in the middle of an acquire).
let busy = 0;
let keepAlive: ReturnType<typeof setInterval> | undefined;
function hold(): void {
  if (busy++ > 0) return;
  if (keepAlive === undefined) keepAlive = setInterval(() => {}, 1 << 30);
  else keepAlive.ref();
}
function letGo(): void {
  if (--busy === 0) keepAlive?.unref();
}

/**
 * Begins every statement: pgpool-II's hint never to send it to a standby
 * (with load_balance_mode on, any statement that begins with a comment
 * goes to the primary; runlock's statements also call volatile functions
 * or read system catalogs, which pgpool-II sends there too). A statement
 * that reaches a standby all the same fails its guard (_sql.ts).
 */
const NO_LOAD_BALANCE = "/*NO LOAD BALANCE*/ ";

/** CancelRequests one cancel() may send while the statement runs on. */
const CANCEL_SENDS = 40;
/** The first pause between two of them; it doubles up to CANCEL_GAP_MS. */
const CANCEL_FIRST_GAP_MS = 5;
const CANCEL_GAP_MS = 500;

/** One dedicated session. */
export class Session {
  readonly #client: PgClient;
  /**
   * The server process of this session as the connection's BackendKeyData
   * says (pg_backend_pid() on a direct connection; a pooler may send its
   * own number).
   */
  readonly backendPid: number;
  /**
   * The nonce this client set on its server session (SESSION_SETTING,
   * _sql.ts), passed to every guarded statement; "" until bound.
   */
  nonce = "";
  /**
   * Set once a lock session reached through a pooler opened the transaction
   * it stays in (_bind.ts, step 1b): each statement is then followed by
   * COMMIT AND CHAIN (ROLLBACK AND CHAIN after a failure), which ends its
   * transaction and begins the next in one statement, so that the pooler
   * never sees the session outside a transaction and never hands its
   * server session to another client.
   */
  pinned = false;
  /** Why the session ended, once it has. */
  #lost: string | undefined;
  #onLost: ((what: string) => void) | undefined;
  /** Statements run one at a time (node-postgres 9 will require it). */
  #tail: Promise<unknown> = Promise.resolve();
  /** Statements given to `query` and not settled yet. */
  #pending = 0;
  #beat: ReturnType<typeof setInterval> | undefined;

  private constructor(client: PgClient) {
    this.#client = client;
    this.backendPid = client.processID ?? 0;
    // An idle session whose server goes away emits "error" (then "end");
    // without a listener, Node would crash on the unhandled "error" event.
    client.on("error", (err) => this.#lose(`ended: ${describe(err)}`));
    client.on("end", () => this.#lose("was closed"));
    client.unref();
  }

  /**
   * Connects. The socket is unreferenced from then on: idle sessions and
   * held locks never keep the process alive, and while a caller awaits a
   * statement, the shared keep-alive timer does (see `hold`).
   */
  static async open(
    config: SessionConfig,
    signal?: AbortSignal,
  ): Promise<Session> {
    const refused = config.optionsRefused === true;
    try {
      return await Session.#open(config, refused, signal);
    } catch (err) {
      if (refused || !refusesOptions(err)) throw err;
      signal?.throwIfAborted();
      config.optionsRefused = true;
      return await Session.#open(config, true, signal);
    }
  }

  static async #open(
    config: SessionConfig,
    withoutOptions: boolean,
    signal?: AbortSignal,
  ): Promise<Session> {
    const options = withoutOptions ? undefined : Object.entries(config.settings)
      .map(([name, value]) => `-c ${name}=${value}`).join(" ");
    const Client = await loadClient();
    const client = new Client({
      connectionString: config.url,
      ...(options === undefined ? {} : { options }),
      fallback_application_name: "runlock",
      connectionTimeoutMillis: config.connectTimeout,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
    });
    let failed: Error | undefined;
    client.on("error", (err) => failed ??= err);
    const abort = () => {
      try {
        client.connection.stream.destroy();
      } catch { /* not connected yet */ }
    };
    signal?.addEventListener("abort", abort, { once: true });
    try {
      await client.connect();
    } catch (err) {
      signal?.throwIfAborted();
      throw failed ?? err;
    } finally {
      signal?.removeEventListener("abort", abort);
    }
    if (signal?.aborted) {
      client.connection.stream.destroy();
      signal.throwIfAborted();
    }
    const session = new Session(client);
    if (withoutOptions) {
      // Without the startup options, the client still needs ISO dates to
      // parse timestamps. A pooler keeps DateStyle per client (PgBouncer
      // tracks it), so this changes no other client's session; lock
      // sessions set the rest of their settings once bound (_bind.ts).
      const drop = () => session.destroy();
      signal?.addEventListener("abort", drop, { once: true });
      try {
        await session.query(
          "SELECT pg_catalog.set_config('DateStyle', 'ISO', false)",
          [],
          undefined,
          false,
          config.connectTimeout,
        );
      } catch (err) {
        session.destroy();
        signal?.throwIfAborted();
        throw err;
      } finally {
        signal?.removeEventListener("abort", drop);
      }
    }
    return session;
  }

  /** Why the session ended, or undefined while it is alive. */
  get lost(): string | undefined {
    return this.#lost;
  }

  /** Called once, with the reason, when the session ends unexpectedly. */
  set onLost(listener: ((what: string) => void) | undefined) {
    this.#onLost = listener;
  }

  /**
   * Runs one statement. `named` statements are prepared once per session
   * (Parse once, then Bind/Execute). The process is kept alive while it
   * runs, unless `background` (the heartbeat). With a `timeout` (ms), a
   * statement with no answer by then ends the session: a server that
   * stopped answering (a silent network partition, a stopped backend)
   * must not hang the caller until TCP gives up, minutes later. An
   * expired timeout first lets the event loop read what arrived (see
   * `deadline`): a process that was stopped reads the answer it got
   * meanwhile before it decides.
   */
  query(
    text: string,
    values: unknown[] = [],
    named?: string,
    background = false,
    timeout = 0,
  ): Promise<Record<string, unknown>[]> {
    return this.#run(text, values, named, background, timeout, "statement");
  }

  async #run(
    text: string,
    values: unknown[],
    named: string | undefined,
    background: boolean,
    timeout: number,
    what: "statement" | "heartbeat",
  ): Promise<Record<string, unknown>[]> {
    if (this.#lost !== undefined) {
      throw new Error(`the session ${this.#lost}`);
    }
    if (!background) hold();
    this.#pending++;
    let disarm: (() => void) | undefined;
    try {
      const run = this.#tail.then(() => {
        if (timeout > 0) {
          disarm = deadline(
            timeout,
            () => this.#lose(`did not answer a ${what} within ${timeout} ms`),
          );
        }
        const sql = NO_LOAD_BALANCE + text;
        const sent = this.#client.query(
          named ? { name: named, text: sql, values } : { text: sql, values },
        );
        return this.pinned ? this.#rechain(sent) : sent;
      });
      this.#tail = run.catch(() => {});
      return (await run).rows;
    } catch (err) {
      if (isGuardError(err)) this.#lose(REROUTED);
      else if (isSessionError(err)) this.#lose(`ended: ${describe(err)}`);
      // Our own deadline ended it: say that, not "Connection terminated".
      const lost = this.#lost as string | undefined;
      if (lost?.startsWith("did not answer")) {
        throw new Error(`the session ${lost}`, { cause: err });
      }
      throw err;
    } finally {
      disarm?.();
      this.#pending--;
      if (!background) letGo();
    }
  }

  /**
   * A pinned session's statement, then the end of its transaction and the
   * start of the next in one statement (see `pinned`): COMMIT AND CHAIN
   * after an answer, ROLLBACK AND CHAIN after a failure. Its answer comes
   * once that is done. If that statement fails too, the session's state is
   * unknown: it is lost (closing it, the pooler drops or resets the server
   * session its client left in a transaction, and whatever it held).
   */
  async #rechain(
    sent: Promise<{ rows: Record<string, unknown>[] }>,
  ): Promise<{ rows: Record<string, unknown>[] }> {
    let failure: unknown;
    let result: { rows: Record<string, unknown>[] } | undefined;
    try {
      result = await sent;
    } catch (err) {
      failure = err;
    }
    if (failure !== undefined && isSessionError(failure)) throw failure;
    try {
      await this.#client.query({
        text: `${NO_LOAD_BALANCE}${
          failure === undefined ? "COMMIT" : "ROLLBACK"
        } AND CHAIN`,
      });
    } catch (err) {
      this.#lose(`ended: its transaction could not go on (${describe(err)})`);
      throw failure ?? err;
    }
    if (failure !== undefined) throw failure;
    return result!;
  }

  /**
   * Checks the session every `interval` ms with `statement` and its
   * `values`; if an answer takes longer than `timeout` ms, or `check` finds
   * something wrong in it (and says what), the session counts as lost and
   * is closed. The timers are unreferenced. As a statement's, an expired
   * timeout first lets the event loop read what arrived (see `deadline`):
   * a holder that was stopped (SIGSTOP, Ctrl-Z, a long GC pause, a blocked
   * event loop) wakes with the deadline overdue while the answer may
   * already sit in the socket's buffer, and reads it before it decides.
   */
  startHeartbeat(
    statement: string,
    values: unknown[],
    interval: number,
    timeout: number,
    check: (rows: Record<string, unknown>[]) => string | undefined,
  ): void {
    let inFlight = false;
    this.#beat = setInterval(() => {
      if (inFlight || this.#lost !== undefined) return;
      inFlight = true;
      this.#run(statement, values, undefined, true, timeout, "heartbeat").then(
        (rows) => {
          inFlight = false;
          const wrong = check(rows);
          if (wrong !== undefined) this.#lose(wrong);
        },
        (err) =>
          this.#lose(
            isGuardError(err)
              ? REROUTED
              : `failed a heartbeat: ${describe(err)}`,
          ),
      );
    }, interval);
    this.#beat.unref();
  }

  /** Stops the heartbeat (the lock was released). */
  stopHeartbeat(): void {
    if (this.#beat !== undefined) clearInterval(this.#beat);
    this.#beat = undefined;
  }

  /**
   * Cancels the statements this session has been given so far, and holds
   * until they have settled.
   *
   * A CancelRequest (on a new connection, with the backend's pid and
   * secret key; PostgreSQL manual §55.2.8 "Canceling Requests in
   * Progress") acts only on a statement the backend is running: one that
   * arrives before the statement does (they travel on two connections) or
   * while the backend has not begun it is ignored, and the statement then
   * runs on (a wait would run out its whole slice after an abort). So while a statement is still unanswered, it sends another,
   * after 5 ms, then doubling pauses up to 500 ms (at most 40 in all), and
   * each time waits until the server has closed that connection (it closes
   * it after it has signalled the backend, or after 2 s).
   *
   * Resolves (never rejects) once every statement given before the call
   * has settled (answered, failed, or its session lost: a statement with a
   * timeout settles by then) and no CancelRequest of ours is still on its
   * way, so a late one cannot hit a later statement; statements given
   * after the call start only then. Resolves at once when no statement is
   * pending. A canceled statement rejects with SQLSTATE 57014
   * (query_canceled); the session stays usable, but a wait that was
   * granted just before the cancel took effect holds the lock: callers
   * release or close.
   */
  cancel(): Promise<void> {
    if (this.#pending === 0 || this.#lost !== undefined) {
      return Promise.resolve();
    }
    let settled = false;
    const given = this.#tail.then(() => void (settled = true));
    const done = (async () => {
      let gap = CANCEL_FIRST_GAP_MS;
      for (let i = 0; i < CANCEL_SENDS; i++) {
        if (settled || this.#lost !== undefined) break;
        await sendCancel(this.#client);
        if (settled) break;
        await pause(gap, given);
        gap = Math.min(2 * gap, CANCEL_GAP_MS);
      }
      await given;
    })();
    this.#tail = done;
    return done;
  }

  /** Closes the connection politely (Terminate message). */
  async close(): Promise<void> {
    this.stopHeartbeat();
    if (this.#lost === undefined) this.#lost = "was closed by runlock";
    this.#onLost = undefined;
    try {
      // A caller awaits this: keep the process alive until it is done.
      hold();
      await this.#client.end().finally(letGo);
    } catch { /* already gone */ }
  }

  /** Drops the connection at once (no round trip). */
  destroy(reason = "was closed by runlock"): void {
    this.stopHeartbeat();
    if (this.#lost === undefined) this.#lost = reason;
    this.#onLost = undefined;
    try {
      this.#client.connection.stream.destroy();
    } catch { /* already gone */ }
  }

  #lose(what: string): void {
    if (this.#lost !== undefined) return;
    // Our own deadline: the backend may be alive and busy, not gone (a
    // commit waiting for a synchronous standby that is not connected
    // holds the advisory lock its statement took, and a closed socket does
    // not end it while it waits). Ask it to stop, so that it answers into
    // the closed socket and ends, dropping what it holds.
    if (this.#pending > 0 && what.startsWith("did not answer")) {
      void sendCancel(this.#client);
    }
    this.#lost = what;
    this.stopHeartbeat();
    // Make the loss real: if only our heartbeat noticed, the server may
    // still think we hold the lock; closing the socket ends the backend
    // (at once if the network works, by keepalive otherwise).
    try {
      this.#client.connection.stream.destroy();
    } catch { /* already gone */ }
    const listener = this.#onLost;
    this.#onLost = undefined;
    listener?.(what);
  }
}
