// One "run" of an imaginary CLI's long-running mode, for scripts/demo.ts:
// it takes the lock on <path> and works until killed, or explains who is
// running instead.
import process from "node:process";
import { acquire, HeldError } from "../mod.ts";

const [path, name] = process.argv.slice(2);
try {
  const lock = await acquire(path);
  const work = setInterval(() => {}, 60_000); // the work loop
  process.on("SIGTERM", async () => {
    clearInterval(work);
    await lock.release(); // a clean stop removes the file
    console.log(`${name}: stopped cleanly and released the lock`);
    process.exit(0);
  });
  console.log(`${name}: took the lock as pid ${lock.pid}; working...`);
} catch (err) {
  if (!(err instanceof HeldError)) throw err;
  console.log(`${name}: refused: ${err.message}`);
  process.exit(75); // EX_TEMPFAIL
}
