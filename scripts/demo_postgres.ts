// `deno task demo:postgres`: the same story as `deno task demo`, on a
// PostgreSQL server (a throwaway cluster started here, or
// RUNLOCK_TEST_PG_URL): a run holds the lock "demo/sync", a second run is
// refused with the first one's pid and host, a status command looks
// without taking the lock, the holder is SIGKILLed, the status turns
// stale, and a new run takes over with a higher fence.
//
// The runs are this same script started as `demo_postgres.ts --run <url>
// <name> <label>`, so each is a separate process with its own session.
import { spawn } from "node:child_process";
import process from "node:process";
import { createInterface } from "node:readline";
import { HeldError, pgLocks } from "../src/postgres/mod.ts";
import { startCluster } from "../tests/fixtures/pg_cluster.ts";

if (process.argv[2] === "--run") {
  // One "run" of an imaginary CLI's long-running mode.
  const [url, name, label] = process.argv.slice(3);
  const locks = pgLocks(url);
  try {
    const lock = await locks.acquire(name, { meta: { cmd: label } });
    const work = setInterval(() => {}, 60_000); // the work loop
    lock.signal.addEventListener("abort", () => {
      console.log(`${label}: lost the lock: ${lock.signal.reason.message}`);
      process.exit(1);
    });
    process.on("SIGTERM", async () => {
      clearInterval(work);
      await lock.release(); // a clean stop marks the record released
      console.log(`${label}: stopped cleanly and released the lock`);
      process.exit(0);
    });
    console.log(
      `${label}: took the lock as pid ${lock.pid} with fence ${lock.fence}; working...`,
    );
  } catch (err) {
    if (!(err instanceof HeldError)) throw err;
    console.log(`${label}: refused: ${err.message}`);
    process.exit(75); // EX_TEMPFAIL
  }
} else {
  await demo();
}

async function demo(): Promise<void> {
  const color = !process.env.NO_COLOR && process.stdout.isTTY;
  const bold = (s: string) => (color ? `\x1b[1m${s}\x1b[0m` : s);
  const dim = (s: string) => (color ? `\x1b[2m${s}\x1b[0m` : s);
  const step = (text: string) => console.log(`\n${bold(`▸ ${text}`)}`);

  step(
    "starting a throwaway PostgreSQL server (initdb + pg_ctl, loopback only)",
  );
  const cluster = await startCluster();
  const url = cluster.url;
  console.log(dim(`  ${url}`));
  const name = "demo/sync";
  const locks = pgLocks(url);

  const startRun = (label: string) => {
    const child = spawn(Deno.execPath(), [
      "run",
      "--quiet",
      "--allow-all",
      new URL(import.meta.url).pathname,
      "--run",
      url,
      name,
      label,
    ], { stdio: ["ignore", "pipe", "inherit"] });
    const lines = createInterface({ input: child.stdout! })[
      Symbol.asyncIterator
    ]();
    const nextLine = async () => String((await lines.next()).value);
    const exited = new Promise<number | null>((resolve) =>
      child.on("close", (code) => resolve(code))
    );
    return { child, nextLine, exited };
  };

  const status = async () => {
    const info = await locks.inspect(name);
    const since = info.started ? ` since ${info.started.toISOString()}` : "";
    const fence = info.fence === undefined ? "" : `, fence ${info.fence}`;
    const text = {
      free: `free: no run is active${fence}`,
      held: `held by pid ${info.pid} on ${
        info.host || "?"
      }${since} (session ${info.backendPid}${fence})`,
      stale:
        `stale: last holder pid ${info.pid} is gone${fence}; the next run takes over`,
      invalid: `invalid: ${info.reason}`,
    }[info.state];
    console.log(`  status: ${text}`);
  };

  try {
    step(`run A starts its work loop, holding "${name}"`);
    const a = startRun("run A");
    console.log(`  ${await a.nextLine()}`);
    console.log(dim(
      `  the table says who: ${
        JSON.stringify(await locks.inspect(name), (_k, v) =>
          typeof v === "bigint" ? String(v) : v)
      }`,
    ));

    step("run B starts while A is active");
    const b = startRun("run B");
    console.log(`  ${await b.nextLine()}`);
    console.log(`  run B exited with ${await b.exited}`);

    step(
      "a status command asks, without taking the lock (pg_locks + the table)",
    );
    await status();

    step(`run A crashes (SIGKILL to pid ${a.child.pid}): no cleanup code runs`);
    a.child.kill("SIGKILL");
    await a.exited;
    console.log(dim(
      "  its socket closed with it, so the server ended its session and dropped the advisory lock",
    ));
    let info = await locks.inspect(name);
    for (let i = 0; i < 100 && info.state === "held"; i++) {
      await new Promise((r) => setTimeout(r, 5));
      info = await locks.inspect(name);
    }
    await status();

    step("run C starts and takes over, with a higher fence");
    const c = startRun("run C");
    console.log(`  ${await c.nextLine()}`);
    await status();
    console.log(dim(
      "  a store that refuses writes fenced lower than the highest it has seen now refuses late writes from A",
    ));

    step("run C is asked to stop (SIGTERM) and releases the lock");
    c.child.kill("SIGTERM");
    console.log(`  ${await c.nextLine()}`);
    await c.exited;
    await status();
    console.log(
      `\n${
        bold("done:")
      } one run at a time across hosts, and everyone could see who.`,
    );
  } finally {
    await locks.end();
    cluster.stop();
  }
}
