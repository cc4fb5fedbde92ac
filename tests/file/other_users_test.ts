// Real users, real permissions. The suite runs as root, which no permission
// check refuses; these tests run the runtime under test as two unprivileged
// identities (uids 65533 and 65534, through `setpriv --reuid --regid
// --clear-groups`) and prove what each of them meets: another user's stale
// lock in a sticky directory, another user's live lock, a directory they
// may not write, a read-only file system, a directory they may not enter.
// Skipped, with a message, where the suite is not root, setpriv is missing,
// or the runtime cannot start as another user.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, before, describe, test } from "node:test";
import { acquireSync, inspect, LockPermissionError } from "../../mod.ts";
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

/** The command line that runs `argv` as `uid`, with a home of its own. */
function as(uid: number, argv: string[]): string[] {
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

/** The one event a short-lived child.ts prints (try, probe). */
async function once(uid: number, args: string[]): Promise<Event> {
  const c = child(uid, args);
  const event = await c.next();
  await c.exited;
  return event;
}

/** A stale lock file owned by `uid`: it took the lock and was SIGKILLed. */
async function staleOf(uid: number, path: string): Promise<number> {
  const holder = child(uid, ["hold", path]);
  const took = await holder.expect("acquired");
  await holder.kill("SIGKILL");
  return took.pid!;
}

function snapshot(path: string): string {
  const s = lstatSync(path);
  return JSON.stringify([
    s.ino,
    s.uid,
    s.mode,
    s.mtimeMs,
    s.nlink,
    readFileSync(path, "latin1"),
  ]);
}

/** A directory owned by `uid` with `mode`, inside the test's root. */
function dirOf(name: string, uid: number, mode: number): string {
  const dir = join(root, name);
  mkdirSync(dir);
  chownSync(dir, uid, uid);
  chmodSync(dir, mode);
  return dir;
}

describe("real users, real permissions", () => {
  before(async () => {
    if (skipReason) return;
    ({ dir: root, cleanup: cleanupRoot } = tempDir());
    chmodSync(root, 0o755);
    for (const uid of [A, B]) dirOf(`home-${uid}`, uid, 0o700);
    // Can the runtime start as another user here? (Its binary or the
    // fixtures may sit where only root can read.)
    const probe = await once(A, ["probe", join(root, "nothing.lock")])
      .catch((err) => ({ event: "failed", message: String(err) }) as Event);
    if (probe.event !== "probe") {
      skipReason = `the ${runtime} runtime cannot start as uid ${A}: ${
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
          `*** file/other_users_test skipped on ${runtime}: ${skipReason}`,
        );
        return t.skip?.(skipReason);
      }
      await fn(t);
    });

  it("another user's stale lock in a sticky directory: LockPermissionError without waiting out its timeout, saying who owns it and that the directory is sticky; the file is untouched", async () => {
    const dir = dirOf("sticky", 0, 0o1777);
    const path = join(dir, "run.lock");
    const deadPid = await staleOf(A, path);
    assert.equal(lstatSync(path).uid, A);
    // A's litter beside it, which B may not remove either: what A leaves if
    // it dies between creating and removing its watch's marker (an empty
    // temp file, made on the lock's first check), as the SIGKILL above can
    // land there on a busy machine.
    const litter = join(dir, ".run.lock.0123456789abcdef.tmp");
    const [touch, ...touchArgs] = as(A, ["touch", litter]);
    const touched = spawnSync(touch, touchArgs);
    assert.equal(touched.status, 0, String(touched.stderr));
    const before = snapshot(path);
    const ownersOf = () =>
      readdirSync(dir).sort().map((n) => [n, lstatSync(join(dir, n)).uid]);
    const left = ownersOf();
    assert.ok(left.every(([, uid]) => uid === A), JSON.stringify(left));
    // B may read it: it is stale, and names A's dead run.
    const seen = await once(B, ["probe", path]);
    assert.equal(seen.state, "stale");
    assert.equal(seen.holder, deadPid);
    // B's acquire, even with a long timeout, fails without waiting it out
    // (the time includes the child's start): no loop.
    const started = Date.now();
    const refused = await once(B, ["try", path, "60000"]);
    const elapsed = Date.now() - started;
    assert.equal(refused.event, "error", JSON.stringify(refused));
    assert.equal(refused.name, "LockPermissionError");
    assert.match(
      String(refused.message),
      new RegExp(
        `^${path}: cannot remove the stale lock: permission denied; the file belongs to uid ${A} and ${dir} is sticky \\(mode 1777\\)`,
      ),
    );
    assert.doesNotMatch(String(refused.message), /needs read and write/);
    assert.ok(elapsed < 60_000, `took ${elapsed} ms with a 60 s timeout`);
    console.log(`refused after ${elapsed} ms (child start included)`);
    assert.equal(snapshot(path), before, "the stale file is untouched");
    assert.deepEqual(ownersOf(), left, "B left no temp file, and A's litter");
    // Its owner takes it over at once, and sweeps its own litter.
    const owner = await once(A, ["try", path]);
    assert.equal(owner.event, "acquired");
    assert.deepEqual(readdirSync(dir), []);
  });

  it("a live lock of user A is seen held, with pid and host, by user B: probes and `runlock status` need only read access", async () => {
    // A shared, /tmp-style directory: B may create files there too.
    const dir = dirOf("shared", 0, 0o1777);
    const path = join(dir, "run.lock");
    const holder = child(A, ["hold", path]);
    try {
      const took = await holder.expect("acquired");
      const seen = await once(B, ["probe", path]);
      assert.equal(seen.state, "held");
      assert.equal(seen.holder, took.pid);
      assert.equal(seen.host, hostname());
      const refused = await once(B, ["try", path]);
      assert.equal(refused.event, "held", JSON.stringify(refused));
      assert.equal(refused.holder, took.pid);
      assert.equal(refused.host, hostname());
      const status = spawnSync(
        as(B, cliCommand())[0],
        [...as(B, cliCommand()).slice(1), "status", "--json", path],
        { encoding: "utf8", cwd: "/" },
      );
      assert.equal(status.status, 0, status.stderr);
      const json = JSON.parse(status.stdout);
      assert.equal(json.state, "held");
      assert.equal(json.pid, took.pid);
      assert.equal(json.host, hostname());
      // Still A's, untouched by B's probes.
      assert.equal(lstatSync(path).uid, A);
      assert.deepEqual(readdirSync(dir), ["run.lock"]);
    } finally {
      await holder.kill();
    }
  });

  it("a directory user B may not write: acquire gives LockPermissionError naming the directory; probes answer", async () => {
    const dir = dirOf("readonly", 0, 0o755);
    const path = join(dir, "run.lock");
    const free = await once(B, ["probe", path]);
    assert.equal(free.state, "free");
    const refused = await once(B, ["try", path]);
    assert.equal(refused.event, "error", JSON.stringify(refused));
    assert.equal(refused.name, "LockPermissionError");
    assert.match(
      String(refused.message),
      new RegExp(
        `^${path}: cannot create the lock: permission denied; this user needs read and write access to ${dir}$`,
      ),
    );
    // A lock root holds there is seen held by B.
    const lock = acquireSync(path);
    try {
      const seen = await once(B, ["probe", path]);
      assert.equal(seen.state, "held");
      assert.equal(seen.holder, process.pid);
    } finally {
      lock.releaseSync();
    }
    assert.deepEqual(readdirSync(dir), []);
  });

  it("missing directories under one user B may not write: acquire's LockPermissionError names that existing directory, not the missing one", async () => {
    const dir = dirOf("readonly-parent", 0, 0o755);
    const path = join(dir, "a", "b", "run.lock");
    const refused = await once(B, ["try", path]);
    assert.equal(refused.event, "error", JSON.stringify(refused));
    assert.equal(refused.name, "LockPermissionError");
    assert.match(
      String(refused.message),
      new RegExp(
        `^${path}: cannot create the lock's directory: permission denied; this user needs read and write access to ${dir}$`,
      ),
    );
    assert.deepEqual(readdirSync(dir), []);
  });

  it("a lock directory user B cannot enter: acquire and probes give LockPermissionError saying so, not a wrong state", async () => {
    const dir = dirOf("closed", 0, 0o700);
    const path = join(dir, "run.lock");
    const lock = acquireSync(path);
    try {
      const refused = await once(B, ["try", path]);
      assert.equal(refused.event, "error", JSON.stringify(refused));
      assert.equal(refused.name, "LockPermissionError");
      assert.match(String(refused.message), new RegExp(`^${path}: `));
      assert.match(String(refused.message), /permission denied/);
      const probe = await once(B, ["probe", path]);
      assert.equal(probe.event, "error", JSON.stringify(probe));
      assert.equal(probe.name, "LockPermissionError");
      assert.match(
        String(probe.message),
        new RegExp(
          `^${path}: cannot read the lock file: permission denied; this user cannot enter ${dir} `,
        ),
      );
    } finally {
      lock.releaseSync();
    }
    assert.deepEqual(readdirSync(dir), []);
  });

  it("a read-only file system: acquire gives LockPermissionError saying so; a stale lock there is reported stale, a held one held", async (t) => {
    // A read-only bind mount of a directory whose lock this process holds
    // (through the writable path) and of one with a stale record.
    const rw = dirOf("rw", 0, 0o755);
    const ro = dirOf("ro", 0, 0o755);
    writeFileSync(join(rw, "stale.lock"), "4242\nrunlock 1\nhost=gone\n");
    const bind = spawnSync("mount", ["--bind", rw, ro], { encoding: "utf8" });
    if (bind.status !== 0) {
      return t.skip(`cannot bind-mount here: ${bind.stderr.trim()}`);
    }
    try {
      const remount = spawnSync("mount", [
        "-o",
        "remount,ro,bind",
        ro,
      ], { encoding: "utf8" });
      assert.equal(remount.status, 0, remount.stderr);
      const lock = acquireSync(join(rw, "run.lock"));
      try {
        for (const uid of [0, B]) {
          const run = (args: string[]) =>
            uid === 0 ? new Child("child.ts", args) : child(uid, args);
          const refused = await run(["try", join(ro, "new.lock")]).next();
          assert.equal(refused.name, "LockPermissionError", `uid ${uid}`);
          assert.match(
            String(refused.message),
            new RegExp(`${ro} is on a read-only filesystem$`),
          );
          const stale = await run(["try", join(ro, "stale.lock")]).next();
          assert.equal(stale.name, "LockPermissionError");
          assert.match(String(stale.message), /read-only filesystem/);
          const probeStale = await run(["probe", join(ro, "stale.lock")])
            .next();
          assert.equal(probeStale.state, "stale");
          assert.equal(probeStale.holder, 4242);
          const probeHeld = await run(["probe", join(ro, "run.lock")]).next();
          assert.equal(probeHeld.state, "held");
          assert.equal(probeHeld.holder, process.pid);
          const probeFree = await run(["probe", join(ro, "free.lock")])
            .next();
          assert.equal(probeFree.state, "free");
        }
        assert.equal((await inspect(join(ro, "run.lock"))).state, "held");
      } finally {
        lock.releaseSync();
      }
      assert.deepEqual(readdirSync(rw).sort(), ["stale.lock"]);
    } finally {
      spawnSync("umount", ["-l", ro]);
    }
  });

  it("LockPermissionError is what a real EACCES or EPERM gives, from acquire and from probes", async () => {
    // EACCES: a file another user made unreadable; EPERM: unlink refused by
    // the sticky bit (above). Here the class itself, in this process.
    const dir = dirOf("private", A, 0o755);
    const path = join(dir, "run.lock");
    const holder = child(A, ["hold", path, "0", ""]);
    try {
      await holder.expect("acquired");
      chmodSync(path, 0o600);
      const probe = await once(B, ["probe", path]);
      assert.equal(probe.name, "LockPermissionError", JSON.stringify(probe));
      assert.match(
        String(probe.message),
        new RegExp(`mode 0600, owner uid ${A}`),
      );
      const take = await once(B, ["try", path]);
      assert.equal(take.name, "LockPermissionError", JSON.stringify(take));
    } finally {
      await holder.kill();
    }
    // The class the public API exports is the one the child reported.
    assert.equal(LockPermissionError.name, "LockPermissionError");
  });
});
