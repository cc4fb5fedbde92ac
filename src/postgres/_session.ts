// One PostgreSQL session (one connection, one server backend): the unit a
// lock lives in, and ends with. The client library is behind _client.ts.
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

/** PgBouncer's refusal of the `options` startup parameter (08P01). */
function refusesOptions(err: unknown): boolean {
  return /unsupported startup parameter:? *"?options/i.test(messageOf(err));
}

// Sockets stay unreferenced (idle sessions and held locks never keep a
// process alive); while a caller awaits a statement, one referenced timer
// does. Not ref()/unref() on the socket per statement: under Deno 2.9 that
// sometimes left a pending read uncounted ("Top-level await promise never
// resolved" mid-acquire).
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
 * pgpool-II's hint to send a statement to the primary even with
 * load_balance_mode on; one that reaches a standby anyway fails its guard.
 */
const NO_LOAD_BALANCE = "/*NO LOAD BALANCE*/ ";

/** CancelRequests one cancel() may send; the first gap doubles to the last. */
const CANCEL_SENDS = 40;
const CANCEL_FIRST_GAP_MS = 5;
const CANCEL_GAP_MS = 500;

/** One dedicated session. */
export class Session {
  readonly #client: PgClient;
  /** BackendKeyData's process id (a pooler may send its own number). */
  readonly backendPid: number;
  /** The nonce of every guarded statement (_bind.ts); "" until bound. */
  nonce = "";
  /**
   * In a transaction for life (_bind.ts, step 1b): each statement is
   * followed by COMMIT AND CHAIN (ROLLBACK AND CHAIN after a failure), so
   * the pooler never sees it outside a transaction.
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
    // Without an "error" listener, Node crashes when an idle session's
    // server goes away.
    client.on("error", (err) => this.#lose(`ended: ${describe(err)}`));
    client.on("end", () => this.#lose("was closed"));
    client.unref();
  }

  /** Connects (without `options` once a pooler refused them). */
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
      // The client parses only ISO dates. PgBouncer keeps DateStyle per
      // client; lock sessions set the other settings once bound.
      const drop = () => session.destroy();
      signal?.addEventListener("abort", drop, { once: true });
      try {
        await session.query(
          "SELECT pg_catalog.set_config('DateStyle', 'ISO', false)",
          [],
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
   * Runs one statement, keeping the process alive meanwhile; `named` ones
   * are prepared once per session. With a `timeout` (ms), no answer by
   * then (after one more event-loop turn, see `deadline`) ends the
   * session: a silent partition or a stopped backend must not hang the
   * caller until TCP gives up, minutes later.
   */
  query(
    text: string,
    values: unknown[] = [],
    timeout = 0,
    named?: string,
  ): Promise<Record<string, unknown>[]> {
    return this.#run(text, values, named, false, timeout, "statement");
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
   * A pinned session's statement, then COMMIT AND CHAIN (ROLLBACK AND
   * CHAIN after a failure). If that fails too, the session's state is
   * unknown: it is lost (the pooler then drops or resets its server
   * session, with what it held).
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
   * Runs `statement` every `interval` ms (unreferenced timers); an answer
   * later than `timeout` ms (see `deadline`), or one `check` finds wrong
   * (saying what), loses the session.
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
   * Cancels the statements given so far, and resolves (never rejects) once
   * they have settled and no CancelRequest of ours is on its way, so none
   * hits a later statement (those start only then).
   *
   * A CancelRequest (§55.2.8) that arrives on its own connection before
   * the backend begins the statement is ignored, and a wait would run out
   * its slice. So while a statement is unanswered, it is sent again after
   * 5 ms, doubling up to 500 ms (40 at most), each after the server closed
   * the last one's connection. A canceled statement rejects with 57014;
   * a wait granted just before holds the lock: callers release or close.
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
    this.#end("was closed by runlock");
    try {
      // A caller awaits this: keep the process alive until it is done.
      hold();
      await this.#client.end().finally(letGo);
    } catch { /* already gone */ }
  }

  /** Drops the connection at once (no round trip). */
  destroy(reason = "was closed by runlock"): void {
    this.#end(reason);
    this.#drop();
  }

  #end(reason: string): void {
    this.stopHeartbeat();
    this.#lost ??= reason;
    this.#onLost = undefined;
  }

  #drop(): void {
    try {
      this.#client.connection.stream.destroy();
    } catch { /* already gone */ }
  }

  #lose(what: string): void {
    if (this.#lost !== undefined) return;
    // Our own deadline: the backend may be busy, not gone (a commit
    // waiting for an absent synchronous standby holds its lock, and a
    // closed socket does not end it). Cancel it, so it answers into the
    // closed socket and ends.
    if (this.#pending > 0 && what.startsWith("did not answer")) {
      void sendCancel(this.#client);
    }
    this.#lost = what;
    this.stopHeartbeat();
    // If only our heartbeat noticed, the server may still think we hold
    // the lock: closing the socket ends the backend (or keepalive does).
    this.#drop();
    const listener = this.#onLost;
    this.#onLost = undefined;
    listener?.(what);
  }
}
