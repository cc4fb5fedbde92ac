// The client library, node-postgres (`pg`), and the CancelRequest it does
// not send itself. Not postgres.js: a pg Client is one session that never
// reconnects behind our back, so a lost lock is seen; postgres.js ran the
// next query on a new session, and a reserved connection used after
// termination threw an uncatchable TypeError (porsager/postgres#1154).
import { connect as netConnect } from "node:net";
import { clearTimeout, setTimeout } from "node:timers";
import { messageOf } from "./_failure.ts";
import { fetchesNpm } from "../platform/runtime.ts";

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
 * Loads node-postgres on the first connection: importing costs nothing,
 * and its import-time read of $USER comes after the --allow-env check
 * (an error, not a prompt). A literal specifier, so `deno compile` and
 * `bun build --compile` bundle it.
 */
export function loadClient(): Promise<ClientClass> {
  // Full, so Deno needs no import map; the npm build makes it "pg".
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
 * The client module could not be loaded (not installed, or not
 * downloadable): never reported as a connection failure.
 */
export class ClientMissing extends Error {
  constructor(cause: unknown) {
    const why = messageOf(cause);
    // The specifier in two pieces: scripts/build_npm.ts rewrites quoted
    // npm: specifiers to bare names.
    const how = fetchesNpm
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
 * Sends one CancelRequest for `client`'s session (§55.2.8); resolves when
 * the server has closed that connection, after 2 s, or on an error.
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
