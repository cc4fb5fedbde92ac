// A throwaway PostgreSQL cluster around a command:
//
//   deno run --allow-all scripts/_pg_cluster.ts -- deno test --allow-all ...
//
// starts a cluster (tests/fixtures/pg_cluster.ts: initdb + pg_ctl, temp
// dir, free port, 127.0.0.1 only, trust auth), runs the command with
// RUNLOCK_TEST_PG_URL pointing at it, stops the cluster (also when the
// command fails or this script is interrupted) and exits with the
// command's code. Without a command it prints the URL and keeps the
// cluster until SIGINT/SIGTERM. With RUNLOCK_TEST_PG_URL already set, it
// runs the command against that server. Without PostgreSQL binaries it
// says so loudly and, unless CI=true (then it fails), runs the command
// without a server, where the PostgreSQL tests skip themselves; for a
// `deno test` command it also leaves out src/postgres/, whose examples
// need a server.
import { spawn } from "node:child_process";
import process from "node:process";
import { startCluster } from "../tests/fixtures/pg_cluster.ts";
import { pgServerAvailable } from "../tests/fixtures/pg_available.ts";

const dash = Deno.args.indexOf("--");
const command = dash >= 0 ? Deno.args.slice(dash + 1) : Deno.args;

function run(argv: string[], env: Record<string, string>): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(argv[0], argv.slice(1), {
      stdio: "inherit",
      env: { ...process.env, ...env },
    });
    for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
      process.on(signal, () => child.kill(signal));
    }
    child.on(
      "close",
      (code, signal) =>
        resolve(code ?? (signal ? 128 + (signal === "SIGINT" ? 2 : 15) : 1)),
    );
  });
}

if (!pgServerAvailable) {
  const banner = "!".repeat(72);
  console.error(
    `${banner}\n! No PostgreSQL binaries (initdb, pg_ctl) and no RUNLOCK_TEST_PG_URL:\n` +
      `! the PostgreSQL backend is NOT tested. Install PostgreSQL (Debian:\n` +
      `! apt-get install postgresql) or point RUNLOCK_TEST_PG_URL at a server.\n${banner}`,
  );
  if (process.env.CI === "true") {
    console.error("CI=true: failing instead of skipping.");
    Deno.exit(1);
  }
  if (command.length === 0) Deno.exit(1);
  const argv = command[1] === "test" && command[0].endsWith("deno")
    ? [command[0], "test", "--ignore=src/postgres/", ...command.slice(2)]
    : command;
  Deno.exit(await run(argv, {}));
}

const cluster = await startCluster();
const stop = () => {
  cluster.stop();
};
if (command.length === 0) {
  console.log(cluster.url);
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    process.on(signal, () => {
      stop();
      Deno.exit(0);
    });
  }
  setInterval(() => {}, 1 << 30);
} else {
  let code = 1;
  try {
    code = await run(command, { RUNLOCK_TEST_PG_URL: cluster.url });
  } finally {
    stop();
  }
  Deno.exit(code);
}
