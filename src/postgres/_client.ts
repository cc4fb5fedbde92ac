// The PostgreSQL client library, node-postgres (`pg`): loading it on the
// first connection, the part of its Client runlock uses, and the
// CancelRequest it does not send itself.
//
// Why node-postgres and not postgres.js (compared on Deno, Node and Bun):
// a pg Client is exactly one session and never reconnects behind our
// back, so a lost lock is seen (its next query fails, "not queryable");
// postgres.js ran the next query on a new session, and a reserved
// connection used after termination threw an uncatchable TypeError
// (porsager/postgres#1154). pg also reports a loss and connects sooner,
// and can unref its socket. It is bigger (~1 MB): loaded on the first
// connection only.
import { connect as netConnect } from "node:net";
import { clearTimeout, setTimeout } from "node:timers";
import { messageOf } from "./_failure.ts";
import { runtime } from "./_runtime.ts";

/** The part of node-postgres's Client that runlock uses. */
export interface PgClient {
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
export function loadClient(): Promise<ClientClass> {
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
    const why = messageOf(cause);
    // The specifier in two pieces: scripts/build_npm.ts rewrites quoted
    // npm: specifiers to bare names.
    const how = runtime === "deno"
      ? `Deno downloads npm:${"pg@8.23.1"} from the npm registry on first use`
      : "install it with `npm install pg` (or `bun add pg`)";
    super(
      `runlock's PostgreSQL backend needs the client node-postgres ("pg", 8.x), ` +
        `which could not be loaded (${why.split("\n")[0]}); ${how}`,
      { cause },
    );
    this.name = "ClientMissing";
  }
}

/**
 * Sends one CancelRequest for the statement `client`'s session runs (on a
 * new connection, with the backend's pid and secret key; PostgreSQL manual
 * §55.2.8 "Canceling Requests in Progress"); resolves when the server has
 * closed that connection, or after 2 s, or on an error (the server will
 * then end the statement, or not, by itself).
 */
export function sendCancel(client: PgClient): Promise<void> {
  const pid = client.processID;
  const secret = client.secretKey;
  if (pid === null || secret === null) return Promise.resolve();
  const host = client.host;
  const port = client.port;
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
