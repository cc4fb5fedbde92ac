// Opening the sessions of one pgLocks object.
import { RunlockError } from "../errors.ts";
import { bind } from "./_bind.ts";
import { connectError, refused } from "./_messages.ts";
import type { Options } from "./_options.ts";
import { granted } from "../platform/runtime.ts";
import { Session, type SessionConfig } from "./_session.ts";
import { SESSION_SETTING, sessionSettings } from "./_settings.ts";
import type { Target } from "./_url.ts";

/** What a session is for: a lock (acquire), probes, or a watch. */
export type Purpose = "lock" | "probe" | "watch";

/** Opens the sessions of one pgLocks object. */
export class Connector {
  readonly target: Target;
  readonly options: Options;
  readonly #config: SessionConfig;
  /** runlock's own session settings, which lock sessions set once bound. */
  readonly #pinned: Record<string, string>;

  constructor(target: Target, options: Options) {
    this.target = target;
    this.options = options;
    this.#pinned = sessionSettings(options);
    this.#config = {
      url: target.connectUrl,
      connectTimeout: options.connectTimeout,
      // The URL's `options` first: runlock's win (_settings.ts).
      settings: {
        ...target.settings,
        ...this.#pinned,
        // No client's yet, whatever a role default says (_bind.ts).
        [SESSION_SETTING]: "",
      },
    };
  }

  /** A new session for `purpose`; `signal` abandons connecting. */
  async open(
    name: string,
    signal: AbortSignal | undefined,
    purpose: Purpose,
  ): Promise<Session> {
    // Under Deno, every missing grant at once, in an error, not a prompt.
    const { host, port } = this.target;
    const missing: string[] = [];
    if (!granted({ name: "env" })) {
      missing.push("--allow-env (the PostgreSQL client reads PG* variables)");
    }
    if (
      !host.startsWith("/") &&
      !granted({ name: "net", host: `${host}:${port}` })
    ) {
      missing.push(`--allow-net=${host}:${port}`);
    }
    if (missing.length > 0) {
      throw new RunlockError(
        name,
        `${name}: cannot connect to PostgreSQL at ${this.target.text}: permission denied; grant ${
          missing.join(" and ")
        }`,
      );
    }
    let session: Session;
    try {
      session = await Session.open(this.#config, signal);
    } catch (err) {
      signal?.throwIfAborted();
      throw connectError(this.target, this.options, name, err, purpose);
    }
    if (purpose !== "lock") return session;
    const idle = String(this.options.idleSessionTimeout);
    try {
      await bind(session, {
        name,
        settings: {
          ...(this.#config.optionsRefused ? this.target.settings : {}),
          ...this.#pinned,
          // Lock sessions only (a dead client behind a TCP proxy).
          idle_session_timeout: idle,
          // A lock session reached through a pooler stays in a transaction.
          idle_in_transaction_session_timeout: idle,
        },
        timeout: this.options.connectTimeout,
        open: (limit) =>
          Session.open(
            this.#config,
            signal === undefined ? limit : AbortSignal.any([signal, limit]),
          ),
      });
    } catch (err) {
      if (err instanceof RunlockError) throw err;
      signal?.throwIfAborted();
      throw refused(
        this.target,
        name,
        "acquire the lock",
        err,
        this.options.schema,
      );
    }
    return session;
  }
}
