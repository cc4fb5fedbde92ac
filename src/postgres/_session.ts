// One PostgreSQL session (one connection, one server backend), the unit a
// lock lives in: the advisory lock belongs to the session and ends with it.
// The only file that touches the client library.
//
// Why node-postgres (`pg`) and not postgres.js (`postgres`), measured here
// on Deno, Node and Bun: a pg Client is exactly one session and never
// reconnects behind our back: after pg_terminate_backend its next query
// fails ("not queryable"), so a lost lock is seen. postgres.js silently
// ran the next query on a NEW session (a lock would vanish without a
// trace), and a reserved connection used after termination crashed the
// process with an uncatchable TypeError from a setImmediate (socket.write
// on null; porsager/postgres#1154, open). pg also reported the loss
// sooner (2-3 ms vs 8-15 ms), connected faster (about 2 ms vs 5-6 ms),
// and can unref its socket, so idle sessions never keep a process alive.
// Startup settings (`options: "-c ..."`) work in both; cancelation we do
// ourselves (CancelRequest, below). pg is bigger (14 small packages,
// ~1 MB) but is loaded only on the first connection.
import { connect as netConnect } from "node:net";
import {
  clearInterval,
  clearTimeout,
  setInterval,
  setTimeout,
} from "node:timers";
import { deadline, pause } from "./_clock.ts";
import { GUARD_MARK } from "./_sql.ts";

/** The part of node-postgres's Client that runlock uses. */
interface PgClient {
  connect(): Promise<void>;
  query(
    config: { text: string; values?: unknown[]; name?: string },
  ): Promise<{ rows: Record<string, unknown>[] }>;
  on(event: "error", listener: (err: Error) => void): void;
  on(event: "end", listener: () => void): void;
  end(): Promise<void>;
  ref(): void;
  unref(): void;
  readonly processID: number | null;
  readonly secretKey: number | null;
  readonly host: string;
  readonly port: number;
  readonly connection: { stream: { destroy(): void } };
}

type ClientClass = new (config: Record<string, unknown>) => PgClient;
let clientClass: Promise<ClientClass> | undefined;

/**
 * Loads node-postgres on the first connection, not at import: importing
 * runlock's PostgreSQL entry costs nothing until it is used, and under
 * Deno the client's import-time read of $USER happens only after the
 * permission check has turned a missing --allow-env into a clear error
 * instead of a prompt. A literal specifier, so `deno compile` and `bun
 * build --compile` still bundle it.
 */
function loadClient(): Promise<ClientClass> {
  // The full specifier, so that Deno needs no import map for it (a project
  // using runlock from a clone, a `deno install`ed CLI); the npm build
  // makes it "pg", an optional peer dependency there.
  clientClass ??= import("npm:pg@8.23.1").then(
    (m) => ((m.default ?? m) as { Client: ClientClass }).Client,
    (err) => {
      clientClass = undefined;
      throw new ClientMissing(err);
    },
  );
  return clientClass;
}

/**
 * The PostgreSQL client module could not be loaded: not installed (npm:
 * it is an optional peer dependency), or, under Deno, not downloadable
 * (no registry, `--cached-only`). Named as such, never as a connection
 * failure.
 */
export class ClientMissing extends Error {
  constructor(cause: unknown) {
    const why = (cause as { message?: unknown } | null)?.message ?? cause;
    // The specifier in two pieces: scripts/build_npm.ts rewrites quoted
    // npm: specifiers to bare names.
    const how = "Deno" in globalThis
      ? `Deno downloads npm:${"pg@8.23.1"} from the npm registry on first use`
      : "install it with `npm install pg` (or `bun add pg`)";
    super(
      `runlock's PostgreSQL backend needs the client node-postgres ("pg", 8.x), ` +
        `which could not be loaded (${String(why).split("\n")[0]}); ${how}`,
      { cause },
    );
    this.name = "ClientMissing";
  }
}

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
  return /unsupported startup parameter:? *"?options/i.test(
    String((err as { message?: unknown } | null)?.message ?? err),
  );
}

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

// What keeps the process alive while a caller awaits a statement. Sockets
// stay unreferenced for their whole life (so idle sessions and held locks
// never keep a process alive); while any caller awaits something, one
// referenced timer does. A socket's ref()/unref() toggled per statement
// was slower, and under Deno 2.9 a pending read re-referenced by ref()
// was occasionally not counted, ending the program with "Top-level await
// promise never resolved" in the middle of an acquire.
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
   * runs on (a wait ran out its whole slice after an
   * abort). So while a statement is still unanswered, it sends another,
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
        await this.#sendCancel();
        if (settled) break;
        await pause(gap, given);
        gap = Math.min(2 * gap, CANCEL_GAP_MS);
      }
      await given;
    })();
    this.#tail = done;
    return done;
  }

  /**
   * Sends one CancelRequest; resolves when the server has closed its
   * connection, or after 2 s, or on an error (the server will then end
   * the statement, or not, by itself).
   */
  #sendCancel(): Promise<void> {
    const pid = this.#client.processID;
    const secret = this.#client.secretKey;
    if (pid === null || secret === null) return Promise.resolve();
    const host = this.#client.host;
    const port = this.#client.port;
    return new Promise((resolve) => {
      const socket = host.startsWith("/")
        ? netConnect(`${host}/.s.PGSQL.${port}`)
        : netConnect(port, host);
      const message = new Uint8Array(16);
      const view = new DataView(message.buffer);
      view.setInt32(0, 16);
      view.setInt32(4, 80877102); // the CancelRequest code
      view.setInt32(8, pid);
      view.setInt32(12, secret);
      const done = () => {
        clearTimeout(timer);
        socket.destroy();
        resolve();
      };
      const timer = setTimeout(done, 2_000);
      socket.once("connect", () => socket.write(message));
      socket.once("close", done);
      socket.once("error", done);
    });
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
      void this.#sendCancel();
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
