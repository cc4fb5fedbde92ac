import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { inotifyWatch } from "./_inotify_deno.ts";
import { libc } from "./_libc_deno.ts";

/** A hang, not a speed bound: the wait is for an event. */
const HANG_MS = 60_000;

Deno.test({
  name:
    "inotify: after the queue overflowed, a watched directory removed and made again at its path meanwhile is watched again (the kernel's notice of the old watch's end was lost)",
  ignore: libc() === undefined,
  // The poll on Deno's blocking pool ends a moment after the last watch.
  sanitizeOps: false,
  async fn() {
    const l = libc()!;
    const top = Deno.makeTempDirSync();
    const sub = `${top}/sub`;
    mkdirSync(sub);
    const names: string[] = [];
    let woken: (() => void) | undefined;
    const stop = inotifyWatch(l, sub, (name) => {
      names.push(name);
      woken?.();
    });
    assert.equal(typeof stop, "function");
    const until = (what: string) =>
      new Promise<void>((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`${what}: no event in ${HANG_MS} ms`)),
          HANG_MS,
        );
        const check = () => {
          if (!names.includes(what)) return;
          clearTimeout(timer);
          woken = undefined;
          resolve();
        };
        woken = check;
        check();
      });
    try {
      // All before the event loop turns: nothing is read meanwhile. More
      // events than the queue holds (16,384 by default), on two files in
      // turn (the kernel merges an event equal to the last).
      const flood = spawnSync("python3", [
        "-c",
        "import sys\nfrom os import utime\na, b = sys.argv[1:]\n" +
        "open(a, 'w').close(); open(b, 'w').close()\n" +
        "for i in range(10000): utime(a); utime(b)",
        `${sub}/a`,
        `${sub}/b`,
      ]);
      assert.equal(flood.status, 0, String(flood.stderr));
      rmSync(sub, { recursive: true });
      mkdirSync(sub);
      await until(""); // the overflow
      writeFileSync(`${sub}/x`, "");
      await until("x");
    } finally {
      (stop as () => void)();
      rmSync(top, { recursive: true, force: true });
    }
  },
});
