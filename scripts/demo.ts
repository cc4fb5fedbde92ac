// `deno run --allow-all scripts/demo.ts` (or `deno task demo`): runlock
// with real processes, on `.state/run.lock` in the directory it runs in
// (the clone, as the README runs it). A run holds
// the lock, a second run is refused with its pid, a status command looks
// without taking the lock, the holder is SIGKILLed, the status turns stale,
// and a new run takes over, then stops cleanly and releases it.
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync, rmdirSync } from "node:fs";
import process from "node:process";
import { createInterface } from "node:readline";
import { inspect } from "../mod.ts";

const color = !process.env.NO_COLOR && process.stdout.isTTY;
const bold = (s: string) => (color ? `\x1b[1m${s}\x1b[0m` : s);
const dim = (s: string) => (color ? `\x1b[2m${s}\x1b[0m` : s);

const dir = ".state";
const path = ".state/run.lock";
const hadDir = existsSync(dir);
const worker = new URL("./_demo_run.ts", import.meta.url).pathname;

function step(text: string): void {
  console.log(`\n${bold(`▸ ${text}`)}`);
}

/** Starts a run with only the permissions runlock needs. */
function startRun(name: string) {
  const child = spawn(Deno.execPath(), [
    "run",
    "--quiet",
    `--allow-read=${dir}`,
    `--allow-write=${dir}`,
    "--allow-sys=hostname",
    worker,
    path,
    name,
  ], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! })[
    Symbol.asyncIterator
  ]();
  const nextLine = async () => String((await lines.next()).value);
  const exited = new Promise<number | null>((resolve) =>
    child.on("close", (code) => resolve(code))
  );
  return { child, nextLine, exited };
}

async function status(): Promise<void> {
  const info = await inspect(path);
  const since = info.started ? ` since ${info.started.toISOString()}` : "";
  const text = {
    free: "free: no run is active",
    held: `held by pid ${info.pid}${
      info.host ? ` on ${info.host}` : ""
    }${since}`,
    stale:
      `stale: last holder pid ${info.pid} is gone; the next run takes over`,
    invalid: `invalid: ${info.reason}`,
  }[info.state];
  console.log(`  status: ${text}`);
}

try {
  step(`run A starts its work loop on ${path}`);
  const a = startRun("run A");
  console.log(`  ${await a.nextLine()}`);
  console.log(dim(
    `  the file says who:\n${
      readFileSync(path, "utf8").trimEnd().replace(/^/gm, "    | ")
    }`,
  ));

  step("run B starts while A is active");
  const b = startRun("run B");
  console.log(`  ${await b.nextLine()}`);
  console.log(`  run B exited with ${await b.exited}`);

  step("a status command asks, without taking the lock");
  await status();

  step(`run A crashes (SIGKILL to pid ${a.child.pid}): no cleanup code runs`);
  a.child.kill("SIGKILL");
  await a.exited;
  console.log(
    dim("  the file is still there, but the kernel dropped A's flock"),
  );
  await status();

  step("run C starts and takes over the crashed run's file");
  const c = startRun("run C");
  console.log(`  ${await c.nextLine()}`);
  await status();

  step("run C is asked to stop (SIGTERM) and releases the lock");
  c.child.kill("SIGTERM");
  console.log(`  ${await c.nextLine()}`);
  await c.exited;
  await status();
  console.log(
    `\n${bold("done:")} one run at a time, and everyone could see who.`,
  );
} finally {
  // Run C released the lock, so .state holds nothing of the demo's: remove
  // it if the demo made it and it is empty.
  if (!hadDir && existsSync(dir) && readdirSync(dir).length === 0) {
    rmdirSync(dir);
  }
}
