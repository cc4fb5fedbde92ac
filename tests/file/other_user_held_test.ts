// A lock another user holds is held, not "permission denied". A user who may
// not write the lock's directory, or who meets the lock on a read-only mount,
// cannot take the lock even when it is free; but while a live run holds it, the
// answer is that run (HeldError, `runlock run`'s exit 75), not a permission to
// fix. As in file/other_users_test: the suite runs as root, and these tests run
// the runtime under test as unprivileged identities (uids 65533 and 65534,
// through `setpriv`), as real processes. Skipped, with a message, where the
// suite is not root, setpriv is missing, or the runtime cannot start as another
// user.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { chmodSync, chownSync, mkdirSync, readdirSync } from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import {
  Child,
  cliCommand,
  type Event,
  fixtureCommand,
  runtime,
  tempDir,
} from "../_helpers.ts";

const A = 65533;
const B = 65534;

/** Why these tests cannot run here, or "" when they can. */
function impossible(): string {
  if (process.getuid?.() !== 0) return "the suite does not run as root";
  if (spawnSync("setpriv", ["--version"]).status !== 0) {
    return "setpriv is not installed";
  }
  return "";
}

let root = "";
let cleanupRoot = () => {};
let skipReason = impossible();

/** The command line that runs `argv` as `uid` (0: as we are). */
function as(uid: number, argv: string[]): string[] {
  if (uid === 0) return argv;
  const home = join(root, `home-${uid}`);
  return [
    "env",
    `HOME=${home}`,
    `DENO_DIR=${join(home, "deno")}`,
    "setpriv",
    `--reuid=${uid}`,
    `--regid=${uid}`,
    "--clear-groups",
    ...argv,
  ];
}

/** fixtures/child.ts run as `uid`. */
function child(uid: number, args: string[]): Child {
  const [cmd, argv] = fixtureCommand("child.ts", []);
  return new Child("child.ts", args, undefined, as(uid, [cmd, ...argv]));
}

/** The one event a short-lived child.ts prints (try, trysync, probe). */
async function once(uid: number, args: string[]): Promise<Event> {
  const c = child(uid, args);
  const event = await c.next();
  await c.exited;
  return event;
}

/** A directory owned by `uid` with `mode`, inside the test's root. */
function dirOf(name: string, uid: number, mode: number): string {
  const dir = join(root, name);
  mkdirSync(dir);
  chownSync(dir, uid, uid);
  chmodSync(dir, mode);
  return dir;
}

/** `runlock <args>` run as `uid`: its exit code and output. */
function cliAs(
  uid: number,
  args: string[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const [cmd, ...argv] = as(uid, cliCommand());
  const proc = spawn(cmd, [...argv, ...args], {
    cwd: "/",
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  proc.stdout.on("data", (d) => stdout += d);
  proc.stderr.on("data", (d) => stderr += d);
  return new Promise((resolve) =>
    proc.on("close", (code) => resolve({ code, stdout, stderr }))
  );
}

/** Asserts that `event` is the HeldError of `holder`'s lock. */
function assertHeldBy(event: Event, holder: Event, who: string): void {
  assert.equal(event.event, "held", `${who}: ${JSON.stringify(event)}`);
  assert.equal(event.holder, holder.pid, who);
  assert.equal(event.host, hostname(), who);
  assert.equal(typeof event.started, "string", who);
  // The record's start, within the holder's acquire (which it timed after).
  const started = Date.parse(String(event.started));
  assert.ok(
    started <= Number(holder.at) && Number(holder.at) - started < 60_000,
    `${who}: started ${event.started}, acquired at ${holder.at}`,
  );
  assert.doesNotMatch(String(event.message), /permission|read-only/, who);
}

describe("a lock another user holds is held, not a permission error", () => {
  before(async () => {
    if (skipReason) return;
    ({ dir: root, cleanup: cleanupRoot } = tempDir());
    chmodSync(root, 0o755);
    for (const uid of [A, B]) dirOf(`home-${uid}`, uid, 0o700);
    // Can the runtime start as another user here? (Its binary or the
    // fixtures may sit where only root can read.)
    const probe = await once(B, ["probe", join(root, "nothing.lock")])
      .catch((err) => ({ event: "failed", message: String(err) }) as Event);
    if (probe.event !== "probe") {
      skipReason = `the ${runtime} runtime cannot start as uid ${B}: ${
        JSON.stringify(probe)
      }`;
    }
  });
  after(() => cleanupRoot());

  const it = (
    name: string,
    fn: (t: { skip(message: string): void }) => Promise<void>,
  ) =>
    test(name, async (t) => {
      if (skipReason) {
        console.warn(
          `*** file/other_user_held_test skipped on ${runtime}: ${skipReason}`,
        );
        return t.skip?.(skipReason);
      }
      await fn(t);
    });

  it("acquire() and acquireSync() of a lock user A holds, in a directory only A may write, give user B HeldError naming A's run (pid, host, start); once it is free, LockPermissionError", async () => {
    const dir = dirOf("a-only", A, 0o755);
    const path = join(dir, "run.lock");
    const holder = child(A, ["hold", path]);
    try {
      const took = await holder.expect("acquired");
      assertHeldBy(await once(B, ["try", path]), took, "acquire");
      assertHeldBy(await once(B, ["trysync", path]), took, "acquireSync");
      // B left nothing, and A's lock is still A's.
      assert.deepEqual(readdirSync(dir), ["run.lock"]);
      holder.send("owned");
      assert.equal((await holder.expect("owned")).owned, true);
      holder.send("release");
      await holder.expect("released");
    } finally {
      await holder.kill();
    }
    // Free: now the permission is what stands in the way.
    for (const mode of ["try", "trysync"]) {
      const refused = await once(B, [mode, path]);
      assert.equal(refused.event, "error", JSON.stringify(refused));
      assert.equal(refused.name, "LockPermissionError", mode);
      assert.match(
        String(refused.message),
        new RegExp(
          `^${path}: cannot create the lock: permission denied; this user needs read and write access to ${dir}$`,
        ),
      );
    }
    assert.deepEqual(readdirSync(dir), []);
  });

  it("runlock run on a lock user A holds, in a directory only A may write, exits 75 for user B, naming A's pid, and does not run the command", async () => {
    const dir = dirOf("a-only-cli", A, 0o755);
    const path = join(dir, "run.lock");
    const holder = child(A, ["hold", path]);
    try {
      const took = await holder.expect("acquired");
      const r = await cliAs(B, ["run", path, "--", "echo", "ran"]);
      assert.equal(r.code, 75, r.stderr);
      assert.equal(r.stdout, "");
      assert.match(
        r.stderr,
        new RegExp(`another run is active as pid ${took.pid}`),
      );
      assert.doesNotMatch(r.stderr, /permission/);
      const waited = await cliAs(B, ["run", "--wait=0.3", path, "--", "echo"]);
      assert.equal(waited.code, 75, waited.stderr);
    } finally {
      await holder.kill();
    }
    // Free: the permission error, exit 2 (not 75: nobody holds it).
    const r = await cliAs(B, ["run", path, "--", "echo", "ran"]);
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stdout, "");
    assert.match(r.stderr, /permission denied/);
  });

  it("a waiter without write access waits while user A holds the lock (HeldError at its timeout, async and sync), and gets LockPermissionError once A releases it", async () => {
    const dir = dirOf("a-only-wait", A, 0o755);
    const path = join(dir, "run.lock");
    const holder = child(A, ["hold", path]);
    let waiter: Child | undefined;
    try {
      const took = await holder.expect("acquired");
      // A timeout that runs out: held, after waiting it out.
      for (const mode of ["try", "trysync"]) {
        const started = Date.now();
        const timed = await once(B, [mode, path, "500"]);
        const elapsed = Date.now() - started;
        assertHeldBy(timed, took, `${mode} with a timeout`);
        assert.ok(elapsed >= 500, `${mode}: gave up after ${elapsed} ms`);
      }
      // A long timeout: B waits for A's lock...
      waiter = child(B, ["wait", path, "60000"]);
      await waiter.expect("waiting");
      const outcome = waiter.next();
      const early = await Promise.race([
        outcome,
        new Promise<undefined>((r) => setTimeout(() => r(undefined), 500)),
      ]);
      assert.equal(
        early,
        undefined,
        `B stopped waiting: ${JSON.stringify(early)}`,
      );
      // ...and finds it free once A releases it: the permission error.
      holder.send("release");
      const released = await holder.expect("released");
      const refused = await outcome;
      assert.equal(refused.event, "error", JSON.stringify(refused));
      assert.equal(refused.name, "LockPermissionError");
      assert.match(
        String(refused.message),
        /cannot create the lock: permission denied/,
      );
      const after = Date.now() - Number(released.at);
      assert.ok(after < 30_000, `refused ${after} ms after the release`);
      await waiter.exited;
    } finally {
      await waiter?.kill();
      await holder.kill();
    }
    assert.deepEqual(readdirSync(dir), []);
  });

  it("a lock a live run holds, seen through a read-only bind mount, is held for root and for user B (acquire, acquireSync, runlock run exit 75); a free one there gives the read-only error", async (t) => {
    // The whole filesystem cannot be remounted read-only under a live
    // holder (its lock file is open for writing: EBUSY), so a read-only
    // mount of a held lock is a second, read-only mount of it: a tmpfs,
    // and a read-only bind mount of it.
    const rw = dirOf("tmpfs-rw", 0, 0o755);
    const ro = dirOf("tmpfs-ro", 0, 0o755);
    const fs = spawnSync(
      "mount",
      ["-t", "tmpfs", "-o", "size=1m", "tmpfs", rw],
      {
        encoding: "utf8",
      },
    );
    if (fs.status !== 0) {
      return t.skip(`cannot mount tmpfs here: ${fs.stderr.trim()}`);
    }
    let holder: Child | undefined;
    let bound = false;
    try {
      chmodSync(rw, 0o755);
      const bind = spawnSync("mount", ["--bind", rw, ro], { encoding: "utf8" });
      assert.equal(bind.status, 0, bind.stderr);
      bound = true;
      const remount = spawnSync("mount", ["-o", "remount,ro,bind", ro], {
        encoding: "utf8",
      });
      assert.equal(remount.status, 0, remount.stderr);
      holder = new Child("child.ts", ["hold", join(rw, "run.lock")]);
      const took = await holder.expect("acquired");
      const path = join(ro, "run.lock");
      for (const uid of [0, B]) {
        assertHeldBy(
          await once(uid, ["try", path]),
          took,
          `acquire, uid ${uid}`,
        );
        assertHeldBy(
          await once(uid, ["trysync", path]),
          took,
          `acquireSync, uid ${uid}`,
        );
        const r = await cliAs(uid, ["run", path, "--", "echo", "ran"]);
        assert.equal(r.code, 75, `uid ${uid}: ${r.stderr}`);
        assert.match(
          r.stderr,
          new RegExp(`another run is active as pid ${took.pid}`),
        );
        const free = await once(uid, ["try", join(ro, "free.lock")]);
        assert.equal(free.name, "LockPermissionError", `uid ${uid}`);
        assert.match(
          String(free.message),
          new RegExp(`${ro} is on a read-only filesystem$`),
        );
      }
      holder.send("owned");
      assert.equal((await holder.expect("owned")).owned, true);
      holder.send("release");
      await holder.expect("released");
      assert.deepEqual(readdirSync(rw), []);
    } finally {
      await holder?.kill();
      if (bound) spawnSync("umount", ["-l", ro]);
      spawnSync("umount", ["-l", rw]);
    }
  });
});
